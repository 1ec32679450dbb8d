// BaseLayer: Lingvo's layer base. A layer is built from its Params, creates its variables and child
// layers during construction, and computes with FProp(theta, ...) on explicit weights, so the same
// layer runs on any theta (towers, pipeline stages, EMA weights, recomputation, stubs).
//
//   class ScaledNorm : public BaseLayer {
//    public:
//     static glossa::Params Params();       // BaseLayer::Params() + dim, ln_tpl
//     explicit ScaledNorm(const glossa::Params& p) : BaseLayer(p) {
//       CreateVariable("w", {{p.GetInt("dim")}});
//       ln_ = CreateChild<LayerNorm>("ln", p.GetParams("ln_tpl"));  // a typed handle, kept
//     }
//     at::Tensor FProp(const NestedMap& theta, const at::Tensor& x) const {
//       return ln_->FProp(ln_.Theta(theta), x) * theta.GetTensor("w");  // Lingvo: theta.ln
//     }
//    private:
//     Child<LayerNorm> ln_;
//   };
//   GLOSSA_REGISTER_CLASS(ScaledNorm, "my.layers.ScaledNorm");
//   auto layer = Instantiate<ScaledNorm>(ScaledNorm::Params().Set("name", "sn"));
//   at::Tensor y = layer->FProp(layer->theta(), x);
//
// Params are read into members in the constructor; FProp reads members, never params() (a test,
// tests/lint/check_fprop_params.py, enforces it for glossa/).
//
// Variable full names are scope paths, `root/child/var`; initial values are deterministic given
// the layer's random_seed (or the WeightInit's seed) and the full name. Without any seed a random
// one is drawn once per process and logged, so the run can be repeated by setting it.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "glossa/core/nested_map.h"
#include "glossa/core/params.h"
#include "glossa/layers/accumulator.h"
#include "glossa/layers/layer_scopes.h"
#include "glossa/layers/mesh.h"
#include "glossa/layers/weight_init.h"

namespace glossa {

class ComputePlan;        // glossa/kernels/compute_plan.h
class FpropCopy;          // glossa/kernels/cast_together.h
struct ComputePolicy;
struct PreparedWeight;

// Where eval reads exponential moving averages of variables (issue 4's ExponentialMovingAverage
// implements it). Average returns nullopt for variables it does not track.
class EmaSource {
 public:
  virtual ~EmaSource() = default;
  virtual std::optional<at::Tensor> Average(const std::string& var_full_name) const = 0;
};

class BaseLayer;

// Lingvo's theta.<name>: the theta of `child` (created under `key`, element `index` of a list of
// children when index >= 0) inside its parent's theta. InvalidArgument naming the child's path and
// the keys present when it is missing; FailedPrecondition for a null child (an empty handle).
const NestedMap& ChildTheta(const NestedMap& parent_theta, const BaseLayer* child,
                            const std::string& key, int64_t index);

// FailedPrecondition: child `key` is not built in this process (a pipeline rank holds only its
// stage's layers).
[[noreturn]] void ThrowChildNotHere(const std::string& key);

// A typed handle to a child layer, returned by CreateChild<T> and kept as a member: FProp calls
// the child through it without lookups by name or casts. An empty handle (a child this process
// does not build: DeclareRemoteScope) is FailedPrecondition when used.
template <typename T>
class Child {
 public:
  Child() = default;
  Child(const T* layer, std::string key, int64_t index = -1)
      : layer_(layer), key_(std::move(key)), index_(index) {}
  const T* operator->() const {
    if (layer_ == nullptr) ThrowChildNotHere(key_);
    return layer_;
  }
  const T& operator*() const { return *operator->(); }
  const T* get() const { return layer_; }
  explicit operator bool() const { return layer_ != nullptr; }
  // This child's theta inside its parent's theta (Lingvo's theta.<name>).
  const NestedMap& Theta(const NestedMap& parent_theta) const {
    return ChildTheta(parent_theta, layer_, key_, index_);
  }

 private:
  const T* layer_ = nullptr;
  std::string key_;
  int64_t index_ = -1;
};

class BaseLayer {
 public:
  // Lingvo's BaseLayer fields: name, dtype, fprop_dtype, random_seed, vn (variational noise),
  // params_init, is_inference, skip_lp_regularization. (TF- and SPMD-specific fields such as
  // allow_implicit_capture and device_mesh are not carried.)
  static glossa::Params Params();
  // Lingvo's CopyBaseParams: copies dtype, fprop_dtype, random_seed, is_inference,
  // skip_lp_regularization, vn and params_init from `from` wherever `to` still has the default.
  static glossa::Params& CopyBaseParams(const glossa::Params& from, glossa::Params& to);

  explicit BaseLayer(const glossa::Params& params);
  virtual ~BaseLayer();
  BaseLayer(const BaseLayer&) = delete;
  BaseLayer& operator=(const BaseLayer&) = delete;

  // The layer's Params (a frozen copy).
  const glossa::Params& params() const { return params_; }
  const std::string& name() const { return name_; }
  // The variable scope, e.g. "lm/enc/layer_0": a variable `w` here is "lm/enc/layer_0/w".
  const std::string& scope() const { return scope_; }
  // Dotted path from the root layer, e.g. "lm.enc.layer_0".
  const std::string& path() const { return path_; }
  const BaseLayer* parent() const { return parent_; }
  // What the layer was built for beyond its Params (the mesh axes of this rank): its parent's, or
  // the root's from InstantiateLayer. Kept for the layer's life; no thread-local scope decides it.
  const BuildContext& build_context() const { return build_context_; }
  // A layer whose Params shard it over a mesh axis that its build context lacks builds whole (every
  // shard in this process: what eval, decode and export run). Training refuses such a model, as
  // its checkpoints would not resume on the mesh its Params name. Default: none.
  struct UnmetMeshAxis {
    std::string variable;  // a sharded variable's full name
    std::string axis;      // the axis it needs ("expert")
    int64_t size = 0;      // of that many ranks
  };
  virtual std::optional<UnmetMeshAxis> UnmetMesh() const { return std::nullopt; }
  // UnmetMesh of this layer and every layer under it, in construction order.
  std::vector<UnmetMeshAxis> UnmetMeshAxes() const;
  at::ScalarType dtype() const { return dtype_; }
  // fprop_dtype, or dtype when unset.
  at::ScalarType fprop_dtype() const { return fprop_dtype_; }
  bool is_inference() const;
  // Why this layer cannot sit inside a container that replays its blocks (recomputation, pipeline
  // stages on other threads): a reason naming what would go wrong, or "" when it can. Containers
  // ask every layer under their blocks (CheckReplayable), so they need know no concrete class.
  virtual std::string ReplayHazard() const { return ""; }
  // Whether FProp adds an auxiliary loss to the current AuxLossContext (a MoE layer's load
  // balancing): a replaying container must carry it out of its replay (a pipeline does; RevNet
  // and recomputation refuse such a layer: CheckReplayable).
  virtual bool AddsAuxLoss() const { return false; }

  // ---- The uniform call ----
  // Every layer can be called by name, whatever its typed FProp looks like: FPropMap(theta,
  // inputs) maps named inputs to named outputs, as Lingvo documents FProp's arguments and
  // NestedMap results. The typed FProp overloads stay for C++ callers; FPropMap is what generic
  // callers use (the Python binding, tools), so they need know no concrete class. A class
  // documents its inputs and outputs in FPropMapSignature() (and its header); FPropMap checks that
  // the required inputs are present and that no unknown input is given (InvalidArgumentError
  // naming the layer and the key). The default serves a Block ({x, paddings?} -> {outputs}); any
  // other class without an override is UnimplementedError naming the class.
  //
  //   NestedMap in;  in.Put("inputs", x);
  //   at::Tensor y = layer.FPropMap(theta, in).GetTensor("outputs");
  struct FPropMapSignature {
    std::vector<std::string> inputs;   // in positional order (Python's *args map onto them)
    size_t required = 1;               // the first `required` inputs must be given
    std::vector<std::string> outputs;  // in order; empty: a dict of whatever FPropMap returns
    // How Python returns it: a tuple of the outputs in order (else a lone output alone, or the
    // dict), and what the result is, for humans.
    bool tuple = false;
    std::string returns;
  };
  // The inputs and outputs FPropMap takes and gives; inputs empty: no uniform call.
  virtual FPropMapSignature FPropMapSpec() const;
  NestedMap FPropMap(const NestedMap& theta, const NestedMap& inputs) const;
  // "FProp(theta, inputs, paddings=None) -> outputs  [ProjectionLayer]"; "" without a call.
  std::string FPropMapSignatureText() const;

  // ---- Variables ----
  struct VariableInfo {
    std::string name;       // within this layer
    std::string full_name;  // scope/name
    WeightParams params;
    bool trainable = true;
    // A trainable float32 variable of a layer whose fprop_dtype is bf16: its bf16 copy as the
    // optimizer left it (theta() uses it while it stands for the variable); null otherwise.
    std::shared_ptr<FpropCopy> fprop_copy;
  };
  // Own variables, in creation order.
  const std::vector<VariableInfo>& variable_infos() const { return var_infos_; }
  const at::Tensor& GetVariable(const std::string& name) const;
  // All variables of this subtree: own ones by name, children's under the child's name (lists of
  // children as lists, dicts as maps).
  NestedMap vars() const;
  // What FProp uses: vars (EMA averages in eval when the root has an EMA and the layer is not in
  // inference mode), with variational noise in training when vn.global_vn, cast to fprop_dtype
  // where it differs from dtype.
  NestedMap theta() const;
  // Every variable of the subtree by full name, with its info.
  std::vector<std::pair<VariableInfo, at::Tensor>> AllVariables() const;
  // Variable scopes of the subtree that other ranks hold (a pipeline stage's model holds its own
  // cells only; DeclareRemoteScope): checkpoint tensors under them belong to those ranks.
  std::vector<std::string> RemoteScopes() const;
  // Sets the root's EMA source (read by theta() in eval anywhere in the tree).
  void SetEma(std::shared_ptr<const EmaSource> ema);
  const EmaSource* ema() const;

  // ---- The inference plan (glossa/kernels/compute_plan.h) ----
  // Sets the root's plan, made by PlanInference for this model's weights (null removes it).
  void SetComputePlan(std::shared_ptr<const ComputePlan> plan);
  // The root's plan where it applies now (one is set and autograd is off), else null: what FProp
  // runs its projections, attention core and decoding step by.
  const ComputePlan* compute_plan() const;
  // Adds the weights this layer's FProp reads through the plan, prepared for it, keyed by
  // PlanKey: the layers that read them (PlannedWeight) override it. `theta` is this layer's.
  virtual void PrepareWeights(const NestedMap& theta, ComputePlan& plan) const;
  // PrepareWeights of this layer and every layer under it.
  void PrepareWeightsTree(ComputePlan& plan) const;
  // Moves every variable of the subtree to `device` (keeping trainability).
  void MoveTo(at::Device device);

  // ---- Children ----
  BaseLayer& GetChild(const std::string& name) const;
  bool HasChild(const std::string& name) const;
  std::vector<std::string> ChildNames() const;
  // Walks children with "a.b[1].c" (lists by index, dicts by key).
  BaseLayer& GetDescendant(const std::string& path) const;
  // Children created by CreateChildren, as a flat list in flatten order.
  std::vector<BaseLayer*> GetChildren(const std::string& name) const;
  template <typename T>
  T& GetChildAs(const std::string& name) const {
    return Cast<T>(GetChild(name), name);
  }

  // ---- Accumulators ----
  void RegisterAccumulator(const std::string& name, std::unique_ptr<Accumulator> acc);
  Accumulator& GetAccumulator(const std::string& name) const;
  // Values of every accumulator in the subtree, nested like vars().
  NestedMap GetAccumulatorValues() const;
  // Sets values from a NestedMap compatible with GetAccumulatorValues() (InvalidArgument
  // otherwise).
  void SetAccumulatorValues(const NestedMap& values);
  void ResetAccumulators();
  void DisableAccumulators();
  void EnableAccumulators();

  // Casts floating tensors to fprop_dtype (Lingvo's _CastToFPropDtype, for inputs).
  at::Tensor CastToFPropDtype(const at::Tensor& x) const;

  // Called by the class registry after the constructor returns: CreateVariable, CreateChild(ren),
  // AddChild and RegisterAccumulator are allowed only before this.
  void FinishConstruction() { constructed_ = true; }

 protected:
  // FPropMap's body, after the inputs were checked against FPropMapSpec(): absent optional
  // inputs are missing from `inputs` (NestedMap::Get... on them throws; use contains()).
  virtual NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const;

  // The plan's key for this layer's variable `name` (or a form derived from it, "atten:qkv"):
  // its full name, scope()/name.
  std::string PlanKey(const std::string& name) const;
  // The weight the plan prepared under PlanKey(name) from `sources` (theta's tensors for it now,
  // checked: ComputePlan::Find), or null without a plan that applies now or without that weight.
  const PreparedWeight* PlannedWeight(const std::string& name,
                                      std::initializer_list<at::Tensor> sources) const;
  // x [M, K]·w + b through PlannedWeight(name, {source}) where there is one, else Affine(x, w, b)
  // (glossa/kernels/gemm.h): `w` is `source` as Affine reads it, [K, N].
  at::Tensor PlannedAffine(const std::string& name, const at::Tensor& source, const at::Tensor& x,
                           const at::Tensor& w, const at::Tensor& b, bool relu = false,
                           bool float_out = false) const;
  // Whether the attention core and the decoding step's row kernels run batch-invariant now
  // (a batch-invariant plan, ComputePlan::BatchInvariantNow).
  bool PlannedBatchInvariant() const;

  // Creates variable `name` (checked like NestedMap keys; shares one namespace with children and
  // accumulators) and returns it.
  at::Tensor CreateVariable(const std::string& name, WeightParams wp);
  // Creates a child from a copy of `p` with the base params copied in (CopyBaseParams); its
  // variable scope is p.name when set, else `name`.
  BaseLayer& CreateChild(const std::string& name, const glossa::Params& p);
  template <typename T>
  T& CreateChildAs(const std::string& name, const glossa::Params& p) {
    return Cast<T>(CreateChild(name, p), name);
  }
  // The same, returning a typed handle to keep (InvalidArgument naming the child when its class
  // is not a T).
  template <typename T>
  Child<T> CreateChild(const std::string& name, const glossa::Params& p) {
    return Child<T>(&Cast<T>(CreateChild(name, p), name), name);
  }
  // A flat list of children (CreateChildren on a list of Params) as typed handles. InvalidArgument
  // naming `name[i]` for an element that is not Params or whose class is not a T.
  template <typename T>
  std::vector<Child<T>> CreateChildren(const std::string& name, const ParamValue::List& params) {
    CheckFlatParamsList(name, params);
    CreateChildren(name, ParamValue(params));
    std::vector<Child<T>> out;
    const std::vector<BaseLayer*> layers = GetChildren(name);
    for (size_t i = 0; i < layers.size(); ++i) {
      const std::string element = name + "[" + std::to_string(i) + "]";
      out.emplace_back(&Cast<T>(*layers[i], element), name, static_cast<int64_t>(i));
    }
    return out;
  }
  // A list or (nested) dict of Params; unnamed children are named `name_0`, `name_1`, ... in
  // flatten order (lists by index, dict keys sorted).
  void CreateChildren(const std::string& name, const ParamValue& params_structure);
  // CreateChildren with the children (and theirs) built in `context` instead of this layer's (a
  // pipeline stage's cells: its context with kPipelineStageCollection).
  template <typename T>
  std::vector<Child<T>> CreateChildrenIn(const BuildContext& context, const std::string& name,
                                         const ParamValue::List& params) {
    ChildContext in(*this, context);
    return CreateChildren<T>(name, params);
  }
  void CreateChildrenIn(const BuildContext& context, const std::string& name,
                        const ParamValue& params_structure) {
    ChildContext in(*this, context);
    CreateChildren(name, params_structure);
  }
  // CreateChild<T> built in `context` (a pipeline's first or last stage's layers around it).
  template <typename T>
  Child<T> CreateChildIn(const BuildContext& context, const std::string& name,
                         const glossa::Params& p) {
    ChildContext in(*this, context);
    return CreateChild<T>(name, p);
  }
  // Adds an existing layer as a child.
  void AddChild(const std::string& name, std::unique_ptr<BaseLayer> child);

 private:
  struct ChildTree;
  template <typename T>
  static T& Cast(BaseLayer& layer, const std::string& name);
  [[noreturn]] static void CastError(const BaseLayer& layer, const std::string& name,
                                     const char* type);
  void CheckName(const std::string& name, const char* what) const;
  void CheckFlatParamsList(const std::string& name, const ParamValue::List& params) const;
  void CheckConstructing(const char* what) const;
  std::unique_ptr<BaseLayer> BuildChild(const glossa::Params& p, const std::string& default_name);
 protected:
  // During construction: the child `name` of this layer (its scope scope()/name) is built and
  // trained on another rank, not here (RemoteScopes).
  void DeclareRemoteScope(const std::string& name);

 private:
  const ChildTree& FindChildTree(const std::string& name) const;
  NestedValue MapChildren(const ChildTree& tree,
                          const std::function<NestedValue(const BaseLayer&)>& fn) const;
  NestedMap CollectTree(const std::function<NestedValue(const BaseLayer&)>& fn) const;
  void ForEachChild(const std::function<void(BaseLayer&)>& fn) const;
  const BaseLayer& Root() const;

  glossa::Params params_;
  std::string name_;
  std::string scope_;
  std::string path_;
  BaseLayer* parent_ = nullptr;
  BuildContext build_context_;
  // The context children are built in while CreateChildrenIn runs (null: build_context_).
  const BuildContext* child_context_ = nullptr;
  struct ChildContext {
    ChildContext(BaseLayer& layer, const BuildContext& context)
        : layer_(layer), previous_(layer.child_context_) {
      layer.child_context_ = &context;
    }
    ~ChildContext() { layer_.child_context_ = previous_; }
    BaseLayer& layer_;
    const BuildContext* previous_;
  };
  at::ScalarType dtype_;
  at::ScalarType fprop_dtype_;
  bool constructed_ = false;
  std::vector<VariableInfo> var_infos_;
  std::map<std::string, at::Tensor> vars_;
  std::map<std::string, std::unique_ptr<ChildTree>> children_;
  std::map<std::string, std::unique_ptr<Accumulator>> accumulators_;
  std::shared_ptr<const EmaSource> ema_;
  std::shared_ptr<const ComputePlan> compute_plan_;
  std::vector<std::string> remote_scopes_;
};

template <typename T>
T& BaseLayer::Cast(BaseLayer& layer, const std::string& name) {
  T* t = dynamic_cast<T*>(&layer);
  if (t == nullptr) CastError(layer, name, typeid(T).name());
  return *t;
}

// The one call shape containers use for their blocks (SequentialLayer, RevNet's f and g blocks,
// pipeline cells, a user's container): a layer that is also a Block maps x to a tensor of the same
// shape, with optional paddings. A user's layer drops into any container by deriving from it:
//
//   class MyBlock : public BaseLayer, public Block {
//     at::Tensor FPropBlock(const NestedMap& theta, const at::Tensor& x,
//                           const at::Tensor& paddings) const override { return FProp(theta, x); }
//   };
class Block {
 public:
  virtual ~Block() = default;
  // x: [B, T, D] for sequence blocks (any shape for element-wise ones); paddings: [B, T] (1 =
  // padded) or undefined; blocks without paddings ignore them.
  virtual at::Tensor FPropBlock(const NestedMap& theta, const at::Tensor& x,
                                const at::Tensor& paddings) const = 0;
  // One incremental-decoding step: x [B, 1, D], the step's tokens taken together (a block that
  // groups tokens, such as MoE routing, overrides this). Default: FPropBlock without paddings.
  virtual at::Tensor StepBlock(const NestedMap& theta, const at::Tensor& x) const {
    return FPropBlock(theta, x, {});
  }
};

// For FPropMapImpl bodies: inputs[key] as a tensor, or an undefined tensor when the optional input
// is absent or None.
at::Tensor OptionalInput(const NestedMap& inputs, std::string_view key);

// The inference plan for `model`'s weights as they are now: every layer prepares what its FProp
// reads for `policy` (PrepareWeightsTree). The Predictor makes one when a bundle loads and sets it
// (model.SetComputePlan); making it again after the weights change is the caller's.
std::shared_ptr<const ComputePlan> PlanInference(const BaseLayer& model,
                                                 const ComputePolicy& policy);

// Builds the layer `p` describes (p.cls) as a root layer, for `context` (the mesh axes of this
// rank; none: the whole model in one process). Every layer under it is built for the same context.
class ConstructionFrame {  // the construction stack's entry for a root (internal)
 public:
  explicit ConstructionFrame(const BuildContext& context);
  ~ConstructionFrame();
  ConstructionFrame(const ConstructionFrame&) = delete;
  ConstructionFrame& operator=(const ConstructionFrame&) = delete;
};
template <typename T = BaseLayer>
std::unique_ptr<T> InstantiateLayer(const Params& p, const BuildContext& context = BuildContext()) {
  ConstructionFrame frame(context);
  return p.Instantiate<T>();
}

}  // namespace glossa
