#include "glossa/io/safetensors.h"

#include <ATen/ATen.h>
#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "glossa/base/crc32c.h"
#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

using json = nlohmann::json;

struct DTypeInfo {
  const char* name;
  at::ScalarType stored;  // the ATen type holding the file's bytes
  at::ScalarType result;  // what the reader returns
  size_t size;
};

const std::vector<DTypeInfo>& DTypes() {
  static const std::vector<DTypeInfo> kTypes = {
      {"BOOL", at::kBool, at::kBool, 1},  {"U8", at::kByte, at::kByte, 1},
      {"I8", at::kChar, at::kChar, 1},    {"I16", at::kShort, at::kShort, 2},
      {"U16", at::kShort, at::kInt, 2},   {"I32", at::kInt, at::kInt, 4},
      {"U32", at::kInt, at::kLong, 4},    {"I64", at::kLong, at::kLong, 8},
      {"F16", at::kHalf, at::kHalf, 2},   {"BF16", at::kBFloat16, at::kBFloat16, 2},
      {"F32", at::kFloat, at::kFloat, 4}, {"F64", at::kDouble, at::kDouble, 8},
  };
  return kTypes;
}

const DTypeInfo& InfoForScalarType(at::ScalarType t, const std::string& name) {
  for (const auto& d : DTypes()) {
    if (d.stored == t && d.result == t) return d;
  }
  throw InvalidArgumentError(
      StrCat("safetensors cannot store tensor '", name, "' of type ", c10::toString(t)));
}

constexpr uint64_t kMaxHeaderSize = 100 << 20;

// The per-tensor CRC32C checksums Glossa writes into __metadata__ (a JSON object of name -> hex),
// verified on load so that flipped bits are DataLoss, not silently wrong weights.
constexpr const char* kChecksumKey = "glossa.crc32c";

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

// The CRC32C of the tensor entries (name, dtype, shape, offsets; __metadata__ excluded), so that a
// header edit that keeps the byte counts (a swapped dtype or shape) is caught as the data CRCs
// cannot. Entries in the header's key order, which nlohmann's object keeps sorted.
constexpr const char* kHeaderChecksumKey = "glossa.header_crc32c";
std::string HeaderChecksum(const json& header) {
  std::string text;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    text += it.key();
    text += '\0';
    text += it.value().at("dtype").dump() + it.value().at("shape").dump() +
            it.value().at("data_offsets").dump();
    text += '\n';
  }
  return Hex32(Crc32c(text.data(), text.size()));
}

// 8-bit floats (OFP8), widened to float32: E4M3 ("fn": no infinities, S.1111.111 is NaN) and
// E5M2 (IEEE-like: infinities and NaNs at exponent 31).
float Fp8ToFloat(uint8_t b, bool e4m3) {
  const bool neg = (b & 0x80) != 0;
  const int exp_bits = e4m3 ? 4 : 5, man_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const int exp = (b >> man_bits) & ((1 << exp_bits) - 1);
  const int man = b & ((1 << man_bits) - 1);
  float v;
  if (e4m3 && exp == 15 && man == 7) return std::numeric_limits<float>::quiet_NaN();
  if (!e4m3 && exp == 31) {
    if (man != 0) return std::numeric_limits<float>::quiet_NaN();
    v = std::numeric_limits<float>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), 1 - bias - man_bits);
  } else {
    v = std::ldexp(static_cast<float>((1 << man_bits) + man), exp - bias - man_bits);
  }
  return neg ? -v : v;
}

}  // namespace

void SaveSafetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                     const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  json checksums = json::object();
  std::vector<at::Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") throw InvalidArgumentError("'__metadata__' cannot name a tensor");
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const auto& info = InfoForScalarType(c.scalar_type(), name);
    const uint64_t bytes = static_cast<uint64_t>(c.numel()) * info.size;
    header[name] = {{"dtype", info.name},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    checksums[name] = Hex32(Crc32c(c.data_ptr(), c.nbytes()));
    contiguous.push_back(c);
  }
  std::map<std::string, std::string> meta = metadata;
  meta[kChecksumKey] = checksums.dump();
  meta[kHeaderChecksumKey] = HeaderChecksum(header);
  header["__metadata__"] = meta;
  std::string header_text = header.dump();
  // Pad the header with spaces so the data starts 8-byte aligned (allowed by the format).
  while ((8 + header_text.size()) % 8 != 0) header_text.push_back(' ');
  const uint64_t n = header_text.size();
  AtomicWriteFileWith(path, [&](int fd) {
    WriteAll(fd, std::string_view(reinterpret_cast<const char*>(&n), 8), path);
    WriteAll(fd, header_text, path);
    for (const auto& c : contiguous) {
      WriteAll(fd, std::string_view(static_cast<const char*>(c.data_ptr()), c.nbytes()), path);
    }
  });
}

namespace {

// One tensor's bytes in the data section.
struct Span {
  uint64_t begin, end;
  std::string name;
};

// The state of one LoadSafetensors call, shared by its steps.
struct SafetensorsLoad {
  explicit SafetensorsLoad(const std::string& p) : path(p) {}
  // The error for a damaged file.
  DataLossError fail(const std::string& why) const {
    return DataLossError(StrCat("safetensors file '", path, "': ", why));
  }

  const std::string& path;
  uint64_t file_size = 0;
  std::string data;            // the whole file
  uint64_t n = 0;              // the header's length
  json header;
  uint64_t data_size = 0;      // the bytes after the header
  const char* base = nullptr;  // the data section, in data
  std::vector<Span> spans;     // every tensor's bytes, in header order
  SafetensorsContents out;
};

// Reads the file and parses its header, checking the header length against the file.
void ReadHeader(SafetensorsLoad& ld) {
  const uint64_t file_size = FileSize(ld.path);
  ld.file_size = file_size;
  if (file_size < 8)
    throw ld.fail(StrCat("file is ", file_size, " bytes, shorter than the 8-byte header length"));
  ld.data = ReadFileToString(ld.path);
  const std::string& data = ld.data;
  uint64_t n;
  std::memcpy(&n, data.data(), 8);
  ld.n = n;
  if (n > kMaxHeaderSize)
    throw ld.fail(StrCat("header length ", n, " exceeds the limit ", kMaxHeaderSize));
  if (n > file_size - 8)
    throw ld.fail(StrCat("header length ", n, " goes beyond the file (", file_size, " bytes)"));
  try {
    ld.header = json::parse(data.begin() + 8, data.begin() + 8 + static_cast<int64_t>(n));
  } catch (const json::exception& e) {
    throw ld.fail(StrCat("header is not valid JSON: ", e.what()));
  }
  if (!ld.header.is_object()) throw ld.fail("header is not a JSON object");
}

// The header's __metadata__ entry e into ld.out.metadata (string values only).
void ReadMetadata(SafetensorsLoad& ld, const json& e) {
  if (!e.is_object()) throw ld.fail("__metadata__ is not an object");
  for (auto m = e.begin(); m != e.end(); ++m) {
    if (!m.value().is_string())
      throw ld.fail(StrCat("__metadata__ '", m.key(), "' is not a string"));
    ld.out.metadata[m.key()] = m.value().get<std::string>();
  }
}

// The type of tensor `name`'s dtype; a type Glossa cannot represent is Unimplemented.
const DTypeInfo& FindDType(const std::string& path, const std::string& name,
                           const std::string& dtype) {
  static const DTypeInfo kFp8[] = {{"F8_E4M3", at::kByte, at::kFloat, 1},
                                   {"F8_E5M2", at::kByte, at::kFloat, 1}};
  const DTypeInfo* info = nullptr;
  for (const auto& d : DTypes()) {
    if (dtype == d.name) info = &d;
  }
  for (const auto& d : kFp8) {
    if (dtype == d.name) info = &d;
  }
  if (info == nullptr) {
    // A well-formed file with a type of the format we cannot represent (F8_E8M0, F4, ...):
    // not corrupt, just unsupported.
    throw UnimplementedError(StrCat("safetensors file '", path, "': tensor '", name,
                                    "' has dtype '", dtype,
                                    "', which Glossa cannot load (supported: BOOL, U8, I8, I16, "
                                    "U16, I32, U32, I64, F16, BF16, F32, F64, F8_E4M3, F8_E5M2)"));
  }
  return *info;
}

// Tensor `name`'s shape (each dimension at most 2^40, as is the element count, set in numel).
std::vector<int64_t> ReadShape(const SafetensorsLoad& ld, const std::string& name,
                               const json& e, uint64_t& numel) {
  std::vector<int64_t> shape;
  numel = 1;
  for (const auto& d : e["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) {
      throw ld.fail(StrCat("tensor '", name, "' has an invalid shape"));
    }
    shape.push_back(d.get<int64_t>());
    numel *= d.get<uint64_t>();
    if (numel > (uint64_t{1} << 40)) throw ld.fail(StrCat("tensor '", name, "' is too large"));
  }
  return shape;
}

// Tensor `name`'s data_offsets, checked to lie in the data and to hold numel elements of info.
Span ReadSpan(const SafetensorsLoad& ld, const std::string& name, const json& e,
              const std::string& dtype, const DTypeInfo& info, uint64_t numel) {
  for (const auto& o : e["data_offsets"]) {
    if (!o.is_number_unsigned())
      throw ld.fail(StrCat("tensor '", name, "' has invalid data_offsets"));
  }
  const uint64_t begin = e["data_offsets"][0].get<uint64_t>(),
                 end = e["data_offsets"][1].get<uint64_t>();
  if (begin > end || end > ld.data_size) {
    throw ld.fail(StrCat("tensor '", name, "' data_offsets [", begin, ", ", end,
                         "] are outside the data (", ld.data_size, " bytes)"));
  }
  if (end - begin != numel * info.size) {
    throw ld.fail(StrCat("tensor '", name, "' has ", end - begin, " bytes, but dtype ", dtype,
                         " and shape need ", numel * info.size));
  }
  return {begin, end, name};
}

// The tensor of span's bytes, widened to what the reader returns (U16, U32, F8_*).
at::Tensor ReadTensorData(const SafetensorsLoad& ld, const Span& span,
                          const std::vector<int64_t>& shape, const DTypeInfo& info,
                          const std::string& dtype) {
  const uint64_t begin = span.begin, end = span.end;
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(info.stored));
  if (end > begin) std::memcpy(t.data_ptr(), ld.base + begin, end - begin);
  if (dtype == "U16") t = t.to(at::kInt).bitwise_and(static_cast<int64_t>(0xFFFF));
  if (dtype == "U32") t = t.to(at::kLong).bitwise_and(static_cast<int64_t>(0xFFFFFFFFLL));
  if (dtype == "F8_E4M3" || dtype == "F8_E5M2") {
    at::Tensor widened = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
    const uint8_t* src = t.data_ptr<uint8_t>();
    float* dst = widened.data_ptr<float>();
    for (int64_t i = 0; i < t.numel(); ++i) dst[i] = Fp8ToFloat(src[i], dtype == "F8_E4M3");
    t = widened;
  }
  return t;
}

// The header's tensor entry `name`: checked, recorded in ld.spans and loaded into ld.out.
void ReadTensor(SafetensorsLoad& ld, const std::string& name, const json& e) {
  if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
      !e.contains("data_offsets") || !e["dtype"].is_string() || !e["shape"].is_array() ||
      !e["data_offsets"].is_array() || e["data_offsets"].size() != 2) {
    throw ld.fail(StrCat("tensor '", name, "' needs dtype, shape and data_offsets [begin, end]"));
  }
  const std::string dtype = e["dtype"].get<std::string>();
  const DTypeInfo& info = FindDType(ld.path, name, dtype);
  uint64_t numel = 1;
  const std::vector<int64_t> shape = ReadShape(ld, name, e, numel);
  const Span span = ReadSpan(ld, name, e, dtype, info, numel);
  ld.spans.push_back(span);
  ld.out.tensors[name] = ReadTensorData(ld, span, shape, info, dtype);
}

// Sorts ld.spans by offset and checks that they tile the data section: no overlaps, gaps or
// trailing bytes.
void CheckSpansTileData(SafetensorsLoad& ld) {
  std::sort(ld.spans.begin(), ld.spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  uint64_t expected = 0;
  for (const auto& s : ld.spans) {
    if (s.begin < expected)
      throw ld.fail(StrCat("tensor '", s.name, "' overlaps the previous tensor's data"));
    if (s.begin > expected)
      throw ld.fail(StrCat("unused bytes before tensor '", s.name, "' at data offset ", expected));
    expected = s.end;
  }
  if (expected != ld.data_size) {
    throw ld.fail(StrCat(ld.data_size - expected, " trailing bytes after the last tensor"));
  }
}

// Checks every tensor's bytes against its CRC32C in `sums` (the kChecksumKey metadata).
void VerifyDataChecksums(const SafetensorsLoad& ld, const std::string& sums) {
  json parsed;
  try {
    parsed = json::parse(sums);
  } catch (const json::exception&) {
    throw ld.fail(StrCat("__metadata__ '", kChecksumKey, "' is not a JSON object"));
  }
  if (!parsed.is_object())
    throw ld.fail(StrCat("__metadata__ '", kChecksumKey, "' is not an object"));
  for (const auto& s : ld.spans) {
    if (!parsed.contains(s.name) || !parsed[s.name].is_string()) {
      throw ld.fail(StrCat("tensor '", s.name, "' has no checksum in '", kChecksumKey, "'"));
    }
    const std::string want = parsed[s.name].get<std::string>();
    const std::string got = Hex32(Crc32c(ld.base + s.begin, s.end - s.begin));
    if (want != got) {
      throw ld.fail(StrCat("tensor '", s.name, "' fails its CRC32C checksum (stored ", want,
                           ", computed ", got, " over data bytes [", s.begin, ", ", s.end,
                           ")): the file is corrupt"));
    }
  }
}

// A file without glossa.crc32c: refused (its bytes cannot be verified) unless the caller trusts it.
void CheckUncheckedFileMayLoad(const SafetensorsLoad& ld, UncheckedFiles unchecked) {
  const auto& metadata = ld.out.metadata;
  const auto version = metadata.find("format_version");
  if (version != metadata.end() && version->second != "1") {
    throw ld.fail(StrCat("written by Glossa (format_version ", version->second,
                         ") but without its '", kChecksumKey,
                         "' checksums: the header was altered"));
  }
  const std::string what = version != metadata.end()
                               ? "an early Glossa checkpoint (format_version 1)"
                               : "not written by Glossa";
  if (unchecked == UncheckedFiles::kRefuse) {
    throw ld.fail(StrCat("carries no checksums (", what,
                         ", or its checksums were edited away), so its bytes cannot be verified; "
                         "if you trust it, `glossa adopt_checkpoint --checkpoint=<its prefix>` "
                         "rewrites it with checksums"));
  }
  LOG(WARNING) << "safetensors file '" << ld.path << "' carries no checksums (" << what
               << "): loaded as trusted, its data is not verified";
}

// Verifies Glossa's checksums (data and header) and takes them out of the metadata.
void VerifyChecksums(SafetensorsLoad& ld, UncheckedFiles unchecked) {
  auto& metadata = ld.out.metadata;
  // Checksums: Glossa writes them into every file; a key of Glossa's that this version does not
  // know (e.g. a damaged "glossa.crc32c") must not switch the check off, nor may a claim to be
  // version 1 (before the checksums) in a file that carries version 2's keys.
  const auto version = metadata.find("format_version");
  for (const auto& [key, value] : metadata) {
    if (key.rfind("glossa.", 0) != 0) continue;
    if (key != kChecksumKey && key != kHeaderChecksumKey) {
      throw ld.fail(StrCat("__metadata__ has the unknown key '", key,
                           "' (Glossa's checksums are '", kChecksumKey,
                           "'): the header is damaged or from a newer Glossa"));
    }
    if (version != metadata.end() && version->second == "1") {
      throw ld.fail(StrCat("claims format_version 1 (before checksums) but carries '", key,
                           "' of version 2: the header was altered"));
    }
  }
  auto sums = metadata.find(kChecksumKey);
  auto h = metadata.find(kHeaderChecksumKey);
  if (sums == metadata.end()) {
    if (h != metadata.end() && version == metadata.end()) {
      throw ld.fail(StrCat("carries '", kHeaderChecksumKey, "' but not '", kChecksumKey,
                           "': the header was altered"));
    }
    CheckUncheckedFileMayLoad(ld, unchecked);
    return;
  }
  VerifyDataChecksums(ld, sums->second);
  metadata.erase(sums);
  // Files written before the header checksum existed have none; those written since must match.
  const bool must_have_header_sum = version != metadata.end() && !version->second.empty();
  if (h == metadata.end() && must_have_header_sum) {
    throw ld.fail(StrCat("written by Glossa (format_version ", version->second,
                         ") but without its '", kHeaderChecksumKey,
                         "' checksum: the header was altered"));
  }
  if (h != metadata.end()) {
    const std::string got = HeaderChecksum(ld.header);
    if (h->second != got) {
      throw ld.fail(StrCat("the header's tensor entries fail their CRC32C checksum (stored ",
                           h->second, ", computed ", got,
                           "): a dtype, shape or offset was altered"));
    }
    metadata.erase(h);
  }
}

}  // namespace

SafetensorsContents LoadSafetensors(const std::string& path, UncheckedFiles unchecked) {
  SafetensorsLoad ld(path);
  ReadHeader(ld);
  ld.data_size = ld.file_size - 8 - ld.n;
  ld.base = ld.data.data() + 8 + ld.n;
  for (auto it = ld.header.begin(); it != ld.header.end(); ++it) {
    if (it.key() == "__metadata__") {
      ReadMetadata(ld, it.value());
    } else {
      ReadTensor(ld, it.key(), it.value());
    }
  }
  CheckSpansTileData(ld);
  VerifyChecksums(ld, unchecked);
  return std::move(ld.out);
}

std::vector<std::string> SaveSafetensorsSharded(const std::string& stem,
                                                const std::map<std::string, at::Tensor>& tensors,
                                                const std::map<std::string, std::string>& metadata,
                                                uint64_t max_shard_bytes) {
  uint64_t total = 0;
  for (const auto& [k, t] : tensors) total += t.nbytes();
  if (total <= max_shard_bytes) {
    SaveSafetensors(stem + ".safetensors", tensors, metadata);
    return {stem + ".safetensors"};
  }
  std::vector<std::map<std::string, at::Tensor>> shards(1);
  uint64_t in_shard = 0;
  for (const auto& [k, t] : tensors) {
    if (in_shard > 0 && in_shard + t.nbytes() > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back()[k] = t;
    in_shard += t.nbytes();
  }
  std::vector<std::string> files;
  json weight_map = json::object();
  char suffix[64];
  for (size_t i = 0; i < shards.size(); ++i) {
    std::snprintf(suffix, sizeof(suffix), "-%05zu-of-%05zu.safetensors", i, shards.size());
    const std::string file = stem + suffix;
    SaveSafetensors(file, shards[i], metadata);
    const std::string base = file.substr(file.rfind('/') + 1);
    for (const auto& [k, t] : shards[i]) weight_map[k] = base;
    files.push_back(file);
  }
  json index = {{"metadata", metadata}, {"weight_map", weight_map}};
  index["metadata"]["total_size"] = std::to_string(total);
  AtomicWriteFile(stem + ".safetensors.index.json", index.dump(1));
  files.push_back(stem + ".safetensors.index.json");
  return files;
}

SafetensorsContents LoadSafetensorsSharded(const std::string& stem, UncheckedFiles unchecked) {
  if (FileExists(stem + ".safetensors")) return LoadSafetensors(stem + ".safetensors", unchecked);
  const std::string index_path = stem + ".safetensors.index.json";
  if (!FileExists(index_path)) {
    throw NotFoundError(StrCat("no checkpoint at '", stem, "' (neither ", stem, ".safetensors nor ",
                               index_path, ")"));
  }
  json index;
  try {
    index = json::parse(ReadFileToString(index_path, 1 << 28));
  } catch (const json::exception& e) {
    throw DataLossError(
        StrCat("safetensors index '", index_path, "' is not valid JSON: ", e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw DataLossError(StrCat("safetensors index '", index_path, "' has no weight_map object"));
  }
  const std::string dir = stem.substr(0, stem.rfind('/') + 1);
  std::map<std::string, std::vector<std::string>> by_file;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string() || it.value().get<std::string>().find('/') != std::string::npos) {
      throw DataLossError(
          StrCat("safetensors index '", index_path, "': bad shard for '", it.key(), "'"));
    }
    by_file[it.value().get<std::string>()].push_back(it.key());
  }
  SafetensorsContents out;
  for (const auto& [file, names] : by_file) {
    SafetensorsContents shard = LoadSafetensors(dir + file, unchecked);
    for (const auto& n : names) {
      auto t = shard.tensors.find(n);
      if (t == shard.tensors.end()) {
        throw DataLossError(StrCat("safetensors index '", index_path, "' maps '", n, "' to ", file,
                                   ", which does not hold it"));
      }
      out.tensors[n] = t->second;
    }
    if (out.metadata.empty()) out.metadata = shard.metadata;
  }
  return out;
}

std::vector<std::string> SafetensorsFiles(const std::string& stem) {
  const std::string dir = stem.substr(0, stem.rfind('/') + 1);
  const std::string base = stem.substr(stem.rfind('/') + 1);
  std::vector<std::string> out;
  for (const auto& name : ListDirectory(dir.empty() ? "." : dir)) {
    if (name == base + ".safetensors" || name == base + ".safetensors.index.json" ||
        (name.rfind(base + "-", 0) == 0 && name.size() > base.size() + 12 &&
         name.compare(name.size() - 12, 12, ".safetensors") == 0)) {
      out.push_back(dir + name);
    }
  }
  return out;
}

}  // namespace glossa
