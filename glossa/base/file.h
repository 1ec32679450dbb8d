// File helpers: atomic writes (temporary file, fsync, rename, fsync of the directory), bounded
// reads, directory listing.
//
//   AtomicWriteFile("/ckpt/checkpoint", text);   // readers see the old or the new file, never half
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace glossa {

// Writes `data` to `path` atomically. Aborted (naming the file) on any I/O error, in which case
// `path` is untouched and the temporary file removed.
void AtomicWriteFile(const std::string& path, std::string_view data);
// The same, with the content produced by `write(fd)` (which must write everything or throw).
void AtomicWriteFileWith(const std::string& path, const std::function<void(int fd)>& write);
// Writes all of `data` to `fd`; Aborted naming `path` on error (ENOSPC included).
void WriteAll(int fd, std::string_view data, const std::string& path);

// InvalidArgument naming `path` and `what` it is for unless it is a regular file (a directory,
// /dev/zero or a FIFO would be read forever or not at all); NotFound when it does not exist.
void CheckRegularFile(const std::string& path, const std::string& what);
// Reads a whole regular file (CheckRegularFile); NotFound when it cannot be opened, DataLoss when
// larger than `max_size`.
std::string ReadFileToString(const std::string& path, uint64_t max_size = uint64_t{1} << 34);
bool FileExists(const std::string& path);
uint64_t FileSize(const std::string& path);
// Names (not paths) of the entries of `dir`, sorted; NotFound when it cannot be listed.
std::vector<std::string> ListDirectory(const std::string& dir);
void RemoveFileIfExists(const std::string& path);
void CreateDirectories(const std::string& dir);
std::string JoinPath(const std::string& a, const std::string& b);

// Truncates a line-oriented file after its last newline (a line torn by a crash mid-write).
// Returns the number of bytes removed; 0 when the file is absent or ends with a newline.
uint64_t TruncateTornLastLine(const std::string& path);
// Removes the temporary files AtomicWriteFile leaves behind when killed ("<name>.tmp.<pid>.<n>")
// in `dir` (not recursive). Returns the names removed. Only for directories this process owns
// (hold a DirectoryLock).
std::vector<std::string> RemoveStaleTempFiles(const std::string& dir);

// An exclusive advisory lock (flock) on `<dir>/<name>`, held for the object's life and released
// by the kernel if the process dies. FailedPrecondition naming the holder's pid when another
// process holds it.
class DirectoryLock {
 public:
  DirectoryLock(const std::string& dir, const std::string& name, const std::string& what);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace glossa
