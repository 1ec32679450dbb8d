#include "glossa/layers/gpipe.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/base/thread_state.h"
#include "glossa/layers/channel.h"
#include "glossa/layers/custom_gradient.h"
#include "glossa/layers/block.h"
#include "glossa/layers/mesh.h"
#include "glossa/layers/moe.h"
#include "glossa/summary/summary.h"

namespace glossa {

namespace {

// Runs fn(stage) on one thread per stage under the caller's ThreadState (eval mode, global step,
// batch shard, summary name scopes, ATen's grad mode, ...), but no summary or aux-loss context:
// stages record summaries into contexts of their own (PipelineForward), and each micro-batch's
// aux losses into one of its own (RunStage), which the pipeline carries out as its "aux" output. The first exception closes every channel (so no
// stage waits forever) and is rethrown after all threads have joined.
void RunStages(int64_t stages, std::vector<std::unique_ptr<Channel>>& channels,
               const std::function<void(int64_t)>& fn) {
  ThreadState caller = ThreadState::Capture();
  caller.Reset("summaries").Reset("aux_losses");
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
      threads.push_back(StartThread(caller, [&, s] {
        try {
          fn(s);
        } catch (...) {
          fail(s);
        }
      }));
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
  const int64_t n = static_cast<int64_t>(cells.AsList().size());
  const auto& ends = params().Get("stage_ends").AsList();
  if (!ends.empty()) {
    int64_t prev = 0;
    for (const auto& e : ends) {
      const int64_t end = e.AsInt();
      if (end <= prev)
        fail(StrCat("stage_ends must be increasing and > 0, got ", end, " after ", prev));
      pipe_.ends.push_back(end);
      prev = end;
    }
    if (prev != n) fail(StrCat("the last stage end must be the cell count ", n, ", got ", prev));
  } else {
    const int64_t stages = params().GetInt("num_stages") > 0 ? params().GetInt("num_stages") : n;
    if (stages > n) fail(StrCat("num_stages ", stages, " exceeds the cell count ", n));
    pipe_.ends = EvenStageEnds(n, stages);
  }
  pipe_.num_micro_batches = params().GetInt("num_micro_batches");
  if (pipe_.num_micro_batches <= 0) fail("num_micro_batches must be > 0");
  pipe_.batch_dim = params().GetInt("batch_dim");
  const ParamValue& mbs = params().Get("micro_batch_size");
  if (!mbs.is_none()) pipe_.micro_batch_size = mbs.AsInt();
  // On a pipe axis: this rank's stage's cells only, under their whole-pipeline names.
  pipe_.placement = PlaceStages(StrCat("pipeline '", path(), "'"), pipe_.ends,
                                 build_context());
  const StagePlacement& place = pipe_.placement;
  ParamValue::List named = NameCells(cells.AsList(), "cells");
  ParamValue::List mine(named.begin() + place.first, named.begin() + place.end);
  {
    // A stage's cells on a pipe axis: their variables are this rank's alone.
    BuildContext stage = build_context();
    if (place.axis != nullptr) stage.WithCollection(kPipelineStageCollection);
    CreateChildrenIn(stage, "cells", mine);
  }
  for (int64_t c = 0; c < n; ++c) {
    if ((c < place.first || c >= place.end) && named[c].is_params()) {
      DeclareRemoteScope(named[c].AsParams().GetString("name"));
    }
  }
  pipe_.owner = this;
  pipe_.cells = GetChildren("cells");
  for (const BaseLayer* c : pipe_.cells) {
    CheckReplayable(*c, StrCat("pipeline '", path(), "'"), /*carries_aux_losses=*/true);
    pipe_.blocks.push_back(&AsBlock(*c, StrCat("pipeline '", path(), "'")));
    pipe_.seeds.push_back(GenerateSeedFromName(c->path()));
  }
}

namespace {

// What one pipelined FProp shares between its forward pass and its backward pass (which runs
// after FProp has returned): the cells, the micro-batching and the saved stage inputs.
struct PipelineRun {
  const PipelineCells* cells = nullptr;
  int64_t stages = 0, m = 0, size = 0, dim = 0;  // m micro-batches of `size` along dim
  at::ScalarType dtype = at::kFloat;              // of the activations
  std::vector<int64_t> micro_shape;               // one micro-batch's activation shape
  std::vector<int64_t> whole_shape;               // the batch's
  int64_t global_step = 0;
  std::vector<std::vector<at::Tensor>> stage_inputs;  // [stage][micro-batch]
  // The cells' aux losses (a MoE layer's): whether any cell of the whole pipeline added one (on a
  // pipe axis, of any rank), and their dtype.
  bool has_aux = false;
  at::ScalarType aux_dtype = at::kFloat;
  std::vector<at::Tensor> paddings;                   // per micro-batch (or undefined)
  MeshAxis* axis() const { return cells->placement.axis; }
  // The stages this process runs: all of them, or on a pipe axis its own.
  int64_t first_stage() const { return axis() ? cells->placement.stage : 0; }
  int64_t end_stage() const { return axis() ? cells->placement.stage + 1 : stages; }
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

// Runs stage s on micro-batch t (cells in order, each from its own step seed; the thread's step
// seed is left as it was). The aux losses its cells add sum into *aux (undefined: none).
at::Tensor RunStage(const PipelineRun& run, int64_t s, const NestedValue::List& thetas,
                    at::Tensor x, int64_t t, at::Tensor* aux) {
  const PipelineCells& pc = *run.cells;
  std::optional<OverWriteGlobalStepContext> overwrite;
  std::optional<BatchShardScope> rows;
  if (pc.masks_follow_rows) {
    const BatchShard outer = CurrentBatchShard();
    rows.emplace(outer.index * run.m + t, outer.count * run.m, 0, 1, t, run.m);
  } else {
    overwrite.emplace(run.global_step * run.m + t);
  }
  struct RestoreSeed {  // on a pipe rank this is the caller's thread
    int64_t seed = GetStepSeed();
    ~RestoreSeed() { ResetStepSeed(seed); }
  } restore;
  const int64_t first = pc.placement.first;
  AuxLossContext aux_losses;  // this micro-batch's, on this stage
  for (int64_t c = s == 0 ? 0 : pc.ends[s - 1]; c < pc.ends[s]; ++c) {
    ResetStepSeed(pc.seeds[c - first]);
    x = pc.blocks[c - first]->FPropBlock(thetas[c - first].AsMap(), x, run.paddings[t]);
  }
  *aux = aux_losses.losses().empty() ? at::Tensor() : aux_losses.Sum();
  return x;
}

// How a stage passes micro-batches (or their gradients) on and gets them: over a channel
// between threads, or by the pipe axis's send/recv between ranks.
struct StageLinks {
  std::function<at::Tensor()> recv;
  std::function<void(const at::Tensor&)> send;
};

// The channels between neighbouring stages of one process: for activations (chs[s]: stage s ->
// s + 1) or, when `backward`, for gradients (chs[s]: stage s + 1 -> s). None on a pipe axis.
std::vector<std::unique_ptr<Channel>> MakeChannels(const PipelineRun& run, bool backward) {
  std::vector<std::unique_ptr<Channel>> chs;
  if (run.axis()) return chs;
  for (int64_t s = 0; s + 1 < run.stages; ++s) {
    const std::string a = StrCat("stage", s), b = StrCat("stage", s + 1);
    chs.push_back(std::make_unique<Channel>(
        StrCat(run.cells->owner->path(), backward ? "/grad:" : "/", backward ? b : a, "->",
               backward ? a : b),
        run.dtype, run.micro_shape, backward ? b : a, backward ? a : b));
  }
  return chs;
}

// Stage s's links: from stage `from` and to stage `to` (-1: none), over `chs` (indexed by the
// lower stage of each pair) or the pipe axis.
StageLinks Links(const PipelineRun& run, std::vector<std::unique_ptr<Channel>>& chs, int64_t s,
                 int64_t from, int64_t to) {
  StageLinks l;
  if (from >= 0) {
    if (run.axis()) {
      l.recv = [&run, from] {
        at::Tensor out = at::empty(run.micro_shape, at::TensorOptions().dtype(run.dtype));
        run.axis()->RecvFrom(out, static_cast<int>(from));
        return out;
      };
    } else {
      Channel* ch = chs[std::min(s, from)].get();
      l.recv = [ch] { return ch->Recv(); };
    }
  }
  if (to >= 0) {
    if (run.axis()) {
      l.send = [&run, to](const at::Tensor& t) {
        if (t.sizes() != at::IntArrayRef(run.micro_shape) || t.scalar_type() != run.dtype) {
          throw InvalidArgumentError(StrCat(
              "pipeline '", run.cells->owner->path(), "': a stage must keep the activation's ",
              "shape and dtype ", at::IntArrayRef(run.micro_shape), " ", c10::toString(run.dtype),
              ", got ", t.sizes(), " ", c10::toString(t.scalar_type())));
        }
        run.axis()->SendTo(t.contiguous(), static_cast<int>(to));
      };
    } else {
      Channel* ch = chs[std::min(s, to)].get();
      l.send = [ch](const at::Tensor& t) { ch->Send(t); };
    }
  }
  return l;
}

// Runs fn(s) for the stages this process runs: every stage on its own thread, or on a pipe axis
// its own stage on the calling thread.
void ForStages(const PipelineRun& run, std::vector<std::unique_ptr<Channel>>& chs,
               const std::function<void(int64_t)>& fn) {
  if (run.axis()) {
    fn(run.first_stage());
  } else {
    RunStages(run.stages, chs, fn);
  }
}

// Hands the whole batch's tensor `pieces` (per micro-batch, held by stage `root`) to every rank
// of the pipe axis; in one process it is just their concatenation. With the ends on their stages,
// only `root` has it (the others, zeros).
at::Tensor ShareFromStage(const PipelineRun& run, std::vector<at::Tensor>& pieces, int64_t root) {
  if (!run.axis()) return at::cat(pieces, run.dim);
  if (run.cells->ends_on_stages) {
    return run.first_stage() == root
               ? at::cat(pieces, run.dim)
               : at::zeros(run.whole_shape, at::TensorOptions().dtype(run.dtype));
  }
  at::Tensor whole = run.first_stage() == root
                         ? at::cat(pieces, run.dim).contiguous()
                         : at::empty(run.whole_shape, at::TensorOptions().dtype(run.dtype));
  // The other ranks receive into the input's shape and dtype: a pipeline that changes them
  // cannot run on ranks (in one process it can).
  if (whole.sizes() != at::IntArrayRef(run.whole_shape) || whole.scalar_type() != run.dtype) {
    throw InvalidArgumentError(StrCat(
        "pipeline '", run.cells->owner->path(), "': on a pipe axis its output must keep the "
        "input's shape and dtype ", at::IntArrayRef(run.whole_shape), " ",
        c10::toString(run.dtype), ", got ", whole.sizes(), " ", c10::toString(whole.scalar_type())));
  }
  run.axis()->Broadcast(whole, static_cast<int>(root));
  return whole;
}

// The pipeline's aux loss: the cells' aux losses summed over the stages (each micro-batch's sum) and
// averaged over the micro-batches: the loss of the whole batch's groups, as a MoE layer averages
// its groups' (a micro-batch routes its own groups). On a pipe axis the stages' sums meet in one
// small all-reduce, which also tells every rank whether any stage has an aux loss.
at::Tensor PipelineAux(PipelineRun& run, const std::vector<at::Tensor>& stage_aux) {
  at::Tensor sum = at::zeros({2}, at::kDouble);  // [Σ aux, stages with one]
  for (const at::Tensor& a : stage_aux) {
    if (!a.defined()) continue;
    sum[0] += a;
    sum[1] += 1;
  }
  if (run.axis()) run.axis()->AllReduceSum(sum);
  run.has_aux = sum[1].item<double>() > 0;
  return (sum[0] / static_cast<double>(run.m)).to(run.aux_dtype);
}

// The forward pass: every stage runs its cells on each micro-batch in turn, without gradients,
// keeping its inputs for the backward's recompute; the last stage's outputs make "y".
NestedMap PipelineForward(PipelineRun& run, const NestedMap& in) {
  const auto& thetas = in.at("cells").AsList();
  const at::Tensor xin = in.GetTensor("x");
  std::vector<at::Tensor> outputs(run.m);
  auto chs = MakeChannels(run, false);  // chs[s]: stage s -> s + 1
  // Summaries the cells record on the stage threads reach the caller's context, under the
  // caller's name scope (the stage threads have it), in stage order (the backward's recompute
  // records none).
  SummaryContext* caller_summaries = SummaryContext::Current();
  std::vector<std::vector<SummaryContext::Entry>> stage_summaries(run.stages);
  std::vector<at::Tensor> stage_aux(run.stages);  // each stage's aux losses over its micro-batches
  ForStages(run, chs, [&](int64_t s) {
    at::NoGradGuard no_grad;
    std::optional<SummaryContext> summaries;
    std::optional<SummaryLoop> micro_batches;  // on a pipe rank: this thread is the caller's
    if (caller_summaries != nullptr && run.axis()) {
      micro_batches.emplace();
    } else if (caller_summaries != nullptr) {
      summaries.emplace();
    }
    const StageLinks io = Links(run, chs, s, s > 0 ? s - 1 : -1, s + 1 < run.stages ? s + 1 : -1);
    for (int64_t t = 0; t < run.m; ++t) {
      at::Tensor xt = s == 0 ? xin.narrow(run.dim, t * run.size, run.size) : io.recv();
      run.stage_inputs[s][t] = xt;
      at::Tensor aux;
      at::Tensor y = RunStage(run, s, thetas, xt, t, &aux);
      if (aux.defined()) {
        stage_aux[s] = stage_aux[s].defined() ? stage_aux[s] + aux.to(at::kDouble) : aux.to(at::kDouble);
      }
      if (s + 1 < run.stages) {
        io.send(y);
      } else {
        outputs[t] = y;
      }
    }
    if (summaries) stage_summaries[s] = summaries->TakeEntries();
  });
  if (caller_summaries != nullptr && !run.axis()) {
    // One value per pipeline call: the micro-batches' values reduce as a loop's do.
    SummaryLoop micro_batches;
    for (auto& entries : stage_summaries) caller_summaries->RecordEntries(std::move(entries));
  }
  return NestedMap{{"y", ShareFromStage(run, outputs, run.stages - 1)},
                   {"aux", PipelineAux(run, stage_aux)}};
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
  NestedValue::List leaves;       // by held cell index (set for this stage's cells only)
  std::vector<at::Tensor> wrt_w;  // the leaves' tensors, flattened in cell order
  std::vector<at::Tensor> sums;   // their gradients summed so far (undefined: none yet)
};

// Fresh leaves for the weights of held cells [first, end); their gradients sum over
// micro-batches.
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
// dyt (and d_aux into its cells' aux losses, each micro-batch's share of the pipeline's): adds the
// weights' gradients into w.sums and returns the input's (zeros when it has none).
at::Tensor RecomputeMicroBatch(const PipelineRun& run, int64_t s, int64_t t, const at::Tensor& dyt,
                               const at::Tensor& d_aux, StageLeaves& w) {
  at::Tensor xt = run.stage_inputs[s][t].detach();
  if (at::isFloatingType(xt.scalar_type())) xt.requires_grad_(true);
  at::Tensor aux;
  at::Tensor y = RunStage(run, s, w.leaves, xt, t, &aux);
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
  std::vector<at::Tensor> outputs, grad_outputs;
  if (y.requires_grad()) {
    outputs.push_back(y);
    grad_outputs.push_back(dyt);
  }
  if (aux.defined() && aux.requires_grad()) {
    outputs.push_back(aux);
    grad_outputs.push_back((d_aux / static_cast<double>(run.m)).to(aux.scalar_type()));
  }
  std::vector<at::Tensor> g(wrt.size());
  if (!outputs.empty() && !wrt.empty()) {
    g = torch::autograd::grad(outputs, wrt, grad_outputs, /*retain_graph=*/false,
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

// The gradients of held cells [first, end) in their weights' structure (zeros where none flowed).
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
  const at::Tensor& d_aux;  // of the pipeline's aux loss (a scalar; zero when unused)
  std::vector<std::unique_ptr<Channel>>& chs;  // chs[s]: stage s + 1 -> s
  std::vector<at::Tensor>& dx;                 // per micro-batch
  std::vector<NestedValue>& d_cells;           // per held cell
};

// Stage s of the backward pass: recomputes its micro-batches, last first, passing the input
// gradients back, then packs its cells' weight gradients into p.d_cells.
void BackwardStage(const BackwardPass& p, int64_t s) {
  const PipelineRun& run = p.run;
  const PipelineCells& pc = *run.cells;
  at::AutoGradMode grad_mode(true);
  SummarySuppressScope no_summaries;  // the recompute records none (the forward did)
  const int64_t held = pc.placement.first;
  const int64_t first = (s == 0 ? 0 : pc.ends[s - 1]) - held, end = pc.ends[s] - held;
  StageLeaves w = MakeStageLeaves(p.thetas, first, end);
  AccumulatorsOff accumulators_off(
      std::vector<BaseLayer*>(pc.cells.begin() + first, pc.cells.begin() + end));
  const StageLinks io =
      Links(run, p.chs, s, s + 1 < run.stages ? s + 1 : -1, s > 0 ? s - 1 : -1);
  for (int64_t t = run.m - 1; t >= 0; --t) {
    at::Tensor dyt =
        s + 1 == run.stages ? p.dy.narrow(run.dim, t * run.size, run.size) : io.recv();
    at::Tensor gx = RecomputeMicroBatch(run, s, t, dyt, p.d_aux, w);
    if (s > 0) {
      io.send(gx);
    } else {
      p.dx[t] = gx;
    }
  }
  PackStageGradients(w, first, end, p.d_cells);
}

// The backward pass: the pipeline in reverse, gradients flowing back over channels; returns the
// gradients of "cells" and "x".
NestedMap PipelineBackward(PipelineRun& run, const NestedMap& in, const NestedMap& dys) {
  const auto& thetas = in.at("cells").AsList();
  const at::Tensor dy = dys.GetTensor("y");
  const at::Tensor d_aux = dys.GetTensor("aux").to(at::kDouble);
  std::vector<at::Tensor> dx(run.m);
  std::vector<NestedValue> d_cells(run.cells->cells.size());
  auto chs = MakeChannels(run, true);  // chs[s]: stage s + 1 -> s
  const BackwardPass pass{run, thetas, dy, d_aux, chs, dx, d_cells};
  ForStages(run, chs, [&](int64_t s) { BackwardStage(pass, s); });
  for (auto& per_stage : run.stage_inputs) {
    for (auto& t : per_stage) t = at::Tensor();  // the boundaries are not needed any more
  }
  NestedMap dxs;
  dxs.Set("cells", NestedValue::List(d_cells.begin(), d_cells.end()));
  dxs.Set("x", ShareFromStage(run, dx, 0));
  return dxs;
}

}  // namespace

at::Tensor PipelineFProp(const PipelineCells& cells, const NestedValue& cells_theta,
                         const at::Tensor& x, const at::Tensor& paddings) {
  const std::string& path = cells.owner->path();
  const int64_t dim = cells.batch_dim;
  if (dim < 0 || dim >= x.dim()) {
    throw InvalidArgumentError(StrCat("layer '", path, "': batch_dim ", dim,
                                      " is out of range for inputs of rank ", x.dim()));
  }
  const int64_t batch = x.size(dim);
  int64_t micro = cells.num_micro_batches;
  // Where the masks follow the rows, the micro-batching leaves the math unchanged: a batch that
  // does not divide (an eval set's last) takes the most micro-batches up to the count that do.
  if (cells.masks_follow_rows && !cells.micro_batch_size) {
    while (micro > 1 && batch % micro != 0) --micro;
  }
  const auto [m, size] = MicroBatches(path, batch, micro, cells.micro_batch_size);
  if (paddings.defined() && (dim != 0 || paddings.size(0) != batch)) {
    throw InvalidArgumentError(StrCat("layer '", path, "': paddings must have the batch (", batch,
                                      ") as dim 0, with batch_dim 0; got paddings of dim 0 size ",
                                      paddings.size(0), " and batch_dim ", dim));
  }
  const int64_t stages = static_cast<int64_t>(cells.ends.size());

  // Shared by fwd and bak: bak runs in the backward pass, after this call has returned.
  auto run = std::make_shared<PipelineRun>();
  run->cells = &cells;
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
  run->whole_shape = x.sizes().vec();
  run->micro_shape = x.sizes().vec();
  run->micro_shape[dim] = size;
  run->dtype = x.scalar_type();
  run->aux_dtype = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;

  auto fwd = [run](const NestedMap& in) { return PipelineForward(*run, in); };
  auto bak = [run](const NestedMap& in, const NestedMap&, const NestedMap& dys) {
    return PipelineBackward(*run, in, dys);
  };
  NestedMap xs;
  xs.Set("cells", cells_theta);
  xs.Set("x", x);
  const NestedMap ys = CallWithCustomGradient(fwd, bak, xs);
  // The cells' aux losses reach the caller's context as one loss of the whole pipeline.
  if (run->has_aux) AuxLossContext::AddLoss(ys.GetTensor("aux"));
  return ys.GetTensor("y");
}

at::Tensor PipeliningLayer::FProp(const NestedMap& theta, const at::Tensor& inputs,
                                  const at::Tensor& paddings) const {
  return PipelineFProp(pipe_, theta.at("cells"), CastToFPropDtype(inputs), paddings);
}

GLOSSA_REGISTER_CLASS(PipeliningLayer, "glossa.layers.PipeliningLayer");

}  // namespace glossa
