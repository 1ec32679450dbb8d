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
#include "glossa/layers/base_layer.h"
#include "glossa/model/base_task.h"
#include "python/common.h"

namespace glossa_py {
namespace {

using glossa::BaseLayer;
using glossa::NestedMap;
using glossa::NestedValue;
using glossa::StrCat;

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

std::string Signature(const BaseLayer& layer) { return layer.FPropMapSignatureText(); }

// FPropMap's result as Python gets it: a tuple of the outputs in order, a lone output alone, or
// the dict (BaseLayer::FPropMapSignature).
py::object ResultToPython(const BaseLayer::FPropMapSignature& spec, const NestedMap& out) {
  if (spec.outputs.empty()) return FromNested(NestedValue(out));
  if (spec.outputs.size() == 1 && !spec.tuple) return FromNested(out.at(spec.outputs[0]));
  py::list l;
  for (const auto& name : spec.outputs) l.append(FromNested(out.at(name)));
  return spec.tuple ? py::object(py::tuple(l)) : py::object(l);
}

// Python's positional and keyword arguments as FPropMap's named inputs (None: not given).
NestedMap ArgsToInputs(const BaseLayer& layer, const BaseLayer::FPropMapSignature& spec,
                       const py::args& args, const py::kwargs& kwargs) {
  const auto& names = spec.inputs;
  if (args.size() > names.size()) {
    throw py::type_error(StrCat(Signature(layer), ": takes ", names.size(),
                                " inputs after theta, got ", args.size()));
  }
  NestedMap inputs;
  std::vector<bool> given(names.size(), false);
  for (size_t i = 0; i < args.size(); ++i) {
    given[i] = !args[i].is_none();
    if (given[i]) inputs.Put(names[i], ToNested(args[i], names[i]));
  }
  for (const auto& [k, v] : kwargs) {
    const std::string name = py::str(k).cast<std::string>();
    auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) {
      throw py::type_error(StrCat(Signature(layer), ": unexpected argument ",
                                  glossa::KeyErrorString(name, names)));
    }
    const size_t i = static_cast<size_t>(it - names.begin());
    if (i < args.size()) {
      throw py::type_error(StrCat(Signature(layer), ": '", name, "' given twice"));
    }
    given[i] = !v.is_none();
    if (given[i]) inputs.Put(name, ToNested(v, name));
  }
  for (size_t i = 0; i < spec.required && i < names.size(); ++i) {
    if (!given[i]) throw py::type_error(StrCat(Signature(layer), ": missing '", names[i], "'"));
  }
  return inputs;
}

// layer.FProp(theta, *args, **kwargs): any layer, through its uniform call (FPropMap).
py::object CallFProp(const PyLayer& self, const py::dict& theta, const py::args& args,
                     const py::kwargs& kwargs) {
  const BaseLayer& layer = *self.layer;
  const BaseLayer::FPropMapSignature spec = layer.FPropMapSpec();
  if (spec.inputs.empty()) {
    throw py::type_error(StrCat("glossa.Layer: ", ClassKey(layer),
                                " has no uniform call (FPropMap): it is not a Block and does not "
                                "override FPropMapSpec/FPropMapImpl"));
  }
  const NestedMap inputs = ArgsToInputs(layer, spec, args, kwargs);
  const NestedMap th = ToNestedMap(theta, "theta");
  NestedMap out;
  {
    py::gil_scoped_release release;
    out = layer.FPropMap(th, inputs);
  }
  return ResultToPython(spec, out);
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

// long function: a list of bindings (Layer, InputGenerator, EvalMode), one .def per
// Python name with its docstring.
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
        const BaseLayer::FPropMapSignature spec = s.layer->FPropMapSpec();
        if (spec.inputs.empty() || spec.outputs.empty()) throw py::type_error("no uniform call");
        NestedMap inputs;
        for (size_t i = 0; i < args.size() && i < spec.inputs.size(); ++i) {
          if (!args[i].is_none()) inputs.Put(spec.inputs[i], ToNested(args[i], "args"));
        }
        std::vector<at::Tensor> cots;
        for (const auto& c : cotangents) cots.push_back(c.cast<at::Tensor>());
        const NestedMap theta = s.layer->theta();
        NestedMap out;
        std::map<std::string, at::Tensor> grads;
        {
          py::gil_scoped_release release;
          out = s.layer->FPropMap(theta, inputs);
          std::vector<at::Tensor> outs;
          for (const auto& name : spec.outputs) outs.push_back(out.GetTensor(name));
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
          for (const auto& name : spec.outputs) out.Put(name, out.GetTensor(name).detach());
        }
        return py::make_tuple(ResultToPython(spec, out), grads);
      },
      "Test helper: (outputs, {theta key: gradient}) computed in C++ only.");
}

}  // namespace glossa_py
