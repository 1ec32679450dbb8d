// The runtime from Python: model configurations written in Python (registered into the C++ model
// registry, called back under the GIL), glossa.train (the CLI's Executor, without the GIL; SIGINT
// saves and stops as SIGTERM does for the CLI, then raises KeyboardInterrupt), the Predictor,
// checkpoints as dicts of tensors, and the command line itself (`python3 -m glossa`).
#include <ATen/ATen.h>
#include <glog/logging.h>
#include <pybind11/functional.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <csignal>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/inference/predictor.h"
#include "glossa/io/safetensors.h"
#include "glossa/kernels/kernel_choice.h"
#include "glossa/model/model_registry.h"
#include "glossa/runtime/blas_kernels.h"
#include "glossa/runtime/cpu_runtime.h"
#include "glossa/runtime/executor.h"
#include "glossa/runtime/trainer.h"
#include "python/common.h"

namespace glossa_py {
namespace {

using glossa::Params;
using glossa::StrCat;

}  // namespace

void InitLogging() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!google::IsGoogleLoggingInitialized()) {
      FLAGS_logtostderr = true;
      google::InitGoogleLogging("glossa");
    }
  });
}

namespace {

// ---- Model configurations written in Python ----

// A class decorated with @glossa.model_registry.register_single_task_model (Task() and dataset
// methods such as Train(), Dev(), Test() returning Params) or register_multitask_model (Model()
// returning MultiTaskModel Params). Held for the life of the process (never released: the C++
// registry outlives the interpreter).
class PyModelParams : public glossa::ModelParamsBase {
 public:
  PyModelParams(PyObject* cls, std::string key, bool multitask)
      : cls_(cls), key_(std::move(key)), multitask_(multitask) {}

  Params Task() const override {
    if (multitask_) return ModelParamsBase::Task();
    return Call(cls_, key_, "Task");
  }
  std::optional<Params> MultiTaskModelParams() const override {
    if (!multitask_) return std::nullopt;
    return Call(cls_, key_, "Model");
  }
  Params ProgramSchedule() const override {
    bool has = false;
    {
      py::gil_scoped_acquire gil;
      has = py::hasattr(py::handle(cls_), "ProgramSchedule");
    }
    return has ? Call(cls_, key_, "ProgramSchedule") : ModelParamsBase::ProgramSchedule();
  }
  std::map<std::string, std::function<Params()>> Datasets() const override {
    std::map<std::string, std::function<Params()>> out;
    py::gil_scoped_acquire gil;
    const py::handle cls(cls_);
    for (const auto& item : py::module_::import("builtins").attr("dir")(cls)) {
      const std::string name = py::str(item).cast<std::string>();
      if (name.empty() || name[0] < 'A' || name[0] > 'Z') continue;
      if (name == "Task" || name == "Model" || name == "ProgramSchedule") continue;
      if (!PyCallable_Check(cls.attr(name.c_str()).ptr())) continue;
      PyObject* c = cls_;
      const std::string key = key_;
      out[name] = [c, key, name] { return Call(c, key, name); };
    }
    return out;
  }

 private:
  static Params Call(PyObject* cls, const std::string& key, const std::string& method) {
    py::gil_scoped_acquire gil;
    try {
      py::object result = py::handle(cls)().attr(method.c_str())();
      if (!py::isinstance<Params>(result)) {
        throw glossa::InvalidArgumentError(StrCat(
            "model ", key, ": ", method, "() returned a ",
            py::str(result.get_type().attr("__name__")).cast<std::string>(),
            ", not glossa.Params"));
      }
      return result.cast<Params>();
    } catch (py::error_already_set& e) {
      throw glossa::InvalidArgumentError(StrCat("model ", key, ": ", method, "() raised ", e.what()));
    }
  }

  PyObject* cls_;
  std::string key_;
  bool multitask_;
};

// ---- glossa.train and SIGINT ----

// The executors glossa.train runs now (several Python threads may train at once).
std::atomic<glossa::Executor*> g_signal_target[64];
std::atomic<bool> g_interrupted{false};

extern "C" void StopOnSigint(int) {
  g_interrupted.store(true);
  for (auto& slot : g_signal_target) {
    glossa::Executor* ex = slot.load();
    if (ex != nullptr) ex->RequestStop();
  }
}

// Installs StopOnSigint while `ex` runs (main thread only: Python handles signals there), and
// restores Python's handler after.
class SigintScope {
 public:
  SigintScope(glossa::Executor* ex, bool main_thread) : installed_(main_thread) {
    for (auto& slot : g_signal_target) {
      glossa::Executor* expected = nullptr;
      if (slot.compare_exchange_strong(expected, ex)) {
        slot_ = &slot;
        break;
      }
    }
    if (installed_) {
      g_interrupted.store(false);
      struct sigaction sa {};
      sa.sa_handler = StopOnSigint;
      sigemptyset(&sa.sa_mask);
      sigaction(SIGINT, &sa, &old_);
    }
  }
  ~SigintScope() {
    if (installed_) sigaction(SIGINT, &old_, nullptr);
    if (slot_ != nullptr) slot_->store(nullptr);
  }
  bool interrupted() const { return installed_ && g_interrupted.load(); }

 private:
  bool installed_;
  std::atomic<glossa::Executor*>* slot_ = nullptr;
  struct sigaction old_ {};
};

// The kernel choices glossa.train's bf16_kernels, gemm_split and row_kernels pin (as the CLI's
// --bf16_kernels, --gemm_split, --row_kernels do) for the call, and the earlier modes after it.
class KernelModesScope {
 public:
  KernelModesScope(const std::string& bf16, const std::string& split, const std::string& rows) {
    const std::pair<glossa::KernelChoice, const std::string*> given[] = {
        {glossa::KernelChoice::kBf16, &bf16},
        {glossa::KernelChoice::kGemmSplit, &split},
        {glossa::KernelChoice::kRowKernel, &rows}};
    std::vector<std::pair<glossa::KernelChoice, glossa::KernelMode>> modes;
    for (const auto& [choice, text] : given) {  // every value checked before any is set
      modes.emplace_back(choice, glossa::ParseKernelMode(
                                     *text, std::string(glossa::KernelChoiceFlag(choice)).substr(2)));
    }
    for (const auto& [choice, mode] : modes) {
      saved_.emplace_back(choice, glossa::GetKernelMode(choice));
      glossa::SetKernelMode(choice, mode);
    }
  }
  ~KernelModesScope() {
    for (const auto& [choice, mode] : saved_) glossa::SetKernelMode(choice, mode);
  }
  KernelModesScope(const KernelModesScope&) = delete;
  KernelModesScope& operator=(const KernelModesScope&) = delete;

 private:
  std::vector<std::pair<glossa::KernelChoice, glossa::KernelMode>> saved_;
};

int64_t Train(const Params& model_params, const std::string& logdir,
              std::optional<int64_t> max_steps, const py::dict& datasets, int verbosity,
              int64_t log_every_n_steps, int intra_op_threads, const py::object& log,
              const std::string& bf16_kernels, const std::string& gemm_split,
              const std::string& row_kernels) {
  InitLogging();
  KernelModesScope kernel_modes(bf16_kernels, gemm_split, row_kernels);
  // The CLI's training (glossa/runtime/trainer.h): the same checks, CPU setup and executor.
  glossa::TrainOptions o;
  o.max_steps = max_steps;
  o.intra_op_threads = intra_op_threads;
  glossa::ExecutorOptions& eo = o.executor;
  eo.logdir = logdir;
  eo.verbosity = verbosity;
  eo.log_every_n_steps = log_every_n_steps;
  for (const auto& [k, v] : datasets) {
    eo.dataset_params[py::str(k).cast<std::string>()] = v.cast<Params>();
  }
  if (!log.is_none()) {
    // Called on this thread, which holds no GIL while training.
    auto fn = std::make_shared<py::object>(log);
    eo.log = [fn](const std::string& line) {
      py::gil_scoped_acquire gil;
      (*fn)(line);
    };
  }
  const bool main_thread =
      py::module_::import("threading").attr("current_thread")().is(
          py::module_::import("threading").attr("main_thread")());
  std::optional<SigintScope> sigint;
  bool interrupted = false;
  o.on_executor = [&](glossa::Executor* ex) {
    if (ex != nullptr) {
      sigint.emplace(ex, main_thread);
    } else {
      interrupted = sigint && sigint->interrupted();
      sigint.reset();
    }
  };
  int64_t step = 0;
  {
    py::gil_scoped_release release;
    step = glossa::Train(model_params, std::move(o));
  }
  if (interrupted) {
    PyErr_SetString(PyExc_KeyboardInterrupt,
                    StrCat("glossa.train stopped at step ", step, " (saved in ", logdir, "/train)")
                        .c_str());
    throw py::error_already_set();
  }
  return step;
}

// ---- Predictor ----

glossa::InferenceMap ToFeeds(const py::kwargs& feeds) {
  glossa::InferenceMap out;
  for (const auto& [k, v] : feeds) {
    const std::string name = py::str(k).cast<std::string>();
    if (THPVariable_Check(v.ptr())) {
      out[name] = glossa::InferenceValue::Of(v.cast<at::Tensor>());
    } else if (py::isinstance<py::str>(v)) {
      throw py::type_error(StrCat("feed '", name, "': a batch of strings is a list of str, not a str"));
    } else if (py::isinstance<py::bool_>(v)) {
      throw py::type_error(StrCat("feed '", name, "' cannot be a bool"));
    } else if (py::isinstance<py::int_>(v)) {
      out[name] = glossa::InferenceValue::Of(
          at::tensor(ToInt64(v, StrCat("feed '", name, "'")), at::kLong).reshape({}));
    } else if (py::isinstance<py::float_>(v)) {
      out[name] = glossa::InferenceValue::Of(at::tensor(v.cast<double>(), at::kFloat).reshape({}));
    } else if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
      std::vector<std::string> strings;
      for (const auto& s : v) {
        if (!py::isinstance<py::str>(s)) {
          throw py::type_error(StrCat("feed '", name, "': a list feed holds str, not ",
                                      py::str(s.get_type().attr("__name__")).cast<std::string>(),
                                      " (pass numbers as a torch.Tensor)"));
        }
        strings.push_back(ToUtf8(s, StrCat("feed '", name, "'")));
      }
      out[name] = glossa::InferenceValue::Strings(std::move(strings));
    } else {
      throw py::type_error(StrCat("feed '", name, "' cannot be a ",
                                  py::str(v.get_type().attr("__name__")).cast<std::string>()));
    }
  }
  return out;
}

py::dict SpecDict(const glossa::InferenceSubgraphSpec& spec) {
  auto tensors = [](const std::map<std::string, glossa::TensorSpec>& m) {
    py::dict d;
    for (const auto& [name, t] : m) {
      d[py::str(name)] = py::dict(py::arg("dtype") = t.dtype, py::arg("rank") = t.rank,
                                  py::arg("optional") = t.optional, py::arg("doc") = t.doc);
    }
    return d;
  };
  return py::dict(py::arg("feeds") = tensors(spec.feeds), py::arg("fetches") = tensors(spec.fetches),
                  py::arg("doc") = spec.doc);
}

}  // namespace

// long function: a list of bindings (models from Python, train, Predictor), one .def
// per Python name with its docstring.
void DefineRuntime(py::module_& m) {
  m.def(
      "_register_model",
      [](const std::string& key, const py::object& cls, bool multitask) {
        for (const char* method : {multitask ? "Model" : "Task"}) {
          if (!py::hasattr(cls, method)) {
            throw py::type_error(StrCat("model ", key, " defines no ", method, "()"));
          }
        }
        PyObject* held = cls.ptr();
        Py_INCREF(held);  // for the life of the process
        glossa::RegisterModel(key, [held, key, multitask] {
          return std::make_unique<PyModelParams>(held, key, multitask);
        });
      },
      py::arg("key"), py::arg("cls"), py::arg("multitask"));

  m.def("train", &Train, py::arg("model_params"), py::arg("logdir"),
        py::arg("max_steps") = py::none(), py::arg("datasets") = py::dict(),
        py::arg("verbosity") = 1, py::arg("log_every_n_steps") = 0,
        py::arg("intra_op_threads") = 0, py::arg("log") = py::none(),
        py::arg("bf16_kernels") = "measure", py::arg("gemm_split") = "measure",
        py::arg("row_kernels") = "measure",
        R"doc(Trains a model with the executor `glossa train` runs; returns the final global step.

model_params: a model's Params (glossa.model_registry.get_params(key, "Train") or a Python
configuration's). It resumes from logdir/train's latest checkpoint, saves as the CLI does, and
runs without the GIL. Ctrl-C (SIGINT) stops after the current step, saves, and raises
KeyboardInterrupt. datasets: {name: Params} for the datasets the program schedule evaluates.
log: a callable taking each console line (default: stdout). intra_op_threads as the CLI's
--intra_op_threads (0: the layout glossa picks; it sets torch's thread count). bf16_kernels,
gemm_split, row_kernels: "measure" (the default: each kernel choice timed on this machine), "aten"
or "native", as the CLI's flags of those names; for this call only.)doc");

  // OpenBLAS's kernel set by measurement (glossa/runtime/blas_kernels.h), for glossa/__init__.py,
  // which reads a cached decision itself and calls these only in the processes it starts.
  m.def("_blas_core_name", [] { return std::string(glossa::BlasCoreName()); });
  m.def("_blas_choice_key", [] { return glossa::BlasChoiceKey(); });
  m.def("_run_blas_probe", [] { glossa::RunBlasProbe(); });
  m.def(
      "_choose_blas_kernels",
      [](const std::vector<std::string>& probe_argv) {
        std::string description;
        std::string chosen;
        {
          py::gil_scoped_release release;
          chosen = glossa::ChooseBlasKernels(probe_argv, &description);
        }
        return std::make_pair(chosen, description);
      },
      py::arg("probe_argv"));

  m.def(
      "load_checkpoint",
      [](const std::string& prefix) {
        glossa::SafetensorsContents c;
        {
          py::gil_scoped_release release;
          c = glossa::LoadSafetensorsSharded(prefix);
        }
        return c.tensors;
      },
      py::arg("prefix"),
      "A checkpoint (e.g. logdir/train/ckpt-00000010) as {variable name: tensor}, with its "
      "global_step and optimizer slots.");

  py::class_<glossa::Predictor, std::shared_ptr<glossa::Predictor>>(
      m, "Predictor", R"doc(Lingvo's Predictor on an inference bundle (glossa export; docs/inference.md).

    pred = glossa.Predictor("/models/austen_tiny")
    out = pred.run("default", text=["It is a truth universally acknowledged"])
    out["total_log_prob"]          # torch.Tensor; string fetches come back as lists of str

Thread-safe: run() releases the GIL, and several threads may call it at once.)doc")
      .def(py::init([](const std::string& bundle, const std::string& checkpoint,
                       const std::vector<std::string>& subgraphs, int64_t max_batch_size,
                       int64_t max_input_tokens, const std::string& precision,
                       bool batch_invariant) {
             InitLogging();
             glossa::PredictorOptions o;
             o.checkpoint = checkpoint;
             o.subgraphs = subgraphs;
             o.max_batch_size = max_batch_size;
             o.max_input_tokens = max_input_tokens;
             o.precision = precision;
             o.batch_invariant = batch_invariant;
             py::gil_scoped_release release;
             return std::make_shared<glossa::Predictor>(bundle, o);
           }),
           py::arg("bundle_dir"), py::arg("checkpoint") = "",
           py::arg("subgraphs") = std::vector<std::string>{}, py::arg("max_batch_size") = 1024,
           py::arg("max_input_tokens") = 4096, py::arg("precision") = "",
           py::arg("batch_invariant") = false)
      .def_property_readonly(
          "compute",
          [](const glossa::Predictor& p) { return p.policy().ToString(); },
          "What the plan made at load runs: 'int8, batch-invariant, fused decoder step'.")
      .def_property_readonly(
          "plan_notes", [](const glossa::Predictor& p) { return p.plan_notes(); },
          "What the plan could not do as its policy asks, one line per reason (e.g. why decoder "
          "layers decline the fused decoder step, at load or at the first step that met it); empty "
          "when it does all of it.")
      .def(
          "run",
          [](const glossa::Predictor& p, const std::string& subgraph,
             const std::vector<std::string>& fetch_keys, const py::kwargs& feeds) {
            const glossa::InferenceMap in = ToFeeds(feeds);
            glossa::InferenceMap out;
            {
              py::gil_scoped_release release;
              out = p.Run(subgraph, in, fetch_keys);
            }
            py::dict d;
            for (const auto& [name, v] : out) {
              if (v.is_strings()) {
                d[py::str(name)] = py::cast(v.strings);
              } else {
                d[py::str(name)] = py::cast(v.tensor);
              }
            }
            return d;
          },
          py::arg("subgraph") = "default", py::arg("fetch_keys") = std::vector<std::string>{},
          "run(subgraph='default', fetch_keys=None, **feeds): feeds are lists of str or torch "
          "tensors; returns {fetch: torch.Tensor or list of str}.")
      .def("subgraphs",
           [](const glossa::Predictor& p) {
             py::dict d;
             for (const auto& [name, spec] : p.ListSubgraphs()) d[py::str(name)] = SpecDict(spec);
             return d;
           },
           "{subgraph: {'feeds': {...}, 'fetches': {...}, 'doc': str}}.")
      .def(
          "load",
          [](glossa::Predictor& p, const std::string& checkpoint) {
            py::gil_scoped_release release;
            p.Load(checkpoint);
          },
          "Swaps in a training checkpoint's weights (runs in flight finish on the old ones).")
      .def_property_readonly("global_step", &glossa::Predictor::global_step);
}

}  // namespace glossa_py
