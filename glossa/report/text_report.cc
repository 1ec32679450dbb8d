#include "glossa/report/text_report.h"

#include <memory>
#include <optional>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/checkpoint/checkpointer.h"
#include "glossa/checkpoint/saver.h"
#include "glossa/input/input_generator.h"
#include "glossa/model/base_model.h"
#include "glossa/model/metric_history.h"
#include "glossa/optim/ema.h"
#include "glossa/runtime/jobs.h"
#include "glossa/runtime/program.h"

namespace glossa {
namespace {

// The latest checkpoint of <logdir>/train loaded into a model built from `p` (EMA shadows when
// the model keeps them).
std::unique_ptr<BaseModel> LoadLatestForEval(const Params& p, const std::string& logdir,
                                             int64_t* step) {
  auto model = InstantiateLayer<BaseModel>(p);
  const std::string train_dir = JoinPath(logdir, "train");
  auto latest = Saver::LatestCheckpoint(train_dir);
  if (!latest)
    throw NotFoundError(StrCat("no checkpoint in ", train_dir, " (run `glossa train` first)"));
  const std::shared_ptr<ExponentialMovingAverage> ema = MakeModelEma(*model);
  const std::optional<int64_t> global_step =
      RestoreForEval(LoadCheckpoint(*latest), *model, ema.get());
  if (!global_step) throw DataLossError(StrCat(*latest, ": checkpoint has no global_step"));
  *step = *global_step;
  return model;
}

// "best log_pplx on Dev (evaler job, lower is better): 4.09 at step 1200; last step 1200" lines.
std::string BestStepLines(const TextReportOptions& o) {
  std::string out;
  for (JobKind kind : {JobKind::kEval, JobKind::kDecode}) {
    for (const auto& [metric, b] : ReadBestStepFiles(ProgramDir(kind, o.logdir, o.dataset))) {
      out += StrCat("best ", metric, " on ", o.dataset, " (",
                    kind == JobKind::kEval ? "evaler" : "decoder", " job, ",
                    b.minimize ? "lower" : "higher", " is better): ", b.value, " at step ",
                    b.best_step, "; last step ", b.last_step, "\n");
    }
  }
  return out;
}

}  // namespace

std::string RenderTextReport(const Params& model_params, const TextReportOptions& o) {
  int64_t step = 0;
  auto model = LoadLatestForEval(model_params, o.logdir, &step);
  BaseTask::ReportInputs in;
  in.model_key = o.model_key;
  in.dataset = o.dataset;
  in.global_step = step;
  in.num_samples = o.num_samples;
  in.eval_metrics = EvalProgram(*model, nullptr).Run(step);
  try {
    in.decode_lines = DecodeProgram(*model, nullptr).Run(step, 1).lines;
  } catch (const UnimplementedError&) {  // a task without Decode reports its metrics only
  }
  const std::string input_path = EvalTaskParamsPath(*model) + ".input";
  in.train_input = [train_params = o.train_params, input_path]() {
    Params ip = train_params().GetParams(input_path).Copy();
    if (ip.Contains("repeat_count")) ip.Set("repeat_count", 1);
    if (ip.Contains("require_sequential_order")) ip.Set("require_sequential_order", true);
    return InstantiateLayer<BaseInputGenerator>(ip);
  };
  return model->task().Report(in) + BestStepLines(o);
}

}  // namespace glossa
