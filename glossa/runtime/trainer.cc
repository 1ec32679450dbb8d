#include "glossa/runtime/trainer.h"

#include <glog/logging.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/dtype.h"
#include "glossa/model/params_passes.h"
#include "glossa/runtime/cpu_runtime.h"

namespace glossa {

int64_t Train(const Params& model_params, TrainOptions options) {
  Params p = model_params.Copy();
  if (!p.Contains("task") && !p.Contains("task_params")) {
    throw InvalidArgumentError(
        "train: model_params must be a model's Params (SingleTaskModel or MultiTaskModel, e.g. "
        "GetModelParams(key, \"Train\")), not a task's or a layer's");
  }
  if (options.max_steps) {
    if (*options.max_steps < 0) throw InvalidArgumentError("train: max_steps must be >= 0");
    for (const std::string& task : TaskPaths(p)) {
      p.Set(task + ".train.max_steps", *options.max_steps);
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
    if (*BlasCoreName() != '\0') LOG(INFO) << "OpenBLAS kernels: " << BlasCoreName();
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
