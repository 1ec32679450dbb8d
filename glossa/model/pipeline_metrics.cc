#include "glossa/model/pipeline_metrics.h"

#include <ATen/ATen.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/mesh.h"

namespace glossa {

void ShareMetricsFromLastStage(const PipelineEnds& ends, const Metrics& metrics,
                               const std::vector<std::string>& names) {
  at::Tensor packed = at::empty({2 * static_cast<int64_t>(names.size())}, at::kDouble);
  for (size_t k = 0; k < names.size(); ++k) {
    const auto m = metrics.find(names[k]);
    if (m == metrics.end()) {
      throw InvalidArgumentError(StrCat("the last pipeline stage has no metric '", names[k],
                                        "' to hand the other stages"));
    }
    packed[2 * k] = m->second.value.detach().to(at::kDouble).reshape({});
    packed[2 * k + 1] = m->second.weight.detach().to(at::kDouble).reshape({});
  }
  ends.axis->Broadcast(packed, static_cast<int>(ends.stages - 1));
}

Metrics MetricsFromLastStage(const PipelineEnds& ends, const std::vector<std::string>& names,
                             at::ScalarType dtype) {
  at::Tensor packed = at::empty({2 * static_cast<int64_t>(names.size())}, at::kDouble);
  ends.axis->Broadcast(packed, static_cast<int>(ends.stages - 1));
  Metrics out;
  for (size_t k = 0; k < names.size(); ++k) {
    out[names[k]] = Metric{packed[2 * k].to(dtype), packed[2 * k + 1].clone()};
  }
  return out;
}

}  // namespace glossa
