#include "glossa/tasks/lm/lm_generation.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/input/tokenizers.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/layer_scopes.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/step_states.h"
#include "glossa/layers/transformer_stack.h"
#include "glossa/tasks/lm/transformer_lm.h"

namespace glossa {

at::Tensor PickTokens(at::Tensor logits, double temperature, int64_t top_k, at::Generator& gen) {
  if (temperature <= 0) return logits.argmax(-1);
  // Shifted by the row maximum first: a tiny temperature then gives a one-hot distribution
  // instead of inf - inf = NaN.
  logits = (logits - std::get<0>(logits.max(-1, /*keepdim=*/true))) / temperature;
  if (top_k > 0 && top_k < logits.size(-1)) {
    at::Tensor kth = std::get<0>(logits.topk(top_k, -1)).select(-1, top_k - 1).unsqueeze(-1);
    logits = logits.masked_fill(logits < kth, -INFINITY);
  }
  return at::multinomial(at::softmax(logits, -1), 1, /*replacement=*/false, gen).squeeze(1);
}

GenerateOptions ReadGenerateOptions(const InferenceMap& feeds, const GenerateOptions& defaults) {
  auto option = [&](const char* key, double fallback) {
    auto it = feeds.find(key);
    return it == feeds.end() ? fallback : it->second.tensor.to(at::kDouble).item<double>();
  };
  GenerateOptions o;
  o.max_new_tokens = static_cast<int64_t>(option("max_new_tokens", static_cast<double>(defaults.max_new_tokens)));
  o.temperature = option("temperature", defaults.temperature);
  o.top_k = static_cast<int64_t>(option("top_k", static_cast<double>(defaults.top_k)));
  o.seed = static_cast<uint64_t>(option("seed", static_cast<double>(defaults.seed)));
  return o;
}

std::vector<std::vector<int64_t>> PromptIds(const BaseTokenizer& tokenizer,
                                            const std::vector<std::string>& prompts) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& prompt : prompts) {
    std::vector<int64_t> ids = {tokenizer.sos_id()};
    for (int64_t id : tokenizer.StringToIds(prompt)) ids.push_back(id);
    out.push_back(std::move(ids));
  }
  return out;
}

InferenceMap GenerateFetches(const BaseTokenizer& tokenizer,
                             const std::vector<std::vector<int64_t>>& draws) {
  std::vector<std::string> texts;
  std::vector<int64_t> lengths;
  int64_t width = 1;
  for (const auto& drawn : draws) {
    std::vector<int64_t> before_eos;
    for (int64_t id : drawn) {
      if (id == tokenizer.eos_id()) break;
      before_eos.push_back(id);
    }
    lengths.push_back(static_cast<int64_t>(before_eos.size()));
    texts.push_back(tokenizer.IdsToString(before_eos));
    width = std::max<int64_t>(width, static_cast<int64_t>(drawn.size()));
  }
  at::Tensor ids = at::full({static_cast<int64_t>(draws.size()), width}, tokenizer.eos_id(), at::kLong);
  for (size_t i = 0; i < draws.size(); ++i) {
    if (!draws[i].empty()) {
      ids[static_cast<int64_t>(i)]
          .narrow(0, 0, static_cast<int64_t>(draws[i].size()))
          .copy_(at::tensor(draws[i], at::kLong));
    }
  }
  InferenceMap out;
  out["text"] = InferenceValue::Strings(std::move(texts));
  out["ids"] = InferenceValue::Of(ids);
  out["lengths"] = InferenceValue::Of(at::tensor(lengths, at::kLong));
  return out;
}

// The running batch. Its rows' steps are right-aligned in the caches: row i's first step is
// column start_i, the columns before it masked; its token at column c has position c - start_i.
// A joining request's prompts are read in one Step: alone, right-aligned among themselves, then
// joined to the running rows (step_states.h: RunningStates, which copies the joining rows only).
// Finished rows leave after each step (the last row moving into each one's place), and the
// columns no row reads any more are dropped once they are half the cache.
class LmGeneration : public GenerationBatch {
 public:
  LmGeneration(const TransformerLmTask& task, const BaseTokenizer& tokenizer)
      : task_(task), tokenizer_(tokenizer), theta_(task.theta()) {
    defaults_ = {task.decode_max_new_tokens_, task.decode_temperature_, task.decode_top_k_, 0};
    aux_ = task_.stack_->PrecomputeAux(task_.stack_.Theta(theta_), at::Tensor());
  }

  int64_t Join(const InferenceMap& feeds) override {
    auto prompts = feeds.find("prompt");
    if (prompts == feeds.end() || !prompts->second.is_strings()) {
      throw InvalidArgumentError("generate: the feed 'prompt' (strings) is missing");
    }
    const GenerateOptions o = ReadGenerateOptions(feeds, defaults_);
    const int64_t id = next_request_++;
    Request& r = requests_[id];
    r.draws.resize(prompts->second.strings.size());
    const auto ids = PromptIds(tokenizer_, prompts->second.strings);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (o.max_new_tokens <= 0) continue;  // nothing to draw
      Row row;
      row.request = id;
      row.index = static_cast<int64_t>(i);
      row.prompt = ids[i];
      row.options = o;
      row.gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
      joining_.push_back(std::move(row));
      ++r.rows_left;
    }
    if (r.rows_left == 0) finished_now_.push_back(id);
    return id;
  }

  GenerationStep Step() override {
    at::NoGradGuard no_grad;  // inference: the plan applies (ComputePlan::AppliesNow)
    EvalModeScope eval;
    if (!joining_.empty()) ReadPrompts();
    GenerationStep out;
    if (!rows_.empty()) DrawAll(out);
    out.finished.insert(out.finished.end(), finished_now_.begin(), finished_now_.end());
    finished_now_.clear();
    ++steps_;
    return out;
  }

  InferenceMap Finish(int64_t request) override {
    auto it = requests_.find(request);
    if (it == requests_.end() || it->second.rows_left > 0) {
      throw NotFoundError(StrCat("generate: no finished request ", request));
    }
    InferenceMap out = GenerateFetches(tokenizer_, it->second.draws);
    requests_.erase(it);
    return out;
  }

  void Cancel(int64_t request) override {
    if (!requests_.erase(request)) throw NotFoundError(StrCat("generate: no request ", request));
    std::erase_if(joining_, [&](const Row& r) { return r.request == request; });
    std::erase(finished_now_, request);
    for (int64_t i = static_cast<int64_t>(rows_.size()) - 1; i >= 0; --i) {
      if (rows_[i].request != request) continue;
      const int64_t moved = running_.RemoveRow(i);
      if (moved >= 0) rows_[i] = std::move(rows_[moved]);
      rows_.pop_back();
    }
    if (rows_.empty()) running_.Clear();
  }

  int64_t rows() const override { return static_cast<int64_t>(rows_.size() + joining_.size()); }
  bool busy() const override { return rows() > 0 || !finished_now_.empty(); }
  int64_t steps() const override { return steps_; }

 private:
  struct Row {
    int64_t request = 0, index = 0;
    std::vector<int64_t> prompt;
    GenerateOptions options;
    at::Generator gen;
    int64_t start = 0;  // its first column
    int64_t token = 0;  // what it reads next
  };
  struct Request {
    std::vector<std::vector<int64_t>> draws;  // per row
    int64_t rows_left = 0;
  };

  // Position embeddings of positions [0, n) at least.
  const at::Tensor& Positions(int64_t n) {
    if (!positions_.defined() || positions_.size(0) < n) {
      const int64_t want = std::max<int64_t>(n, positions_.defined() ? 2 * positions_.size(0) : 1024);
      positions_ = task_.position_emb_->FProp(task_.position_emb_.Theta(theta_), want);
    }
    return positions_;
  }

  // One step of the stack for `rows` (token and position each) over `states` of `steps` columns,
  // row i masking the columns before starts[i].
  at::Tensor StackStep(const std::vector<int64_t>& tokens, const std::vector<int64_t>& positions,
                       const std::vector<int64_t>& starts, int64_t steps, NestedMap* states) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    int64_t furthest = 0;
    for (int64_t p : positions) furthest = std::max(furthest, p);
    const at::Tensor pe = Positions(furthest + 1).index_select(0, at::tensor(positions, at::kLong));
    const at::Tensor x = task_.emb_->FProp(task_.emb_.Theta(theta_), at::tensor(tokens, at::kLong).unsqueeze(1))
                             .squeeze(1) + pe;
    at::Tensor paddings = at::zeros({n, steps + 1}, at::kFloat);
    float* p = paddings.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t s = 0; s < std::min(starts[i], steps + 1); ++s) p[i * (steps + 1) + s] = 1.0f;
    }
    auto [y, next] = task_.stack_->ExtendStepProjected(task_.stack_.Theta(theta_), x, *states,
                                                       aux_, at::Tensor(), paddings);
    *states = std::move(next);
    return y;
  }

  // The joining rows read their prompts but for the last token, right-aligned, then join.
  void ReadPrompts() {
    std::vector<Row> rows = std::move(joining_);
    joining_.clear();
    const int64_t k = static_cast<int64_t>(rows.size());
    int64_t steps = 0;
    for (const Row& r : rows) steps = std::max<int64_t>(steps, static_cast<int64_t>(r.prompt.size()) - 1);
    NestedMap states = task_.stack_->InitStates(k, at::kFloat);
    std::vector<int64_t> starts(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) {
      starts[i] = steps - (static_cast<int64_t>(rows[i].prompt.size()) - 1);
    }
    for (int64_t c = 0; c < steps; ++c) {
      std::vector<int64_t> tokens(static_cast<size_t>(k)), positions(static_cast<size_t>(k));
      for (int64_t i = 0; i < k; ++i) {
        const bool in = c >= starts[i];  // before its start a row reads a masked stand-in
        tokens[i] = rows[i].prompt[in ? c - starts[i] : 0];
        positions[i] = in ? c - starts[i] : 0;
      }
      StackStep(tokens, positions, starts, c, &states);
    }
    int64_t shift_running = 0, shift_joining = 0;
    running_.Join(states, &shift_running, &shift_joining);
    for (Row& r : rows_) r.start += shift_running;
    for (int64_t i = 0; i < k; ++i) {
      rows[i].start = starts[i] + shift_joining;
      rows[i].token = rows[i].prompt.back();
      rows_.push_back(std::move(rows[i]));
    }
  }

  void DrawAll(GenerationStep& out) {
    const int64_t n = static_cast<int64_t>(rows_.size());
    std::vector<int64_t> tokens(static_cast<size_t>(n)), positions(static_cast<size_t>(n)),
        starts(static_cast<size_t>(n));
    const int64_t cached = running_.steps();
    for (int64_t i = 0; i < n; ++i) {
      tokens[i] = rows_[i].token;
      positions[i] = cached - rows_[i].start;
      starts[i] = rows_[i].start;
    }
    NestedMap states = running_.View();
    const at::Tensor y = StackStep(tokens, positions, starts, cached, &states);
    running_.Adopt(states);
    const at::Tensor logits = task_.softmax_->Logits(task_.softmax_.Theta(theta_), y).to(at::kFloat);
    std::vector<int64_t> leaving;
    for (int64_t i = 0; i < n; ++i) {
      Row& r = rows_[i];
      const int64_t next = PickTokens(logits.narrow(0, i, 1), r.options.temperature, r.options.top_k,
                                      r.gen)[0].item<int64_t>();
      Request& req = requests_.at(r.request);
      auto& drawn = req.draws[r.index];
      drawn.push_back(next);
      r.token = next;
      out.tokens.push_back({r.request, r.index, next, tokenizer_.IdToPiece(next)});
      if (next == tokenizer_.eos_id() ||
          static_cast<int64_t>(drawn.size()) >= r.options.max_new_tokens) {
        if (--req.rows_left == 0) out.finished.push_back(r.request);
        leaving.push_back(i);
      }
    }
    // The finished rows leave, the last: the last row moves into each one's place.
    for (auto it = leaving.rbegin(); it != leaving.rend(); ++it) {
      const int64_t moved = running_.RemoveRow(*it);
      if (moved >= 0) rows_[*it] = std::move(rows_[moved]);
      rows_.pop_back();
    }
    if (rows_.empty()) {
      running_.Clear();
      return;
    }
    // Drop the columns before every row's first once they are half the cache.
    int64_t first = running_.steps();
    for (const Row& r : rows_) first = std::min(first, r.start);
    if (first >= 64 && 2 * first >= running_.steps()) {
      running_.DropSteps(first);
      for (Row& r : rows_) r.start -= first;
    }
  }

  const TransformerLmTask& task_;
  const BaseTokenizer& tokenizer_;
  const NestedMap theta_;
  GenerateOptions defaults_;
  NestedMap aux_;
  at::Tensor positions_;
  std::map<int64_t, Request> requests_;
  std::vector<Row> rows_, joining_;
  std::vector<int64_t> finished_now_;
  RunningStates running_;
  int64_t steps_ = 0, next_request_ = 0;
};

std::unique_ptr<GenerationBatch> MakeLmGeneration(const TransformerLmTask& task,
                                                  const BaseTokenizer& tokenizer) {
  return std::make_unique<LmGeneration>(task, tokenizer);
}

}  // namespace glossa
