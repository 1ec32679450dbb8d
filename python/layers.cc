// glossa.Layer: any registered layer, built from its Params, called from Python on torch tensors.
// FProp(theta, *args, **kwargs) runs the layer's C++ FProp with the GIL released; the outputs are
// torch tensors in the same autograd graph, so loss.backward() in Python reaches the layer's
// variables (theta's tensors are the variables themselves, shared, not copied).
//
// A layer's FProp has its own C++ signature; the adapters below map Python arguments (by position
// or name) to it. Layers that are Blocks (glossa/layers/base_layer.h) get FProp(x, paddings=None)
// from FPropBlock; others without an adapter raise TypeError naming the class.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <typeinfo>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/input/input_generator.h"
#include "glossa/layers/attention.h"
#include "glossa/layers/base_layer.h"
#include "glossa/layers/conv.h"
#include "glossa/layers/embedding.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/normalization.h"
#include "glossa/layers/revnet.h"
#include "glossa/layers/rnn.h"
#include "glossa/layers/softmax.h"
#include "glossa/layers/transformer.h"
#include "glossa/model/base_task.h"
#include "glossa/models/image.h"
#include "python/common.h"

namespace glossa_py {
namespace {

using glossa::BaseLayer;
using glossa::NestedMap;
using glossa::NestedValue;
using glossa::StrCat;

// One FProp call shape: the argument names after theta (the first `required` of them must be
// given), and the call. The result is a NestedValue; `tuple` makes a list result a Python tuple.
struct Adapter {
  std::string cls;  // the C++ class it handles, for the signature text
  std::vector<std::string> args;
  size_t required = 1;
  std::string returns;
  bool tuple = false;
  std::function<bool(const BaseLayer&)> matches;
  std::function<NestedValue(const BaseLayer&, const NestedMap&, const std::vector<NestedValue>&)>
      call;
};

at::Tensor T(const std::vector<NestedValue>& a, size_t i) {
  if (i >= a.size() || a[i].is_none()) return at::Tensor();
  return a[i].AsTensor();
}
NestedMap M(const std::vector<NestedValue>& a, size_t i) {
  if (i >= a.size() || a[i].is_none()) return NestedMap();
  return a[i].AsMap();
}
NestedValue Pair(const at::Tensor& x, const at::Tensor& y) {
  return NestedValue(NestedValue::List{NestedValue(x), NestedValue(y)});
}

template <typename L>
std::function<bool(const BaseLayer&)> Is() {
  return [](const BaseLayer& l) { return dynamic_cast<const L*>(&l) != nullptr; };
}
template <typename L>
const L& As(const BaseLayer& l) {
  return dynamic_cast<const L&>(l);
}

const std::vector<Adapter>& Adapters() {
  using namespace glossa;
  static const std::vector<Adapter> adapters = [] {
    std::vector<Adapter> a;
    a.push_back({"ProjectionLayer", {"inputs", "paddings"}, 1, "Tensor", false,
                 Is<ProjectionLayer>(), [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   return NestedValue(As<ProjectionLayer>(l).FProp(th, T(x, 0), T(x, 1)));
                 }});
    a.push_back({"LayerNorm", {"inputs"}, 1, "Tensor", false, Is<LayerNorm>(),
                 [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   return NestedValue(As<LayerNorm>(l).FProp(th, T(x, 0)));
                 }});
    a.push_back({"BatchNormLayer", {"inputs", "paddings"}, 1, "Tensor", false,
                 Is<BatchNormLayer>(), [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   return NestedValue(As<BatchNormLayer>(l).FProp(th, T(x, 0), T(x, 1)));
                 }});
    a.push_back({"EmbeddingLayer", {"ids"}, 1, "Tensor", false, Is<EmbeddingLayer>(),
                 [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   return NestedValue(As<EmbeddingLayer>(l).FProp(th, T(x, 0)));
                 }});
    a.push_back({"PositionalEmbeddingLayer", {"seq_length_or_position"}, 1, "Tensor", false,
                 Is<PositionalEmbeddingLayer>(),
                 [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   const auto& layer = As<PositionalEmbeddingLayer>(l);
                   if (x[0].kind() == NestedValue::Kind::kInt) return NestedValue(layer.FProp(th, x[0].AsInt()));
                   return NestedValue(layer.FPropWithPosition(th, T(x, 0)));
                 }});
    a.push_back({"MultiHeadedProjectionLayer", {"inputs"}, 1, "Tensor", false,
                 Is<MultiHeadedProjectionLayer>(),
                 [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   return NestedValue(As<MultiHeadedProjectionLayer>(l).FProp(th, T(x, 0)));
                 }});
    a.push_back({"PerDimScaleLayer", {"inputs"}, 1, "Tensor", false, Is<PerDimScaleLayer>(),
                 [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   return NestedValue(As<PerDimScaleLayer>(l).FProp(th, T(x, 0)));
                 }});
    a.push_back({"MultiHeadedAttention", {"query", "key", "value", "paddings", "causal"}, 3,
                 "(context, probs)", true, Is<MultiHeadedAttention>(),
                 [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   const bool causal = x.size() > 4 && !x[4].is_none() && x[4].AsBool();
                   auto [c, p] = As<MultiHeadedAttention>(l).FProp(th, T(x, 0), T(x, 1), T(x, 2),
                                                                   T(x, 3), causal);
                   return Pair(c, p);
                 }});
    a.push_back({"Conv2DLayer", {"inputs", "paddings"}, 1, "(outputs, paddings)", true,
                 Is<Conv2DLayer>(), [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   auto [y, p] = As<Conv2DLayer>(l).FProp(th, T(x, 0), T(x, 1));
                   return Pair(y, p);
                 }});
    a.push_back({"PoolingLayer", {"inputs", "paddings"}, 1, "(outputs, paddings)", true,
                 Is<PoolingLayer>(), [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   auto [y, p] = As<PoolingLayer>(l).FProp(th, T(x, 0), T(x, 1));
                   return Pair(y, p);
                 }});
    a.push_back({"TransformerAttentionLayer", {"query", "source", "paddings"}, 1,
                 "(outputs, probs)", true, Is<TransformerAttentionLayer>(),
                 [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   auto [y, p] =
                       As<TransformerAttentionLayer>(l).FProp(th, T(x, 0), T(x, 1), T(x, 2));
                   return Pair(y, p);
                 }});
    a.push_back({"TransformerLayer", {"inputs", "paddings", "aux_vecs", "aux_paddings"}, 1,
                 "(outputs, atten_probs)", true, Is<TransformerLayer>(),
                 [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   auto [y, p] =
                       As<TransformerLayer>(l).FProp(th, T(x, 0), T(x, 1), T(x, 2), T(x, 3));
                   return Pair(y, p);
                 }});
    a.push_back({"TransformerStack", {"inputs", "paddings", "aux_vecs", "aux_paddings"}, 1,
                 "Tensor", false, Is<TransformerStack>(),
                 [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   return NestedValue(
                       As<TransformerStack>(l).FProp(th, T(x, 0), T(x, 1), T(x, 2), T(x, 3)));
                 }});
    a.push_back({"SimpleFullSoftmax",
                 {"inputs", "class_ids", "class_weights", "paddings", "class_probabilities"}, 1,
                 "dict (logits, per_example_xent, ...)", false, Is<SimpleFullSoftmax>(),
                 [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   return NestedValue(As<SimpleFullSoftmax>(l).FProp(th, T(x, 0), T(x, 1), T(x, 2),
                                                                    T(x, 3), T(x, 4)));
                 }});
    a.push_back({"LSTMCellSimple", {"state0", "inputs", "padding"}, 2, "dict (m, c)", false,
                 Is<LSTMCellSimple>(), [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   return NestedValue(As<LSTMCellSimple>(l).FProp(th, M(x, 0), T(x, 1), T(x, 2)));
                 }});
    a.push_back({"RNNLayer", {"inputs", "paddings", "state0"}, 1, "(outputs, final_state)", true,
                 Is<RNNLayer>(), [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   auto [y, s] = As<RNNLayer>(l).FProp(th, T(x, 0), T(x, 1), M(x, 2));
                   return NestedValue(NestedValue::List{NestedValue(y), NestedValue(s)});
                 }});
    a.push_back({"StackedRNN", {"inputs", "paddings"}, 1, "(outputs, [final_state, ...])", true,
                 Is<StackedRNN>(), [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   auto [y, states] = As<StackedRNN>(l).FProp(th, T(x, 0), T(x, 1));
                   NestedValue::List s;
                   for (auto& m : states) s.emplace_back(std::move(m));
                   return NestedValue(NestedValue::List{NestedValue(y), NestedValue(std::move(s))});
                 }});
    a.push_back({"RevNetLayer", {"x1", "x2", "extra"}, 2, "(y1, y2)", true, Is<RevNetLayer>(),
                 [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   auto out = As<RevNetLayer>(l).FProp(th, T(x, 0), T(x, 1), T(x, 2));
                   return Pair(out.y1, out.y2);
                 }});
    a.push_back({"StackedRevNetLayer", {"x1", "x2", "extra"}, 2, "(y1, y2)", true,
                 Is<StackedRevNetLayer>(),
                 [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   auto [y1, y2] = As<StackedRevNetLayer>(l).FProp(th, T(x, 0), T(x, 1), T(x, 2));
                   return Pair(y1, y2);
                 }});
    a.push_back({"ImageFeatureExtractor", {"images"}, 1, "Tensor [B, D]", false,
                 [](const BaseLayer& l) {
                   return dynamic_cast<const ImageFeatureExtractor*>(&l) != nullptr;
                 },
                 [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   return NestedValue(
                       dynamic_cast<const ImageFeatureExtractor&>(l).FPropImages(th, T(x, 0)));
                 }});
    a.push_back({"BaseTask", {"batch"}, 1, "(metrics {name: (value, weight)}, per_example)", true,
                 Is<BaseTask>(), [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   const auto r = As<BaseTask>(l).FProp(th, M(x, 0));
                   NestedMap metrics;
                   for (const auto& [name, m] : r.metrics) {
                     metrics.Put(name, NestedValue(NestedValue::List{NestedValue(m.value),
                                                                     NestedValue(m.weight)}));
                   }
                   return NestedValue(NestedValue::List{NestedValue(std::move(metrics)),
                                                        NestedValue(r.per_example)});
                 }});
    // Any other Block (SequentialLayer, dropout, feed-forward, MoE, pipelines, a user's block).
    a.push_back({"Block", {"x", "paddings"}, 1, "Tensor", false,
                 [](const BaseLayer& l) { return dynamic_cast<const Block*>(&l) != nullptr; },
                 [](const BaseLayer& l, const NestedMap& th, const auto& x) {
                   return NestedValue(dynamic_cast<const Block&>(l).FPropBlock(th, T(x, 0), T(x, 1)));
                 }});
    return a;
  }();
  return adapters;
}

const Adapter* FindAdapter(const BaseLayer& layer) {
  for (const auto& a : Adapters()) {
    if (a.matches(layer)) return &a;
  }
  return nullptr;
}

std::string ClassKey(const BaseLayer& layer) {
  try {
    return glossa::ClassRegistry::KeyOfType(typeid(layer));
  } catch (const glossa::Error&) {
    return glossa::Demangle(typeid(layer).name());
  }
}

// A layer as Python holds it: the root it belongs to is kept alive by every handle into it.
struct PyLayer {
  std::shared_ptr<BaseLayer> root;
  BaseLayer* layer = nullptr;
  std::shared_ptr<std::mutex> input_mu = std::make_shared<std::mutex>();
};
// Input generators: batches as dicts of tensors.
struct PyInputGenerator : PyLayer {};

std::string Signature(const BaseLayer& layer) {
  const Adapter* a = FindAdapter(layer);
  if (a == nullptr) return "";
  std::string s = "FProp(theta";
  for (size_t i = 0; i < a->args.size(); ++i) {
    s += ", " + a->args[i] + (i < a->required ? "" : "=None");
  }
  return s + ") -> " + a->returns + "  [" + a->cls + "]";
}

py::object ToPython(const NestedValue& v, bool tuple) {
  if (tuple && v.is_list()) {
    py::list l = FromNested(v);
    return py::tuple(l);
  }
  return FromNested(v);
}

py::object CallFProp(const PyLayer& self, const py::dict& theta, const py::args& args,
                     const py::kwargs& kwargs) {
  const BaseLayer& layer = *self.layer;
  const Adapter* a = FindAdapter(layer);
  if (a == nullptr) {
    throw py::type_error(StrCat("glossa.Layer: ", ClassKey(layer),
                                " has no FProp callable from Python (its FProp signature is not one "
                                "python/layers.cc adapts, and it is not a Block)"));
  }
  if (args.size() > a->args.size()) {
    throw py::type_error(StrCat(Signature(layer), ": takes ", a->args.size(),
                                " inputs after theta, got ", args.size()));
  }
  std::vector<NestedValue> inputs(a->args.size());
  std::vector<bool> given(a->args.size(), false);
  for (size_t i = 0; i < args.size(); ++i) {
    inputs[i] = ToNested(args[i], a->args[i]);
    given[i] = !args[i].is_none();
  }
  for (const auto& [k, v] : kwargs) {
    const std::string name = py::str(k).cast<std::string>();
    auto it = std::find(a->args.begin(), a->args.end(), name);
    if (it == a->args.end()) {
      throw py::type_error(StrCat(Signature(layer), ": unexpected argument ",
                                  glossa::KeyErrorString(name, a->args)));
    }
    const size_t i = static_cast<size_t>(it - a->args.begin());
    if (i < args.size()) {
      throw py::type_error(StrCat(Signature(layer), ": '", name, "' given twice"));
    }
    inputs[i] = ToNested(v, name);
    given[i] = !v.is_none();
  }
  for (size_t i = 0; i < a->required; ++i) {
    if (!given[i]) {
      throw py::type_error(StrCat(Signature(layer), ": missing '", a->args[i], "'"));
    }
  }
  const NestedMap th = ToNestedMap(theta, "theta");
  NestedValue out;
  {
    py::gil_scoped_release release;
    out = a->call(layer, th, inputs);
  }
  return ToPython(out, a->tuple);
}

PyLayer Child(const PyLayer& self, const std::string& path) {
  return PyLayer{self.root, &self.layer->GetDescendant(path), self.input_mu};
}

}  // namespace

py::object Instantiate(const glossa::Params& p) {
  const std::string key = p.Contains("cls") ? p.ClsKey() : std::string();
  if (key.empty()) {
    throw py::type_error("Params.Instantiate(): these Params name no class (no 'cls')");
  }
  const auto& entry = glossa::ClassRegistry::Get(key);
  if (!glossa::ClassRegistry::DerivesFrom<BaseLayer>(entry)) {
    throw py::type_error(StrCat("Params.Instantiate(): ", key, " (", entry.type_name,
                                ") is not a layer or input generator; Python builds those"));
  }
  std::unique_ptr<BaseLayer> layer;
  {
    py::gil_scoped_release release;
    layer = glossa::ClassRegistry::Create<BaseLayer>(key, p);
  }
  PyLayer out;
  out.layer = layer.get();
  out.root = std::move(layer);
  if (dynamic_cast<glossa::BaseInputGenerator*>(out.layer) != nullptr) {
    return py::cast(PyInputGenerator{std::move(out)});
  }
  return py::cast(std::move(out));
}

void DefineLayers(py::module_& m) {
  py::class_<PyLayer>(m, "Layer", R"doc(A Glossa layer built from its Params (p.Instantiate()).

    layer = glossa.class_params("glossa.layers.ProjectionLayer").Set(
        name="proj", input_dim=4, output_dim=3).Instantiate()
    y = layer.FProp(layer.theta, x)      # torch tensors in, torch tensors out
    y.sum().backward()                   # reaches layer.vars' .grad
    opt = torch.optim.Adam(layer.parameters())

theta is a dict of the variables themselves (shared, not copied), so gradients from Python's
backward() accumulate in them. FProp's arguments after theta depend on the layer class; see
`fprop_signature`.)doc")
      .def_property_readonly("name", [](const PyLayer& s) { return s.layer->name(); })
      .def_property_readonly("path", [](const PyLayer& s) { return s.layer->path(); })
      .def_property_readonly("cls", [](const PyLayer& s) { return ClassKey(*s.layer); },
                             "The registry key of the layer's class.")
      .def_property_readonly("params", [](const PyLayer& s) { return s.layer->params().Copy(); },
                             "A copy of the Params the layer was built from.")
      .def_property_readonly(
          "theta", [](const PyLayer& s) { return FromNestedMap(s.layer->theta()); },
          "What FProp uses (dict of tensors, nested like the children): the variables, or their "
          "EMA averages inside glossa.EvalMode() when the model keeps an EMA.")
      .def_property_readonly("vars", [](const PyLayer& s) { return FromNestedMap(s.layer->vars()); },
                             "Every variable of the layer's subtree (dict of tensors).")
      .def(
          "variables",
          [](const PyLayer& s) {
            py::list out;
            for (const auto& [info, t] : s.layer->AllVariables()) {
              out.append(py::make_tuple(info.full_name, t));
            }
            return out;
          },
          "[(full name, tensor)] for every variable of the subtree, e.g. 'proj/w'.")
      .def(
          "parameters",
          [](const PyLayer& s) {
            py::list out;
            for (const auto& [info, t] : s.layer->AllVariables()) {
              if (info.trainable) out.append(t);
            }
            return out;
          },
          "The trainable variables, for a torch.optim optimizer.")
      .def_property_readonly("fprop_signature", [](const PyLayer& s) { return Signature(*s.layer); },
                             "How FProp is called for this layer's class ('' when it is not).")
      .def("FProp", &CallFProp, py::arg("theta"),
           "FProp(theta, *inputs, **named_inputs): the layer's forward computation on torch "
           "tensors (see fprop_signature); runs without the GIL.")
      .def(
          "__call__",
          [](const PyLayer& s, const py::args& args, const py::kwargs& kwargs) {
            return CallFProp(s, FromNestedMap(s.layer->theta()), args, kwargs);
          },
          "FProp(self.theta, *inputs, **named_inputs).")
      .def("children", [](const PyLayer& s) { return s.layer->ChildNames(); })
      .def("child", &Child, "A descendant by path: 'stack.x_layers[0].fflayer'.")
      .def("__repr__", [](const PyLayer& s) {
        return StrCat("<glossa.Layer ", s.layer->path(), " (", ClassKey(*s.layer), ")>");
      });

  // Iteration ends (StopIteration) at the end of the data.
  py::class_<PyInputGenerator, PyLayer>(m, "InputGenerator",
                                        "An input generator (p.Instantiate() on input Params).")
      .def(
          "GetPreprocessedInputBatch",
          [](PyInputGenerator& s) {
            glossa::NestedMap batch;
            {
              py::gil_scoped_release release;
              std::lock_guard<std::mutex> lock(*s.input_mu);
              batch = dynamic_cast<glossa::BaseInputGenerator&>(*s.layer).GetPreprocessedInputBatch();
            }
            return FromNestedMap(batch);
          },
          "The next batch (dict of tensors); IndexError (OutOfRange) at the end of the data.")
      .def("__iter__", [](py::object s) { return s; })
      .def("__next__",
           [](PyInputGenerator& s) {
             glossa::NestedMap batch;
             try {
               py::gil_scoped_release release;
               std::lock_guard<std::mutex> lock(*s.input_mu);
               batch = dynamic_cast<glossa::BaseInputGenerator&>(*s.layer).GetPreprocessedInputBatch();
             } catch (const glossa::Error& e) {
               if (e.code() == glossa::StatusCode::kOutOfRange) throw py::stop_iteration();
               throw;
             }
             return FromNestedMap(batch);
           })
      .def("Reset", [](PyInputGenerator& s) {
        std::lock_guard<std::mutex> lock(*s.input_mu);
        dynamic_cast<glossa::BaseInputGenerator&>(*s.layer).Reset();
      });

  // with glossa.EvalMode(): FProp as in evaluation (no dropout, EMA weights), on this thread.
  struct PyEvalMode {
    std::unique_ptr<glossa::EvalModeScope> scope;
  };
  py::class_<PyEvalMode>(m, "EvalMode",
                         "with glossa.EvalMode(): FProp runs as in evaluation on this thread (no "
                         "dropout; EMA weights in theta when the model keeps them).")
      .def(py::init<>())
      .def("__enter__", [](PyEvalMode& e) { e.scope = std::make_unique<glossa::EvalModeScope>(true); })
      .def("__exit__", [](PyEvalMode& e, const py::args&) { e.scope.reset(); });

  // For the tests: FProp and gradients computed entirely in C++ (torch::autograd::grad), with no
  // Python autograd on the way: sum(outputs[i] * cotangents[i]) differentiated by theta's leaves.
  m.def(
      "_cpp_fprop_and_grads",
      [](const PyLayer& s, const py::list& args, const py::list& cotangents) {
        const Adapter* a = FindAdapter(*s.layer);
        if (a == nullptr) throw py::type_error("no adapter");
        std::vector<NestedValue> inputs;
        for (const auto& x : args) inputs.push_back(ToNested(x, "args"));
        inputs.resize(a->args.size());
        std::vector<at::Tensor> cots;
        for (const auto& c : cotangents) cots.push_back(c.cast<at::Tensor>());
        const NestedMap theta = s.layer->theta();
        NestedValue out;
        std::map<std::string, at::Tensor> grads;
        {
          py::gil_scoped_release release;
          out = a->call(*s.layer, theta, inputs);
          std::vector<at::Tensor> outs;
          if (out.is_tensor()) {
            outs.push_back(out.AsTensor());
          } else {
            for (const auto& v : out.AsList()) outs.push_back(v.AsTensor());
          }
          at::Tensor total = at::zeros({}, outs[0].options());
          for (size_t i = 0; i < cots.size(); ++i) total = total + (outs[i] * cots[i]).sum();
          std::vector<at::Tensor> leaves;
          std::vector<std::string> names;
          for (const auto& [k, v] : theta.FlattenItems()) {
            if (v.is_tensor() && v.AsTensor().requires_grad()) {
              names.push_back(k);
              leaves.push_back(v.AsTensor());
            }
          }
          const auto g = torch::autograd::grad({total}, leaves, {}, false, false, true);
          for (size_t i = 0; i < g.size(); ++i) grads[names[i]] = g[i];
          // Detach the outputs: this is the C++ reference, not a graph for Python.
          if (out.is_tensor()) {
            out = NestedValue(out.AsTensor().detach());
          } else {
            NestedValue::List l;
            for (const auto& v : out.AsList()) l.emplace_back(v.AsTensor().detach());
            out = NestedValue(std::move(l));
          }
        }
        return py::make_tuple(ToPython(out, a->tuple), grads);
      },
      "Test helper: (outputs, {theta key: gradient}) computed in C++ only.");
}

}  // namespace glossa_py
