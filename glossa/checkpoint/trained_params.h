// The Params a training run was trained with (<logdir>/control/params.txt), for the jobs that
// follow it: export, eval, decode and report must build the model the checkpoints hold, not what
// the registry says today or what the command line happens to repeat.
//
//   std::vector<std::string> notes = ApplyTrainedParams(p, "runs/x", OverrideKeys(text), false);
//   for (const auto& n : notes) std::cerr << n << "\n";
#pragma once

#include <string>
#include <vector>

#include "glossa/core/params.h"

namespace glossa {

// The keys "key : value" override lines set (OverrideLines' output, or a params file's text).
std::vector<std::string> OverrideKeys(const std::string& override_text);

// True for the keys a trained model does not depend on: its inputs (any `input` component), its
// training and eval settings (`train`, `eval`), the program schedule and the random seed.
bool IsRunSettingKey(const std::string& key);

// Makes `p` the model <logdir>/control/params.txt describes (no file: nothing changes). Every
// other key (see IsRunSettingKey) that differs is taken from the run, and said in the notes
// returned; a differing key that `override_keys` set (or a key under one of them) is an
// InvalidArgument showing the difference, unless `allow_change`, which keeps the override and says
// so. A key the run has and `p` lacks is an InvalidArgument naming it.
std::vector<std::string> ApplyTrainedParams(Params& p, const std::string& logdir,
                                            const std::vector<std::string>& override_keys,
                                            bool allow_change);

}  // namespace glossa
