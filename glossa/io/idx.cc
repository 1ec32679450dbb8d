#include "glossa/io/idx.h"

#include <ATen/ATen.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

struct IdxType {
  at::ScalarType dtype;
  int size;
};

bool TypeOf(int code, IdxType* t) {
  switch (code) {
    case 0x08: *t = {at::kByte, 1}; return true;
    case 0x09: *t = {at::kChar, 1}; return true;
    case 0x0B: *t = {at::kShort, 2}; return true;
    case 0x0C: *t = {at::kInt, 4}; return true;
    case 0x0D: *t = {at::kFloat, 4}; return true;
    case 0x0E: *t = {at::kDouble, 8}; return true;
    default: return false;
  }
}

}  // namespace

std::string MaybeGunzip(const std::string& bytes, const std::string& what) {
  if (bytes.size() < 2 || static_cast<unsigned char>(bytes[0]) != 0x1f ||
      static_cast<unsigned char>(bytes[1]) != 0x8b) {
    return bytes;
  }
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) throw InternalError("zlib: inflateInit2 failed");
  std::string out;
  std::vector<char> buf(1 << 20);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    z.next_out = reinterpret_cast<Bytef*>(buf.data());
    z.avail_out = static_cast<uInt>(buf.size());
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      const uint64_t at = z.total_in;
      const std::string msg = z.msg != nullptr ? z.msg : (rc == Z_BUF_ERROR ? "truncated" : "error");
      inflateEnd(&z);
      throw DataLossError(StrCat(what, ": corrupt gzip data at compressed byte ", at, " (", msg, ")"));
    }
    out.append(buf.data(), buf.size() - z.avail_out);
    if (rc == Z_OK && z.avail_in == 0 && z.avail_out != 0) {
      const uint64_t at = z.total_in;
      inflateEnd(&z);
      throw DataLossError(StrCat(what, ": truncated gzip data: it ends at byte ", at,
                                 " before the end of the stream"));
    }
  }
  inflateEnd(&z);
  return out;
}

IdxArray ParseIdx(const std::string& raw, const std::string& what) {
  const std::string bytes = MaybeGunzip(raw, what);
  auto u8 = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  if (bytes.size() < 4) {
    throw DataLossError(StrCat(what, ": truncated IDX header (", bytes.size(), " bytes, need 4)"));
  }
  if (u8(0) != 0 || u8(1) != 0) {
    throw DataLossError(StrCat(what, ": not an IDX file (byte 0: the magic must start with two "
                               "zero bytes)"));
  }
  IdxType type;
  if (!TypeOf(u8(2), &type)) {
    static const char* kHex = "0123456789abcdef";
    throw DataLossError(StrCat(what, ": byte 2: unknown IDX type code 0x", kHex[u8(2) >> 4],
                               kHex[u8(2) & 15], " (known: 08, 09, 0b, 0c, 0d, 0e)"));
  }
  const int rank = u8(3);
  if (rank == 0) throw DataLossError(StrCat(what, ": byte 3: IDX rank 0"));
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (bytes.size() < header) {
    throw DataLossError(StrCat(what, ": truncated IDX header at byte ", bytes.size(), " (rank ",
                               rank, " needs ", header, " bytes)"));
  }
  std::vector<int64_t> dims;
  uint64_t count = 1;
  for (int d = 0; d < rank; ++d) {
    const size_t o = 4 + 4 * static_cast<size_t>(d);
    const uint32_t v = (uint32_t{u8(o)} << 24) | (uint32_t{u8(o + 1)} << 16) |
                       (uint32_t{u8(o + 2)} << 8) | uint32_t{u8(o + 3)};
    if (v > (1u << 31) - 1) throw DataLossError(StrCat(what, ": byte ", o, ": dim ", v, " too large"));
    dims.push_back(v);
    count *= v;
    if (count > (uint64_t{1} << 40)) throw DataLossError(StrCat(what, ": byte ", o, ": too many values"));
  }
  const uint64_t body = count * type.size;
  if (bytes.size() - header < body) {
    std::string shape;
    for (size_t d = 0; d < dims.size(); ++d) shape += StrCat(d ? "x" : "", dims[d]);
    throw DataLossError(StrCat(what, ": truncated IDX data: dims ", shape, " need ",
                               header + body, " bytes, the file ends at byte ", bytes.size()));
  }
  if (bytes.size() - header > body) {
    throw DataLossError(StrCat(what, ": ", bytes.size() - header - body,
                               " unexpected bytes after the IDX data at byte ", header + body));
  }
  at::Tensor t = at::empty(dims, at::TensorOptions().dtype(type.dtype));
  char* dst = static_cast<char*>(t.data_ptr());
  std::memcpy(dst, bytes.data() + header, body);
  if (type.size > 1) {  // big-endian to this machine's order
    for (uint64_t i = 0; i < count; ++i) std::reverse(dst + i * type.size, dst + (i + 1) * type.size);
  }
  return IdxArray{u8(2), t};
}

IdxArray ReadIdx(const std::string& path) { return ParseIdx(ReadFileToString(path), path); }

}  // namespace glossa
