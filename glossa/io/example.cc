#include "glossa/io/example.h"

#include <ATen/ATen.h>
#include <google/protobuf/arena.h>

#include <numeric>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/io/example.pb.h"

namespace glossa {
namespace {

const char* KindName(proto::Feature::KindCase k) {
  switch (k) {
    case proto::Feature::kBytesList: return "bytes_list";
    case proto::Feature::kFloatList: return "float_list";
    case proto::Feature::kInt64List: return "int64_list";
    default: return "empty";
  }
}

proto::Feature::KindCase WantedKind(FeatureType t) {
  switch (t) {
    case FeatureType::kInt64: return proto::Feature::kInt64List;
    case FeatureType::kFloat: return proto::Feature::kFloatList;
    case FeatureType::kBytes: return proto::Feature::kBytesList;
  }
  return proto::Feature::KIND_NOT_SET;
}

std::string Where(std::string_view where, const std::string& name) {
  return where.empty() ? StrCat("feature '", name, "'") : StrCat(where, ": feature '", name, "'");
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

NestedValue BytesValue(std::vector<std::string> values, bool scalar) {
  if (scalar) return NestedValue(std::move(values.front()));
  NestedValue::List list;
  for (auto& v : values) list.emplace_back(std::move(v));
  return NestedValue(std::move(list));
}

// Puts into `out` under `name` the default of the missing fixed-length feature `s` (shaped
// `shape`, `n` elements), or throws InvalidArgumentError if it has none or a wrong count.
void PutDefault(const FeatureSpec& s, const std::vector<int64_t>& shape, int64_t n,
                std::string_view where, const std::string& name, NestedMap& out) {
  if (s.type == FeatureType::kBytes) {
    if (!s.default_bytes) {
      throw InvalidArgumentError(StrCat(Where(where, name), " is missing and has no default"));
    }
    std::vector<std::string> values = *s.default_bytes;
    if (values.size() == 1 && n != 1) values.assign(n, values[0]);
    out.Put(name, BytesValue(values, s.shape.empty()));
  } else {
    if (!s.default_numbers) {
      throw InvalidArgumentError(StrCat(Where(where, name), " is missing and has no default"));
    }
    std::vector<double> d = *s.default_numbers;
    if (d.size() == 1 && n != 1) d.assign(n, d[0]);
    if (static_cast<int64_t>(d.size()) != n) {
      throw InvalidArgumentError(
          StrCat(Where(where, name), ": default has ", d.size(), " values, shape needs ", n));
    }
    at::Tensor t = at::tensor(d, at::kDouble).reshape(shape);
    out.Put(name, t.to(s.type == FeatureType::kInt64 ? at::kLong : at::kFloat));
  }
}

}  // namespace

FeatureSpec FeatureSpec::Fixed(FeatureType type, std::vector<int64_t> shape,
                               std::optional<std::vector<double>> default_value) {
  FeatureSpec s;
  s.type = type;
  s.shape = std::move(shape);
  s.default_numbers = std::move(default_value);
  return s;
}

FeatureSpec FeatureSpec::VarLen(FeatureType type) {
  FeatureSpec s;
  s.type = type;
  s.var_len = true;
  return s;
}

NestedMap ParseExample(std::string_view serialized, const FeatureSpecs& spec,
                       std::string_view where) {
  // Parsed into an arena whose first block is on the stack: a small Example (the common case:
  // a few features of tokens) costs no heap allocation; larger ones spill to heap blocks.
  alignas(16) char block[8192];
  google::protobuf::ArenaOptions arena_options;
  arena_options.initial_block = block;
  arena_options.initial_block_size = sizeof(block);
  google::protobuf::Arena arena(arena_options);
  auto* example = google::protobuf::Arena::CreateMessage<proto::Example>(&arena);
  if (!example->ParseFromArray(serialized.data(), static_cast<int>(serialized.size()))) {
    throw DataLossError(StrCat(where.empty() ? "" : StrCat(where, ": "),
                               "record is not a valid tf.train.Example (", serialized.size(),
                               " bytes)"));
  }
  const auto& features = example->features().feature();
  NestedMap out;
  for (const auto& [name, s] : spec) {
    auto it = features.find(name);
    const bool present =
        it != features.end() && it->second.kind_case() != proto::Feature::KIND_NOT_SET;
    if (present && it->second.kind_case() != WantedKind(s.type)) {
      throw InvalidArgumentError(StrCat(Where(where, name), " is a ",
                                        KindName(it->second.kind_case()), ", but the spec wants ",
                                        KindName(WantedKind(s.type))));
    }
    const int64_t count = !present                        ? 0
                          : s.type == FeatureType::kInt64 ? it->second.int64_list().value_size()
                          : s.type == FeatureType::kFloat ? it->second.float_list().value_size()
                                                          : it->second.bytes_list().value_size();
    std::vector<int64_t> shape = s.var_len ? std::vector<int64_t>{count} : s.shape;
    const int64_t n = NumElements(shape);
    if (!s.var_len && present && count != n) {
      throw InvalidArgumentError(
          StrCat(Where(where, name), " has ", count, " values, but the spec's shape needs ", n));
    }
    if (!present && !s.var_len) {
      // A missing fixed-length feature takes its default.
      PutDefault(s, shape, n, where, name, out);
      continue;
    }
    switch (s.type) {
      case FeatureType::kInt64: {
        at::Tensor t = at::empty({n}, at::kLong);
        if (n) std::memcpy(t.data_ptr<int64_t>(), it->second.int64_list().value().data(), n * 8);
        out.Put(name, s.var_len ? t : t.reshape(shape));  // var_len: already [n], no view
        break;
      }
      case FeatureType::kFloat: {
        at::Tensor t = at::empty({n}, at::kFloat);
        if (n) std::memcpy(t.data_ptr<float>(), it->second.float_list().value().data(), n * 4);
        out.Put(name, s.var_len ? t : t.reshape(shape));
        break;
      }
      case FeatureType::kBytes: {
        std::vector<std::string> values;
        if (present) {
          for (const auto& v : it->second.bytes_list().value()) values.push_back(v);
        }
        out.Put(name, BytesValue(values, !s.var_len && s.shape.empty()));
        break;
      }
    }
  }
  return out;
}

ExampleBuilder& ExampleBuilder::Int64(const std::string& name, const std::vector<int64_t>& values) {
  int64s[name] = values;
  return *this;
}
ExampleBuilder& ExampleBuilder::Float(const std::string& name, const std::vector<float>& values) {
  floats[name] = values;
  return *this;
}
ExampleBuilder& ExampleBuilder::Bytes(const std::string& name,
                                      const std::vector<std::string>& values) {
  bytes[name] = values;
  return *this;
}

std::string ExampleBuilder::Serialize() const {
  proto::Example ex;
  auto* f = ex.mutable_features()->mutable_feature();
  for (const auto& [k, v] : int64s) {
    for (int64_t x : v) (*f)[k].mutable_int64_list()->add_value(x);
    (*f)[k].mutable_int64_list();
  }
  for (const auto& [k, v] : floats) {
    for (float x : v) (*f)[k].mutable_float_list()->add_value(x);
    (*f)[k].mutable_float_list();
  }
  for (const auto& [k, v] : bytes) {
    for (const auto& x : v) (*f)[k].mutable_bytes_list()->add_value(x);
    (*f)[k].mutable_bytes_list();
  }
  return ex.SerializeAsString();
}

}  // namespace glossa
