#include "glossa/base/file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

std::string Errno() { return std::strerror(errno); }

void FsyncDirectory(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

void WriteAll(int fd, std::string_view data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw AbortedError(StrCat("write to '", path, "' failed: ", Errno()));
    }
    done += static_cast<size_t>(n);
  }
}

void AtomicWriteFileWith(const std::string& path, const std::function<void(int fd)>& write) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = StrCat(path, ".tmp.", ::getpid(), ".", counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw AbortedError(StrCat("cannot create '", tmp, "': ", Errno()));
  try {
    write(fd);
    if (::fsync(fd) != 0) throw AbortedError(StrCat("fsync of '", tmp, "' failed: ", Errno()));
    if (::close(fd) != 0) {
      throw AbortedError(StrCat("close of '", tmp, "' failed: ", Errno()));
    }
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = Errno();
    ::unlink(tmp.c_str());
    throw AbortedError(StrCat("rename of '", tmp, "' to '", path, "' failed: ", err));
  }
  FsyncDirectory(path);
}

void AtomicWriteFile(const std::string& path, std::string_view data) {
  AtomicWriteFileWith(path, [&](int fd) { WriteAll(fd, data, path); });
}

void CheckRegularFile(const std::string& path, const std::string& what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    throw NotFoundError(StrCat(what, " '", path, "' does not exist (", Errno(), ")"));
  }
  if (S_ISREG(st.st_mode)) return;
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISFIFO(st.st_mode) ? "a pipe"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a regular file";
  throw InvalidArgumentError(StrCat(what, " '", path, "' is ", kind, ", not a regular file"));
}

std::string ReadFileToString(const std::string& path, uint64_t max_size) {
  CheckRegularFile(path, "file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFoundError(StrCat("cannot open '", path, "'"));
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  if (size > max_size) {
    throw DataLossError(StrCat("'", path, "' is ", size, " bytes, more than the limit ", max_size));
  }
  in.seekg(0);
  std::string data(size, '\0');
  in.read(data.data(), static_cast<std::streamsize>(size));
  if (static_cast<uint64_t>(in.gcount()) != size) {
    throw DataLossError(StrCat("short read of '", path, "'"));
  }
  return data;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw NotFoundError(StrCat("cannot stat '", path, "'"));
  return static_cast<uint64_t>(st.st_size);
}

std::vector<std::string> ListDirectory(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    out.push_back(e.path().filename().string());
  }
  if (ec) throw NotFoundError(StrCat("cannot list directory '", dir, "': ", ec.message()));
  std::sort(out.begin(), out.end());
  return out;
}

void RemoveFileIfExists(const std::string& path) { ::unlink(path.c_str()); }

void CreateDirectories(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw AbortedError(StrCat("cannot create directory '", dir, "': ", ec.message()));
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}


uint64_t TruncateTornLastLine(const std::string& path) {
  if (!FileExists(path)) return 0;
  const uint64_t size = FileSize(path);
  if (size == 0) return 0;
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) throw AbortedError(StrCat("cannot open '", path, "': ", Errno()));
  // Scan back from the end for the last newline, a block at a time.
  uint64_t keep = 0;
  char buf[4096];
  uint64_t end = size;
  bool found = false;
  while (end > 0 && !found) {
    const uint64_t start = end > sizeof(buf) ? end - sizeof(buf) : 0;
    const ssize_t n = ::pread(fd, buf, end - start, static_cast<off_t>(start));
    if (n != static_cast<ssize_t>(end - start)) {
      ::close(fd);
      throw AbortedError(StrCat("cannot read '", path, "': ", Errno()));
    }
    for (ssize_t i = n - 1; i >= 0; --i) {
      if (buf[i] == '\n') {
        keep = start + static_cast<uint64_t>(i) + 1;
        found = true;
        break;
      }
    }
    end = start;
  }
  if (keep == size) {
    ::close(fd);
    return 0;
  }
  if (::ftruncate(fd, static_cast<off_t>(keep)) != 0) {
    const std::string err = Errno();
    ::close(fd);
    throw AbortedError(StrCat("cannot truncate '", path, "': ", err));
  }
  ::close(fd);
  return size - keep;
}

std::vector<std::string> RemoveStaleTempFiles(const std::string& dir) {
  std::vector<std::string> removed;
  for (const auto& name : ListDirectory(dir)) {
    // "<name>.tmp.<pid>.<counter>", as AtomicWriteFileWith names them.
    const size_t pos = name.rfind(".tmp.");
    if (pos == std::string::npos || pos == 0) continue;
    const std::string tail = name.substr(pos + 5);
    const size_t dot = tail.find('.');
    auto digits = [](std::string_view s) {
      return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (dot == std::string::npos || !digits(std::string_view(tail).substr(0, dot)) ||
        !digits(std::string_view(tail).substr(dot + 1))) {
      continue;
    }
    RemoveFileIfExists(JoinPath(dir, name));
    removed.push_back(name);
  }
  return removed;
}

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& name,
                             const std::string& what) {
  CreateDirectories(dir);
  const std::string path = JoinPath(dir, name);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw AbortedError(StrCat("cannot open lock file '", path, "': ", Errno()));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {0};
    const ssize_t n = ::pread(fd_, pid, sizeof(pid) - 1, 0);
    ::close(fd_);
    fd_ = -1;
    throw FailedPreconditionError(
        StrCat("'", dir, "' is in use by another ", what,
               n > 0 ? StrCat(" (pid ", std::string(Strip(std::string_view(pid, static_cast<size_t>(n)))), ")") : "",
               ": two ", what, "s on one directory would overwrite each other's files (lock file '",
               path, "')"));
  }
  const std::string mine = StrCat(::getpid(), "\n");
  if (::ftruncate(fd_, 0) == 0) {
    (void)!::pwrite(fd_, mine.data(), mine.size(), 0);
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace glossa
