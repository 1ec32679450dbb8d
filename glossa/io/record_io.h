// Record files: TFRecord (plain or GZIP), one-record-per-line text, and their writers.
//
// TFRecord framing: uint64 length (little endian), masked CRC32C of the length, the data, masked
// CRC32C of the data. Every CRC is checked; a corrupt or truncated record is DataLoss naming the
// file and byte offset, unless `skip_corrupt_records` is set, in which case records with a bad data
// CRC are skipped and counted (a bad length CRC loses the rest of the file, also counted).
//
//   auto reader = RecordReader::Open("tfrecord", "/data/train-00000-of-00010");
//   std::string record;
//   while (reader->Next(&record)) { ... }
//   std::string_view view;                       // or without a copy, valid until the next call:
//   while (reader->NextView(&view)) { ... }
//   TFRecordWriter w("/tmp/out.tfrecord");  w.Write("payload");  w.Close();
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace glossa {

struct RecordReaderOptions {
  bool skip_corrupt_records = false;
  // Larger records are DataLoss (guards against a corrupt length that passed its CRC).
  uint64_t max_record_size = uint64_t{1} << 31;
  // Text files: a longer line is DataLoss naming the file and offset (a line is one example).
  size_t max_line_bytes = size_t{1} << 20;
  size_t buffer_size = 1 << 20;
};

class RecordReader {
 public:
  virtual ~RecordReader() = default;
  // Reads the next record into `record`; false at the end of the file.
  virtual bool Next(std::string* record) = 0;
  // The next record without copying it: `record` views the reader's buffer and stays valid until
  // the next call on this reader. TFRecord files hand out their read window (each record's CRC
  // checked in place); other readers copy into a buffer of their own.
  virtual bool NextView(std::string_view* record);
  // Byte offset (in the uncompressed stream) where the next record starts.
  virtual uint64_t offset() const = 0;
  // Records skipped as corrupt (skip_corrupt_records).
  virtual int64_t num_corrupt_skipped() const { return 0; }
  const std::string& path() const { return path_; }

  // type: "tfrecord", "tfrecord_gzip" or "text". NotFound when the file cannot be opened,
  // InvalidArgument for an unknown type; DataLoss for a tfrecord_gzip file that is not gzip.
  static std::unique_ptr<RecordReader> Open(std::string_view type, const std::string& path,
                                            const RecordReaderOptions& options = {});

 protected:
  explicit RecordReader(std::string path) : path_(std::move(path)) {}
  std::string path_;

 private:
  std::string view_buffer_;  // NextView's copy for readers without a window of their own
};

class TFRecordWriter {
 public:
  // Creates (truncates) `path`; gzip writes tfrecord_gzip. NotFound/Aborted on I/O errors.
  explicit TFRecordWriter(const std::string& path, bool gzip = false);
  ~TFRecordWriter();
  TFRecordWriter(const TFRecordWriter&) = delete;
  TFRecordWriter& operator=(const TFRecordWriter&) = delete;
  void Write(std::string_view record);
  void Flush();
  void Close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The 12-byte header and 4-byte footer framing one record (for tests and tools).
std::string TFRecordFrame(std::string_view record);

}  // namespace glossa
