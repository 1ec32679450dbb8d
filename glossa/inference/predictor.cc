#include "glossa/inference/predictor.h"

#include <ATen/ATen.h>
#include <malloc.h>

#include <algorithm>
#include <optional>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/optim/ema.h"
#include "glossa/checkpoint/checkpointer.h"
#include "glossa/checkpoint/saver.h"

namespace glossa {

// A string feed longer than this many bytes per token of max_input_tokens is refused before it is
// tokenized (4096 tokens: 128 KiB).
constexpr int64_t kMaxBytesPerInputToken = 32;

struct Predictor::Loaded {
  std::unique_ptr<BaseModel> owned;  // null for the bundle's own model
  const BaseModel* model = nullptr;
  int64_t global_step = 0;
  std::shared_ptr<const ComputePlan> plan;  // set on model
  // The model's theta, built once for these weights (every Run reads it; BaseTask::RunInference).
  NestedMap theta;
};

namespace {

std::string Names(const std::map<std::string, InferenceSubgraphSpec>& m) {
  std::vector<std::string> n;
  for (const auto& [k, v] : m) n.push_back(k);
  return Join(n, ", ");
}

std::string FeedNames(const std::map<std::string, TensorSpec>& m) {
  std::vector<std::string> n;
  for (const auto& [k, v] : m) n.push_back(k);
  return Join(n, ", ");
}

std::unique_ptr<BaseModel> ModelFromCheckpoint(const Params& bundle_params,
                                               const std::string& checkpoint, int64_t* step) {
  Params p = bundle_params.Copy();
  if (!p.IsSet("random_seed")) p.Set("random_seed", 0);  // overwritten by the checkpoint
  auto model = InstantiateLayer<BaseModel>(p);
  const std::shared_ptr<ExponentialMovingAverage> ema = MakeModelEma(*model);
  const std::optional<int64_t> s = RestoreForEval(LoadCheckpoint(checkpoint), *model, ema.get());
  *step = s.value_or(0);
  std::map<std::string, at::Tensor> served;
  const auto shadows = ema ? ema->Shadows() : std::map<std::string, at::Tensor>{};
  for (const auto& [info, t] : model->AllVariables()) {
    auto it = shadows.find(info.full_name + ExponentialMovingAverage::kSuffix);
    served[info.full_name] = it != shadows.end() ? it->second : t;
  }
  CheckFiniteWeights(served, StrCat("checkpoint '", checkpoint, "'"));
  if (ema) {  // serve the averages: copy them into the variables
    at::NoGradGuard no_grad;
    const auto shadows = ema->Shadows();
    for (const auto& [info, t] : model->AllVariables()) {
      auto it = shadows.find(info.full_name + ExponentialMovingAverage::kSuffix);
      if (it != shadows.end()) const_cast<at::Tensor&>(t).copy_(it->second);
    }
  }
  return model;
}

}  // namespace

Predictor::Predictor(const std::string& bundle_dir, PredictorOptions options)
    : bundle_(LoadBundle(bundle_dir)), options_(std::move(options)) {
  // What the bundle exported (its inference graph), each of which the task must still run.
  const auto& all = bundle_.subgraphs;
  const auto declared = bundle_.model->task().Inference();
  for (const auto& [name, spec] : all) {
    if (!declared.count(name)) {
      throw FailedPreconditionError(StrCat("bundle '", bundle_dir, "': its inference graph has "
                                           "subgraph '", name, "', which the task does not run"));
    }
  }
  if (options_.subgraphs.empty()) {
    specs_ = all;
  } else {
    for (const auto& name : options_.subgraphs) {
      auto it = all.find(name);
      if (it == all.end()) {
        throw NotFoundError(StrCat("bundle '", bundle_dir, "' has no subgraph '", name,
                                   "' (it has: ", Names(all), ")"));
      }
      specs_[name] = it->second;
    }
  }
  auto q = bundle_.manifest.find("quantize");
  policy_.precision =
      !options_.precision.empty()
          ? ParsePrecision(options_.precision, "precision")
          : ParsePrecision(q != bundle_.manifest.end() ? q->second : "",
                           StrCat("bundle '", bundle_dir, "': manifest quantize"));
  policy_.batch_invariant = options_.batch_invariant;
  policy_.fused_decoder_step = options_.fused_decoder_step;
  auto loaded = std::make_shared<Loaded>();
  loaded->model = bundle_.model.get();
  loaded->global_step = bundle_.global_step;
  loaded->plan = PlanInference(*bundle_.model, policy_);
  bundle_.model->SetComputePlan(loaded->plan);
  loaded->theta = bundle_.model->task().theta();
  current_ = loaded;
  if (!options_.checkpoint.empty()) Load(options_.checkpoint);
}

Predictor::~Predictor() = default;

std::shared_ptr<const Predictor::Loaded> Predictor::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

int64_t Predictor::global_step() const { return Current()->global_step; }

void Predictor::Load(const std::string& checkpoint) {
  auto loaded = std::make_shared<Loaded>();
  loaded->owned = ModelFromCheckpoint(bundle_.model_params, checkpoint, &loaded->global_step);
  loaded->model = loaded->owned.get();
  loaded->plan = PlanInference(*loaded->owned, policy_);  // prepared before any Run sees it
  loaded->owned->SetComputePlan(loaded->plan);
  loaded->theta = loaded->owned->task().theta();
  std::shared_ptr<const Loaded> previous = std::move(loaded);
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(current_, previous);
  }
  previous.reset();  // the previous model, unless a Run still holds it
  // The process keeps freed memory for reuse (glossa/runtime/cpu_runtime.cc raises glibc's trim
  // threshold for training); a serving process reloading weights for days must hand the freed
  // copies back, or fragmentation across the threads' arenas grows its memory with every reload.
  malloc_trim(0);
}

void Predictor::CheckRange(const std::string& what, const std::string& name,
                           const TensorSpec& s, const at::Tensor& t) const {
  if (t.numel() == 0) return;
  const at::Tensor d = t.to(at::kDouble);
  if (t.is_floating_point() && !at::isfinite(d).all().item<bool>()) {
    throw InvalidArgumentError(StrCat(what, " must be finite"));
  }
  const double lo = d.min().item<double>(), hi = d.max().item<double>();
  std::optional<double> max = s.max;
  if (name == "max_new_tokens") {
    max = std::min(max.value_or(options_.max_new_tokens), double(options_.max_new_tokens));
  }
  auto show = [&](double x) { return t.is_floating_point() ? PyFloatRepr(x) : StrCat(int64_t(x)); };
  if ((s.min && lo < *s.min) || (max && hi > *max)) {
    const double bad = s.min && lo < *s.min ? lo : hi;
    throw InvalidArgumentError(StrCat(what, " is ", show(bad), "; it must be in [",
                                      s.min ? show(*s.min) : std::string("-inf"), ", ",
                                      max ? show(*max) : std::string("inf"), "]",
                                      name == "max_new_tokens" ? " (max_new_tokens)" : ""));
  }
}

void Predictor::CheckFeeds(const std::string& subgraph, const InferenceSubgraphSpec& spec,
                           const InferenceMap& feeds, const BaseTokenizer* tokenizer) const {
  const std::string where = StrCat("subgraph '", subgraph, "'");
  for (const auto& [name, value] : feeds) {
    if (!spec.feeds.count(name)) {
      throw InvalidArgumentError(StrCat(where, ": unknown feed '", name, "' (its feeds: ",
                                        FeedNames(spec.feeds), ")"));
    }
  }
  int64_t batch = -1;
  for (const auto& [name, s] : spec.feeds) {
    auto it = feeds.find(name);
    if (it == feeds.end()) {
      if (s.optional) continue;
      throw InvalidArgumentError(StrCat(where, ": missing feed '", name, "' (", s.dtype, ", rank ",
                                        s.rank, ")"));
    }
    const InferenceValue& v = it->second;
    const std::string what = StrCat(where, ": feed '", name, "'");
    int64_t n = -1;
    if (s.dtype == "string") {
      if (!v.is_strings()) throw InvalidArgumentError(StrCat(what, " must be strings, got a tensor"));
      n = static_cast<int64_t>(v.strings.size());
      if (tokenizer != nullptr && !s.bytes) {
        for (size_t i = 0; i < v.strings.size(); ++i) {
          // Every tokenizer makes at most one token per byte: short strings need no count.
          const auto bytes = static_cast<int64_t>(v.strings[i].size());
          if (bytes <= options_.max_input_tokens) continue;
          // Bounded before tokenizing too: tokenizing costs time by the byte.
          if (bytes > kMaxBytesPerInputToken * options_.max_input_tokens) {
            throw InvalidArgumentError(StrCat(what, "[", i, "] is ", bytes, " bytes, more than ",
                                              kMaxBytesPerInputToken, " per token of "
                                              "max_input_tokens ", options_.max_input_tokens,
                                              " (", kMaxBytesPerInputToken *
                                                        options_.max_input_tokens, " bytes)"));
          }
          const auto len = static_cast<int64_t>(tokenizer->StringToIds(v.strings[i]).size());
          if (len > options_.max_input_tokens) {
            throw InvalidArgumentError(StrCat(what, "[", i, "] is ", len,
                                              " tokens, more than max_input_tokens ",
                                              options_.max_input_tokens));
          }
        }
      }
    } else {
      if (v.is_strings()) {
        throw InvalidArgumentError(StrCat(what, " must be a ", s.dtype, " tensor, got strings"));
      }
      const bool ok_type = s.dtype == "int64" ? !v.tensor.is_floating_point() &&
                                                    v.tensor.scalar_type() != at::kBool
                                              : v.tensor.is_floating_point();
      if (!ok_type) {
        throw InvalidArgumentError(StrCat(what, " must be ", s.dtype, ", got ",
                                          c10::toString(v.tensor.scalar_type())));
      }
      if (v.tensor.dim() != s.rank) {
        throw InvalidArgumentError(StrCat(what, " must have rank ", s.rank, ", got shape ",
                                          v.tensor.sizes()));
      }
      CheckRange(what, name, s, v.tensor);
      if (s.rank > 0) n = v.tensor.size(0);
    }
    if (s.rank == 0) continue;
    if (n == 0) throw InvalidArgumentError(StrCat(what, " is an empty batch"));
    if (n > options_.max_batch_size) {
      throw InvalidArgumentError(StrCat(what, " has ", n, " examples, more than max_batch_size ",
                                        options_.max_batch_size));
    }
    if (batch >= 0 && n != batch) {
      throw InvalidArgumentError(StrCat(what, " has ", n, " examples, the other feeds ", batch));
    }
    batch = n;
  }
}

void Predictor::Validate(const std::string& subgraph, const InferenceMap& feeds,
                         const std::vector<std::string>& fetch_keys,
                         bool validate_fetches) const {
  auto it = specs_.find(subgraph);
  if (it == specs_.end()) {
    throw NotFoundError(StrCat("no subgraph '", subgraph, "' (subgraphs: ", Names(specs_), ")"));
  }
  for (const auto& key : fetch_keys) {
    if (validate_fetches && !it->second.fetches.count(key)) {
      throw InvalidArgumentError(StrCat("subgraph '", subgraph, "': unknown fetch '", key,
                                        "' (its fetches: ", FeedNames(it->second.fetches), ")"));
    }
  }
  CheckFeeds(subgraph, it->second, feeds, bundle_.tokenizer.get());
}

InferenceMap Predictor::Run(const std::string& subgraph, const InferenceMap& feeds,
                            const std::vector<std::string>& fetch_keys, bool validate_fetches,
                            int64_t* global_step) const {
  Validate(subgraph, feeds, fetch_keys, validate_fetches);
  const std::shared_ptr<const Loaded> loaded = Current();  // this Run's weights, whatever Load does
  if (global_step != nullptr) *global_step = loaded->global_step;
  at::NoGradGuard no_grad;  // inference: the plan applies (ComputePlan::AppliesNow)
  InferenceMap all = loaded->model->task().RunInference(loaded->theta, subgraph, feeds,
                                                        bundle_.tokenizer.get());
  // A NaN is never an answer (JSON would carry it as null): the model or its input broke.
  for (const auto& [key, v] : all) {
    if (!v.is_strings() && v.tensor.is_floating_point() && at::isnan(v.tensor).any().item<bool>()) {
      throw InternalError(StrCat("subgraph '", subgraph, "': fetch '", key,
                                 "' holds NaN values (the weights at global step ",
                                 loaded->global_step, " or this input give no finite answer)"));
    }
  }
  if (fetch_keys.empty()) return all;
  InferenceMap out;
  for (const auto& key : fetch_keys) {
    auto f = all.find(key);
    if (f != all.end()) out[key] = f->second;
  }
  return out;
}

namespace {

// A task's batch with the weights it runs on held, and each request's feeds checked first.
class PredictorGeneration : public GenerationBatch {
 public:
  PredictorGeneration(const Predictor& predictor, std::string subgraph,
                      std::shared_ptr<const void> weights, std::unique_ptr<GenerationBatch> batch)
      : predictor_(predictor), subgraph_(std::move(subgraph)), weights_(std::move(weights)),
        batch_(std::move(batch)) {}
  int64_t Join(const InferenceMap& feeds) override {
    predictor_.Validate(subgraph_, feeds);
    return batch_->Join(feeds);
  }
  GenerationStep Step() override { return batch_->Step(); }
  InferenceMap Finish(int64_t request) override { return batch_->Finish(request); }
  void Cancel(int64_t request) override { batch_->Cancel(request); }
  int64_t rows() const override { return batch_->rows(); }
  bool busy() const override { return batch_->busy(); }
  int64_t steps() const override { return batch_->steps(); }

 private:
  const Predictor& predictor_;
  const std::string subgraph_;
  const std::shared_ptr<const void> weights_;
  const std::unique_ptr<GenerationBatch> batch_;
};

}  // namespace

std::unique_ptr<GenerationBatch> Predictor::StartGeneration(const std::string& subgraph,
                                                            int64_t* global_step) const {
  if (!specs_.count(subgraph)) Validate(subgraph, {});  // NotFound listing the subgraphs
  const std::shared_ptr<const Loaded> loaded = Current();
  if (global_step != nullptr) *global_step = loaded->global_step;
  std::unique_ptr<GenerationBatch> batch =
      loaded->model->task().StartGeneration(subgraph, bundle_.tokenizer.get());
  if (batch == nullptr) return nullptr;
  return std::make_unique<PredictorGeneration>(*this, subgraph, loaded, std::move(batch));
}

size_t Predictor::prepared_weights() const { return Current()->plan->size(); }

std::vector<std::string> Predictor::plan_notes() const { return Current()->plan->notes(); }

int64_t Predictor::CountTokens(const std::string& text) const {
  if (bundle_.tokenizer == nullptr) return static_cast<int64_t>(text.size());
  return static_cast<int64_t>(bundle_.tokenizer->StringToIds(text).size());
}

}  // namespace glossa
