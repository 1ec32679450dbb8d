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

at::Tensor PipeliningLayer::FProp(const NestedMap& theta, const at::Tensor& inputs,
                                  const at::Tensor& paddings) const {
  const int64_t dim = batch_dim_;
  if (dim < 0 || dim >= inputs.dim()) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': batch_dim ", dim,
                                      " is out of range for inputs of rank ", inputs.dim()));
  }
  const int64_t batch = inputs.size(dim);
  int64_t m = num_micro_batches_;
  int64_t size = 0;
  if (micro_batch_size_) {
    size = *micro_batch_size_;
    if (size <= 0 || (m > 1 && size * m != batch) || batch % size != 0) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': micro_batch_size ", size,
                                        " x num_micro_batches ", m, " does not match the batch ",
                                        batch));
    }
    m = batch / size;
  } else {
    if (batch % m != 0) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': the batch ", batch,
                                        " does not split into ", m, " micro-batches"));
    }
    size = batch / m;
  }
  if (paddings.defined() && (dim != 0 || paddings.size(0) != batch)) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': paddings must have the batch (", batch,
                                      ") as dim 0, with batch_dim 0; got paddings of dim 0 size ",
                                      paddings.size(0), " and batch_dim ", dim));
  }
  const int64_t stages = num_stages();

  struct State {
    std::vector<std::vector<at::Tensor>> stage_inputs;  // [stage][micro-batch]
    std::vector<at::Tensor> paddings;                   // per micro-batch (or undefined)
    int64_t global_step = 0;
  };
  auto state = std::make_shared<State>();
  state->global_step = GetGlobalStep();
  state->stage_inputs.assign(stages, std::vector<at::Tensor>(m));
  for (int64_t t = 0; t < m; ++t) {
    state->paddings.push_back(paddings.defined() ? paddings.narrow(0, t * size, size)
                                                 : at::Tensor());
  }
  // Runs stage s on micro-batch t (cells in order, each from its own step seed).
  auto run_stage = [this, state, m](int64_t s, const NestedValue::List& thetas, at::Tensor x,
                                    int64_t t) {
    OverWriteGlobalStepContext overwrite(state->global_step * m + t);
    for (int64_t c = s == 0 ? 0 : ends_[s - 1]; c < ends_[s]; ++c) {
      ResetStepSeed(cell_seeds_[c]);
      x = blocks_[c]->FPropBlock(thetas[c].AsMap(), x, state->paddings[t]);
    }
    return x;
  };
  const at::Tensor x = CastToFPropDtype(inputs);
  std::vector<int64_t> micro_shape = x.sizes().vec();
  micro_shape[dim] = size;
  const at::ScalarType dtype = x.scalar_type();
  // Captured by value: bak runs in the backward pass, after this call has returned.
  auto make_channels = [this, stages, dtype, micro_shape](bool backward) {
    std::vector<std::unique_ptr<Channel>> chs;
    for (int64_t s = 0; s + 1 < stages; ++s) {
      const std::string a = StrCat("stage", s), b = StrCat("stage", s + 1);
      chs.push_back(std::make_unique<Channel>(
          StrCat(path(), backward ? "/grad:" : "/", backward ? b : a, "->", backward ? a : b),
          dtype, micro_shape, backward ? b : a, backward ? a : b));
    }
    return chs;
  };

  auto fwd = [this, state, run_stage, make_channels, stages, m, size, dim](const NestedMap& in) {
    const auto& thetas = in.at("cells").AsList();
    const at::Tensor xin = in.GetTensor("x");
    std::vector<at::Tensor> outputs(m);
    auto chs = make_channels(false);  // chs[s]: stage s -> s + 1
    // Summaries the cells record on the stage threads reach the caller's context, under the
    // caller's name scope, in stage order (the backward's recompute records none).
    SummaryContext* caller_summaries = SummaryContext::Current();
    const std::string summary_scope = SummaryNameScope::Current();
    std::vector<std::vector<SummaryContext::Entry>> stage_summaries(stages);
    RunStages(stages, chs, [&](int64_t s) {
      at::NoGradGuard no_grad;
      std::optional<SummaryContext> summaries;
      std::optional<SummaryNameScope> scope;
      if (caller_summaries != nullptr) {
        summaries.emplace();
        if (!summary_scope.empty()) scope.emplace(summary_scope);
      }
      for (int64_t t = 0; t < m; ++t) {
        at::Tensor xt = s == 0 ? xin.narrow(dim, t * size, size) : chs[s - 1]->Recv();
        state->stage_inputs[s][t] = xt;
        at::Tensor y = run_stage(s, thetas, xt, t);
        if (s + 1 < stages) {
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
    return NestedMap{{"y", at::cat(outputs, dim)}};
  };

  auto bak = [this, state, run_stage, make_channels, stages, m, size, dim](
                 const NestedMap& in, const NestedMap&, const NestedMap& dys) {
    const auto& thetas = in.at("cells").AsList();
    const at::Tensor dy = dys.GetTensor("y");
    std::vector<at::Tensor> dx(m);
    std::vector<NestedValue> d_cells(cells_.size());
    auto chs = make_channels(true);  // chs[s]: stage s + 1 -> s
    RunStages(stages, chs, [&](int64_t s) {
      at::AutoGradMode grad_mode(true);
      const int64_t first = s == 0 ? 0 : ends_[s - 1];
      // Fresh leaves for this stage's weights; their gradients sum over micro-batches.
      NestedValue::List leaves(thetas.size());
      std::vector<at::Tensor> wrt_w, sums;
      for (int64_t c = first; c < ends_[s]; ++c) {
        NestedMap l = DetachedLeaves(thetas[c].AsMap());
        for (const auto& t : l.FlattenTensors()) wrt_w.push_back(t);
        leaves[c] = std::move(l);
      }
      sums.resize(wrt_w.size());
      // The recompute must not count again; re-enabled on every exit path.
      struct AccumulatorsOff {
        std::vector<BaseLayer*> cells;
        explicit AccumulatorsOff(std::vector<BaseLayer*> c) : cells(std::move(c)) {
          for (BaseLayer* l : cells) l->DisableAccumulators();
        }
        ~AccumulatorsOff() {
          for (BaseLayer* l : cells) l->EnableAccumulators();
        }
      } accumulators_off(
          std::vector<BaseLayer*>(cells_.begin() + first, cells_.begin() + ends_[s]));
      for (int64_t t = m - 1; t >= 0; --t) {
        at::Tensor dyt = s + 1 == stages ? dy.narrow(dim, t * size, size) : chs[s]->Recv();
        at::Tensor xt = state->stage_inputs[s][t].detach();
        if (at::isFloatingType(xt.scalar_type())) xt.requires_grad_(true);
        at::Tensor y = run_stage(s, leaves, xt, t);
        // Differentiate with respect to what requires a gradient: the stage input when it is
        // floating, and the floating weights.
        std::vector<at::Tensor> wrt;
        if (xt.requires_grad()) wrt.push_back(xt);
        const size_t first_w = wrt.size();
        std::vector<size_t> used;  // indices into wrt_w
        for (size_t i = 0; i < wrt_w.size(); ++i) {
          if (wrt_w[i].requires_grad()) {
            wrt.push_back(wrt_w[i]);
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
          sums[used[k]] = sums[used[k]].defined() ? sums[used[k]] + gw : gw;
        }
        const at::Tensor gx_raw = first_w == 1 ? g[0] : at::Tensor();
        at::Tensor gx = gx_raw.defined() ? gx_raw : at::zeros_like(xt);
        if (s > 0) {
          chs[s - 1]->Send(gx);
        } else {
          dx[t] = gx;
        }
      }
      size_t k = 0;
      for (int64_t c = first; c < ends_[s]; ++c) {
        const NestedMap& l = leaves[c].AsMap();
        std::vector<at::Tensor> grads;
        for (const auto& w : l.FlattenTensors()) {
          grads.push_back(sums[k].defined() ? sums[k] : at::zeros_like(w));
          ++k;
        }
        d_cells[c] = l.Pack(grads);
      }
    });
    for (auto& per_stage : state->stage_inputs) {
      for (auto& t : per_stage) t = at::Tensor();  // the boundaries are not needed any more
    }
    NestedMap dxs;
    dxs.Set("cells", NestedValue::List(d_cells.begin(), d_cells.end()));
    dxs.Set("x", at::cat(dx, dim));
    return dxs;
  };

  NestedMap xs;
  xs.Set("cells", theta.at("cells"));
  xs.Set("x", x);
  return CallWithCustomGradient(fwd, bak, xs).GetTensor("y");
}

GLOSSA_REGISTER_CLASS(PipeliningLayer, "glossa.layers.PipeliningLayer");

}  // namespace glossa
