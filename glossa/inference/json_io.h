// JSON for inference feeds, fetches and specs: what `glossa predict` reads and writes per line and
// what `glossa serve` speaks over HTTP.
//
//   feeds   {"text": ["a b", "c"], "max_new_tokens": 8}   strings: arrays of strings (rank 1);
//                                                          rank 0: a number; tensors: nested arrays
//   fetches {"total_log_prob": [-3.2, -1.5], "log_probs": [[-1.0, -2.2], [-1.5]], "text": [...]}
//
// Per-token fetches ([B, T] tensors) are cut to each row's length when the subgraph fetches
// "lengths", so a row reads the same whatever else was batched with it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "glossa/model/inference_spec.h"

namespace glossa {

// Feeds from a JSON object, checked against `spec` (unknown names, JSON types, ragged arrays,
// integers for int64); errors are InvalidArgument prefixed with `where`.
InferenceMap FeedsFromJson(const nlohmann::json& feeds, const InferenceSubgraphSpec& spec,
                           const std::string& where);

// One tensor as a JSON number (rank 0) or nested arrays.
nlohmann::json TensorToJson(const at::Tensor& t);

// All fetches, batch-major, per-token rows cut to "lengths".
nlohmann::ordered_json FetchesToJson(const InferenceMap& fetches);
// Row `i` of every batched fetch (rank-0 fetches as they are).
nlohmann::ordered_json FetchRowToJson(const InferenceMap& fetches, int64_t i);

nlohmann::ordered_json SpecToJson(const InferenceSubgraphSpec& spec);

// A :run or :stream request's body: {"feeds": {...}, "fetch_keys": [...]?}, its fetch keys into
// `fetch_keys`; InvalidArgument naming what is wrong (not JSON, not an object, an unknown field,
// no feeds, fetch_keys not an array of strings).
nlohmann::json ParseRunRequest(const std::string& request_body,
                               std::vector<std::string>& fetch_keys);

}  // namespace glossa
