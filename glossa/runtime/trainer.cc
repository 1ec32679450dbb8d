#include "glossa/runtime/trainer.h"

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/dtype.h"
#include "glossa/runtime/cpu_runtime.h"

namespace glossa {
namespace {

// The main task's Params path ("task" or "task_params.<main_task>").
std::string MainTaskPath(const Params& p) {
  if (p.Contains("task")) return "task";
  std::string main = p.GetString("main_task");
  const auto names = p.GetParams("task_params").Keys();
  if (main.empty() && !names.empty()) main = names.front();
  return StrCat("task_params.", main);
}

}  // namespace

int64_t Train(const Params& model_params, TrainOptions options) {
  Params p = model_params.Copy();
  if (!p.Contains("task") && !p.Contains("task_params")) {
    throw InvalidArgumentError(
        "train: model_params must be a model's Params (SingleTaskModel or MultiTaskModel, e.g. "
        "GetModelParams(key, \"Train\")), not a task's or a layer's");
  }
  if (options.max_steps) {
    if (*options.max_steps < 0) throw InvalidArgumentError("train: max_steps must be >= 0");
    if (p.Contains("task")) {
      p.Set("task.train.max_steps", *options.max_steps);
    } else {
      for (const auto& name : p.GetParams("task_params").Keys()) {
        p.Set(StrCat("task_params.", name, ".train.max_steps"), *options.max_steps);
      }
    }
  }
  for (const auto& ds : p.Get("program_schedule.eval_dataset_names").AsList()) {
    if (!options.executor.dataset_params.count(ds.AsString())) {
      throw InvalidArgumentError(StrCat("train: the program schedule evaluates '", ds.AsString(),
                                        "', but no Params were given for that dataset"));
    }
  }
  if (options.intra_op_threads) {
    const ParamValue& fprop = p.Get(MainTaskPath(p) + ".fprop_dtype");
    ConfigureCpuRuntime(*options.intra_op_threads,
                        !fprop.is_none() && fprop.AsDType() == DType::kBFloat16);
  }
  Executor ex(p, std::move(options.executor));
  struct Registration {
    const std::function<void(Executor*)>& f;
    ~Registration() {
      if (f) f(nullptr);
    }
  } registration{options.on_executor};
  if (options.on_executor) options.on_executor(&ex);
  return ex.Run();
}

}  // namespace glossa
