#include "glossa/io/safetensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

namespace fs = std::filesystem;

std::string Dir() {
  fs::path dir = ::glossa::testing::TestRoot() / "st";
  fs::create_directories(dir);
  return dir.string();
}

std::map<std::string, at::Tensor> EveryDtype() {
  at::Tensor base = at::arange(-3, 3, at::kDouble).view({2, 3});
  return {{"f32", base.to(at::kFloat)},     {"f64", base},
          {"bf16", base.to(at::kBFloat16)}, {"f16", base.to(at::kHalf)},
          {"i64", base.to(at::kLong)},      {"i32", base.to(at::kInt)},
          {"u8", (base + 3).to(at::kByte)}, {"bool", base > 0},
          {"scalar", at::full({}, 7.5)},    {"empty", at::zeros({0, 4})},
          {"lm/emb/w", at::randn({5, 2})}};
}

void ExpectSame(const std::map<std::string, at::Tensor>& a,
                const std::map<std::string, at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, t] : a) {
    ASSERT_TRUE(b.count(k)) << k;
    EXPECT_EQ(b.at(k).scalar_type(), t.scalar_type()) << k;
    EXPECT_TRUE(at::equal(b.at(k), t)) << k;
  }
}

TEST(Safetensors, EveryDtypeRoundTripsWithMetadata) {
  const std::string path = Dir() + "/all.safetensors";
  const auto tensors = EveryDtype();
  SaveSafetensors(path, tensors, {{"format_version", "2"}, {"input_position", "42"}});
  SafetensorsContents c = LoadSafetensors(path);
  ExpectSame(tensors, c.tensors);
  EXPECT_EQ(c.metadata.at("format_version"), "2");
  EXPECT_EQ(c.metadata.at("input_position"), "42");
}

TEST(Safetensors, ShardedRoundTripWithIndex) {
  const std::string stem = Dir() + "/ckpt-00000100";
  std::map<std::string, at::Tensor> t;
  for (int i = 0; i < 10; ++i) t["v" + std::to_string(i)] = at::randn({100});
  auto files = SaveSafetensorsSharded(stem, t, {{"format_version", "2"}}, 1000);
  EXPECT_GT(files.size(), 2u);
  EXPECT_EQ(files.back(), stem + ".safetensors.index.json");
  EXPECT_TRUE(
      FileExists(stem + "-00000-of-0000" + std::to_string(files.size() - 1) + ".safetensors"));
  SafetensorsContents c = LoadSafetensorsSharded(stem);
  ExpectSame(t, c.tensors);
  EXPECT_EQ(c.metadata.at("format_version"), "2");
  EXPECT_EQ(SafetensorsFiles(stem).size(), files.size());
  auto single = SaveSafetensorsSharded(Dir() + "/small", {{"a", at::ones({2})}}, {}, 1 << 20);
  EXPECT_EQ(single, std::vector<std::string>{Dir() + "/small.safetensors"});
  EXPECT_THROW(LoadSafetensorsSharded(Dir() + "/nothing"), NotFoundError);
}

std::string Header(const std::string& json) {
  uint64_t n = json.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + json;
}

void ExpectDataLoss(const std::string& bytes, const std::string& substring) {
  const std::string path = Dir() + "/bad.safetensors";
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_ERROR_CONTAINS(LoadSafetensors(path), DataLossError, "safetensors file '" + path + "': ");
  EXPECT_ERROR_CONTAINS(LoadSafetensors(path), DataLossError, substring);
}

TEST(Safetensors, RejectsMalformedFiles) {
  const std::string four(4, '\0');
  ExpectDataLoss("abc", "shorter than the 8-byte header length");
  uint64_t huge = 1000;
  ExpectDataLoss(std::string(reinterpret_cast<const char*>(&huge), 8) + "{}",
                 "header length 1000 goes beyond the file");
  ExpectDataLoss(Header("{not json"), "header is not valid JSON");
  ExpectDataLoss(Header("[1, 2]"), "header is not a JSON object");
  ExpectDataLoss(Header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}})") + four,
                 "outside the data");
  ExpectDataLoss(Header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})") + four,
                 "tensor 'a' has 4 bytes, but dtype F32 and shape need 8");
  ExpectDataLoss(Header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                            "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})") +
                     four + four,
                 "overlaps");
  ExpectDataLoss(
      Header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})") + four + "xx",
      "2 trailing bytes after the last tensor");
  ExpectDataLoss(Header(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})") + four,
                 "invalid shape");
  ExpectDataLoss(Header(R"({"a": {"dtype": "F32"}})"), "needs dtype, shape and data_offsets");
  ExpectDataLoss(Header(R"({"__metadata__": {"k": 1}})"), "__metadata__ 'k' is not a string");
}

TEST(Safetensors, UnsupportedDtypesAreUnimplementedNotDataLoss) {
  const std::string path = Dir() + "/e8m0.safetensors";
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      << Header(R"({"a": {"dtype": "F8_E8M0", "shape": [4], "data_offsets": [0, 4]}})")
      << std::string(4, '\0');
  EXPECT_ERROR_CONTAINS(LoadSafetensors(path), UnimplementedError,
                        "tensor 'a' has dtype 'F8_E8M0', which Glossa cannot load");
}

TEST(Safetensors, Fp8TensorsLoadWidenedToFloat32) {
  // OFP8 encodings and their values (the OCP 8-bit floating point specification's tables): E4M3
  // has no infinities and a single NaN pattern per sign; E5M2 follows IEEE 754.
  const std::vector<std::pair<uint8_t, float>> e4m3 = {
      {0x00, 0.0f},   {0x38, 1.0f},          {0xB8, -1.0f},         {0x7E, 448.0f},
      {0x01, 0x1p-9f}, {0x08, 0x1p-6f},       {0x3C, 1.5f},          {0x40, 2.0f}};
  const std::vector<std::pair<uint8_t, float>> e5m2 = {
      {0x00, 0.0f},    {0x3C, 1.0f},    {0xBC, -1.0f},  {0x7B, 57344.0f},
      {0x01, 0x1p-16f}, {0x04, 0x1p-14f}, {0x3E, 1.5f},   {0x7C, INFINITY}};
  for (const auto& [dtype, table] : {std::pair{std::string("F8_E4M3"), e4m3},
                                     std::pair{std::string("F8_E5M2"), e5m2}}) {
    SCOPED_TRACE(dtype);
    std::string bytes;
    for (const auto& [b, v] : table) bytes.push_back(static_cast<char>(b));
    bytes.push_back(static_cast<char>(0x7F));  // NaN in both
    const std::string path = Dir() + "/" + dtype + ".safetensors";
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        << Header(StrCat(R"({"a": {"dtype": ")", dtype, R"(", "shape": [)", bytes.size(),
                         R"(], "data_offsets": [0, )", bytes.size(), "]}}"))
        << bytes;
    const at::Tensor t = LoadSafetensors(path, UncheckedFiles::kAllow).tensors.at("a");
    ASSERT_EQ(t.scalar_type(), at::kFloat);
    for (size_t i = 0; i < table.size(); ++i) {
      EXPECT_EQ(t[static_cast<int64_t>(i)].item<float>(), table[i].second) << i;
    }
    EXPECT_TRUE(std::isnan(t[static_cast<int64_t>(table.size())].item<float>()));
  }
}

TEST(Safetensors, FlippedBitsFailTheChecksum) {
  const std::string path = Dir() + "/flip.safetensors";
  SaveSafetensors(path, {{"a", at::arange(100, at::kFloat)}, {"b", at::ones({3})}});
  std::string data = ReadFileToString(path);
  uint64_t n;
  std::memcpy(&n, data.data(), 8);
  data[8 + n + 4 * 10 + 1] ^= 0x10;  // a bit of a[10]
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
  EXPECT_ERROR_CONTAINS(LoadSafetensors(path), DataLossError,
                        "tensor 'a' fails its CRC32C checksum");
  // The checksums stay out of the metadata callers see.
  SaveSafetensors(path, {{"a", at::ones({2})}}, {{"k", "v"}});
  EXPECT_EQ(LoadSafetensors(path).metadata, (std::map<std::string, std::string>{{"k", "v"}}));
}

// Rewrites the header of a safetensors file with `edit` applied to its text (same length kept by
// the edits below, so the data offsets stay valid).
void EditHeader(const std::string& path, const std::function<void(std::string&)>& edit) {
  std::string data = ReadFileToString(path);
  uint64_t n;
  std::memcpy(&n, data.data(), 8);
  std::string header = data.substr(8, n);
  edit(header);
  ASSERT_EQ(header.size(), n);
  data.replace(8, n, header);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

TEST(Safetensors, TheChecksumCannotBeSwitchedOffByEditingTheHeader) {
  const std::string path = Dir() + "/keys.safetensors";
  auto save = [&] {
    SaveSafetensors(path, {{"a", at::arange(100, at::kFloat)}}, {{"format_version", "2"}});
  };
  // One bit in the key's name: an unknown Glossa key, not a file without checksums.
  save();
  EditHeader(path, [](std::string& h) { h.replace(h.find("glossa.crc32c"), 13, "glossa.crc32b"); });
  EXPECT_ERROR_CONTAINS(LoadSafetensors(path), DataLossError, "unknown key 'glossa.crc32b'");
  // A file that says Glossa wrote it (format_version) must carry the checksums.
  save();
  EditHeader(path, [](std::string& h) { h.replace(h.find("glossa.crc32c"), 13, "other.crc32cx"); });
  EXPECT_ERROR_CONTAINS(LoadSafetensors(path), DataLossError,
                        "written by Glossa (format_version 2) but without its 'glossa.crc32c'");
  // A dtype swap keeps every byte count and every data CRC: the header checksum catches it.
  save();
  EditHeader(path, [](std::string& h) { h.replace(h.find("\"F32\""), 5, "\"I32\""); });
  EXPECT_ERROR_CONTAINS(LoadSafetensors(path), DataLossError,
                        "the header's tensor entries fail their CRC32C checksum");
  // A shape swap likewise.
  SaveSafetensors(path, {{"a", at::zeros({2, 3})}});
  EditHeader(path, [](std::string& h) { h.replace(h.find("[2,3]"), 5, "[3,2]"); });
  EXPECT_ERROR_CONTAINS(LoadSafetensors(path), DataLossError, "a dtype, shape or offset");
}

// Issue 47 item 4: claiming version 1 (before checksums) and moving the checksums aside must not
// switch the check off: such a file is refused like any unchecked one, and a version-1 claim
// beside version 2's keys is DataLoss even where unchecked files are allowed.
TEST(Safetensors, ADowngradeToVersionOneDoesNotSwitchTheChecksumsOff) {
  const std::string path = Dir() + "/downgrade.safetensors";
  auto save_corrupt = [&] {
    SaveSafetensors(path, {{"a", at::arange(100, at::kFloat)}}, {{"format_version", "2"}});
    std::string data = ReadFileToString(path);
    uint64_t n;
    std::memcpy(&n, data.data(), 8);
    data[8 + n + 4 * 10 + 1] ^= 0x10;  // a bit of a[10]
    std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
    EditHeader(path, [](std::string& h) {
      h.replace(h.find("\"format_version\":\"2\""), 20, "\"format_version\":\"1\"");
    });
  };
  // The version alone: version 2's keys under a version-1 claim.
  save_corrupt();
  for (auto unchecked : {UncheckedFiles::kRefuse, UncheckedFiles::kAllow}) {
    EXPECT_ERROR_CONTAINS(LoadSafetensors(path, unchecked), DataLossError,
                          "claims format_version 1 (before checksums) but carries 'glossa.");
  }
  // The version and the checksums renamed out of Glossa's namespace: an unchecked file, refused.
  save_corrupt();
  EditHeader(path, [](std::string& h) { h.replace(h.find("glossa.crc32c"), 13, "xlossa.crc32c"); });
  EditHeader(path, [](std::string& h) {
    h.replace(h.find("glossa.header_crc32c"), 20, "xlossa.header_crc32c");
  });
  EXPECT_ERROR_CONTAINS(LoadSafetensors(path), DataLossError,
                        "carries no checksums (an early Glossa checkpoint (format_version 1), or "
                        "its checksums were edited away), so its bytes cannot be verified; if you "
                        "trust it, `glossa adopt_checkpoint");
  // Only the header checksum left (no version claimed): altered.
  SaveSafetensors(path, {{"a", at::arange(100, at::kFloat)}});
  EditHeader(path, [](std::string& h) { h.replace(h.find("glossa.crc32c"), 13, "xlossa.crc32c"); });
  EXPECT_ERROR_CONTAINS(LoadSafetensors(path, UncheckedFiles::kAllow), DataLossError,
                        "carries 'glossa.header_crc32c' but not 'glossa.crc32c'");
  // Explicitly trusted, a genuinely unchecked file loads.
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      << Header(R"({"__metadata__": {"format_version": "1"},
                    "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})")
      << std::string(4, '\0');
  EXPECT_ERROR_CONTAINS(LoadSafetensors(path), DataLossError, "carries no checksums");
  EXPECT_EQ(LoadSafetensors(path, UncheckedFiles::kAllow).tensors.at("a").item<float>(), 0.0f);
}

TEST(Safetensors, ReadsTheSafetensorsProjectsSamples) {
  const std::string dir = testing::SourcePath("../shared/testdata/safetensors");
  if (!fs::exists(dir)) GTEST_SKIP() << "../shared/testdata is absent: " << dir;
  SafetensorsContents all = LoadSafetensors(dir + "/overall.safetensors", UncheckedFiles::kAllow);
  EXPECT_EQ(all.tensors.size(), 9u);
  for (const char* f : {"B", "H", "I", "b", "d", "e", "f", "h", "i"}) {
    SafetensorsContents c = LoadSafetensors(dir + "/" + f + ".safetensors", UncheckedFiles::kAllow);
    ASSERT_EQ(c.tensors.size(), 1u) << f;
    at::Tensor t = c.tensors.begin()->second;
    EXPECT_EQ(t.numel(), 6) << f;
    const bool is_unsigned =
        std::string(f) == "B" || std::string(f) == "H" || std::string(f) == "I";
    at::Tensor expected = at::arange(-3, 3, at::kDouble);
    if (is_unsigned) {
      const double mod = std::string(f) == "B"   ? 256.0
                         : std::string(f) == "H" ? 65536.0
                                                 : 4294967296.0;
      expected = at::where(expected < 0, expected + mod, expected);
    }
    EXPECT_TRUE(at::equal(t.reshape(-1).to(at::kDouble), expected)) << f << ": " << t;
  }
}

TEST(AtomicWrite, FailuresLeaveTheOldFileIntact) {
  const std::string path = Dir() + "/state";
  AtomicWriteFile(path, "old");
  EXPECT_THROW(AtomicWriteFileWith(path, [](int) { throw AbortedError("disk full"); }),
               AbortedError);
  EXPECT_EQ(ReadFileToString(path), "old");
  for (const auto& name : ListDirectory(Dir()))
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
  AtomicWriteFile(path, "new");
  EXPECT_EQ(ReadFileToString(path), "new");
  EXPECT_THROW(AtomicWriteFile("/proc/no/such/dir/x", "y"), AbortedError);
}

}  // namespace
}  // namespace glossa
