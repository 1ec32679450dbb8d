// The per-process random seed of variables whose layers set no random_seed (base_layer.cc draws
// it once). The trainer says it when it starts a model from scratch, so that the run can be
// repeated; where weights come from a checkpoint (eval, decode, export, a resumed run) it does not
// matter and is not said.
//
//   const int64_t before = ProcessRandomSeedUses();
//   auto model = InstantiateLayer<BaseModel>(p);
//   if (ProcessRandomSeedUses() > before) Log(StrCat("random seed ", ProcessRandomSeed()));
#pragma once

#include <cstdint>

namespace glossa {

// The seed, drawn on first use.
int64_t ProcessRandomSeed();
// How many variables have been initialized from it so far in this process.
int64_t ProcessRandomSeedUses();
// The seed, counted as one more use (what a variable's initialization without a seed takes).
int64_t UseProcessRandomSeed();

}  // namespace glossa
