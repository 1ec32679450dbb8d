#include "glossa/model/params_passes.h"

#include <gtest/gtest.h>

#include "glossa/core/dtype.h"
#include "glossa/input/input_generator.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/transformer_stack.h"
#include "glossa/model/base_model.h"
#include "glossa/optim/schedule.h"
#include "glossa/tasks/lm/transformer_lm.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

Params LmTask() { return TransformerLmTask::CommonParams(50, 16, 32, 2, 2); }

TEST(ParamsPasses, TheMainTaskHasOnePathForEveryModelKind) {
  Params single = SingleTaskModel::Params();
  single.Set("task", LmTask());
  EXPECT_EQ(TaskPaths(single), std::vector<std::string>{"task"});
  EXPECT_EQ(MainTaskPath(single), "task");

  Params multi = MultiTaskModel::Params();
  multi.GetParams("task_params").Define("b", LmTask(), "");
  multi.GetParams("task_params").Define("a", LmTask(), "");
  EXPECT_EQ(TaskPaths(multi), (std::vector<std::string>{"task_params.b", "task_params.a"}));
  EXPECT_EQ(MainTaskPath(multi), "task_params.b");  // main_task empty: the first task
  multi.Set("main_task", "a");
  EXPECT_EQ(MainTaskPath(multi), "task_params.a");
  multi.Set("main_task", "c");
  EXPECT_ERROR_CONTAINS(MainTaskPath(multi), NotFoundError, "main_task c (keys are [");
  EXPECT_ERROR_CONTAINS(TaskPaths(LmTask()), InvalidArgumentError, "not a task's or a layer's");
  EXPECT_ERROR_CONTAINS(TaskPaths(MultiTaskModel::Params()), InvalidArgumentError,
                        "task_params is empty");
}

// What the data-parallel pass rewrites follows the classes: an input generator anywhere (in a
// list too) is sharded, and neither a layer that happens to have an input's field names nor a
// schedule's num_splits is touched.
TEST(ParamsPasses, ShardingRewritesInputsAndTasksByClassNotByFieldName) {
  Params model = SingleTaskModel::Params();
  Params task = LmTask();
  Params input = TextLmInput::Params();
  input.Set("bucket_batch_limit", ParamValue::List{8});
  task.Set("input", input);
  Params schedule = LinearRampupExponentialDecayScaledByNumSplitSchedule::Params();
  schedule.Set("num_splits", 3);
  task.Set("train.learner.lr_schedule", schedule);
  Params lookalike = ProjectionLayer::Params();
  lookalike.Define("num_input_replicas", 1, "").Define("input_replica_id", 0, "");
  lookalike.Define("batch_size", 8, "");
  task.Define("lookalike", lookalike, "");
  task.Define("more_inputs", ParamValue::List{ParamValue(input.Copy())}, "");
  model.Set("task", task);

  EXPECT_TRUE(ShardParamsForReplicas(model, 2, 1).empty());
  EXPECT_EQ(model.GetInt("task.input.num_input_replicas"), 2);
  EXPECT_EQ(model.GetInt("task.input.input_replica_id"), 1);
  EXPECT_EQ(model.Get("task.input.bucket_batch_limit").AsList()[0].AsInt(), 4);
  const Params& listed = model.Get("task.more_inputs").AsList()[0].AsParams();
  EXPECT_EQ(listed.GetInt("input_replica_id"), 1);
  EXPECT_EQ(listed.Get("bucket_batch_limit").AsList()[0].AsInt(), 4);
  EXPECT_EQ(model.GetInt("task.lookalike.num_input_replicas"), 1);
  EXPECT_EQ(model.GetInt("task.lookalike.batch_size"), 8);
  EXPECT_EQ(model.GetInt("task.train.learner.lr_schedule.num_splits"), 3);
  EXPECT_ERROR_CONTAINS(ShardParamsForReplicas(model, 2, 2), InvalidArgumentError,
                        "rank 2 of world size 2 is out of range");
}

TEST(ParamsPasses, FloatActivationsReachEveryLayerAndOnlyLayers) {
  Params stack = TransformerStack::Params();
  Params layer = stack.GetParams("transformer_layer_params_tpl").Copy();
  layer.Set("fprop_dtype", DType::kBFloat16);
  stack.Set("transformer_layer_params_tpl", ParamValue::List{ParamValue(layer.Copy()),
                                                             ParamValue(layer.Copy())});
  stack.Set("fprop_dtype", DType::kBFloat16);
  Params plain;  // no class: not a layer, whatever its fields are called
  plain.Define("fprop_dtype", DType::kBFloat16, "");
  stack.Define("plain", plain, "");

  FloatActivations(stack);
  EXPECT_TRUE(stack.Get("fprop_dtype").is_none());
  for (const ParamValue& v : stack.Get("transformer_layer_params_tpl").AsList()) {
    EXPECT_TRUE(v.AsParams().Get("fprop_dtype").is_none());
  }
  EXPECT_FALSE(stack.Get("plain.fprop_dtype").is_none());
}

}  // namespace
}  // namespace glossa
