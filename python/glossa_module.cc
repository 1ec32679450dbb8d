// The `glossa` Python extension (pybind11, for Debian's /usr/bin/python3): Params with attribute
// access and Lingvo's text and proto formats, and the model registry. Python values map to
// ParamValues both ways (None, bool, int, float, str, list, dict, nested Params; dtypes as their
// names, which glossa/__init__.py turns into torch.dtype). glossa::Error codes become Python
// exceptions: NotFound -> KeyError, InvalidArgument -> ValueError (TypeError for a kind
// mismatch), others -> RuntimeError.
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <string>
#include <vector>

#include "python/common.h"

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/nested_map.h"
#include "glossa/core/params.h"
#include "glossa/core/registry.h"
#include "glossa/model/model_registry.h"

using glossa::ParamValue;
using glossa::Params;

namespace glossa_py {
namespace {

struct DTypeName {
  std::string name;
};

}  // namespace

namespace {

// Bounds the nesting of values built from Python (a 100,000-deep list would overflow the stack
// of every recursive walk of the Params).
constexpr int kMaxValueDepth = 100;

ParamValue ToValueAt(const py::handle& o, int depth);

}  // namespace

int64_t ToInt64(const py::handle& o, const std::string& what) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(o.ptr(), &overflow);
  if (overflow != 0) {
    throw py::value_error(glossa::StrCat(what, ": ", py::repr(o).cast<std::string>(),
                                         " does not fit in a 64-bit integer"));
  }
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return static_cast<int64_t>(v);
}

std::string ToUtf8(const py::handle& o, const std::string& what) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(o.ptr(), &size);
  if (data == nullptr) {
    PyErr_Clear();
    throw py::value_error(glossa::StrCat(what, ": the string is not valid Unicode (it holds a "
                                         "lone surrogate, which has no UTF-8 form)"));
  }
  return std::string(data, static_cast<size_t>(size));
}

ParamValue ToValue(const py::handle& o) { return ToValueAt(o, 0); }

namespace {

ParamValue ToValueAt(const py::handle& o, int depth) {
  if (depth > kMaxValueDepth) {
    throw py::value_error(glossa::StrCat("a Params value may nest at most ", kMaxValueDepth,
                                         " lists, tuples or dicts deep"));
  }
  if (o.is_none()) return ParamValue();
  if (py::isinstance<py::bool_>(o)) return ParamValue(o.cast<bool>());
  if (py::isinstance<py::int_>(o)) return ParamValue(ToInt64(o, "a Params value"));
  if (py::isinstance<py::float_>(o)) return ParamValue(o.cast<double>());
  if (py::isinstance<py::str>(o)) return ParamValue(ToUtf8(o, "a Params value"));
  if (py::isinstance<Params>(o)) return ParamValue(o.cast<const Params&>());
  if (py::isinstance<DTypeName>(o)) {
    return ParamValue(glossa::ParseDType(o.cast<DTypeName>().name));
  }
  if (py::isinstance<py::list>(o) || py::isinstance<py::tuple>(o)) {
    ParamValue::List list;
    for (const auto& item : o) list.push_back(ToValueAt(item, depth + 1));
    return ParamValue(std::move(list));
  }
  if (py::isinstance<py::dict>(o)) {
    ParamValue::Dict dict;
    for (const auto& [k, v] : o.cast<py::dict>()) {
      dict[py::str(k).cast<std::string>()] = ToValueAt(v, depth + 1);
    }
    return ParamValue(std::move(dict));
  }
  throw py::type_error(glossa::StrCat("a Params value cannot be a ",
                                      py::str(o.get_type().attr("__name__")).cast<std::string>()));
}

}  // namespace

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

glossa::NestedMap ToNestedMap(const py::dict& d, const std::string& where) {
  glossa::NestedMap m;
  for (const auto& [k, v] : d) {
    const std::string key = py::str(k).cast<std::string>();
    m.Put(key, ToNested(v, where.empty() ? key : where + "." + key));  // validates the key
  }
  return m;
}

glossa::NestedValue ToNested(const py::handle& o, const std::string& where) {
  if (o.is_none()) return glossa::NestedValue();
  if (THPVariable_Check(o.ptr())) return glossa::NestedValue(o.cast<at::Tensor>());
  if (py::isinstance<py::bool_>(o)) return glossa::NestedValue(o.cast<bool>());
  const std::string what = where.empty() ? std::string("a value") : where;
  if (py::isinstance<py::int_>(o)) return glossa::NestedValue(ToInt64(o, what));
  if (py::isinstance<py::float_>(o)) return glossa::NestedValue(o.cast<double>());
  if (py::isinstance<py::str>(o)) return glossa::NestedValue(ToUtf8(o, what));
  if (py::isinstance<py::dict>(o)) return glossa::NestedValue(ToNestedMap(o.cast<py::dict>(), where));
  if (py::isinstance<py::list>(o) || py::isinstance<py::tuple>(o)) {
    glossa::NestedValue::List l;
    int i = 0;
    for (const auto& x : o) l.push_back(ToNested(x, glossa::StrCat(where, "[", i++, "]")));
    return glossa::NestedValue(std::move(l));
  }
  throw py::type_error(glossa::StrCat("NestedMap value '", where, "' cannot be a ",
                                      py::str(o.get_type().attr("__name__")).cast<std::string>()));
}

py::dict FromNestedMap(const glossa::NestedMap& m) {
  py::dict d;
  for (const auto& [k, v] : m) d[py::str(k)] = FromNested(v);
  return d;
}

py::object FromNested(const glossa::NestedValue& v) {
  using K = glossa::NestedValue::Kind;
  switch (v.kind()) {
    case K::kNone: return py::none();
    case K::kTensor: return py::cast(v.AsTensor());
    case K::kInt: return py::int_(v.AsInt());
    case K::kFloat: return py::float_(v.AsFloat());
    case K::kBool: return py::bool_(v.AsBool());
    case K::kString: return py::str(v.AsString());
    case K::kMap: return FromNestedMap(v.AsMap());
    case K::kList: {
      py::list l;
      for (const auto& x : v.AsList()) l.append(FromNested(x));
      return l;
    }
  }
  return py::none();
}

namespace {

// Every Params inside `v` (nested Params, lists and dicts of them).
void CollectParams(const ParamValue& v, std::vector<const Params*>& out) {
  if (v.is_params()) {
    out.push_back(&v.AsParams());
    for (const auto& e : v.AsParams()) CollectParams(e.value, out);
  } else if (v.is_list()) {
    for (const auto& x : v.AsList()) CollectParams(x, out);
  } else if (v.kind() == ParamValue::Kind::kDict) {
    for (const auto& [k, x] : v.AsDict()) CollectParams(x, out);
  }
}

// Whether a Python object refers to a Params inside `v` (a handle such as s = p.task.stack).
bool HasPythonHandle(const ParamValue& v) {
  std::vector<const Params*> inside;
  CollectParams(v, inside);
  const auto& instances = py::detail::get_internals().registered_instances;
  for (const Params* q : inside) {
    if (instances.find(static_cast<const void*>(q)) != instances.end()) return true;
  }
  return false;
}

// Nested Params handed to Python point into their parent's storage. A value replaced while such a
// handle exists is kept here, so that the handle goes on reading the Params it was taken from (as
// in Python) instead of freed memory; it is freed once no handle refers to it. Used with the GIL
// held, which serializes every access from Python threads.
std::vector<ParamValue>& Replaced() {
  static auto* replaced = new std::vector<ParamValue>();
  return *replaced;
}

// p.x = v keeps a scalar field's kind: max_steps = 'abc' is a TypeError when set, not a failure
// when the trainer reads it. None, a list or Params may replace anything; an int may set a float.
void CheckKeepsKind(const std::string& name, const ParamValue& old, const ParamValue& v) {
  using K = ParamValue::Kind;
  const K was = old.kind(), now = v.kind();
  auto scalar = [](K k) { return k == K::kBool || k == K::kInt || k == K::kFloat || k == K::kString; };
  // A field documented as "an int or a list" (splits) may become a list or Params.
  if (!scalar(was) || !scalar(now) || now == was || (was == K::kFloat && now == K::kInt)) return;
  throw glossa::InvalidArgumentError(glossa::StrCat("param '", name, "' is a ", old.KindName(),
                                                    ", not a ", v.KindName()));
}

void SetAttr(Params& p, const std::string& name, const py::handle& value) {
  ParamValue v = ToValue(value);
  CheckKeepsKind(name, p.Get(name), v);
  auto& replaced = Replaced();
  replaced.erase(std::remove_if(replaced.begin(), replaced.end(),
                                [](const ParamValue& r) { return !HasPythonHandle(r); }),
                 replaced.end());
  // The old value, moved out (its Params keep their addresses) when a handle refers into it.
  auto& slot = const_cast<ParamValue&>(p.Get(name));  // NotFound/InvalidArgument for a bad path
  if (HasPythonHandle(slot)) replaced.push_back(std::move(slot));
  p.Set(name, std::move(v));
}

}  // namespace
}  // namespace glossa_py

// long function: the module's list of bindings, one .def per Python name with its
// docstring; the other Define* files hold the rest of the list.
PYBIND11_MODULE(_glossa, m) {
  using namespace glossa_py;
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

  py::class_<Params>(m, "Params", py::dynamic_attr(), R"doc(Lingvo's Params: a tree of named, documented values.

    p = glossa.Params()
    p.Define("dim", 8, "Model dimension.")
    p.dim = 16                      # existing keys only (AttributeError with did-you-mean)
    p.Set(dim=32); p.Get("dim"); p.Doc("dim")
    text = p.ToText(); q = glossa.Params().FromText(text)
)doc")
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
      .def("Instantiable", [](const Params& p) { return !p.ClsKey().empty(); },
           "Whether cls names a registered class (Instantiate() builds it).")
      .def("Instantiate", &Instantiate,
           "Builds the class `cls` names: a glossa.Layer for layers (tasks and models too), a "
           "glossa.InputGenerator for input generators.")
      .def("Doc", [](const Params& p, const std::string& path) { return p.Doc(path); },
           "The description a key was defined with (a dotted path).")
      .def("ToTextWithDocs", &Params::ToTextWithDocs,
           "The text format with each key's description as a comment above it.")
      .def("__dir__",
           [](py::object self) {
             py::list names = py::module_::import("builtins").attr("object").attr("__dir__")(self);
             for (const auto& k : self.cast<const Params&>().Keys()) names.append(py::str(k));
             return names;
           })
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

  m.def("nested_map", [](const py::dict& d) { return FromNestedMap(ToNestedMap(d, "")); },
        "A dict as a Glossa NestedMap would hold it (keys validated; tensors shared, not copied).");
  m.def("flatten",
        [](const py::dict& d) {
          py::list out;
          for (const auto& [k, v] : ToNestedMap(d, "").FlattenItems()) {
            out.append(py::make_tuple(k, FromNested(v)));
          }
          return out;
        },
        "NestedMap.FlattenItems: (dotted key, leaf) pairs in Lingvo's order (keys sorted).");
  m.def("pack",
        [](const py::dict& structure, const py::list& values) {
          std::vector<glossa::NestedValue> leaves;
          for (const auto& v : values) leaves.push_back(ToNested(v, "values"));
          return FromNestedMap(ToNestedMap(structure, "").Pack(leaves));
        },
        "NestedMap.Pack: `structure`'s shape with `values` as its leaves, in flatten order.");

  m.attr("__version__") = GLOSSA_VERSION_STRING;
  InitLogging();
  DefineLayers(m);
  DefineRuntime(m);
  DefineCli(m);

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
