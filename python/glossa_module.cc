// The `glossa` Python extension (pybind11, for Debian's /usr/bin/python3): Params with attribute
// access and Lingvo's text and proto formats, and the model registry. Python values map to
// ParamValues both ways (None, bool, int, float, str, list, dict, nested Params; dtypes as their
// names, which glossa/__init__.py turns into torch.dtype). glossa::Error codes become Python
// exceptions: NotFound -> KeyError, InvalidArgument -> ValueError (TypeError for a kind
// mismatch), others -> RuntimeError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/params.h"
#include "glossa/core/registry.h"
#include "glossa/model/model_registry.h"

namespace py = pybind11;
using glossa::ParamValue;
using glossa::Params;

namespace {

struct DTypeName {
  std::string name;
};

ParamValue ToValue(const py::handle& o) {
  if (o.is_none()) return ParamValue();
  if (py::isinstance<py::bool_>(o)) return ParamValue(o.cast<bool>());
  if (py::isinstance<py::int_>(o)) return ParamValue(o.cast<int64_t>());
  if (py::isinstance<py::float_>(o)) return ParamValue(o.cast<double>());
  if (py::isinstance<py::str>(o)) return ParamValue(o.cast<std::string>());
  if (py::isinstance<Params>(o)) return ParamValue(o.cast<Params>());
  if (py::isinstance<DTypeName>(o)) {
    return ParamValue(glossa::ParseDType(o.cast<DTypeName>().name));
  }
  if (py::isinstance<py::list>(o) || py::isinstance<py::tuple>(o)) {
    ParamValue::List list;
    for (const auto& item : o) list.push_back(ToValue(item));
    return ParamValue(std::move(list));
  }
  if (py::isinstance<py::dict>(o)) {
    ParamValue::Dict dict;
    for (const auto& [k, v] : o.cast<py::dict>()) dict[py::str(k).cast<std::string>()] = ToValue(v);
    return ParamValue(std::move(dict));
  }
  throw py::type_error(glossa::StrCat("a Params value cannot be a ",
                                      py::str(o.get_type().attr("__name__")).cast<std::string>()));
}

py::object FromValue(const ParamValue& v) {
  switch (v.kind()) {
    case ParamValue::Kind::kNone: return py::none();
    case ParamValue::Kind::kBool: return py::bool_(v.AsBool());
    case ParamValue::Kind::kInt: return py::int_(v.AsInt());
    case ParamValue::Kind::kFloat: return py::float_(v.AsFloat());
    case ParamValue::Kind::kString: return py::str(v.AsString());
    case ParamValue::Kind::kDType:
      return py::cast(DTypeName{std::string(glossa::DTypeName(v.AsDType()))});
    case ParamValue::Kind::kList: {
      py::list l;
      for (const auto& x : v.AsList()) l.append(FromValue(x));
      return l;
    }
    case ParamValue::Kind::kDict: {
      py::dict d;
      for (const auto& [k, x] : v.AsDict()) d[py::str(k)] = FromValue(x);
      return d;
    }
    case ParamValue::Kind::kParams: return py::cast(v.AsParams());
    default: return py::str(v.KindName());  // enums and class refs: their text
  }
}

void SetAttr(Params& p, const std::string& name, const py::handle& value) {
  if (py::isinstance<Params>(value)) {
    p.Set(name, ParamValue(value.cast<Params>()));
  } else {
    p.Set(name, ToValue(value));
  }
}

}  // namespace

PYBIND11_MODULE(_glossa, m) {
  m.doc() = "Glossa: Lingvo-style Params, registry and models on libtorch (docs/python.md).";
  static py::exception<glossa::Error> base(m, "GlossaError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const glossa::Error& e) {
      const std::string msg = e.message();
      switch (e.code()) {
        case glossa::StatusCode::kNotFound: PyErr_SetString(PyExc_KeyError, msg.c_str()); return;
        case glossa::StatusCode::kInvalidArgument:
          PyErr_SetString(msg.find(" is a ") != std::string::npos &&
                                  msg.find(", not ") != std::string::npos
                              ? PyExc_TypeError
                              : PyExc_ValueError,
                          msg.c_str());
          return;
        case glossa::StatusCode::kOutOfRange: PyErr_SetString(PyExc_IndexError, msg.c_str()); return;
        default: base(e.what()); return;
      }
    }
  });

  py::class_<DTypeName>(m, "_DTypeName")
      .def(py::init<std::string>())
      .def_readonly("name", &DTypeName::name)
      .def("__repr__", [](const DTypeName& d) { return "dtype(" + d.name + ")"; })
      .def("__eq__", [](const DTypeName& a, const DTypeName& b) { return a.name == b.name; });

  py::class_<Params>(m, "Params", py::dynamic_attr())
      .def(py::init<>())
      .def("Define",
           [](Params& p, const std::string& name, const py::object& value, const std::string& doc) {
             p.Define(name, ToValue(value), doc);
             return &p;
           },
           py::arg("name"), py::arg("default_value"), py::arg("description"),
           py::return_value_policy::reference)
      .def("Get", [](const Params& p, const std::string& path) { return FromValue(p.Get(path)); },
           "The value at a dotted path ('task.stack.num_layers').")
      .def("Set",
           [](Params& p, const py::kwargs& kwargs) {
             for (const auto& [k, v] : kwargs) SetAttr(p, py::str(k).cast<std::string>(), v);
             return &p;
           },
           py::return_value_policy::reference, "Set(name=value, ...): existing keys only.")
      .def("SetPath", [](Params& p, const std::string& path, const py::object& v) { SetAttr(p, path, v); })
      .def("Copy", &Params::Copy)
      .def("ToText", &Params::ToText, "Lingvo's text format.")
      .def("FromText", [](Params& p, const std::string& text) { p.FromText(text); return &p; },
           py::return_value_policy::reference)
      .def("ToProto", [](const Params& p) { return py::bytes(p.ToProtoBytes()); },
           "The Hyperparam proto, serialized.")
      .def_static("FromProto", [](const py::bytes& b) { return Params::FromProtoBytes(std::string(b)); })
      .def("TextDiff", &Params::TextDiff)
      .def("Keys", &Params::Keys)
      .def("Contains", &Params::Contains)
      .def("Instantiable", [](const Params& p) { return !p.ClsKey().empty(); })
      .def("__contains__", &Params::Contains)
      .def("__iter__",
           [](const Params& p) { return py::iter(py::cast(p.Keys())); })
      .def("__len__", &Params::size)
      .def("__eq__", [](const Params& a, const Params& b) { return a == b; })
      .def("__getattr__",
           [](py::object self, const std::string& name) -> py::object {
             Params& p = self.cast<Params&>();
             if (!p.Contains(name)) {
               throw py::attribute_error(glossa::StrCat(
                   "Params has no attribute ", glossa::KeyErrorString(name, p.Keys())));
             }
             // Nested Params by reference (kept alive by their parent), so that
             // p.task.stack.num_layers = 4 changes p.
             if (p.Get(name).is_params()) {
               return py::cast(&p.GetParams(name), py::return_value_policy::reference_internal,
                               self);
             }
             return FromValue(p.Get(name));
           })
      .def("__setattr__",
           [](Params& p, const std::string& name, const py::object& v) {
             if (!p.Contains(name)) {
               throw py::attribute_error(glossa::StrCat(
                   "Params has no attribute ", glossa::KeyErrorString(name, p.Keys()),
                   " (Define it first)"));
             }
             SetAttr(p, name, v);
           })
      .def("__repr__", [](const Params& p) { return p.ToText(); });

  m.def("registered_classes", &glossa::ClassRegistry::Keys, "Every registered class key.");
  m.def("registered_models", &glossa::ModelKeys, "Every registered model key.");
  m.def("class_params", [](const std::string& key) {
    const auto& entry = glossa::ClassRegistry::Get(key);
    if (!entry.default_params) {
      throw glossa::FailedPreconditionError(glossa::StrCat("class '", key, "' declares no Params()"));
    }
    return entry.default_params();
  }, "A registered class's default Params.");
  m.def("get_params",
        [](const std::string& key, const std::string& dataset, const std::string& override_text) {
          return glossa::GetModelParams(key, dataset, override_text);
        },
        py::arg("key"), py::arg("dataset") = "Train", py::arg("override") = "",
        "A registered model's Params for a dataset (GetModelParams), with 'key : value' overrides.");
}
