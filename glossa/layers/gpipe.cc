#include "glossa/layers/gpipe.h"

#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>
#include <torch/csrc/autograd/autograd.h>

#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/layers/channel.h"
#include "glossa/layers/custom_gradient.h"
#include "glossa/layers/block.h"
#include "glossa/summary/summary.h"

namespace glossa {

std::vector<int64_t> EvenStageEnds(int64_t cells, int64_t stages) {
  std::vector<int64_t> ends;
  int64_t end = 0;
  for (int64_t s = 0; s < stages; ++s) {
    end += cells / stages + (s < cells % stages ? 1 : 0);
    ends.push_back(end);
  }
  return ends;
}

namespace {

// Runs fn(stage) on one thread per stage with the caller's ATen thread-local state, eval mode and
// global step. The first exception closes every channel (so no stage waits forever) and is
// rethrown after all threads have joined.
void RunStages(int64_t stages, std::vector<std::unique_ptr<Channel>>& channels,
               const std::function<void(int64_t)>& fn) {
  const at::ThreadLocalState tls;
  const bool eval = IsEvalMode();
  const int64_t global_step = GetGlobalStep();
  std::mutex mu;
  std::exception_ptr error;
  std::vector<std::thread> threads;
  auto fail = [&](int64_t s) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) error = std::current_exception();
    for (auto& ch : channels) ch->Close(StrCat("stage ", s, " failed"));
  };
  for (int64_t s = 0; s < stages; ++s) {
    try {
      threads.emplace_back([&, s] {
        try {
          at::ThreadLocalStateGuard tls_guard(tls);
          EvalModeScope eval_scope(eval);
          GlobalStepContext step(global_step);
          fn(s);
        } catch (...) {
          fail(s);
        }
      });
    } catch (...) {  // no thread for stage s: stop the others, then report
      fail(s);
      break;
    }
  }
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

glossa::Params PipeliningLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<PipeliningLayer>());
  p.Define("cell_tpl", ParamValue::List{}, "The cells: a list of layer Params applied in order.");
  p.Define("num_stages", 0, "Pipeline stages (0: one per cell); cells are split evenly.");
  p.Define("stage_ends", ParamValue::List{},
           "Increasing cell end indices of the stages, the last equal to the cell count "
           "(overrides num_stages).");
  p.Define("num_micro_batches", 1, "Micro-batches the batch is split into.");
  p.Define("micro_batch_size", nullptr,
           "Examples per micro-batch (None: batch / num_micro_batches); with num_micro_batches "
           "> 1 their product must equal the batch.");
  p.Define("batch_dim", 0, "The batch dimension of the inputs.");
  return p;
}

PipeliningLayer::PipeliningLayer(const glossa::Params& p) : BaseLayer(p) {
  auto fail = [&](const std::string& what) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': ", what));
  };
  const ParamValue& cells = params().Get("cell_tpl");
  if (!cells.is_list() || cells.AsList().empty()) fail("cell_tpl must be a non-empty list");
  CreateChildren("cells", cells);
  cells_ = GetChildren("cells");
  for (const BaseLayer* c : cells_) {
    CheckReplayable(*c, StrCat("pipeline '", path(), "'"));
    blocks_.push_back(&AsBlock(*c, StrCat("pipeline '", path(), "'")));
    cell_seeds_.push_back(GenerateSeedFromName(c->path()));
  }
  const int64_t n = static_cast<int64_t>(cells_.size());
  const auto& ends = params().Get("stage_ends").AsList();
  if (!ends.empty()) {
    int64_t prev = 0;
    for (const auto& e : ends) {
      const int64_t end = e.AsInt();
      if (end <= prev)
        fail(StrCat("stage_ends must be increasing and > 0, got ", end, " after ", prev));
      ends_.push_back(end);
      prev = end;
    }
    if (prev != n) fail(StrCat("the last stage end must be the cell count ", n, ", got ", prev));
  } else {
    const int64_t stages = params().GetInt("num_stages") > 0 ? params().GetInt("num_stages") : n;
    if (stages > n) fail(StrCat("num_stages ", stages, " exceeds the cell count ", n));
    ends_ = EvenStageEnds(n, stages);
  }
  num_micro_batches_ = params().GetInt("num_micro_batches");
  if (num_micro_batches_ <= 0) fail("num_micro_batches must be > 0");
  batch_dim_ = params().GetInt("batch_dim");
  const ParamValue& mbs = params().Get("micro_batch_size");
  if (!mbs.is_none()) micro_batch_size_ = mbs.AsInt();
}

namespace {

// What one pipelined FProp shares between its forward pass and its backward pass (which runs
// after FProp has returned): the cells, the micro-batching and the saved stage inputs.
struct PipelineRun {
  const BaseLayer* layer = nullptr;  // the pipeline (for its path)
  std::vector<BaseLayer*> cells;
  std::vector<const Block*> blocks;
  std::vector<int64_t> cell_seeds;
  std::vector<int64_t> ends;                      // cell end index (exclusive) of each stage
  int64_t stages = 0, m = 0, size = 0, dim = 0;  // m micro-batches of `size` along dim
  at::ScalarType dtype = at::kFloat;              // of the activations
  std::vector<int64_t> micro_shape;               // one micro-batch's activation shape
  int64_t global_step = 0;
  std::vector<std::vector<at::Tensor>> stage_inputs;  // [stage][micro-batch]
  std::vector<at::Tensor> paddings;                   // per micro-batch (or undefined)
};

// The number and size of the micro-batches a batch of `batch` splits into (num_micro_batches m,
// or micro_batch_size when set); throws when they do not fit the batch.
std::pair<int64_t, int64_t> MicroBatches(const std::string& path, int64_t batch, int64_t m,
                                         const std::optional<int64_t>& micro_batch_size) {
  int64_t size = 0;
  if (micro_batch_size) {
    size = *micro_batch_size;
    if (size <= 0 || (m > 1 && size * m != batch) || batch % size != 0) {
      throw InvalidArgumentError(StrCat("layer '", path, "': micro_batch_size ", size,
                                        " x num_micro_batches ", m, " does not match the batch ",
                                        batch));
    }
    m = batch / size;
  } else {
    if (batch % m != 0) {
      throw InvalidArgumentError(StrCat("layer '", path, "': the batch ", batch,
                                        " does not split into ", m, " micro-batches"));
    }
    size = batch / m;
  }
  return {m, size};
}

// Runs stage s on micro-batch t (cells in order, each from its own step seed).
at::Tensor RunStage(const PipelineRun& run, int64_t s, const NestedValue::List& thetas,
                    at::Tensor x, int64_t t) {
  OverWriteGlobalStepContext overwrite(run.global_step * run.m + t);
  for (int64_t c = s == 0 ? 0 : run.ends[s - 1]; c < run.ends[s]; ++c) {
    ResetStepSeed(run.cell_seeds[c]);
    x = run.blocks[c]->FPropBlock(thetas[c].AsMap(), x, run.paddings[t]);
  }
  return x;
}

// The channels between neighbouring stages: for activations (chs[s]: stage s -> s + 1) or, when
// `backward`, for gradients (chs[s]: stage s + 1 -> s).
std::vector<std::unique_ptr<Channel>> MakeChannels(const PipelineRun& run, bool backward) {
  std::vector<std::unique_ptr<Channel>> chs;
  for (int64_t s = 0; s + 1 < run.stages; ++s) {
    const std::string a = StrCat("stage", s), b = StrCat("stage", s + 1);
    chs.push_back(std::make_unique<Channel>(
        StrCat(run.layer->path(), backward ? "/grad:" : "/", backward ? b : a, "->",
               backward ? a : b),
        run.dtype, run.micro_shape, backward ? b : a, backward ? a : b));
  }
  return chs;
}

// The forward pass: every stage runs its cells on each micro-batch in turn, without gradients,
// keeping its inputs for the backward's recompute; the last stage's outputs make "y".
NestedMap PipelineForward(PipelineRun& run, const NestedMap& in) {
  const auto& thetas = in.at("cells").AsList();
  const at::Tensor xin = in.GetTensor("x");
  std::vector<at::Tensor> outputs(run.m);
  auto chs = MakeChannels(run, false);  // chs[s]: stage s -> s + 1
  // Summaries the cells record on the stage threads reach the caller's context, under the
  // caller's name scope, in stage order (the backward's recompute records none).
  SummaryContext* caller_summaries = SummaryContext::Current();
  const std::string summary_scope = SummaryNameScope::Current();
  std::vector<std::vector<SummaryContext::Entry>> stage_summaries(run.stages);
  RunStages(run.stages, chs, [&](int64_t s) {
    at::NoGradGuard no_grad;
    std::optional<SummaryContext> summaries;
    std::optional<SummaryNameScope> scope;
    if (caller_summaries != nullptr) {
      summaries.emplace();
      if (!summary_scope.empty()) scope.emplace(summary_scope);
    }
    for (int64_t t = 0; t < run.m; ++t) {
      at::Tensor xt = s == 0 ? xin.narrow(run.dim, t * run.size, run.size) : chs[s - 1]->Recv();
      run.stage_inputs[s][t] = xt;
      at::Tensor y = RunStage(run, s, thetas, xt, t);
      if (s + 1 < run.stages) {
        chs[s]->Send(y);
      } else {
        outputs[t] = y;
      }
    }
    if (summaries) stage_summaries[s] = summaries->TakeEntries();
  });
  if (caller_summaries != nullptr) {
    // One value per pipeline call: the micro-batches' values reduce as a loop's do.
    SummaryLoop micro_batches;
    for (auto& entries : stage_summaries) caller_summaries->RecordEntries(std::move(entries));
  }
  return NestedMap{{"y", at::cat(outputs, run.dim)}};
}

// Disables the accumulators of the cells for its lifetime: the recompute must not count again;
// re-enabled on every exit path.
struct AccumulatorsOff {
  std::vector<BaseLayer*> cells;
  explicit AccumulatorsOff(std::vector<BaseLayer*> c) : cells(std::move(c)) {
    for (BaseLayer* l : cells) l->DisableAccumulators();
  }
  ~AccumulatorsOff() {
    for (BaseLayer* l : cells) l->EnableAccumulators();
  }
};

// A backward stage's fresh leaves for its cells' weights, and their gradients summed over the
// micro-batches.
struct StageLeaves {
  NestedValue::List leaves;       // by cell index (set for this stage's cells only)
  std::vector<at::Tensor> wrt_w;  // the leaves' tensors, flattened in cell order
  std::vector<at::Tensor> sums;   // their gradients summed so far (undefined: none yet)
};

// Fresh leaves for the weights of cells [first, end); their gradients sum over micro-batches.
StageLeaves MakeStageLeaves(const NestedValue::List& thetas, int64_t first, int64_t end) {
  StageLeaves w;
  w.leaves = NestedValue::List(thetas.size());
  for (int64_t c = first; c < end; ++c) {
    NestedMap l = DetachedLeaves(thetas[c].AsMap());
    for (const auto& t : l.FlattenTensors()) w.wrt_w.push_back(t);
    w.leaves[c] = std::move(l);
  }
  w.sums.resize(w.wrt_w.size());
  return w;
}

// Recomputes stage s on micro-batch t from its saved input, under autograd, and backpropagates
// dyt: adds the weights' gradients into w.sums and returns the input's (zeros when it has none).
at::Tensor RecomputeMicroBatch(const PipelineRun& run, int64_t s, int64_t t, const at::Tensor& dyt,
                               StageLeaves& w) {
  at::Tensor xt = run.stage_inputs[s][t].detach();
  if (at::isFloatingType(xt.scalar_type())) xt.requires_grad_(true);
  at::Tensor y = RunStage(run, s, w.leaves, xt, t);
  // Differentiate with respect to what requires a gradient: the stage input when it is
  // floating, and the floating weights.
  std::vector<at::Tensor> wrt;
  if (xt.requires_grad()) wrt.push_back(xt);
  const size_t first_w = wrt.size();
  std::vector<size_t> used;  // indices into w.wrt_w
  for (size_t i = 0; i < w.wrt_w.size(); ++i) {
    if (w.wrt_w[i].requires_grad()) {
      wrt.push_back(w.wrt_w[i]);
      used.push_back(i);
    }
  }
  std::vector<at::Tensor> g(wrt.size());
  if (y.requires_grad() && !wrt.empty()) {
    g = torch::autograd::grad({y}, wrt, {dyt}, /*retain_graph=*/false,
                              /*create_graph=*/false, /*allow_unused=*/true);
  }
  for (size_t k = 0; k < used.size(); ++k) {
    const at::Tensor& gw = g[first_w + k];
    if (!gw.defined()) continue;
    w.sums[used[k]] = w.sums[used[k]].defined() ? w.sums[used[k]] + gw : gw;
  }
  const at::Tensor gx_raw = first_w == 1 ? g[0] : at::Tensor();
  at::Tensor gx = gx_raw.defined() ? gx_raw : at::zeros_like(xt);
  return gx;
}

// The gradients of cells [first, end) in their weights' structure (zeros where none flowed).
void PackStageGradients(const StageLeaves& w, int64_t first, int64_t end,
                        std::vector<NestedValue>& d_cells) {
  size_t k = 0;
  for (int64_t c = first; c < end; ++c) {
    const NestedMap& l = w.leaves[c].AsMap();
    std::vector<at::Tensor> grads;
    for (const auto& v : l.FlattenTensors()) {
      grads.push_back(w.sums[k].defined() ? w.sums[k] : at::zeros_like(v));
      ++k;
    }
    d_cells[c] = l.Pack(grads);
  }
}

// What the stages of one backward pass share.
struct BackwardPass {
  const PipelineRun& run;
  const NestedValue::List& thetas;
  const at::Tensor& dy;
  std::vector<std::unique_ptr<Channel>>& chs;  // chs[s]: stage s + 1 -> s
  std::vector<at::Tensor>& dx;                 // per micro-batch
  std::vector<NestedValue>& d_cells;
};

// Stage s of the backward pass: recomputes its micro-batches, last first, passing the input
// gradients back, then packs its cells' weight gradients into p.d_cells.
void BackwardStage(const BackwardPass& p, int64_t s) {
  const PipelineRun& run = p.run;
  at::AutoGradMode grad_mode(true);
  const int64_t first = s == 0 ? 0 : run.ends[s - 1];
  StageLeaves w = MakeStageLeaves(p.thetas, first, run.ends[s]);
  AccumulatorsOff accumulators_off(
      std::vector<BaseLayer*>(run.cells.begin() + first, run.cells.begin() + run.ends[s]));
  for (int64_t t = run.m - 1; t >= 0; --t) {
    at::Tensor dyt =
        s + 1 == run.stages ? p.dy.narrow(run.dim, t * run.size, run.size) : p.chs[s]->Recv();
    at::Tensor gx = RecomputeMicroBatch(run, s, t, dyt, w);
    if (s > 0) {
      p.chs[s - 1]->Send(gx);
    } else {
      p.dx[t] = gx;
    }
  }
  PackStageGradients(w, first, run.ends[s], p.d_cells);
}

// The backward pass: the pipeline in reverse, gradients flowing back over channels; returns the
// gradients of "cells" and "x".
NestedMap PipelineBackward(PipelineRun& run, const NestedMap& in, const NestedMap& dys) {
  const auto& thetas = in.at("cells").AsList();
  const at::Tensor dy = dys.GetTensor("y");
  std::vector<at::Tensor> dx(run.m);
  std::vector<NestedValue> d_cells(run.cells.size());
  auto chs = MakeChannels(run, true);  // chs[s]: stage s + 1 -> s
  const BackwardPass pass{run, thetas, dy, chs, dx, d_cells};
  RunStages(run.stages, chs, [&](int64_t s) { BackwardStage(pass, s); });
  for (auto& per_stage : run.stage_inputs) {
    for (auto& t : per_stage) t = at::Tensor();  // the boundaries are not needed any more
  }
  NestedMap dxs;
  dxs.Set("cells", NestedValue::List(d_cells.begin(), d_cells.end()));
  dxs.Set("x", at::cat(dx, run.dim));
  return dxs;
}

}  // namespace

at::Tensor PipeliningLayer::FProp(const NestedMap& theta, const at::Tensor& inputs,
                                  const at::Tensor& paddings) const {
  const int64_t dim = batch_dim_;
  if (dim < 0 || dim >= inputs.dim()) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': batch_dim ", dim,
                                      " is out of range for inputs of rank ", inputs.dim()));
  }
  const int64_t batch = inputs.size(dim);
  const auto [m, size] = MicroBatches(path(), batch, num_micro_batches_, micro_batch_size_);
  if (paddings.defined() && (dim != 0 || paddings.size(0) != batch)) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': paddings must have the batch (", batch,
                                      ") as dim 0, with batch_dim 0; got paddings of dim 0 size ",
                                      paddings.size(0), " and batch_dim ", dim));
  }
  const int64_t stages = num_stages();

  // Shared by fwd and bak: bak runs in the backward pass, after this call has returned.
  auto run = std::make_shared<PipelineRun>();
  run->layer = this;
  run->cells = cells_;
  run->blocks = blocks_;
  run->cell_seeds = cell_seeds_;
  run->ends = ends_;
  run->stages = stages;
  run->m = m;
  run->size = size;
  run->dim = dim;
  run->global_step = GetGlobalStep();
  run->stage_inputs.assign(stages, std::vector<at::Tensor>(m));
  for (int64_t t = 0; t < m; ++t) {
    run->paddings.push_back(paddings.defined() ? paddings.narrow(0, t * size, size)
                                               : at::Tensor());
  }
  const at::Tensor x = CastToFPropDtype(inputs);
  run->micro_shape = x.sizes().vec();
  run->micro_shape[dim] = size;
  run->dtype = x.scalar_type();

  auto fwd = [run](const NestedMap& in) { return PipelineForward(*run, in); };
  auto bak = [run](const NestedMap& in, const NestedMap&, const NestedMap& dys) {
    return PipelineBackward(*run, in, dys);
  };
  NestedMap xs;
  xs.Set("cells", theta.at("cells"));
  xs.Set("x", x);
  return CallWithCustomGradient(fwd, bak, xs).GetTensor("y");
}

GLOSSA_REGISTER_CLASS(PipeliningLayer, "glossa.layers.PipeliningLayer");

}  // namespace glossa
