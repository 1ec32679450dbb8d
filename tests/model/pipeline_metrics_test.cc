// A pipeline's metrics under Lingvo's placement (glossa/model/pipeline_metrics.h): the last
// stage's values and weights reach every other rank of the pipeline, in the asked order and
// dtype; a metric the last stage lacks is named, not sent as garbage.
#include "glossa/model/pipeline_metrics.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "glossa/base/errors.h"
#include "glossa/runtime/distributed.h"
#include "glossa/runtime/gradient_sync.h"
#include "glossa/runtime/mesh.h"
#include "tests/runtime/workers.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

TEST(PipelineMetrics, TheLastStagesMetricsReachEveryStage) {
  const std::vector<std::string> names = {"loss", "num_predictions"};
  std::vector<Metrics> got(3);
  RunWorkers(3, [&](Distributed& dist) {
    const int r = dist.rank();
    DistributedMeshAxis axis(dist);
    const PipelineEnds ends{&axis, r, 3};
    if (ends.last()) {
      Metrics mine{{"loss", Metric{at::scalar_tensor(2.5), at::scalar_tensor(40.0)}},
                   {"num_predictions", Metric{at::scalar_tensor(40.0), at::scalar_tensor(1.0)}},
                   {"unshared", Metric{at::scalar_tensor(7.0), at::scalar_tensor(1.0)}}};
      ShareMetricsFromLastStage(ends, mine, names);
      got[r] = mine;
    } else {
      got[r] = MetricsFromLastStage(ends, names, r == 0 ? at::kFloat : at::kDouble);
    }
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(got[r].size(), 2u) << "rank " << r;
    EXPECT_EQ(got[r].at("loss").value.item<double>(), 2.5) << "rank " << r;
    EXPECT_EQ(got[r].at("loss").weight.item<double>(), 40.0) << "rank " << r;
    EXPECT_EQ(got[r].at("num_predictions").value.item<double>(), 40.0) << "rank " << r;
    EXPECT_EQ(got[r].at("num_predictions").weight.item<double>(), 1.0) << "rank " << r;
  }
  EXPECT_EQ(got[0].at("loss").value.scalar_type(), at::kFloat);
  EXPECT_EQ(got[1].at("loss").value.scalar_type(), at::kDouble);
  // A name the last stage does not have: refused there, before anything is sent.
  RunWorkers(1, [&](Distributed& dist) {
    DistributedMeshAxis axis(dist);
    const PipelineEnds ends{&axis, 0, 1};
    EXPECT_ERROR_CONTAINS(ShareMetricsFromLastStage(ends, Metrics{}, {"loss"}),
                          InvalidArgumentError, "the last pipeline stage has no metric 'loss'");
  });
}

}  // namespace
}  // namespace glossa
