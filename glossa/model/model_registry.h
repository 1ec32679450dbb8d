// The model registry: experiment configurations registered under "<task>.<module>.<Class>" (e.g.
// "lm.austen.TransformerLmTiny"), each giving its task Params and its datasets' input Params.
// GetModelParams builds a SingleTaskModel's Params for one dataset and applies
// --model_params_override / --model_params_file_override text.
//
//   class TransformerLmTiny : public ModelParamsBase {
//     Params Task() const override;
//     std::map<std::string, std::function<Params()>> Datasets() const override;  // Train, Dev, ...
//   };
//   GLOSSA_REGISTER_MODEL(TransformerLmTiny, "lm.austen.TransformerLmTiny");
//   Params p = GetModelParams("lm.austen.TransformerLmTiny", "Train", "task.train.max_steps : 10");
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "glossa/core/params.h"
// The model classes GetModelParams builds Params for (SingleTaskModel, MultiTaskModel); model
// files that register a model usually instantiate them too.
#include "glossa/model/base_model.h"

namespace glossa {

class ModelParamsBase {
 public:
  virtual ~ModelParamsBase() = default;
  // The task's Params (without input). Multi-task models override MultiTaskModelParams instead.
  virtual Params Task() const;
  // Multi-task models: MultiTaskModel Params (task_params without inputs, task_probs); their
  // datasets return Params with one input per task name.
  virtual std::optional<Params> MultiTaskModelParams() const { return std::nullopt; }
  // The executor's program schedule (SimpleProgramSchedule Params); by default train only.
  virtual Params ProgramSchedule() const;
  // Dataset name -> its input generator Params.
  virtual std::map<std::string, std::function<Params()>> Datasets() const = 0;
};

using ModelParamsFactory = std::function<std::unique_ptr<ModelParamsBase>()>;
// InvalidArgument for a malformed (fewer than three dotted parts) or duplicate key. Python model
// configurations register as "py:<module>.<Class>" (two parts suffice) and may replace themselves.
void RegisterModel(const std::string& key, ModelParamsFactory factory);
std::vector<std::string> ModelKeys();
// NotFound (with near names) for unknown models.
std::unique_ptr<ModelParamsBase> GetModelParamsClass(const std::string& key);

// SingleTaskModel Params for `key` with task.input from `dataset`, then the overrides:
// `override_text` ("key : value" lines separated by newlines or ';') or the file
// `override_file` (both given: InvalidArgument). Unknown dataset: NotFound with near names.
// Lingvo's --model_task_name on a MultiTaskModel's Params: `task` becomes the main task (the one
// eval and decode run) and, when `training`, the only task trained (the others' task_probs 0).
// InvalidArgument for a single-task model, NotFound (listing the tasks) for an unknown task.
void SelectModelTask(Params& model_params, const std::string& task, bool training);

// `--model_params_override` text as params text lines: ';' separates lines outside quoted
// strings ('...' or "...", backslash escapes), and is kept inside them.
std::string OverrideLines(const std::string& text);

Params GetModelParams(const std::string& key, const std::string& dataset,
                      const std::string& override_text = "", const std::string& override_file = "");

#define GLOSSA_MODEL_CONCAT_INNER(a, b) a##b
#define GLOSSA_MODEL_CONCAT(a, b) GLOSSA_MODEL_CONCAT_INNER(a, b)
#define GLOSSA_REGISTER_MODEL(Class, key)                                                   \
  [[maybe_unused]] static const bool GLOSSA_MODEL_CONCAT(glossa_model_, __COUNTER__) = [] { \
    ::glossa::RegisterModel(key, [] { return std::make_unique<Class>(); });                 \
    return true;                                                                            \
  }()

}  // namespace glossa
