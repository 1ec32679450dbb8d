// The per-process random seed of variables whose layers set no random_seed (base_layer.cc draws
// it once). The trainer says it when it starts a model from scratch, so that the run can be
// repeated; where weights come from a checkpoint (eval, decode, export, a resumed run) it does not
// matter and is not said.
//
//   if (auto seed = UsedProcessRandomSeed()) Log(StrCat("initialized from random seed ", *seed));
#pragma once

#include <cstdint>
#include <optional>

namespace glossa {

// The seed, when some variable was initialized from it; none otherwise.
std::optional<int64_t> UsedProcessRandomSeed();

}  // namespace glossa
