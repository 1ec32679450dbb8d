// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON header {name: {dtype, shape, data_offsets: [begin, end]},
// "__metadata__": {string: string}}, then the tensor bytes. Loading parses and bounds-checks
// everything and executes nothing; every malformed file is DataLoss naming the file and the
// problem. Writes are atomic. Large tensor sets can be sharded with the safetensors index layout
// (`<name>.safetensors.index.json` {metadata, weight_map: {tensor: shard file}}).
//
//   SaveSafetensors("/ckpt/ckpt-00001000.safetensors", {{"lm/w", w}}, {{"format_version", "1"}});
//   SafetensorsContents c = LoadSafetensors("/ckpt/ckpt-00001000.safetensors");
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace glossa {

struct SafetensorsContents {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// dtypes: BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64 (U16 and U32 are read, widened to
// int32 and int64, since ATen has no such unsigned types). Tensors are written contiguous, CPU.
void SaveSafetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                     const std::map<std::string, std::string>& metadata = {});

// A file without Glossa's checksums (an early Glossa checkpoint, a file from another tool, or a
// header whose checksums were edited away) cannot be verified: it is DataLoss unless the caller
// says the file is trusted (`glossa adopt_checkpoint`, which rewrites it with checksums).
enum class UncheckedFiles { kRefuse, kAllow };
SafetensorsContents LoadSafetensors(const std::string& path,
                                    UncheckedFiles unchecked = UncheckedFiles::kRefuse);

// Sharded form: `<stem>.safetensors` when the data fits in `max_shard_bytes`, else
// `<stem>-00000-of-0000N.safetensors` shards plus `<stem>.safetensors.index.json`. Returns the
// files written (shards first, the index last).
std::vector<std::string> SaveSafetensorsSharded(const std::string& stem,
                                                const std::map<std::string, at::Tensor>& tensors,
                                                const std::map<std::string, std::string>& metadata,
                                                uint64_t max_shard_bytes);
// Loads `<stem>.safetensors` or, when absent, the shards listed by `<stem>.safetensors.index.json`.
SafetensorsContents LoadSafetensorsSharded(const std::string& stem,
                                           UncheckedFiles unchecked = UncheckedFiles::kRefuse);
// The files that make up checkpoint `stem` (for deletion), existing ones only.
std::vector<std::string> SafetensorsFiles(const std::string& stem);

}  // namespace glossa
