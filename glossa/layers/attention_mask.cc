#include "glossa/layers/attention_mask.h"

#include <ATen/ATen.h>

#include <limits>

namespace glossa {

namespace {

// Whether `cached` (at `version`) is `t` unchanged: the same tensor (held by the cache, so its
// address cannot be reused by another) not written in place since; both undefined also match.
bool SameInput(const at::Tensor& cached, int64_t version, const at::Tensor& t) {
  if (!t.defined()) return !cached.defined();
  return cached.defined() && cached.unsafeGetTensorImpl() == t.unsafeGetTensorImpl() &&
         version == t._version();
}

}  // namespace

// The key mask [B or 1, 1, T or 1, S] (true = masked) of padded keys, keys of another segment
// (packed inputs: query segment ids [B, T], key segment ids [B, S]; a query in segment 0, the
// padding, is not masked by the key paddings) and, when causal, future keys. Every layer of a
// stack attends over the same inputs: the last mask is kept per thread with the tensors it came
// from and their versions (an in-place write makes the entry stale).
at::Tensor KeyMask(const at::Tensor& paddings, const at::Tensor& query_segments,
                   const at::Tensor& key_segments, int64_t t, int64_t s, bool causal,
                   at::Device device) {
  struct Entry {
    at::Tensor paddings, query_segments, key_segments, mask;
    int64_t versions[3] = {0, 0, 0};
    int64_t t = 0, s = 0;
    bool causal = false;
  };
  thread_local Entry last;  // per-thread cache: the last mask built
  if (last.mask.defined() && last.t == t && last.s == s && last.causal == causal &&
      last.mask.device() == device && SameInput(last.paddings, last.versions[0], paddings) &&
      SameInput(last.query_segments, last.versions[1], query_segments) &&
      SameInput(last.key_segments, last.versions[2], key_segments)) {
    return last.mask;
  }
  at::Tensor mask;
  if (paddings.defined()) mask = (paddings > 0.5).view({paddings.size(0), 1, 1, s});
  if (query_segments.defined()) {
    const int64_t b = query_segments.size(0);
    const at::Tensor q = query_segments.view({b, 1, t, 1});
    const at::Tensor other_segment = q != key_segments.view({b, 1, 1, s});
    mask = mask.defined() ? ((mask & (q != 0)) | other_segment) : other_segment;
  }
  if (causal) {
    at::Tensor future = at::ones({t, s}, at::TensorOptions().dtype(at::kBool).device(device))
                            .triu(1)
                            .view({1, 1, t, s});
    mask = mask.defined() ? (mask | future) : future;
  }
  auto version = [](const at::Tensor& x) { return x.defined() ? x._version() : int64_t{0}; };
  last = Entry{paddings,
               query_segments,
               key_segments,
               mask,
               {version(paddings), version(query_segments), version(key_segments)},
               t,
               s,
               causal};
  return mask;
}

// The additive bias of a key mask in `dtype`: the dtype's lowest value where masked, else 0
// (cached per thread for the last mask, which KeyMask hands to every layer of a stack).
at::Tensor MaskBias(const at::Tensor& key_mask, const at::TensorOptions& options) {
  thread_local at::Tensor last_mask, last_bias;  // per-thread cache: the last bias
  if (last_bias.defined() && last_mask.unsafeGetTensorImpl() == key_mask.unsafeGetTensorImpl() &&
      last_bias.scalar_type() == options.dtype().toScalarType() &&
      last_bias.device() == options.device()) {
    return last_bias;
  }
  const at::ScalarType dtype = options.dtype().toScalarType();
  // Masked logits become the dtype's lowest value, so their probability is exactly 0.
  const double lowest = dtype == at::kDouble     ? std::numeric_limits<double>::lowest()
                        : dtype == at::kBFloat16 ? -3.38e38
                        : dtype == at::kHalf     ? -65504.0
                                                 : std::numeric_limits<float>::lowest();
  last_bias = at::zeros(key_mask.sizes(), options).masked_fill_(key_mask, lowest);
  last_mask = key_mask;
  return last_bias;
}

}  // namespace glossa
