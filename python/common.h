// Shared by the _glossa extension's files: Python <-> ParamValue and NestedValue conversions
// (tensors shared with torch, never copied), and the parts each file defines on the module.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>  // at::Tensor <-> torch.Tensor, sharing storage

#include <string>

#include "glossa/core/nested_map.h"
#include "glossa/core/params.h"

namespace glossa_py {

namespace py = pybind11;

// A Python int as int64 and a str as UTF-8; ValueError naming `what` (and not pybind11's bare
// RuntimeError) for an int outside int64 (2**70) or a str that is not valid Unicode (a lone
// surrogate).
int64_t ToInt64(const py::handle& o, const std::string& what);
std::string ToUtf8(const py::handle& o, const std::string& what);

glossa::ParamValue ToValue(const py::handle& o);
py::object FromValue(const glossa::ParamValue& v);
glossa::NestedValue ToNested(const py::handle& o, const std::string& where);
glossa::NestedMap ToNestedMap(const py::dict& d, const std::string& where);
py::object FromNested(const glossa::NestedValue& v);
py::dict FromNestedMap(const glossa::NestedMap& m);

// p.Instantiate(): a Layer for layers (tasks and models included), an InputGenerator for input
// generators; TypeError for other classes.
py::object Instantiate(const glossa::Params& p);

// glog to stderr, once (at import).
void InitLogging();

void DefineLayers(py::module_& m);   // layers.cc: Layer, InputGenerator, EvalMode
void DefineRuntime(py::module_& m);  // runtime.cc: models from Python, train, Predictor
void DefineCli(py::module_& m);      // cli_entry.cc: cli_main (python3 -m glossa)

}  // namespace glossa_py
