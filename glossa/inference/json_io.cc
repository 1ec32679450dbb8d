#include "glossa/inference/json_io.h"

#include <ATen/ATen.h>

#include <limits>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {

namespace {

// Checks that `j` is numbers nested as `shape` (no ragged rows, numbers at the leaves only).
void CheckShape(const nlohmann::json& j, size_t depth, const std::vector<int64_t>& shape,
                bool integers, const std::string& what) {
  if (depth == shape.size()) {
    if (j.is_array()) throw InvalidArgumentError(StrCat(what, " is ragged (nesting depths differ)"));
    if (!j.is_number()) {
      throw InvalidArgumentError(StrCat(what, " holds ", j.type_name(), ", expected numbers"));
    }
    if (integers && !j.is_number_integer()) {
      throw InvalidArgumentError(StrCat(what, " must hold integers, got ", j.dump()));
    }
    if (integers && j.is_number_unsigned() &&
        j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw InvalidArgumentError(StrCat(what, " holds ", j.dump(), ", beyond int64"));
    }
    return;
  }
  if (!j.is_array() || static_cast<int64_t>(j.size()) != shape[depth]) {
    throw InvalidArgumentError(StrCat(what, " is ragged (rows of different lengths or depths)"));
  }
  for (const auto& e : j) CheckShape(e, depth + 1, shape, integers, what);
}

// The shape of nested arrays of numbers (from the first element at each depth), checked.
std::vector<int64_t> ShapeOf(const nlohmann::json& j, bool integers, const std::string& what) {
  std::vector<int64_t> shape;
  for (const nlohmann::json* p = &j; p->is_array(); p = &(*p)[0]) {
    shape.push_back(static_cast<int64_t>(p->size()));
    if (p->empty()) break;
  }
  CheckShape(j, 0, shape, integers, what);
  return shape;
}

template <typename T>
void Flatten(const nlohmann::json& j, std::vector<T>* out) {
  if (!j.is_array()) {
    out->push_back(j.get<T>());
    return;
  }
  for (const auto& e : j) Flatten(e, out);
}

std::string Names(const std::map<std::string, TensorSpec>& m) {
  std::vector<std::string> n;
  for (const auto& [k, v] : m) n.push_back(k);
  return Join(n, ", ");
}

}  // namespace

InferenceMap FeedsFromJson(const nlohmann::json& feeds, const InferenceSubgraphSpec& spec,
                           const std::string& where) {
  if (!feeds.is_object()) {
    throw InvalidArgumentError(StrCat(where, ": feeds must be a JSON object, got ",
                                      feeds.type_name()));
  }
  InferenceMap out;
  for (auto it = feeds.begin(); it != feeds.end(); ++it) {
    auto s = spec.feeds.find(it.key());
    if (s == spec.feeds.end()) {
      throw InvalidArgumentError(StrCat(where, ": unknown feed '", it.key(), "' (feeds: ",
                                        Names(spec.feeds), ")"));
    }
    const TensorSpec& ts = s->second;
    const nlohmann::json& v = it.value();
    const std::string what = StrCat(where, ": feed '", it.key(), "'");
    if (ts.dtype == "string") {
      if (!v.is_array()) {
        throw InvalidArgumentError(StrCat(what, " must be an array of strings, got ",
                                          v.type_name()));
      }
      std::vector<std::string> strings;
      for (size_t i = 0; i < v.size(); ++i) {
        if (!v[i].is_string()) {
          throw InvalidArgumentError(StrCat(what, "[", i, "] must be a string, got ",
                                            v[i].type_name()));
        }
        strings.push_back(v[i].get<std::string>());
      }
      out[it.key()] = InferenceValue::Strings(std::move(strings));
      continue;
    }
    const bool integers = ts.dtype == "int64";
    const std::vector<int64_t> shape = ShapeOf(v, integers, what);
    if (static_cast<int64_t>(shape.size()) != ts.rank) {
      throw InvalidArgumentError(StrCat(what, " must have rank ", ts.rank, ", got rank ",
                                        shape.size()));
    }
    at::Tensor t;
    if (integers) {
      std::vector<int64_t> flat;
      Flatten(v, &flat);
      t = at::tensor(flat, at::kLong);
    } else {
      std::vector<float> flat;
      Flatten(v, &flat);
      t = at::tensor(flat, at::kFloat);
    }
    out[it.key()] = InferenceValue::Of(t.reshape(shape));
  }
  return out;
}

nlohmann::json TensorToJson(const at::Tensor& t) {
  const at::Tensor c = t.is_floating_point() ? t.to(at::kDouble).contiguous()
                                             : t.to(at::kLong).contiguous();
  if (c.dim() == 0) {
    return c.is_floating_point() ? nlohmann::json(c.item<double>())
                                 : nlohmann::json(c.item<int64_t>());
  }
  nlohmann::json a = nlohmann::json::array();
  for (int64_t i = 0; i < c.size(0); ++i) a.push_back(TensorToJson(c[i]));
  return a;
}

namespace {

// Row i of one fetch: a string, or the tensor row (cut to lengths[i] for [B, T] fetches).
nlohmann::json Row(const InferenceValue& v, const InferenceMap& fetches, int64_t i) {
  if (v.is_strings()) return v.strings.at(static_cast<size_t>(i));
  at::Tensor r = v.tensor[i];
  const auto lengths = fetches.find("lengths");
  if (lengths != fetches.end() && !lengths->second.is_strings() && v.tensor.dim() == 2) {
    const int64_t n = lengths->second.tensor[i].item<int64_t>();
    r = r.narrow(0, 0, std::min<int64_t>(std::max<int64_t>(n, 0), r.size(0)));
  }
  // Per-hypothesis fetches (scores [B, K], ids [B, K, T]) are cut to the hypotheses found.
  const auto found = fetches.find("num_hyps_found");
  if (found != fetches.end() && !found->second.is_strings() && v.tensor.dim() >= 2 &&
      &v != &found->second) {
    const int64_t n = found->second.tensor[i].item<int64_t>();
    r = r.narrow(0, 0, std::min<int64_t>(std::max<int64_t>(n, 0), r.size(0)));
  }
  return TensorToJson(r);
}

int64_t BatchOf(const InferenceValue& v) {
  if (v.is_strings()) return static_cast<int64_t>(v.strings.size());
  return v.tensor.dim() == 0 ? -1 : v.tensor.size(0);
}

}  // namespace

nlohmann::ordered_json FetchesToJson(const InferenceMap& fetches) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [name, v] : fetches) {
    const int64_t b = BatchOf(v);
    if (b < 0) {
      out[name] = TensorToJson(v.tensor);
      continue;
    }
    nlohmann::json rows = nlohmann::json::array();
    for (int64_t i = 0; i < b; ++i) rows.push_back(Row(v, fetches, i));
    out[name] = std::move(rows);
  }
  return out;
}

nlohmann::ordered_json FetchRowToJson(const InferenceMap& fetches, int64_t i) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [name, v] : fetches) {
    out[name] = BatchOf(v) < 0 ? TensorToJson(v.tensor) : Row(v, fetches, i);
  }
  return out;
}

nlohmann::ordered_json SpecToJson(const InferenceSubgraphSpec& spec) {
  auto side = [](const std::map<std::string, TensorSpec>& m) {
    nlohmann::ordered_json o = nlohmann::ordered_json::object();
    for (const auto& [name, s] : m) {
      o[name] = {{"dtype", s.dtype}, {"rank", s.rank}, {"optional", s.optional}, {"doc", s.doc}};
      if (s.bytes) o[name]["bytes"] = true;
      if (s.min) o[name]["min"] = *s.min;
      if (s.max) o[name]["max"] = *s.max;
    }
    return o;
  };
  nlohmann::ordered_json out;
  out["doc"] = spec.doc;
  out["feeds"] = side(spec.feeds);
  out["fetches"] = side(spec.fetches);
  return out;
}

nlohmann::json ParseRunRequest(const std::string& request_body,
                               std::vector<std::string>& fetch_keys) {
  nlohmann::json body;
  try {
    body = nlohmann::json::parse(request_body);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(StrCat("the request body is not valid JSON: ", e.what()));
  }
  if (!body.is_object()) {
    throw InvalidArgumentError(StrCat("the request body must be a JSON object, got ",
                                      body.type_name()));
  }
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (it.key() != "feeds" && it.key() != "fetch_keys") {
      throw InvalidArgumentError(StrCat("unknown request field '", it.key(),
                                        "' (fields: feeds, fetch_keys)"));
    }
  }
  if (!body.contains("feeds")) throw InvalidArgumentError("the request has no \"feeds\"");
  if (body.contains("fetch_keys")) {
    const auto& k = body["fetch_keys"];
    if (!k.is_array()) throw InvalidArgumentError("\"fetch_keys\" must be an array of strings");
    for (const auto& e : k) {
      if (!e.is_string()) {
        throw InvalidArgumentError("\"fetch_keys\" must be an array of strings");
      }
      fetch_keys.push_back(e.get<std::string>());
    }
  }
  return body;
}

}  // namespace glossa
