#include "glossa/runtime/data_parallel.h"

#include <ATen/ATen.h>

#include <cstring>
#include <fstream>
#include <sys/stat.h>

#include "glossa/base/crc32c.h"
#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/io/safetensors.h"
#include "glossa/checkpoint/checkpointer.h"
#include "glossa/layers/mesh.h"
#include "glossa/checkpoint/saver.h"

namespace glossa {
namespace {

// The files the Params name (vocabularies, SentencePiece models): "key\tpath\tsize\thash" lines.
void NamedFiles(const Params& p, const std::string& path, std::string* out) {
  for (const auto& e : p.entries()) {
    const std::string key = path.empty() ? e.name : path + "." + e.name;
    if (e.value.is_params()) {
      NamedFiles(e.value.AsParams(), key, out);
      continue;
    }
    if (e.value.kind() != ParamValue::Kind::kString) continue;
    const std::string& file = e.value.AsString();
    struct stat st {};
    if (file.empty() || file.find('*') != std::string::npos || stat(file.c_str(), &st) != 0 ||
        !S_ISREG(st.st_mode) || st.st_size > (int64_t{1} << 30)) {
      continue;
    }
    std::ifstream in(file, std::ios::binary);
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    char buf[1 << 16];
    while (in) {
      in.read(buf, sizeof(buf));
      for (std::streamsize i = 0; i < in.gcount(); ++i) {
        h = (h ^ static_cast<unsigned char>(buf[i])) * 1099511628211ull;
      }
    }
    *out += StrCat(key, "\t", file, "\t", static_cast<int64_t>(st.st_size), "\t", h, "\n");
  }
}

void Append(std::string* out, const void* data, size_t n) {
  out->append(static_cast<const char*>(data), n);
}
void AppendInt(std::string* out, int64_t v) { Append(out, &v, sizeof(v)); }

struct Reader {
  const std::string& s;
  size_t pos = 0;
  void Read(void* dst, size_t n) {
    if (n > s.size() - pos) {
      throw DataLossError(StrCat("gathered decode outputs: truncated at byte ", pos, " of ",
                                 s.size()));
    }
    std::memcpy(dst, s.data() + pos, n);
    pos += n;
  }
  int64_t Int() {
    int64_t v = 0;
    Read(&v, sizeof(v));
    return v;
  }
};

}  // namespace

void CheckSameConfiguration(Distributed& dist, const Params& model_params) {
  dist.CheckSame("the world size", StrCat(dist.world_size()));
  dist.CheckSame("the model Params (compare the workers' --model, --params_file and "
                 "--params_override)",
                 model_params.ToText());
  std::string files;
  NamedFiles(model_params, "", &files);
  dist.CheckSame("the contents of the files the model Params name (vocabularies, SentencePiece "
                 "models)",
                 files);
}

int64_t SyncStateFromChief(Distributed& dist, BaseModel& model, ExponentialMovingAverage* ema,
                           int64_t global_step,
                           const std::function<void(const std::string&)>& log,
                           const ShardLayout& shards, const std::string& restored_prefix) {
  if (dist.world_size() == 1) return global_step;
  const bool chief = dist.rank() == 0;
  std::map<std::string, at::Tensor> state;
  std::string spec;
  const std::string prefix =
      shards.empty() ? std::string() : dist.AllGatherStrings(chief ? restored_prefix : "")[0];
  if (chief) {
    for (const auto& [name, t] : CheckpointTensors(model, ema, global_step)) {
      if (FindPiece(shards, name) != nullptr) continue;  // each rank has its own
      state[name] = t.detach().contiguous().clone();
      std::vector<std::string> dims;
      for (int64_t d : t.sizes()) dims.push_back(StrCat(d));
      spec += StrCat(name, "\t", static_cast<int>(t.scalar_type()), "\t", Join(dims, ","), "\n");
    }
  }
  spec = dist.AllGatherStrings(spec)[0];
  if (!chief) {
    for (const auto& line : Split(spec, '\n')) {
      const std::vector<std::string> f = Split(line, '\t');
      if (f.size() != 3) continue;
      std::vector<int64_t> dims;
      if (!f[2].empty()) {
        for (const auto& d : Split(f[2], ',')) dims.push_back(std::stoll(d));
      }
      state[f[0]] = at::zeros(dims, at::TensorOptions().dtype(
                                        static_cast<at::ScalarType>(std::stoi(f[1]))));
    }
  }
  // One broadcast per dtype, flattened.
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (auto& [name, t] : state) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, list] : by_dtype) {
    std::vector<at::Tensor> parts;
    for (const at::Tensor& t : list) parts.push_back(t.reshape({-1}));
    at::Tensor flat = at::cat(parts);
    dist.Broadcast({flat});
    int64_t offset = 0;
    for (at::Tensor& t : list) {
      t.copy_(flat.slice(0, offset, offset + t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
  if (chief) return global_step;
  if (!shards.empty()) {
    // This rank's pieces: cut from the restored checkpoint, or its own initialization.
    std::map<std::string, at::Tensor> own;
    if (!prefix.empty()) {
      SafetensorsContents c = LoadCheckpoint(prefix);
      SlicePieces(c, shards);
      own = std::move(c.tensors);
    } else {
      own = CheckpointTensors(model, ema, global_step);
    }
    for (auto& [name, t] : own) {
      if (FindPiece(shards, name) != nullptr) state[name] = t;
    }
  }
  SafetensorsContents contents;
  contents.tensors = std::move(state);
  const int64_t step = RestoreCheckpoint(contents, model, ema);
  Checkpointer::RestoreInputPositions(contents, model, log);
  return step;
}

bool ShareBatchOverPipe(MeshAxis* pipe, bool have, NestedMap& batch) {
  if (pipe == nullptr || pipe->size() == 1) return have;
  const bool root = pipe->index() == 0;
  std::string bytes;
  if (root && have) bytes = SerializeNestedMaps({batch});
  at::Tensor header = at::tensor({static_cast<int64_t>(have ? 1 : 0),
                                  static_cast<int64_t>(bytes.size())}, at::kLong);
  pipe->Broadcast(header, 0);
  if (header[0].item<int64_t>() == 0) return false;
  at::Tensor data = at::empty({header[1].item<int64_t>()}, at::kByte);
  if (root) std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  pipe->Broadcast(data, 0);
  if (!root) {
    batch = DeserializeNestedMaps(
        std::string(static_cast<const char*>(data.data_ptr()), static_cast<size_t>(data.numel())))
        .at(0);
  }
  return true;
}

std::string PieceReplicaDigest(const BaseLayer& model) {
  std::string digest;
  for (const auto& v : LearnerVariables(model)) {
    if (!v.rank_local()) continue;
    const at::Tensor t = v.value.detach().contiguous();
    digest += StrCat(v.name, ":", Crc32c(t.data_ptr(), t.numel() * t.element_size()), "\n");
  }
  return digest;
}

std::string SerializeNestedMaps(const std::vector<NestedMap>& maps) {
  std::string out;
  AppendInt(&out, static_cast<int64_t>(maps.size()));
  for (const NestedMap& m : maps) {
    const auto items = m.FlattenItems();
    AppendInt(&out, static_cast<int64_t>(items.size()));
    for (const auto& [key, v] : items) {
      if (!v.is_tensor()) {
        throw UnimplementedError(StrCat("gathering decode outputs across workers: '", key,
                                        "' is not a tensor"));
      }
      const at::Tensor t = v.AsTensor().detach().cpu().contiguous();
      AppendInt(&out, static_cast<int64_t>(key.size()));
      Append(&out, key.data(), key.size());
      AppendInt(&out, static_cast<int64_t>(t.scalar_type()));
      AppendInt(&out, t.dim());
      for (int64_t d : t.sizes()) AppendInt(&out, d);
      const size_t bytes = t.numel() * t.element_size();
      if (bytes > 0) Append(&out, t.data_ptr(), bytes);
    }
  }
  return out;
}

std::vector<NestedMap> DeserializeNestedMaps(const std::string& bytes) {
  Reader r{bytes};
  const int64_t n = r.Int();
  std::vector<NestedMap> out;
  for (int64_t i = 0; i < n; ++i) {
    NestedMap m;
    const int64_t items = r.Int();
    for (int64_t j = 0; j < items; ++j) {
      std::string key(static_cast<size_t>(r.Int()), '\0');
      r.Read(key.data(), key.size());
      const auto dtype = static_cast<at::ScalarType>(r.Int());
      const int64_t dim = r.Int();
      std::vector<int64_t> sizes;
      for (int64_t d = 0; d < dim; ++d) sizes.push_back(r.Int());
      at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtype));
      const size_t nbytes = t.numel() * t.element_size();
      if (nbytes > 0) r.Read(t.data_ptr(), nbytes);
      m.Set(key, t);
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace glossa
