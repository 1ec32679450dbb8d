// IDX files, the MNIST format (yann.lecun.com/exdb/mnist): two zero bytes, a type code (0x08
// unsigned byte, 0x09 signed byte, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64), the rank,
// the dims as big-endian int32s, then the values, big-endian, row-major. gzip-compressed files
// (Debian's dataset-fashion-mnist ships *.gz) are recognised by their magic and inflated.
//
//   IdxArray images = ReadIdx("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
//   images.data.sizes();   // [60000, 28, 28], uint8
//
// Every malformed input is DataLoss naming the file and the byte offset: a bad magic or type code,
// a truncated header or body, trailing bytes, a corrupt gzip stream.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace glossa {

struct IdxArray {
  int type_code = 0;
  at::Tensor data;  // uint8, int8, int16, int32, float32 or float64, native byte order
};

IdxArray ReadIdx(const std::string& path);
// `bytes` is the file's contents (gzip or not); `what` names it in errors.
IdxArray ParseIdx(const std::string& bytes, const std::string& what);
// Inflates gzip data (DataLoss naming `what` when corrupt or truncated); other data is returned
// as it is.
std::string MaybeGunzip(const std::string& bytes, const std::string& what);

}  // namespace glossa
