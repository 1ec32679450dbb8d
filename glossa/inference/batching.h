// Dynamic batching's arithmetic (glossa serve, server.h): which requests may share a run, their
// feeds merged into one, and each request's rows of the run's fetches.
//
//   if (MergeKey(sg, a) == MergeKey(sg, b)) { InferenceMap all = Run(MergeFeeds({&a, &b})); ...
//   InferenceMap mine = SliceFetches(all, /*offset=*/BatchSize(a), BatchSize(b), total); }
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "glossa/model/inference_spec.h"

namespace glossa {

// Examples in a request: the first batched feed's size (1 when every feed is an option).
int64_t BatchSize(const InferenceMap& feeds);
// Requests merge when they run the same subgraph with the same feed names, the same option
// values (rank 0) and the same non-batch dims and dtypes, and when their longest strings fall in
// the same length bucket (powers of two of bytes: 0, 1, 2-3, 4-7, ..., so that a merged batch pads
// little): the same key.
std::string MergeKey(const std::string& subgraph, const InferenceMap& feeds);
// The requests' feeds as one: batched feeds concatenated in order, options from the first.
InferenceMap MergeFeeds(const std::vector<const InferenceMap*>& batch);
// Rows [offset, offset + n) of every batched fetch of a run over `total` examples.
InferenceMap SliceFetches(const InferenceMap& all, int64_t offset, int64_t n, int64_t total);

}  // namespace glossa
