#include "glossa/layers/onnx_graph.h"

#include <ATen/ATen.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <cstring>
#include <exception>
#include <limits>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/layers/base_layer.h"

namespace glossa {

OnnxAttr OnnxAttr::Int(std::string name, int64_t v) {
  OnnxAttr a;
  a.name = std::move(name);
  a.kind = Kind::kInt;
  a.i = v;
  return a;
}
OnnxAttr OnnxAttr::Ints(std::string name, std::vector<int64_t> v) {
  OnnxAttr a;
  a.name = std::move(name);
  a.kind = Kind::kInts;
  a.ints = std::move(v);
  return a;
}
OnnxAttr OnnxAttr::Float(std::string name, float v) {
  OnnxAttr a;
  a.name = std::move(name);
  a.kind = Kind::kFloat;
  a.f = v;
  return a;
}
OnnxAttr OnnxAttr::String(std::string name, std::string v) {
  OnnxAttr a;
  a.name = std::move(name);
  a.kind = Kind::kString;
  a.s = std::move(v);
  return a;
}

namespace {

int32_t OnnxType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return onnx::TensorProto::FLOAT;
    case at::kDouble: return onnx::TensorProto::DOUBLE;
    case at::kLong: return onnx::TensorProto::INT64;
    case at::kInt: return onnx::TensorProto::INT32;
    case at::kBool: return onnx::TensorProto::BOOL;
    case at::kByte: return onnx::TensorProto::UINT8;
    case at::kChar: return onnx::TensorProto::INT8;
    default: throw InternalError(StrCat("onnx: no ONNX type for ", c10::toString(t)));
  }
}

void SetValueInfo(onnx::ValueInfoProto* v, const std::string& name, at::ScalarType type,
                  const std::vector<std::string>& dims) {
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(OnnxType(type));
  auto* shape = tt->mutable_shape();
  for (const auto& d : dims) {
    auto* dim = shape->add_dim();
    if (!d.empty() && d.find_first_not_of("0123456789") == std::string::npos) {
      dim->set_dim_value(std::stoll(d));
    } else {
      dim->set_dim_param(d);
    }
  }
}

}  // namespace

struct OnnxGraph::Impl {
  onnx::ModelProto model;
  onnx::GraphProto* graph = nullptr;
  int64_t counter = 0;
  std::string Fresh(const std::string& stem) { return StrCat(stem, "_", counter++); }
};

OnnxGraph::OnnxGraph(std::string name) : impl_(std::make_unique<Impl>()) {
  auto& m = impl_->model;
  m.set_ir_version(8);  // ONNX 1.10+ (opset 15-17)
  m.set_producer_name("glossa");
  auto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOpset);
  impl_->graph = m.mutable_graph();
  impl_->graph->set_name(std::move(name));
}

OnnxGraph::~OnnxGraph() = default;

std::string OnnxGraph::Input(const std::string& name, at::ScalarType type,
                             const std::vector<std::string>& dims) {
  SetValueInfo(impl_->graph->add_input(), name, type, dims);
  return name;
}

void OnnxGraph::Output(const std::string& value, const std::string& name, at::ScalarType type,
                       const std::vector<std::string>& dims) {
  if (value != name) {
    auto* node = impl_->graph->add_node();
    node->set_op_type("Identity");
    node->set_name(impl_->Fresh("Identity"));
    node->add_input(value);
    node->add_output(name);
  }
  SetValueInfo(impl_->graph->add_output(), name, type, dims);
}

namespace {

void FillTensor(onnx::TensorProto* p, const std::string& name, const at::Tensor& src) {
  const at::Tensor t = src.detach().cpu().contiguous();
  p->set_name(name);
  p->set_data_type(OnnxType(t.scalar_type()));
  for (int64_t d : t.sizes()) p->add_dims(d);
  // raw_data is little-endian, as the host (x86-64, aarch64) is.
  p->set_raw_data(std::string(static_cast<const char*>(t.data_ptr()), t.nbytes()));
}

}  // namespace

std::string OnnxGraph::Weight(const std::string& name, const at::Tensor& t) {
  FillTensor(impl_->graph->add_initializer(), name, t.detach().to(at::kFloat));
  return name;
}

std::string OnnxGraph::Const(const at::Tensor& t) {
  const std::string name = impl_->Fresh("const");
  FillTensor(impl_->graph->add_initializer(), name, t);
  return name;
}

std::string OnnxGraph::ConstInts(const std::vector<int64_t>& v) {
  return Const(at::tensor(v, at::kLong));
}

std::string OnnxGraph::ConstScalar(float v) { return Const(at::scalar_tensor(v, at::kFloat)); }

std::vector<std::string> OnnxGraph::Ops(const std::string& type,
                                        const std::vector<std::string>& inputs, int n_outputs,
                                        const std::vector<OnnxAttr>& attrs) {
  auto* node = impl_->graph->add_node();
  node->set_op_type(type);
  node->set_name(impl_->Fresh(type));
  for (const auto& in : inputs) node->add_input(in);
  std::vector<std::string> outs;
  for (int i = 0; i < n_outputs; ++i) {
    outs.push_back(impl_->Fresh(type + "_out"));
    node->add_output(outs.back());
  }
  for (const auto& a : attrs) {
    auto* p = node->add_attribute();
    p->set_name(a.name);
    switch (a.kind) {
      case OnnxAttr::Kind::kInt:
        p->set_type(onnx::AttributeProto::INT);
        p->set_i(a.i);
        break;
      case OnnxAttr::Kind::kInts:
        p->set_type(onnx::AttributeProto::INTS);
        for (int64_t v : a.ints) p->add_ints(v);
        break;
      case OnnxAttr::Kind::kFloat:
        p->set_type(onnx::AttributeProto::FLOAT);
        p->set_f(a.f);
        break;
      case OnnxAttr::Kind::kString:
        p->set_type(onnx::AttributeProto::STRING);
        p->set_s(a.s);
        break;
    }
  }
  return outs;
}

std::string OnnxGraph::Op(const std::string& type, const std::vector<std::string>& inputs,
                          const std::vector<OnnxAttr>& attrs) {
  return Ops(type, inputs, 1, attrs)[0];
}

std::string OnnxGraph::Affine(const std::string& x, const std::string& w, const std::string& b) {
  const std::string y = Op("MatMul", {x, w});
  return b.empty() ? y : Op("Add", {y, b});
}

std::string OnnxGraph::SetPaddings(const std::string& paddings) {
  const std::string lowest = ConstScalar(std::numeric_limits<float>::lowest());
  const std::string zero = ConstScalar(0.0f);
  const std::string pad_keys =
      Op("Unsqueeze", {Op("Greater", {paddings, ConstScalar(0.5f)}), ConstInts({1, 2})});
  const std::string t = Op("Gather", {Op("Shape", {paddings}), Const(at::scalar_tensor(1, at::kLong))});
  const std::string pos =
      Op("Range", {Const(at::scalar_tensor(0, at::kLong)), t, Const(at::scalar_tensor(1, at::kLong))});
  const std::string future = Op("Less", {Op("Unsqueeze", {pos, ConstInts({1})}),
                                         Op("Unsqueeze", {pos, ConstInts({0})})});  // [T, T]
  Set("self_bias", Op("Where", {pad_keys, lowest, zero}));
  Set("causal_bias", Op("Where", {Op("Or", {pad_keys, future}), lowest, zero}));
  const std::string nonpad = Op("Sub", {ConstScalar(1.0f), paddings});
  Set("nonpad", Op("Unsqueeze", {nonpad, ConstInts({2})}));
  return nonpad;
}

const std::string& OnnxGraph::Get(const std::string& key) const {
  auto it = named_.find(key);
  if (it == named_.end()) {
    throw InternalError(StrCat("onnx export: the value '", key, "' was not set by the task"));
  }
  return it->second;
}

int64_t OnnxGraph::num_nodes() const { return impl_->graph->node_size(); }

std::string OnnxGraph::SerializeChecked() const {
  onnx::ModelProto model = impl_->model;
  try {
    onnx::checker::check_model(model);
    onnx::ShapeInferenceOptions options;
    options.check_type = true;
    options.error_mode = 1;  // strict: an inconsistent shape is an error
    onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(), options);
  } catch (const std::exception& e) {
    throw InternalError(StrCat("onnx export: graph '", impl_->graph->name(),
                               "' fails onnx's checker: ", e.what()));
  }
  std::string bytes;
  if (!impl_->model.SerializeToString(&bytes)) {
    throw InternalError(StrCat("onnx export: graph '", impl_->graph->name(),
                               "' does not serialize (over 2 GB?)"));
  }
  return bytes;
}

void OnnxGraph::Save(const std::string& path) const { AtomicWriteFile(path, SerializeChecked()); }

void OnnxGraph::Unsupported(const BaseLayer& layer, const std::string& what) {
  throw UnimplementedError(StrCat("--onnx: layer '", layer.path(), "': ", what,
                                  " is not covered by the ONNX export"));
}

}  // namespace glossa
