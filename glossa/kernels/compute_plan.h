// The inference plan: what arithmetic a loaded model runs, decided once when it loads, with its
// weights prepared for it then (CTranslate2 chooses its compute type at load and converts the
// weights for it; nothing on the hot path asks a global what mode it is in).
//
//   ComputePolicy policy;  policy.precision = Precision::kInt8;  policy.batch_invariant = true;
//   auto plan = PlanInference(*model, policy);  // glossa/layers/base_layer.h: every layer
//   model->SetComputePlan(plan);                // prepares its weights; FProp then reads them
//
// A ComputePolicy says:
//  - precision: float32 (the model's own weights; a bf16 model stays bf16), or int8: every
//    projection a layer prepared runs Int8Affine (glossa/kernels/int8_gemm.h) on its weight
//    quantized per output channel at load, or bf16: every projection a layer prepared runs on its
//    weight rounded to bf16 at load (half the bytes a decoding step reads), float32 activations
//    and sums (PackedAffineBf16, glossa/kernels/packed_affine.h);
//  - batch_invariant: the projections and the attention core take the batch-invariant kernels
//    (glossa/kernels/batch_invariant.h): a request's bits do not depend on what shares its batch;
//  - fused_decoder_step: incremental decoding runs the fused step (glossa/kernels/decoder_step.h)
//    where it applies, or the layers' unfused composition (its reference).
//
// The prepared weights are keyed by name: a layer's variable's full name ("lm/stack/.../w"),
// with a suffix for a form derived from several variables ("…/atten:qkv", Q, K and V in one
// matrix). Each is kept in the layout Affine reads, [K, N] contiguous (a transposed output
// projection transposed once), with its int8 form under int8 and, for float32 weights under
// float32, packed into the panels of PackedAffine (the plan's fp32 projections read those: always
// when batch-invariant, with the same bits as InvariantAffine; else where they measured faster
// than BLAS for the shape). A prepared weight remembers the
// tensors it was made from; reading it for other values (theta changed, or another theta) is an
// InternalError naming it, never a silent use of stale weights. The plan applies without
// autograd only: training ignores it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace glossa {

struct Int8Weight;  // glossa/kernels/int8_gemm.h

enum class Precision { kFloat32, kInt8, kBf16 };

struct ComputePolicy {
  Precision precision = Precision::kFloat32;
  bool batch_invariant = false;
  bool fused_decoder_step = true;
  // "float32, batch-invariant, fused decoder step": what a run prints in its first lines.
  std::string ToString() const;
};

// "float32", "int8" or "bf16" (the manifest's quantize, --precision); InvalidArgument naming
// `what` else.
Precision ParsePrecision(const std::string& text, const std::string& what);
const char* PrecisionName(Precision p);

// A weight prepared for the policy: w [K, N] as Affine reads it (contiguous), under int8 its
// quantized form, and under bf16 w holds the bf16-rounded values in float32 (what every path
// computes with) beside their panels.
struct PreparedWeight {
  std::string key;
  at::Tensor w;
  std::shared_ptr<const Int8Weight> int8;
  // Under float32 for a float32 weight: w packed into PackPanels' panels
  // (glossa/kernels/packed_affine.h), which PackedAffine reads sequentially.
  at::Tensor panels;
  // Under bf16 for a float32 weight: w rounded to bf16 and packed by PackPanelsBf16, which
  // PackedAffineBf16 reads at any row count (the plan decided: no measurement).
  at::Tensor panels_bf16;
  // What it was made from: each source's data, shape, strides and version at preparation.
  struct Source {
    const void* data = nullptr;
    std::vector<int64_t> sizes, strides;
    uint32_t version = 0;
  };
  std::vector<Source> sources;
};

class ComputePlan {
 public:
  explicit ComputePlan(ComputePolicy policy) : policy_(policy) {}

  const ComputePolicy& policy() const { return policy_; }
  // Whether the attention core and the row kernels run batch-invariant now: the policy says so,
  // autograd is off and GLOSSA_KERNELS is not reference (ATen's kernels are not invariant).
  bool BatchInvariantNow() const;
  // Whether the plan applies now (autograd off).
  static bool AppliesNow();

  // Prepares `w` [K, N] (any strides; float32 or bf16) under `key`, made from `sources` (the
  // variables it reads: w itself, or the ones it fuses). InternalError when `key` is taken.
  void Prepare(const std::string& key, const at::Tensor& w,
               std::initializer_list<at::Tensor> sources);
  // The weight prepared under `key`, checked against `sources` (the tensors theta holds for them
  // now): null when none was prepared under `key`; InternalError naming it when they differ from
  // what it was made from.
  const PreparedWeight* Find(const std::string& key,
                             std::initializer_list<at::Tensor> sources) const;
  // x [M, K] · w (+ b) as the policy says: Int8Affine on the int8 form; PackedAffineBf16 on the
  // bf16 panels (x float32); PackedAffine on the panels when batch-invariant or where
  // PackedKernelsFor measured it faster than BLAS; else Affine on the prepared matrix. x float32 or bf16 (under int8 a bf16 x
  // is widened exactly and the result rounded back unless float_out, as Affine's bf16 does).
  at::Tensor Affine(const PreparedWeight& w, const at::Tensor& x, const at::Tensor& b,
                    bool relu = false, bool float_out = false) const;

  std::vector<std::string> keys() const;
  size_t size() const { return weights_.size(); }

  // What the plan could not do as its policy asks, said once when it is made (the Predictor
  // prints them at load). A note of a `topic` already noted is counted, not repeated: six
  // decoder layers declining the fused step for one reason make one line.
  //   plan.AddNote("fused decoder step: post layer norm", "... layer 'dec/x_layers_0': ...");
  //   plan.notes();  // {"... layer 'dec/x_layers_0': ... (and 5 more)"}
  void AddNote(const std::string& topic, const std::string& note);
  // What only a step meets, which a plan cannot check at load (decoding states of another dtype,
  // say): the first decode that meets a `topic` not noted yet notes it and says it then
  // (LOG(WARNING) "compute: ..."); later ones count it. Thread-safe (decodes run concurrently).
  void NoteAtStep(const std::string& topic, const std::string& note) const;
  // The notes made at load, then the ones steps made.
  std::vector<std::string> notes() const;

 private:
  struct Note {
    std::string topic, text;
    int64_t more = 0;
  };
  // Counts `topic` in `notes` if it is there; false if not.
  static bool Count(std::vector<Note>& notes, const std::string& topic);
  ComputePolicy policy_;
  std::map<std::string, PreparedWeight> weights_;
  mutable std::mutex notes_mu_;
  std::vector<Note> notes_;
  mutable std::vector<Note> step_notes_;
};

}  // namespace glossa
