// TransformerStack (Lingvo's StackedTransformerLayers) and its encoder and decoder params; the
// layers it stacks are in transformer.cc.
#include <ATen/ATen.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/block.h"
#include "glossa/core/step_seed.h"
#include "glossa/layers/dropout.h"
#include "glossa/layers/flops.h"
#include "glossa/layers/gpipe.h"
#include "glossa/layers/transformer_stack.h"

namespace glossa {

// ---- TransformerStack ----

glossa::Params TransformerStack::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<TransformerStack>());
  DefineLayerFields(p);
  p.Define("input_dropout_prob", 0.0, "Dropout probability on the stack's input.");
  p.Define("final_layer_norm", nullptr,
           "A layer norm after the last layer. None: when the first layer's self-attention is "
           "pre-layer-norm (Lingvo's default is False; post-norm layers end normalized already).");
  p.Define("ln_tpl", LayerNorm::Params(), "The final layer norm's params.");
  p.Define("dropout_tpl", DeterministicDropoutLayer::Params(),
           "Params of the input dropout (keep_prob is set from input_dropout_prob).");
  p.Define("splits", 1,
           "GPipe stages of the layers: an int (that many, balanced by the layers' declared FLOPs "
           "per token, glossa/layers/flops.h; 1: no pipeline) or a list of increasing layer end "
           "indices whose last is num_layers. On a mesh's "
           "'pipe' axis each rank holds one stage.");
  p.Define("num_micro_batches", 1, "Micro-batches a pipelined batch is split into.");
  p.Define("place_ends_on_stages", false,
           "On a 'pipe' axis (stages on ranks), Lingvo's placement: the stack reads its input on "
           "stage 0 only and its output (after the final layer norm, held by the last stage) "
           "stays on the last stage, the other ranks getting zeros of its shape, so that what "
           "feeds the stack (the embedding) lives on stage 0 and what reads it (the softmax) on "
           "the last (PlaceEnds). False: the output and the input's gradient are broadcast to "
           "every rank and what surrounds the stack is replicated.");
  p.Define("end_stage_flops", ParamValue::List{0.0, 0.0},
           "[first, last]: forward FLOPs per token that run beside the first and the last stage "
           "when they sit there (place_ends_on_stages on a 'pipe' axis: the task's embedding "
           "and softmax; the task sets them from their declared FLOPs), counted when an int "
           "splits balances the stages.");
  return p;
}

namespace {

// What the stages' balance counts beside the layers: end_stage_flops, when the ends sit on the
// stages (place_ends_on_stages, stages on the ranks of a 'pipe' axis).
std::pair<double, double> EndStageFlops(const glossa::Params& p, const BuildContext& context) {
  if (!p.GetBool("place_ends_on_stages") || context.axis("pipe") == nullptr) return {0, 0};
  const ParamValue::List& f = p.Get("end_stage_flops").AsList();
  if (f.size() != 2 || !(f[0].AsFloat() >= 0) || !(f[1].AsFloat() >= 0)) {
    throw InvalidArgumentError(StrCat("layer '", p.GetString("name"),
                                      "': end_stage_flops must be [first, last], both >= 0"));
  }
  return {f[0].AsFloat(), f[1].AsFloat()};
}

}  // namespace

void TransformerStack::DefineLayerFields(glossa::Params& p) {
  p.Define("num_layers", 1, "Number of transformer layers.");
  p.Define("mdl_dim", 0, "Model dimension set into every layer's input_dim; 0 keeps theirs.");
  p.Define("hidden_dim", 0,
           "Feed-forward hidden dimension set into every layer's tr_fflayer_tpl; 0 keeps theirs.");
  p.Define("num_atten_heads", 0,
           "Attention heads set into every layer's attention templates; 0 keeps theirs.");
  p.Define("dropout_prob", nullptr,
           "When set, the attention, residual and relu dropout probability of every block.");
  p.Define("mask_self_atten", false, "Causal self-attention in every layer (decoder).");
  p.Define("has_aux_atten", false, "Cross-attention to the encoder output (decoder).");
  p.Define("transformer_layer_params_tpl", TransformerLayer::Params(),
           "TransformerLayer params: one template for every layer, or a list whose length "
           "divides num_layers (layer i uses entry i / (num_layers / len)): with [dense, moe] and 4 "
           "layers, layers 0-1 are dense and 2-3 MoE, as in Lingvo.");
}

std::vector<glossa::Params> TransformerStack::LayerParams(const glossa::Params& p) {
  const std::string where = StrCat("layer '", p.GetString("name"), "' (", p.ClsKey(), ")");
  const int64_t n = p.GetInt("num_layers");
  if (n <= 0) throw InvalidArgumentError(StrCat(where, ": num_layers must be > 0, got ", n));
  const ParamValue& tpl = p.Get("transformer_layer_params_tpl");
  std::vector<glossa::Params> templates;
  if (tpl.is_list()) {
    for (const auto& t : tpl.AsList()) {
      if (!t.is_params()) {
        throw InvalidArgumentError(
            StrCat(where, ": transformer_layer_params_tpl must hold Params, found a ", t.KindName()));
      }
      templates.push_back(t.AsParams());
    }
    if (templates.empty() || n % static_cast<int64_t>(templates.size()) != 0) {
      throw InvalidArgumentError(StrCat(where, ": transformer_layer_params_tpl has ",
                                        templates.size(), " templates, which must divide num_layers ",
                                        n));
    }
  } else if (tpl.is_params()) {
    templates.push_back(tpl.AsParams());
  } else {
    throw InvalidArgumentError(StrCat(where, ": transformer_layer_params_tpl must be Params or a "
                                             "list of Params, got ",
                                      tpl.KindName()));
  }
  const int64_t factor = n / static_cast<int64_t>(templates.size());
  const ParamValue& dropout = p.Get("dropout_prob");
  std::vector<glossa::Params> layers;
  for (int64_t i = 0; i < n; ++i) {
    const size_t t = static_cast<size_t>(i / factor);
    glossa::Params l = templates[t].Copy();
    const std::string which =
        tpl.is_list() ? StrCat("transformer_layer_params_tpl[", t, "]")
                      : std::string("transformer_layer_params_tpl");
    for (const char* field : {"mask_self_atten", "has_aux_atten", "tr_fflayer_tpl"}) {
      if (!l.Contains(field)) {
        throw InvalidArgumentError(StrCat(where, ": ", which, " (", l.ClsKey(), ") has no ", field,
                                          " field; use TransformerLayer Params"));
      }
    }
    if (p.GetInt("hidden_dim") > 0 &&
        !(l.Get("tr_fflayer_tpl").is_params() &&
          l.GetParams("tr_fflayer_tpl").Contains("hidden_dim"))) {
      throw InvalidArgumentError(StrCat(
          where, ": hidden_dim is set but ", which,
          ".tr_fflayer_tpl has no hidden_dim field; set hidden_dim to 0 to keep the template's"));
    }
    l.Set("name", "");  // children are named x_layers_<i>
    l.Set("mask_self_atten", p.GetBool("mask_self_atten"));
    l.Set("has_aux_atten", p.GetBool("has_aux_atten"));
    if (p.GetInt("mdl_dim") > 0) l.Set("input_dim", p.GetInt("mdl_dim"));
    if (p.GetInt("num_atten_heads") > 0) l.Set("num_heads", p.GetInt("num_atten_heads"));
    if (p.GetInt("hidden_dim") > 0) l.Set("tr_fflayer_tpl.hidden_dim", p.GetInt("hidden_dim"));
    if (!dropout.is_none()) {
      const double d = dropout.AsFloat();
      for (const char* a : {"tr_atten_tpl", "tr_self_atten_tpl", "tr_aux_atten_tpl"}) {
        if (!l.Get(a).is_params()) continue;
        l.Set(StrCat(a, ".atten_dropout_prob"), d).Set(StrCat(a, ".residual_dropout_prob"), d);
      }
      l.Set("tr_fflayer_tpl.residual_dropout_prob", d).Set("tr_fflayer_tpl.relu_dropout_prob", d);
    }
    layers.push_back(std::move(l));
  }
  return layers;
}

namespace {

// final_layer_norm, or when None whether the first layer's self-attention is pre-layer-norm.
bool UsesFinalLayerNorm(const glossa::Params& p, const glossa::Params& layer0) {
  const ParamValue& final_ln = p.Get("final_layer_norm");
  if (!final_ln.is_none()) return final_ln.AsBool();
  const ParamValue& self = layer0.Get("tr_self_atten_tpl");
  const glossa::Params& atten =
      self.is_params() ? self.AsParams() : layer0.GetParams("tr_atten_tpl");
  return atten.Contains("pre_layer_norm") && atten.GetBool("pre_layer_norm");
}

}  // namespace

TransformerStack::~TransformerStack() = default;

TransformerStack::TransformerStack(const glossa::Params& p) : BaseLayer(p) {
  const std::vector<glossa::Params> layer_params = LayerParams(p);
  ParamValue::List layers(layer_params.begin(), layer_params.end());
  input_dropout_ =
      CreateChild<DropoutLayer>("input_dropout", DropoutParams(p, "input_dropout_prob"));
  const int64_t n = static_cast<int64_t>(layers.size());
  const std::string where = StrCat("layer '", path(), "'");
  const std::vector<int64_t> ends =
      StageEndsOf(where, p.Get("splits"), layer_params, EndStageFlops(p, build_context()));
  StagePlacement place;
  place.end = n;
  if (ends.size() > 1) {
    if (p.GetBool("has_aux_atten")) {
      throw InvalidArgumentError(StrCat(where, ": pipelined layers (splits ", ends.size(),
                                        ") take no cross-attention inputs (has_aux_atten)"));
    }
    if (p.GetInt("num_micro_batches") <= 0) {
      throw InvalidArgumentError(StrCat(where, ": num_micro_batches must be > 0"));
    }
    place = PlaceStages(where, ends, build_context());
  }
  const ParamValue::List named = NameCells(layers, "x_layers");
  {
    // A stage's layers on a pipe axis: their variables are this rank's alone.
    BuildContext stage = build_context();
    if (place.axis != nullptr) stage.WithCollection(kPipelineStageCollection);
    layers_ = CreateChildrenIn<TransformerLayer>(
        stage, "x_layers", ParamValue::List(named.begin() + place.first, named.begin() + place.end));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (i < place.first || i >= place.end) {
      DeclareRemoteScope(named[i].AsParams().GetString("name"));
    }
  }
  if (ends.size() > 1) {
    pipe_ = std::make_unique<PipelineCells>();
    pipe_->owner = this;
    pipe_->ends = ends;
    pipe_->placement = place;
    pipe_->num_micro_batches = p.GetInt("num_micro_batches");
    pipe_->masks_follow_rows = true;
  }
  if (pipe_) pipe_->cells = GetChildren("x_layers");
  for (const auto& layer : layers_) {
    if (pipe_) {
      pipe_->blocks.push_back(&AsBlock(*layer, StrCat("pipeline '", path(), "'")));
      CheckReplayable(*layer, StrCat("pipeline '", path(), "'"), /*carries_aux_losses=*/true);
    }
    layer_seeds_.push_back(GenerateSeedFromName(layer->path()));
  }
  if (pipe_) pipe_->seeds = layer_seeds_;
  model_dim_ = layers_.front()->params().GetInt("input_dim");
  for (size_t i = 1; i < layers_.size(); ++i) {
    const int64_t d = layers_[i]->params().GetInt("input_dim");
    if (d != model_dim_) {
      throw InvalidArgumentError(StrCat("layer '", path(), "': layer ", i, " has input_dim ", d,
                                        " but layer 0 has ", model_dim_,
                                        "; set mdl_dim to give every layer one width"));
    }
  }
  ends_ = PlaceEnds(p, build_context());
  if (pipe_) pipe_->ends_on_stages = ends_.axis != nullptr;
  if (UsesFinalLayerNorm(p, layers_.front()->params())) {
    const glossa::Params ln = p.GetParams("ln_tpl").Copy().Set("input_dim", model_dim_);
    if (ends_.axis == nullptr) {
      final_ln_ = CreateChild<LayerNorm>("final_ln", ln);
    } else if (ends_.last()) {  // with the last stage's layers
      BuildContext last = build_context();
      last.WithCollection(kPipelineStageCollection);
      final_ln_ = CreateChildIn<LayerNorm>(last, "final_ln", ln);
    } else {
      DeclareRemoteScope(ln.GetString("name").empty() ? "final_ln" : ln.GetString("name"));
    }
  }
}

PipelineEnds TransformerStack::PlaceEnds(const glossa::Params& p,
                                                           const BuildContext& context) {
  PipelineEnds e;
  if (!p.GetBool("place_ends_on_stages")) return e;
  const std::string where = StrCat("layer '", p.GetString("name"), "'");
  const std::vector<int64_t> ends =
      StageEndsOf(where, p.Get("splits"), LayerParams(p), EndStageFlops(p, context));
  if (ends.size() == 1) return e;
  const StagePlacement place = PlaceStages(where, ends, context);
  if (place.axis == nullptr) return e;
  e.axis = place.axis;
  e.stage = place.stage;
  e.stages = static_cast<int64_t>(ends.size());
  return e;
}

at::Tensor TransformerStack::FProp(const NestedMap& theta, const at::Tensor& inputs,
                                   const at::Tensor& paddings, const at::Tensor& aux_vecs,
                                   const at::Tensor& aux_paddings, const at::Tensor& segment_ids,
                                   const at::Tensor& aux_segment_ids) const {
  at::Tensor x = input_dropout_->FProp(input_dropout_.Theta(theta), CastToFPropDtype(inputs));
  // Without gradients in one process (eval, decode, a bundle) the cells run in order on this
  // thread over the whole batch: what splits 1 computes, without stage threads. Micro-batches
  // save activation memory for a backward pass, and stages on ranks hold only their own cells.
  const bool pipelined =
      pipe_ && (pipe_->placement.axis != nullptr || at::GradMode::is_enabled());
  if (pipelined && (segment_ids.defined() || aux_segment_ids.defined())) {
    throw FailedPreconditionError(StrCat("layer '", path(), "': packed inputs (segment ids) ",
                                         "cannot run in a pipeline (splits > 1); set the input's ",
                                         "packed_input to False"));
  }
  if (pipelined) {
    x = PipelineFProp(*pipe_, theta.at("x_layers"), x, paddings);
  } else {
    // Each layer from its own step seed, as a pipeline stage runs it (the masks do not depend on
    // splits); the thread's step seed is left as it was, on every exit path.
    struct RestoreSeed {
      int64_t seed = GetStepSeed();
      ~RestoreSeed() { ResetStepSeed(seed); }
    } restore;
    for (size_t i = 0; i < layers_.size(); ++i) {
      ResetStepSeed(layer_seeds_[i]);
      x = layers_[i]
              ->FProp(layers_[i].Theta(theta), x, paddings, aux_vecs, aux_paddings, segment_ids,
                      aux_segment_ids)
              .first;
    }
  }
  if (final_ln_) x = final_ln_->FProp(final_ln_.Theta(theta), x);
  return x;
}

void TransformerStack::CheckWhole(const char* what) const {
  if (pipe_ && pipe_->placement.axis != nullptr) {
    throw FailedPreconditionError(StrCat(
        "layer '", path(), "': ", what, " needs every layer, but this rank holds only pipeline "
        "stage ", pipe_->placement.stage, "'s (layers ", pipe_->placement.first, "-",
        pipe_->placement.end - 1, "); decode and export the trained checkpoint in one process"));
  }
}

NestedMap TransformerStack::InitStates(int64_t batch_size, at::ScalarType dtype) const {
  CheckWhole("incremental decoding");
  NestedMap states;
  NestedValue::List per_layer;
  for (const auto& layer : layers_) per_layer.push_back(layer->InitStates(batch_size, dtype));
  states.Put("x_layers", std::move(per_layer));
  return states;
}

std::pair<at::Tensor, NestedMap> TransformerStack::ExtendStep(
    const NestedMap& theta, const at::Tensor& inputs, const NestedMap& states,
    const at::Tensor& aux_vecs, const at::Tensor& aux_paddings) const {
  return ExtendStepProjected(theta, inputs, states, PrecomputeAux(theta, aux_vecs), aux_paddings);
}

NestedMap TransformerStack::PrecomputeContext(const NestedMap& theta, const at::Tensor& source,
                                              const at::Tensor& source_paddings) const {
  NestedMap context = StepLayer::PrecomputeContext(theta, source, source_paddings);
  context.Put("aux", PrecomputeAux(theta, source));
  return context;
}

std::pair<at::Tensor, NestedMap> TransformerStack::ExtendStep(const NestedMap& theta,
                                                              const at::Tensor& inputs,
                                                              const NestedMap& states,
                                                              const NestedMap& context) const {
  const NestedMap aux =
      context.contains("aux") ? context.at("aux").AsMap() : PrecomputeAux(theta, at::Tensor());
  return ExtendStepProjected(theta, inputs, states, aux, OptionalInput(context, "aux_paddings"),
                             OptionalInput(context, "paddings"));
}

NestedMap TransformerStack::PrecomputeAux(const NestedMap& theta,
                                          const at::Tensor& aux_vecs) const {
  CheckWhole("incremental decoding");
  NestedValue::List per_layer;
  for (const auto& layer : layers_) {
    per_layer.push_back(aux_vecs.defined() ? layer->PrecomputeAux(layer.Theta(theta), aux_vecs)
                                           : NestedMap());
  }
  NestedMap out;
  out.Put("x_layers", std::move(per_layer));
  return out;
}

std::pair<at::Tensor, NestedMap> TransformerStack::ExtendStepProjected(
    const NestedMap& theta, const at::Tensor& inputs, const NestedMap& states,
    const NestedMap& aux, const at::Tensor& aux_paddings, const at::Tensor& paddings) const {
  const auto& layer_aux = aux.at("x_layers").AsList();
  at::Tensor x = input_dropout_->FProp(input_dropout_.Theta(theta), CastToFPropDtype(inputs));
  const auto& layer_states = states.at("x_layers").AsList();
  NestedValue::List new_states;
  for (size_t i = 0; i < layers_.size(); ++i) {
    // Each layer through the one decoding interface, with its own projected source.
    NestedMap context;
    if (!layer_aux[i].AsMap().empty()) context.Put("aux", layer_aux[i].AsMap());
    if (aux_paddings.defined()) context.Put("aux_paddings", aux_paddings);
    if (paddings.defined()) context.Put("paddings", paddings);
    const StepLayer& layer = *layers_[i];
    auto [y, s] = layer.ExtendStep(layers_[i].Theta(theta), x, layer_states[i].AsMap(), context);
    x = y;
    new_states.push_back(std::move(s));
  }
  if (final_ln_) x = final_ln_->FProp(final_ln_.Theta(theta), x);
  NestedMap out;
  out.Put("x_layers", std::move(new_states));
  return {x, out};
}

glossa::Params TransformerEncoder::Params() {
  glossa::Params p = TransformerStack::Params();
  p.Set("cls", ClsOf<TransformerEncoder>());
  return p;
}

glossa::Params TransformerDecoder::Params() {
  glossa::Params p = TransformerStack::Params();
  p.Set("cls", ClsOf<TransformerDecoder>());
  p.Set("mask_self_atten", true).Set("has_aux_atten", true);
  return p;
}

GLOSSA_REGISTER_CLASS(TransformerStack, "glossa.layers.TransformerStack");
GLOSSA_REGISTER_CLASS(TransformerEncoder, "glossa.layers.TransformerEncoder");
GLOSSA_REGISTER_CLASS(TransformerDecoder, "glossa.layers.TransformerDecoder");

// ---- The uniform call (BaseLayer::FPropMap) ----

BaseLayer::FPropMapSignature TransformerStack::FPropMapSpec() const {
  return {{"inputs", "paddings", "aux_vecs", "aux_paddings", "segment_ids", "aux_segment_ids"},
          1, {"outputs"}, false, "Tensor"};
}

NestedMap TransformerStack::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  NestedMap out;
  out.Put("outputs", FProp(theta, inputs.GetTensor("inputs"), OptionalInput(inputs, "paddings"),
                           OptionalInput(inputs, "aux_vecs"), OptionalInput(inputs, "aux_paddings"),
                           OptionalInput(inputs, "segment_ids"),
                           OptionalInput(inputs, "aux_segment_ids")));
  return out;
}

}  // namespace glossa
