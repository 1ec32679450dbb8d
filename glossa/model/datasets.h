// The data each dataset of a model reads, as Params (model_registry.h's GetModelParams adds
// `datasets` to a single-task model's Params: `datasets.train`, `datasets.dev`, ... each its
// input's file_pattern), and how a job's task.input follows them.
//
//   Params p = GetModelParams("lm.text.TransformerLmTiny", "Dev", overrides);
//   ApplyTrainedParams(p, logdir, keys, false);   // the run's datasets.*
//   ResolveDatasetInput(p, "Dev", keys);          // task.input.file_pattern = datasets.dev
#pragma once

#include <string>
#include <vector>

#include "glossa/core/params.h"

namespace glossa {

// Sets p's task.input.file_pattern from datasets.<dataset lower-cased> (a follower job calls it
// again once the run's `datasets` replaced the registered ones), unless `override_keys` gave
// task.input's file_pattern, which then becomes datasets.<dataset>. An empty datasets.<dataset> (a
// model with no such data, e.g. lm.text.* before it is given) is, when `require`, an
// InvalidArgument naming the key to set (GetModelParams does not require it: a follower job takes
// it from the run afterwards). A dataset other than Train reads unpacked: its
// task.input.packed_input (when the input has one) is set to False. Models without `datasets`
// are left as they are.
void ResolveDatasetInput(Params& p, const std::string& dataset,
                         const std::vector<std::string>& override_keys, bool require = true);

// A training run whose Train reads other data than `model_key`'s registered Train while a dataset
// that no override named still reads its registered data (task.input.file_pattern, the natural
// route, changes Train alone): which data is that dataset meant to be? InvalidArgument, with the
// datasets.* override that says what each reads. The train command's check, not other jobs'.
void RefuseTrainingOnMixedData(const std::string& model_key, const Params& p,
                               const std::vector<std::string>& override_keys);

// Whether one of the override keys sets `key` (the key itself or a Params above it).
bool OverridesCover(const std::vector<std::string>& override_keys, const std::string& key);

}  // namespace glossa
