// A task's metrics under Lingvo's pipeline placement (PipelineEnds, glossa/layers/gpipe.h): the
// loss and metrics are computed on the last stage of a pipeline over ranks, which hands them to
// the pipeline's other ranks in one broadcast, so that every rank logs, checks and reports the
// same numbers. Every rank of the pipeline calls one of the two with the same names, in the same
// order.
//
//   if (ends.axis != nullptr && !ends.last()) {
//     out.metrics = MetricsFromLastStage(ends, names, at::kFloat);
//   } else {
//     out = ...;  // compute
//     if (ends.axis != nullptr) ShareMetricsFromLastStage(ends, out.metrics, names);
//   }
#pragma once

#include <string>
#include <vector>

#include "glossa/layers/gpipe.h"
#include "glossa/optim/learner.h"

namespace glossa {

// On the last stage: broadcasts the values and weights of `names` (each in `metrics`; InvalidArgument
// naming a missing one) over ends.axis.
void ShareMetricsFromLastStage(const PipelineEnds& ends, const Metrics& metrics,
                               const std::vector<std::string>& names);
// On the other stages: the last stage's metrics `names` (values of `dtype`, weights double).
Metrics MetricsFromLastStage(const PipelineEnds& ends, const std::vector<std::string>& names,
                             at::ScalarType dtype);

}  // namespace glossa
