#include "glossa/io/record_io.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#if defined(__x86_64__)
#endif

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "glossa/base/crc32c.h"
#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

// A byte stream over a plain or gzip file, read in large chunks into a window that callers parse
// in place: Ensure(n) makes the next n bytes contiguous at Data(), Consume(n) moves past them.
// Plain files are read with read(2) straight into the window (no stdio locking or copies).
class ByteSource {
 public:
  // zlib reads a file without the gzip magic as plain bytes; a tfrecord_gzip file must be gzip.
  static void CheckGzipMagic(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw NotFoundError(StrCat("cannot open '", path, "': ", std::strerror(errno)));
    unsigned char magic[2] = {0, 0};
    const ssize_t got = ::read(fd, magic, 2);
    ::close(fd);
    if (got != 2 || magic[0] != 0x1f || magic[1] != 0x8b) {
      throw DataLossError(StrCat("'", path, "' is not a gzip file (", got < 2 ? "shorter than"
                                 : "no gzip magic in", " its first 2 bytes); read it as ",
                                 "'tfrecord:' if it is uncompressed"));
    }
  }

  ByteSource(const std::string& path, bool gzip, size_t buffer_size)
      : path_(path), gzip_(gzip), window_(std::max<size_t>(buffer_size, 1 << 16)) {
    if (gzip) {
      CheckGzipMagic(path);
      gz_ = gzopen(path.c_str(), "rb");
      if (gz_ == nullptr)
        throw NotFoundError(StrCat("cannot open '", path, "': ", std::strerror(errno)));
      gzbuffer(gz_, static_cast<unsigned>(std::min<size_t>(window_.size(), 1u << 30)));
    } else {
      fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_ < 0) throw NotFoundError(StrCat("cannot open '", path, "': ", std::strerror(errno)));
      ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
    }
  }
  ~ByteSource() {
    if (gz_) gzclose(gz_);
    if (fd_ >= 0) ::close(fd_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  // Makes up to n bytes contiguous at Data(); returns how many there are (fewer than n only at
  // the end of the file). The window grows to hold n bytes when it must.
  size_t Ensure(size_t n) {
    if (end_ - pos_ >= n) return n;  // the common case, inlined into the framing
    return Refill(n);
  }
  const char* Data() const { return window_.data() + pos_; }
  void Consume(size_t n) {
    pos_ += n;
    offset_ += n;
  }
  // Copies up to n bytes out; returns how many (fewer only at the end).
  size_t Read(char* dst, size_t n) {
    size_t total = 0;
    while (total < n) {
      const size_t avail = Ensure(std::min(n - total, window_.size()));
      if (avail == 0) break;
      std::memcpy(dst + total, Data(), avail);
      Consume(avail);
      total += avail;
    }
    return total;
  }
  // Bytes consumed so far (in the uncompressed stream).
  uint64_t offset() const { return offset_; }

 private:
  // Ensure's slow path: moves the unread bytes to the front and reads more.
  __attribute__((noinline)) size_t Refill(size_t n) {
    if (eof_) return std::min(n, end_ - pos_);
    if (pos_ > 0) {
      std::memmove(window_.data(), window_.data() + pos_, end_ - pos_);
      end_ -= pos_;
      pos_ = 0;
    }
    if (n > window_.size()) window_.resize(n);
    while (end_ < n && !eof_) {
      const size_t got = Fill(window_.data() + end_, window_.size() - end_);
      if (got == 0) eof_ = true;
      end_ += got;
    }
    return std::min(n, end_);
  }

  // Reads what the file has, up to n bytes, into dst; 0 at its end.
  size_t Fill(char* dst, size_t n) {
    const uint64_t at = offset_ + (end_ - pos_);
    while (true) {
      if (gzip_) {
        const int r = gzread(gz_, dst, static_cast<unsigned>(std::min<size_t>(n, 1u << 30)));
        if (r < 0) {
          int errnum = 0;
          const char* msg = gzerror(gz_, &errnum);
          throw DataLossError(StrCat("'", path_, "': gzip error at offset ", at, ": ", msg));
        }
        return static_cast<size_t>(r);
      }
      const ssize_t r = ::read(fd_, dst, n);
      if (r >= 0) return static_cast<size_t>(r);
      if (errno == EINTR) continue;
      throw DataLossError(
          StrCat("'", path_, "': read error at offset ", at, ": ", std::strerror(errno)));
    }
  }

  std::string path_;
  bool gzip_;
  gzFile gz_ = nullptr;
  int fd_ = -1;
  std::vector<char> window_;
  size_t pos_ = 0, end_ = 0;  // the unread bytes are window_[pos_, end_)
  bool eof_ = false;
  uint64_t offset_ = 0;
};

uint64_t DecodeFixed64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian hosts (x86_64, aarch64)
  return v;
}
uint32_t DecodeFixed32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

class TFRecordReader : public RecordReader {
 public:
  TFRecordReader(const std::string& path, bool gzip, const RecordReaderOptions& options)
      : RecordReader(path), source_(path, gzip, options.buffer_size), options_(options) {}

  // Parses each record in place in the source's window: one copy, into `record`.
  bool Next(std::string* record) override {
    std::string_view view;
    if (!NextView(&view)) return false;
    record->assign(view.data(), view.size());
    return true;
  }

  // The record in the source's window, CRC-checked in place; consumed on the next call (a view
  // stays valid until then: the window only moves when the next record is framed).
  bool NextView(std::string_view* record) override {
    if (pending_consume_) {
      source_.Consume(pending_consume_);
      pending_consume_ = 0;
    }
    while (true) {
      if (done_) return false;
      const uint64_t start = source_.offset();
      const size_t got = source_.Ensure(12);
      if (got == 0) {
        done_ = true;
        return false;
      }
      if (got < 12) {
        return Corrupt(start, StrCat("truncated record header (", got, " of 12 bytes)"), true);
      }
      const char* header = source_.Data();
      const uint64_t length = DecodeFixed64(header);
      if (MaskCrc(Crc32cOf8Bytes(header)) != DecodeFixed32(header + 8)) {
        return Corrupt(start, "corrupt record length (CRC mismatch)", true);
      }
      if (length > options_.max_record_size) {
        return Corrupt(
            start,
            StrCat("record length ", length, " exceeds max_record_size ", options_.max_record_size),
            true);
      }
      const size_t framed = 12 + static_cast<size_t>(length) + 4;
      const size_t have = source_.Ensure(framed);
      if (have < framed) {
        return Corrupt(start,
                       StrCat("truncated record: ", have - 12, " of ", length + 4,
                              " data and CRC bytes"),
                       true);
      }
      const char* data = source_.Data() + 12;
      const uint32_t expected = DecodeFixed32(data + length);
      if (MaskCrc(Crc32c(data, length)) != expected) {
        source_.Consume(framed);
        Corrupt(start, "corrupt record data (CRC mismatch)", false);  // throws, or skips it
        continue;
      }
      *record = std::string_view(data, length);
      pending_consume_ = framed;
      return true;
    }
  }
  uint64_t offset() const override { return source_.offset() + pending_consume_; }
  int64_t num_corrupt_skipped() const override { return skipped_; }

 private:
  // Throws DataLoss, or (skip_corrupt_records) counts the record and returns true to go on;
  // `fatal` means the stream cannot be resynchronized, so the rest of the file is dropped.
  bool Corrupt(uint64_t offset, const std::string& what, bool fatal) {
    if (!options_.skip_corrupt_records) {
      throw DataLossError(StrCat("'", path_, "': ", what, " at byte offset ", offset));
    }
    ++skipped_;
    if (fatal) done_ = true;
    return fatal ? false : true;
  }

  ByteSource source_;
  RecordReaderOptions options_;
  size_t pending_consume_ = 0;  // the frame of the record last handed out
  bool done_ = false;
  int64_t skipped_ = 0;
};

class TextLineReader : public RecordReader {
 public:
  TextLineReader(const std::string& path, const RecordReaderOptions& options)
      : RecordReader(path),
        source_(path, false, options.buffer_size),
        max_line_bytes_(options.max_line_bytes) {}
  bool Next(std::string* record) override {
    record->clear();
    while (true) {
      if (pos_ == buffer_.size()) {
        buffer_.resize(1 << 16);
        const size_t got = source_.Read(buffer_.data(), buffer_.size());
        buffer_.resize(got);
        pos_ = 0;
        if (got == 0) {
          if (record->empty() && !partial_) return false;
          partial_ = false;
          return true;  // the last line without a newline
        }
      }
      const char* begin = buffer_.data() + pos_;
      const void* nl = std::memchr(begin, '\n', buffer_.size() - pos_);
      if (nl != nullptr) {
        const size_t len = static_cast<const char*>(nl) - begin;
        record->append(begin, len);
        if (record->size() > max_line_bytes_) {
          throw DataLossError(StrCat("text file '", path(), "': the line at byte offset ", offset_,
                                     " is longer than ", max_line_bytes_,
                                     " bytes (max_line_bytes; not a text file?)"));
        }
        pos_ += len + 1;
        offset_ += record->size() + 1;
        partial_ = false;
        if (!record->empty() && record->back() == '\r') record->pop_back();
        return true;
      }
      record->append(begin, buffer_.size() - pos_);
      partial_ = true;
      pos_ = buffer_.size();
      if (record->size() > max_line_bytes_) {
        throw DataLossError(StrCat("text file '", path(), "': the line at byte offset ", offset_,
                                   " is longer than ", max_line_bytes_,
                                   " bytes (max_line_bytes; not a text file?)"));
      }
    }
  }
  uint64_t offset() const override { return offset_; }

 private:
  ByteSource source_;
  std::string buffer_;
  size_t pos_ = 0;
  uint64_t offset_ = 0;
  bool partial_ = false;
  size_t max_line_bytes_;
};

}  // namespace

bool RecordReader::NextView(std::string_view* record) {
  if (!Next(&view_buffer_)) return false;
  *record = view_buffer_;
  return true;
}

std::unique_ptr<RecordReader> RecordReader::Open(std::string_view type, const std::string& path,
                                                 const RecordReaderOptions& options) {
  if (type != "tfrecord" && type != "tfrecord_gzip" && type != "text") {
    throw InvalidArgumentError(StrCat("unknown record file type '", type,
                                      "' (expected tfrecord, tfrecord_gzip or text) for '", path,
                                      "'"));
  }
  CheckRegularFile(path, "record file");
  if (type == "tfrecord") return std::make_unique<TFRecordReader>(path, false, options);
  if (type == "tfrecord_gzip") return std::make_unique<TFRecordReader>(path, true, options);
  if (type == "text") return std::make_unique<TextLineReader>(path, options);
  throw InvalidArgumentError(StrCat("unknown record file type '", type,
                                    "' (expected tfrecord, tfrecord_gzip or text) for '", path,
                                    "'"));
}

std::string TFRecordFrame(std::string_view record) {
  std::string out(12, '\0');
  const uint64_t length = record.size();
  std::memcpy(out.data(), &length, 8);
  const uint32_t length_crc = MaskCrc(Crc32c(out.data(), 8));
  std::memcpy(out.data() + 8, &length_crc, 4);
  out.append(record);
  const uint32_t data_crc = MaskCrc(Crc32c(record));
  out.append(reinterpret_cast<const char*>(&data_crc), 4);
  return out;
}

struct TFRecordWriter::Impl {
  std::string path;
  bool gzip;
  FILE* file = nullptr;
  gzFile gz = nullptr;
};

TFRecordWriter::TFRecordWriter(const std::string& path, bool gzip)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->gzip = gzip;
  if (gzip) {
    impl_->gz = gzopen(path.c_str(), "wb");
    if (!impl_->gz)
      throw NotFoundError(StrCat("cannot create '", path, "': ", std::strerror(errno)));
  } else {
    impl_->file = std::fopen(path.c_str(), "wb");
    if (!impl_->file)
      throw NotFoundError(StrCat("cannot create '", path, "': ", std::strerror(errno)));
  }
}

TFRecordWriter::~TFRecordWriter() {
  try {
    Close();
  } catch (...) {
  }
}

void TFRecordWriter::Write(std::string_view record) {
  const std::string framed = TFRecordFrame(record);
  bool ok;
  if (impl_->gzip) {
    ok = impl_->gz && gzwrite(impl_->gz, framed.data(), static_cast<unsigned>(framed.size())) ==
                          static_cast<int>(framed.size());
  } else {
    ok = impl_->file && std::fwrite(framed.data(), 1, framed.size(), impl_->file) == framed.size();
  }
  if (!ok)
    throw AbortedError(StrCat("write to '", impl_->path, "' failed: ", std::strerror(errno)));
}

void TFRecordWriter::Flush() {
  if (impl_->gzip) {
    if (impl_->gz) gzflush(impl_->gz, Z_SYNC_FLUSH);
  } else if (impl_->file && std::fflush(impl_->file) != 0) {
    throw AbortedError(StrCat("flush of '", impl_->path, "' failed: ", std::strerror(errno)));
  }
}

void TFRecordWriter::Close() {
  if (impl_->gz) {
    const int rc = gzclose(impl_->gz);
    impl_->gz = nullptr;
    if (rc != Z_OK) throw AbortedError(StrCat("close of '", impl_->path, "' failed"));
  }
  if (impl_->file) {
    const int rc = std::fclose(impl_->file);
    impl_->file = nullptr;
    if (rc != 0)
      throw AbortedError(StrCat("close of '", impl_->path, "' failed: ", std::strerror(errno)));
  }
}

}  // namespace glossa
