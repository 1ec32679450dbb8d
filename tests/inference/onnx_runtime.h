// Runs an exported ONNX model in ONNX Runtime's CPU build (onnxruntime-node, run by
// bench/onnx/ort_run.js, installed by scripts/setup.sh): the independent engine that checks the
// ONNX export (tests/inference/bundle_test.cc, tests/layers/onnx_graph_test.cc).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace glossa {

// feeds: int64 or float32 tensors by input name. Returns the outputs (float64, by name). Fails the
// test (ADD_FAILURE, empty map) when node or ONNX Runtime is missing or the run fails.
inline std::map<std::string, at::Tensor> RunOnnxRuntime(
    const std::string& model, const std::vector<std::pair<std::string, at::Tensor>>& feeds,
    const std::string& feeds_file) {
  nlohmann::json spec;
  for (const auto& [name, t] : feeds) {
    const at::Tensor c = t.contiguous();
    nlohmann::json f;
    f["dims"] = c.sizes().vec();
    if (c.scalar_type() == at::kLong) {
      f["type"] = "int64";
      f["data"] = std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
    } else {
      const at::Tensor ff = c.to(at::kFloat).contiguous();
      f["type"] = "float32";
      f["data"] = std::vector<float>(ff.data_ptr<float>(), ff.data_ptr<float>() + ff.numel());
    }
    spec[name] = f;
  }
  std::ofstream(feeds_file) << spec.dump();
  const std::string script = std::string(GLOSSA_SOURCE_DIR) + "/bench/onnx/ort_run.js";
  const std::string cmd = "node '" + script + "' --model '" + model + "' --feeds '" + feeds_file +
                          "' --threads 1 2>&1";
  std::string text;
  if (FILE* pipe = ::popen(cmd.c_str(), "r")) {
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) text.append(buf, n);
    const int rc = ::pclose(pipe);
    if (rc != 0) {
      ADD_FAILURE() << "ONNX Runtime failed (is it installed? bash scripts/setup.sh): " << cmd
                    << "\n" << text;
      return {};
    }
  }
  std::map<std::string, at::Tensor> out;
  const nlohmann::json result = nlohmann::json::parse(text);
  for (const auto& [name, o] : result.at("outputs").items()) {
    const std::vector<double> data = o.at("data").get<std::vector<double>>();
    out[name] = at::tensor(data, at::kDouble).view(o.at("dims").get<std::vector<int64_t>>());
  }
  return out;
}

}  // namespace glossa
