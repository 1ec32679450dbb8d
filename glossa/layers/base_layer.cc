#include "glossa/layers/base_layer.h"
#include "glossa/layers/process_seed.h"

#include <ATen/ATen.h>
#include <glog/logging.h>

#include <charconv>
#include <atomic>
#include <mutex>
#include <random>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/kernels/cast_together.h"

namespace glossa {

void ThrowChildNotHere(const std::string& key) {
  throw FailedPreconditionError(StrCat("child layer '", key, "' is not built in this process: a "
                                       "pipeline rank holds only its stage's layers"));
}

namespace {

// The construction stack of this thread (innermost last): a layer whose constructor is running
// CreateChild, or a root's InstantiateLayer with the context it builds for. A layer's constructor
// takes its parent and build context from the top (a root built outside InstantiateLayer: none).
struct Frame {
  BaseLayer* parent;
  const BuildContext* context;  // a root's, or a child's from CreateChildrenIn; else the parent's
};
// per-thread (not carried): a layer and its children are built on one thread.
thread_local std::vector<Frame> t_construction;

// Lingvo's SanitizeScopeKey: drop one leading '_', '[' -> '_', drop ']'.
std::string SanitizeScopeKey(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    if (i == 0 && c == '_') continue;
    if (c != ']') out += c == '[' ? '_' : c;
  }
  return out;
}

Params DefaultVN() {
  Params vn;
  vn.Define("scale", nullptr,
            "Multiplier. Stddev for Gaussian noise; uniform noise is in [-scale/2, scale/2].");
  vn.Define("global_vn", false, "Add global variational noise to the weights in training.");
  vn.Define("per_step_vn", false, "Add per-timestep variational noise.");
  vn.Define("seed", nullptr, "Op seed for the noise.");
  vn.Define("deterministic", true, "Draw the noise from the step seed pair (always true here).");
  vn.Define("use_uniform_noise", false, "Uniform noise in [-0.5, 0.5) instead of N(0, 1).");
  vn.Define("weight_norm_type", nullptr,
            "None, 'L2', 'Linf' or 'PerChannelLinf': scale the noise by this norm of the weight.");
  vn.Define("weight_norm_stop_grad", true, "Stop the gradient through the weight norm.");
  vn.Define("start_step", 0, "Add noise only from this global step on.");
  return vn;
}

std::optional<int64_t> OptionalInt(const Params& p, const char* key) {
  const ParamValue& v = p.Get(key);
  if (v.is_none()) return std::nullopt;
  return v.AsInt();
}

}  // namespace

// A child slot: one layer, a list of slots or a dict of slots.
struct BaseLayer::ChildTree {
  std::unique_ptr<BaseLayer> layer;
  std::vector<ChildTree> list;
  std::map<std::string, ChildTree> dict;
  enum class Kind { kLayer, kList, kDict } kind = Kind::kLayer;
};

glossa::Params BaseLayer::Params() {
  glossa::Params p;
  p.Define("cls", nullptr, "Cls that this param object is associated with.");
  p.Define("name", "", "Name of this layer object.");
  p.Define("dtype", DType::kFloat32, "Datatype to use (variables).");
  p.Define("fprop_dtype", nullptr, "Activations datatype to use; None means dtype.");
  p.Define("random_seed", nullptr,
           "Random seed for deterministic unit tests; inherited by children that leave it unset.");
  p.Define("vn", DefaultVN(), "How variational noise should be applied.");
  p.Define("params_init", WeightInit::Default().ToParams(),
           "How model weights should be initialized. Not to be confused with hyperparams.");
  p.Define("is_inference", nullptr, "True if in inference mode.");
  p.Define("skip_lp_regularization", nullptr,
           "If True, all variables in this layer skip L1/L2 regularization; passed to children "
           "left at None.");
  return p;
}

glossa::Params& BaseLayer::CopyBaseParams(const glossa::Params& from, glossa::Params& to) {
  if (to.Get("dtype").AsDType() == DType::kFloat32) to.Set("dtype", from.Get("dtype"));
  for (const char* key : {"fprop_dtype", "random_seed", "is_inference", "skip_lp_regularization"}) {
    if (to.Get(key).is_none()) to.Set(key, from.Get(key));
  }
  if (to.GetParams("vn") == DefaultVN()) to.Set("vn", from.GetParams("vn"));
  if (WeightInit::FromParams(to.GetParams("params_init")).IsDefault()) {
    to.Set("params_init", from.GetParams("params_init"));
  }
  return to;
}

std::vector<BaseLayer::UnmetMeshAxis> BaseLayer::UnmetMeshAxes() const {
  std::vector<UnmetMeshAxis> out;
  if (auto need = UnmetMesh()) out.push_back(std::move(*need));
  ForEachChild([&](BaseLayer& child) {
    for (auto& need : child.UnmetMeshAxes()) out.push_back(std::move(need));
  });
  return out;
}

ConstructionFrame::ConstructionFrame(const BuildContext& context) {
  t_construction.push_back({nullptr, &context});
}
ConstructionFrame::~ConstructionFrame() { t_construction.pop_back(); }

BaseLayer::BaseLayer(const glossa::Params& params) : params_(params.Copy()) {
  name_ = params_.GetString("name");
  if (name_.empty()) {
    throw InvalidArgumentError(StrCat(
        "layer params (cls ", PyStrRepr(params_.Get("cls").is_none() ? "None" : params_.ClsKey()),
        ") must set `name`"));
  }
  if (!t_construction.empty()) {
    const Frame& top = t_construction.back();
    parent_ = top.parent;
    build_context_ = top.context != nullptr ? *top.context : parent_->build_context_;
  }
  // Names become variable names, checkpoint keys and summary tags: keep them short.
  constexpr size_t kMaxNameBytes = 256;
  if (name_.size() > kMaxNameBytes) {
    throw InvalidArgumentError(StrCat(
        "layer name '", name_.substr(0, 32), "...' under '", parent_ ? parent_->path_ : "", "' is ",
        name_.size(), " bytes; the limit is ", kMaxNameBytes));
  }
  const std::string scope_name = SanitizeScopeKey(name_);
  scope_ = parent_ ? parent_->scope_ + "/" + scope_name : scope_name;
  path_ = parent_ ? parent_->path_ + "." + name_ : name_;
  dtype_ = ToScalarType(params_.Get("dtype").AsDType());
  const ParamValue& fprop = params_.Get("fprop_dtype");
  fprop_dtype_ = fprop.is_none() ? dtype_ : ToScalarType(fprop.AsDType());
  WeightInit::FromParams(params_.GetParams("params_init"));  // validates early
  params_.Freeze();
}

BaseLayer::~BaseLayer() = default;

bool BaseLayer::is_inference() const {
  const ParamValue& v = params_.Get("is_inference");
  return !v.is_none() && v.AsBool();
}

void BaseLayer::CheckConstructing(const char* what) const {
  if (constructed_) {
    throw FailedPreconditionError(
        StrCat("layer '", path_, "': ", what, " is only allowed during construction"));
  }
}

void BaseLayer::CheckName(const std::string& name, const char* what) const {
  try {
    NestedMap::CheckKey(name);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(
        StrCat("layer '", path_, "': invalid ", what, " name: ", e.message()));
  }
  if (vars_.count(name) || children_.count(name) || accumulators_.count(name)) {
    throw InvalidArgumentError(StrCat("layer '", path_, "': ", what, " name '", name,
                                      "' is already used by a variable, child or accumulator"));
  }
}

at::Tensor BaseLayer::CreateVariable(const std::string& name, WeightParams wp) {
  CheckConstructing("CreateVariable");
  CheckName(name, "variable");
  for (const std::string& c : build_context_.collections()) {
    if (std::find(wp.collections.begin(), wp.collections.end(), c) == wp.collections.end()) {
      wp.collections.push_back(c);
    }
  }
  const ParamValue& skip_lp = params_.Get("skip_lp_regularization");
  if (!skip_lp.is_none() && skip_lp.AsBool() &&
      std::find(wp.collections.begin(), wp.collections.end(), kSkipLpRegularizationCollection) ==
          wp.collections.end()) {
    wp.collections.push_back(kSkipLpRegularizationCollection);
  }
  VariableInfo info;
  info.name = name;
  info.full_name = scope_ + "/" + name;
  info.trainable = std::find(wp.collections.begin(), wp.collections.end(),
                             kNonTrainableCollection) == wp.collections.end();
  info.params = wp;
  at::Tensor value;
  VariableStubScope* const stubs = VariableStubScope::Current();
  if (stubs != nullptr && name.find("total_samples") == std::string::npos) {
    auto key = std::make_pair(wp.shape, ToScalarType(wp.dtype));
    auto it = stubs->cache_.find(key);
    if (it == stubs->cache_.end()) {
      it = stubs->cache_
               .emplace(key, at::zeros(wp.shape, at::TensorOptions().dtype(key.second)))
               .first;
    }
    value = it->second;
  } else {
    const std::optional<int64_t> layer_seed = OptionalInt(params_, "random_seed");
    const int64_t user_seed = wp.init.seed ? *wp.init.seed
                              : layer_seed ? *layer_seed
                                           : UseProcessRandomSeed();
    try {
      const std::array<int64_t, 2> seed = {user_seed, GenerateSeedFromName(info.full_name)};
      if (wp.shard_count > 1 && !wp.shape.empty()) {
        WeightParams whole = wp;
        const int64_t dim = wp.shard_dim, n = wp.shape.at(dim);
        whole.shape[dim] *= wp.shard_count;
        value = InitializeWeight(whole, seed)
                    .slice(dim, wp.shard_index * n, (wp.shard_index + 1) * n)
                    .contiguous();
      } else {
        value = InitializeWeight(wp, seed);
      }
    } catch (const InvalidArgumentError& e) {
      throw InvalidArgumentError(StrCat("variable '", info.full_name, "': ", e.message()));
    }
    if (info.trainable && value.is_floating_point()) value.requires_grad_(true);
  }
  if (info.trainable && value.scalar_type() == at::kFloat && dtype_ == at::kFloat &&
      fprop_dtype_ == at::kBFloat16) {
    info.fprop_copy = std::make_shared<FpropCopy>();
  }
  var_infos_.push_back(info);
  vars_[name] = value;
  return value;
}

const NestedMap& ChildTheta(const NestedMap& parent_theta, const BaseLayer* child_ptr,
                            const std::string& key, int64_t index) {
  if (child_ptr == nullptr) {
    throw FailedPreconditionError(
        StrCat("Theta() of an empty child handle ('", key, "'): the child was never created"));
  }
  const BaseLayer& child = *child_ptr;
  auto missing = [&](const std::string& what) -> InvalidArgumentError {
    std::vector<std::string> keys;
    for (const auto& [k, v] : parent_theta) keys.push_back(k);
    return InvalidArgumentError(StrCat("theta of layer '", child.path(), "' is missing: ", what,
                                       " (the theta given to '",
                                       child.parent() ? child.parent()->path() : "", "' has: ",
                                       Join(keys, ", "), ")"));
  };
  if (!parent_theta.contains(key)) throw missing(StrCat("no '", key, "'"));
  const NestedValue& v = parent_theta.at(key);
  if (index < 0) {
    if (!v.is_map()) throw missing(StrCat("'", key, "' is a ", v.KindName(), ", not a map"));
    return v.AsMap();
  }
  if (!v.is_list() || index >= static_cast<int64_t>(v.AsList().size()) ||
      !v.AsList()[index].is_map()) {
    throw missing(StrCat("'", key, "' has no map at index ", index));
  }
  return v.AsList()[index].AsMap();
}

const at::Tensor& BaseLayer::GetVariable(const std::string& name) const {
  auto it = vars_.find(name);
  if (it == vars_.end()) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : vars_) keys.push_back(k);
    throw NotFoundError(StrCat("layer '", path_, "' has no variable ", KeyErrorString(name, keys)));
  }
  return it->second;
}

std::unique_ptr<BaseLayer> BaseLayer::BuildChild(const glossa::Params& p,
                                                 const std::string& default_name) {
  glossa::Params child_params = p.Copy();
  if (child_params.IsFrozen()) {
    // Frozen params (e.g. another layer's params()) are copied into a mutable Params.
    glossa::Params unfrozen;
    for (const auto& e : child_params) unfrozen.Define(e.name, e.value, e.doc);
    child_params = std::move(unfrozen);
  }
  if (!child_params.Contains("name") || !child_params.Contains("cls")) {
    throw InvalidArgumentError(StrCat("layer '", path_, "': child '", default_name,
                                      "' params are not layer params (no name or cls)"));
  }
  CopyBaseParams(params_, child_params);
  if (child_params.GetString("name").empty()) child_params.Set("name", default_name);
  t_construction.push_back({this, child_context_});
  try {
    std::unique_ptr<BaseLayer> child = child_params.Instantiate<BaseLayer>();
    t_construction.pop_back();
    return child;
  } catch (...) {
    t_construction.pop_back();
    throw;
  }
}

void BaseLayer::CheckFlatParamsList(const std::string& name,
                                    const ParamValue::List& params) const {
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].is_params()) {
      throw InvalidArgumentError(StrCat("layer '", path_, "': ", name, "[", i,
                                        "] must be layer Params, found a ", params[i].KindName()));
    }
  }
}

BaseLayer& BaseLayer::CreateChild(const std::string& name, const glossa::Params& p) {
  CheckConstructing("CreateChild");
  CheckName(name, "child");
  auto tree = std::make_unique<ChildTree>();
  tree->layer = BuildChild(p, name);
  BaseLayer& child = *tree->layer;
  children_[name] = std::move(tree);
  return child;
}

void BaseLayer::CreateChildren(const std::string& name, const ParamValue& structure) {
  CheckConstructing("CreateChildren");
  CheckName(name, "child");
  int uid = 0;
  std::function<ChildTree(const ParamValue&)> build = [&](const ParamValue& v) -> ChildTree {
    ChildTree t;
    if (v.is_params()) {
      const bool named = !v.AsParams().Contains("name") || !v.AsParams().GetString("name").empty();
      t.layer = BuildChild(v.AsParams(), named ? "" : StrCat(name, "_", uid));
      if (!named) ++uid;
    } else if (v.is_list()) {
      t.kind = ChildTree::Kind::kList;
      for (const auto& x : v.AsList()) t.list.push_back(build(x));
    } else if (v.is_dict()) {
      t.kind = ChildTree::Kind::kDict;
      for (const auto& [k, x] : v.AsDict()) {
        NestedMap::CheckKey(k);
        t.dict.emplace(k, build(x));
      }
    } else {
      throw InvalidArgumentError(StrCat("layer '", path_, "': CreateChildren('", name,
                                        "') takes lists and dicts of layer Params, found a ",
                                        v.KindName()));
    }
    return t;
  };
  if (!structure.is_list() && !structure.is_dict()) {
    throw InvalidArgumentError(StrCat("layer '", path_, "': CreateChildren('", name,
                                      "') takes a list or dict of layer Params, not a ",
                                      structure.KindName()));
  }
  children_[name] = std::make_unique<ChildTree>(build(structure));
}

void BaseLayer::AddChild(const std::string& name, std::unique_ptr<BaseLayer> child) {
  CheckConstructing("AddChild");
  CheckName(name, "child");
  if (!child)
    throw InvalidArgumentError(StrCat("layer '", path_, "': AddChild('", name, "', null)"));
  auto tree = std::make_unique<ChildTree>();
  tree->layer = std::move(child);
  children_[name] = std::move(tree);
}

const BaseLayer::ChildTree& BaseLayer::FindChildTree(const std::string& name) const {
  auto it = children_.find(name);
  if (it == children_.end()) {
    throw NotFoundError(
        StrCat("layer '", path_, "' has no child ", KeyErrorString(name, ChildNames())));
  }
  return *it->second;
}

BaseLayer& BaseLayer::GetChild(const std::string& name) const {
  const ChildTree& t = FindChildTree(name);
  if (t.kind != ChildTree::Kind::kLayer) {
    throw InvalidArgumentError(StrCat("layer '", path_, "': child '", name,
                                      "' is a list or dict of layers; use GetChildren or "
                                      "GetDescendant"));
  }
  return *t.layer;
}

bool BaseLayer::HasChild(const std::string& name) const { return children_.count(name) > 0; }

std::vector<std::string> BaseLayer::ChildNames() const {
  std::vector<std::string> names;
  for (const auto& [k, v] : children_) names.push_back(k);
  return names;
}

std::vector<BaseLayer*> BaseLayer::GetChildren(const std::string& name) const {
  std::vector<BaseLayer*> out;
  std::function<void(const ChildTree&)> walk = [&](const ChildTree& t) {
    if (t.kind == ChildTree::Kind::kLayer) {
      out.push_back(t.layer.get());
    } else if (t.kind == ChildTree::Kind::kList) {
      for (const auto& x : t.list) walk(x);
    } else {
      for (const auto& [k, x] : t.dict) walk(x);
    }
  };
  walk(FindChildTree(name));
  return out;
}

BaseLayer& BaseLayer::GetDescendant(const std::string& path) const {
  const BaseLayer* layer = this;
  const ChildTree* tree = nullptr;
  for (const std::string& part : Split(path, '.')) {
    std::string name = part;
    std::vector<size_t> indices;
    size_t bracket = part.find('[');
    if (bracket != std::string::npos) {
      name = part.substr(0, bracket);
      std::string rest = part.substr(bracket);
      while (!rest.empty()) {
        size_t close = rest.find(']');
        if (rest[0] != '[' || close == std::string::npos || close == 1) {
          throw InvalidArgumentError(StrCat("malformed layer path '", path, "'"));
        }
        size_t idx = 0;
        const std::string num = rest.substr(1, close - 1);
        auto res = std::from_chars(num.data(), num.data() + num.size(), idx);
        if (res.ec != std::errc() || res.ptr != num.data() + num.size()) {
          throw InvalidArgumentError(StrCat("malformed index in layer path '", path, "'"));
        }
        indices.push_back(idx);
        rest = rest.substr(close + 1);
      }
    }
    if (tree != nullptr && tree->kind == ChildTree::Kind::kDict) {
      auto it = tree->dict.find(name);
      if (it == tree->dict.end())
        throw NotFoundError(StrCat("no child '", name, "' in '", path, "'"));
      tree = &it->second;
    } else {
      if (tree != nullptr) layer = tree->layer.get();
      tree = &layer->FindChildTree(name);
    }
    for (size_t idx : indices) {
      if (tree->kind != ChildTree::Kind::kList || idx >= tree->list.size()) {
        throw NotFoundError(
            StrCat("layer path '", path, "': no element [", idx, "] in '", name, "'"));
      }
      tree = &tree->list[idx];
    }
  }
  if (tree == nullptr || tree->kind != ChildTree::Kind::kLayer) {
    throw InvalidArgumentError(StrCat("layer path '", path, "' does not name a single layer"));
  }
  return *tree->layer;
}

NestedValue BaseLayer::MapChildren(const ChildTree& tree,
                                   const std::function<NestedValue(const BaseLayer&)>& fn) const {
  if (tree.kind == ChildTree::Kind::kLayer) return fn(*tree.layer);
  if (tree.kind == ChildTree::Kind::kList) {
    NestedValue::List list;
    for (const auto& x : tree.list) list.push_back(MapChildren(x, fn));
    return NestedValue(std::move(list));
  }
  NestedMap m;
  for (const auto& [k, x] : tree.dict) m.Put(k, MapChildren(x, fn));
  return NestedValue(std::move(m));
}

NestedMap BaseLayer::CollectTree(const std::function<NestedValue(const BaseLayer&)>& fn) const {
  NestedMap out;
  for (const auto& [name, tree] : children_) out.Put(name, MapChildren(*tree, fn));
  return out;
}

void BaseLayer::ForEachChild(const std::function<void(BaseLayer&)>& fn) const {
  for (const auto& [name, tree] : children_) {
    std::function<void(const ChildTree&)> walk = [&](const ChildTree& t) {
      if (t.kind == ChildTree::Kind::kLayer) {
        fn(*t.layer);
      } else if (t.kind == ChildTree::Kind::kList) {
        for (const auto& x : t.list) walk(x);
      } else {
        for (const auto& [k, x] : t.dict) walk(x);
      }
    };
    walk(*tree);
  }
}

NestedMap BaseLayer::vars() const {
  NestedMap out = CollectTree([](const BaseLayer& c) { return NestedValue(c.vars()); });
  for (const auto& [name, v] : vars_) out.Put(name, v);
  return out;
}

const BaseLayer& BaseLayer::Root() const {
  const BaseLayer* l = this;
  while (l->parent_ != nullptr) l = l->parent_;
  return *l;
}

void BaseLayer::SetEma(std::shared_ptr<const EmaSource> ema) { ema_ = std::move(ema); }
const EmaSource* BaseLayer::ema() const { return Root().ema_.get(); }

std::vector<std::pair<BaseLayer::VariableInfo, at::Tensor>> BaseLayer::AllVariables() const {
  std::vector<std::pair<VariableInfo, at::Tensor>> out;
  for (const auto& info : var_infos_) out.emplace_back(info, vars_.at(info.name));
  ForEachChild([&](BaseLayer& c) {
    for (auto& item : c.AllVariables()) out.push_back(std::move(item));
  });
  return out;
}

std::vector<std::string> BaseLayer::RemoteScopes() const {
  std::vector<std::string> out = remote_scopes_;
  ForEachChild([&](BaseLayer& c) {
    for (auto& s : c.RemoteScopes()) out.push_back(std::move(s));
  });
  return out;
}

void BaseLayer::DeclareRemoteScope(const std::string& name) {
  CheckConstructing("DeclareRemoteScope");
  remote_scopes_.push_back(scope_ + "/" + SanitizeScopeKey(name));
}

void BaseLayer::MoveTo(at::Device device) {
  for (auto& [name, v] : vars_) {
    const bool grad = v.requires_grad();
    at::Tensor moved = v.detach().to(device);
    if (grad) moved.requires_grad_(true);
    v = moved;
  }
  ForEachChild([&](BaseLayer& c) { c.MoveTo(device); });
}

void BaseLayer::SetAccumulatorValues(const NestedMap& values) {
  if (!values.IsCompatible(GetAccumulatorValues())) {
    throw InvalidArgumentError(StrCat(
        "layer '", path_, "': SetAccumulatorValues keys [", Join(values.Keys(), ", "),
        "] do not match the accumulators [", Join(GetAccumulatorValues().Keys(), ", "), "]"));
  }
  for (const auto& [name, acc] : accumulators_) acc->SetValue(values.at(name).AsTensor());
  for (const auto& [name, tree] : children_) {
    std::function<void(const ChildTree&, const NestedValue&)> walk = [&](const ChildTree& t,
                                                                         const NestedValue& v) {
      if (t.kind == ChildTree::Kind::kLayer) {
        t.layer->SetAccumulatorValues(v.AsMap());
      } else if (t.kind == ChildTree::Kind::kList) {
        for (size_t i = 0; i < t.list.size(); ++i) walk(t.list[i], v.AsList()[i]);
      } else {
        for (const auto& [k, x] : t.dict) walk(x, v.AsMap().at(k));
      }
    };
    if (values.contains(name)) walk(*tree, values.at(name));
  }
}

at::Tensor BaseLayer::CastToFPropDtype(const at::Tensor& x) const {
  if (!x.defined() || !x.is_floating_point() || x.scalar_type() == fprop_dtype_) return x;
  return x.to(fprop_dtype_);
}

void BaseLayer::CastError(const BaseLayer& layer, const std::string& name, const char* type) {
  throw InvalidArgumentError(
      StrCat("child '", name, "' (", layer.path(), ") is not a ", Demangle(type)));
}

}  // namespace glossa
