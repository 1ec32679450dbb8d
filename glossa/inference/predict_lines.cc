#include "glossa/inference/predict_lines.h"

#include <ATen/ATen.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <istream>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/inference/json_io.h"
#include "glossa/inference/predictor.h"

namespace glossa {
namespace {

// One input line: its string feeds, and its options (scalar feeds) with a key that tells which
// lines may share a batch.
struct Example {
  std::map<std::string, std::string> strings;
  InferenceMap options;
  std::string options_key;
  int64_t line = 0;    // its line number
  int64_t tokens = 0;  // its longest string feed's tokens (what sorting and the budget count)
};

class LineBatcher {
 public:
  LineBatcher(const Predictor& predictor, const PredictLinesOptions& o)
      : predictor_(predictor), o_(o), spec_(predictor.ListSubgraphs().at(o.subgraph)) {
    for (const auto& [name, s] : spec_.feeds) {
      if (s.dtype == "string") string_feeds_.push_back(name);
    }
    plain_text_ok_ = string_feeds_.size() == 1;
    if (o_.input_format != "auto" && o_.input_format != "text" && o_.input_format != "json") {
      throw InvalidArgumentError(StrCat("input_format must be auto, text or json, got '",
                                        o_.input_format, "'"));
    }
    if (o_.input_format == "text" && !plain_text_ok_) {
      throw InvalidArgumentError(StrCat("--input_format=text: subgraph '", o_.subgraph, "' has ",
                                        string_feeds_.size(),
                                        " string feeds; text lines need exactly one (use json)"));
    }
  }

  int64_t Run(std::istream& in, std::ostream& out) {
    const bool sorting = o_.sort_window > 1;
    const size_t window = static_cast<size_t>(sorting ? o_.sort_window : o_.batch_size);
    std::string line;
    int64_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      Example ex = Parse(line, line_no);
      ex.line = line_no;
      if (sorting || o_.max_batch_tokens > 0) {
        for (const auto& [name, text] : ex.strings) {
          const int64_t tokens = predictor_.CountTokens(text);
          // Counted here anyway: the line is named, not the sorted batch it would fail in.
          if (tokens > predictor_.options().max_input_tokens) {
            throw InvalidArgumentError(StrCat(o_.input_name, ":", line_no, ": feed '", name,
                                              "' is ", tokens, " tokens, more than "
                                              "max_input_tokens ",
                                              predictor_.options().max_input_tokens));
          }
          ex.tokens = std::max(ex.tokens, tokens);
        }
      }
      pending_.push_back(std::move(ex));
      if (pending_.size() >= window) Drain(out, sorting);
    }
    if (in.bad()) {
      throw DataLossError(StrCat("cannot read ", o_.input_name, " after line ", line_no));
    }
    Drain(out, sorting);
    return answered_;
  }

 private:
  Example Parse(const std::string& line, int64_t line_no) const {
    const std::string where = StrCat(o_.input_name, ":", line_no, ": ");
    if (static_cast<int64_t>(line.size()) > o_.max_line_bytes) {
      throw InvalidArgumentError(StrCat(where, "line of ", line.size(),
                                        " bytes is longer than --max_line_bytes=",
                                        o_.max_line_bytes));
    }
    const bool json_line =
        o_.input_format == "json" || (o_.input_format == "auto" && !line.empty() && line[0] == '{');
    Example ex;
    if (!json_line) {
      if (!plain_text_ok_) {
        throw InvalidArgumentError(StrCat(where, "expected a JSON object (subgraph '",
                                          o_.subgraph, "' has ", string_feeds_.size(),
                                          " string feeds)"));
      }
      ex.strings[string_feeds_[0]] = line;
      return ex;
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw InvalidArgumentError(StrCat(where, "not valid JSON: ", e.what(),
                                        plain_text_ok_ && o_.input_format == "auto"
                                            ? " (a text line starting with '{'? use "
                                              "--input_format=text)"
                                            : ""));
    }
    if (!j.is_object()) {
      throw InvalidArgumentError(StrCat(where, "expected a JSON object of feeds, got ",
                                        j.type_name()));
    }
    for (auto it = j.begin(); it != j.end(); ++it) AddFeed(where, it.key(), it.value(), &ex);
    return ex;
  }

  void AddFeed(const std::string& where, const std::string& name, const nlohmann::json& v,
               Example* ex) const {
    auto s = spec_.feeds.find(name);
    if (s == spec_.feeds.end()) {
      std::vector<std::string> names;
      for (const auto& [n, unused] : spec_.feeds) names.push_back(n);
      throw InvalidArgumentError(StrCat(where, "unknown feed '", name, "' (feeds: ",
                                        Join(names, ", "), ")"));
    }
    const TensorSpec& ts = s->second;
    if (ts.dtype == "string") {
      if (!v.is_string()) {
        throw InvalidArgumentError(StrCat(where, "feed '", name, "' must be a string"));
      }
      ex->strings[name] = v.get<std::string>();
    } else if (ts.rank == 0 && v.is_number()) {
      if (ts.dtype == "int64" && !v.is_number_integer()) {
        throw InvalidArgumentError(StrCat(where, "feed '", name, "' must be an integer, got ",
                                          v.dump()));
      }
      ex->options[name] = InferenceValue::Of(
          ts.dtype == "int64" ? at::scalar_tensor(v.get<int64_t>(), at::kLong)
                              : at::scalar_tensor(v.get<double>(), at::kDouble).to(at::kFloat));
      ex->options_key += name + "=" + v.dump() + ";";
    } else {
      throw InvalidArgumentError(StrCat(where, "feed '", name, "' must be a ",
                                        ts.rank == 0 ? "number" : "string"));
    }
  }

  // Cuts the pending lines into batches (in input order, or sorted by options and length), runs
  // them and writes every line's answer in input order.
  void Drain(std::ostream& out, bool sorting) {
    if (pending_.empty()) return;
    std::vector<size_t> order(pending_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (sorting) {
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        const Example &x = pending_[a], &y = pending_[b];
        return x.options_key != y.options_key ? x.options_key < y.options_key
                                              : x.tokens < y.tokens;
      });
    }
    std::vector<std::string> answers(pending_.size());
    std::vector<size_t> batch;
    int64_t longest = 0;
    for (size_t i : order) {
      const Example& ex = pending_[i];
      const int64_t rows = static_cast<int64_t>(batch.size()) + 1;
      const bool fits =
          batch.empty() || (ex.options_key == pending_[batch[0]].options_key &&
                            rows <= o_.batch_size &&
                            (o_.max_batch_tokens <= 0 ||
                             rows * std::max(longest, ex.tokens) <= o_.max_batch_tokens));
      if (!fits) {
        RunBatch(batch, &answers);
        batch.clear();
        longest = 0;
      }
      batch.push_back(i);
      longest = std::max(longest, ex.tokens);
    }
    RunBatch(batch, &answers);
    for (const std::string& a : answers) out << a << "\n";
    errno = 0;
    out.flush();
    if (!out.good()) {
      throw AbortedError(StrCat("cannot write ", o_.output_name, ": ",
                                errno != 0 ? std::strerror(errno) : "write error"));
    }
    answered_ += static_cast<int64_t>(pending_.size());
    pending_.clear();
  }

  // Which lines a batch holds, for its errors: "the batch ending at line 9" for a run of lines,
  // else "the batch of lines 3, 17, 40" (the first 8 named).
  std::string BatchLines(const std::vector<size_t>& batch) const {
    bool run = true;
    for (size_t k = 1; k < batch.size(); ++k) {
      run = run && pending_[batch[k]].line == pending_[batch[k - 1]].line + 1;
    }
    if (run) return StrCat("the batch ending at line ", pending_[batch.back()].line);
    std::vector<std::string> named;
    for (size_t k = 0; k < batch.size() && k < 8; ++k) named.push_back(StrCat(pending_[batch[k]].line));
    return StrCat("the batch of lines ", Join(named, ", "),
                  batch.size() > 8 ? StrCat(" and ", batch.size() - 8, " more") : "");
  }

  // Runs the lines `batch` (indices into pending_) and puts their answers in *answers.
  void RunBatch(const std::vector<size_t>& batch, std::vector<std::string>* answers) {
    if (batch.empty()) return;
    InferenceMap feeds = pending_[batch[0]].options;
    for (const auto& name : string_feeds_) {
      std::vector<std::string> column;
      bool any = false;
      for (size_t i : batch) {
        auto it = pending_[i].strings.find(name);
        any = any || it != pending_[i].strings.end();
        column.push_back(it == pending_[i].strings.end() ? std::string() : it->second);
      }
      if (any) feeds[name] = InferenceValue::Strings(std::move(column));
    }
    InferenceMap fetches;
    try {
      fetches = predictor_.Run(o_.subgraph, feeds);
    } catch (const Error& e) {
      ThrowError(e.code(), StrCat(o_.input_name, " (", BatchLines(batch), "): ", e.message()));
    }
    for (size_t k = 0; k < batch.size(); ++k) {
      const nlohmann::ordered_json row = FetchRowToJson(fetches, static_cast<int64_t>(k));
      (*answers)[batch[k]] =
          row.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    }
  }

  const Predictor& predictor_;
  const PredictLinesOptions& o_;
  const InferenceSubgraphSpec spec_;
  std::vector<std::string> string_feeds_;
  bool plain_text_ok_ = false;
  std::vector<Example> pending_;  // read, not yet answered
  int64_t answered_ = 0;
};

}  // namespace

int64_t PredictLines(const Predictor& predictor, std::istream& in, std::ostream& out,
                     const PredictLinesOptions& options) {
  if (options.batch_size < 1) throw InvalidArgumentError("predict: batch_size must be >= 1");
  if (options.sort_window < 0 || options.max_batch_tokens < 0) {
    throw InvalidArgumentError("predict: sort_window and max_batch_tokens must be >= 0");
  }
  LineBatcher batcher(predictor, options);
  return batcher.Run(in, out);
}

}  // namespace glossa
