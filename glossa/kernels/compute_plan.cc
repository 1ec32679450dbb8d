#include "glossa/kernels/compute_plan.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <glog/logging.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/kernels/batch_invariant.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/gemm.h"
#include "glossa/kernels/int8_gemm.h"
#include "glossa/kernels/packed_affine.h"

namespace glossa {

std::string ComputePolicy::ToString() const {
  // GLOSSA_KERNELS=reference runs ATen's kernels, which are not batch-invariant: said, not hidden.
  const char* invariant = !batch_invariant            ? ""
                          : KernelsForcedToReference() ? ", batch-invariant (off: GLOSSA_KERNELS=reference)"
                                                       : ", batch-invariant";
  return StrCat(PrecisionName(precision), invariant,
                fused_decoder_step ? ", fused decoder step" : ", unfused decoder step");
}

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kInt8: return "int8";
    case Precision::kBf16: return "bf16";
    default: return "float32";
  }
}

Precision ParsePrecision(const std::string& text, const std::string& what) {
  if (text == "float32" || text.empty() || text == "none") return Precision::kFloat32;
  if (text == "int8") return Precision::kInt8;
  if (text == "bf16") return Precision::kBf16;
  throw InvalidArgumentError(StrCat(what, " is '", text, "'; it must be float32, bf16 or int8"));
}

bool ComputePlan::AppliesNow() { return !c10::GradMode::is_enabled(); }

bool ComputePlan::BatchInvariantNow() const {
  return policy_.batch_invariant && AppliesNow() && !KernelsForcedToReference();
}

namespace {

PreparedWeight::Source SourceOf(const at::Tensor& t) {
  PreparedWeight::Source s;
  s.data = t.data_ptr();
  s.sizes = t.sizes().vec();
  s.strides = t.strides().vec();
  s.version = t.is_inference() ? 0 : t._version();
  return s;
}

// Whether `t` is still what `then` recorded: compared in place on every call, nothing allocated.
bool SameSource(const at::Tensor& t, const PreparedWeight::Source& then) {
  return t.data_ptr() == then.data && t.sizes() == at::IntArrayRef(then.sizes) &&
         t.strides() == at::IntArrayRef(then.strides) &&
         (t.is_inference() ? 0 : t._version()) == then.version;
}

}  // namespace

void ComputePlan::Prepare(const std::string& key, const at::Tensor& w,
                          std::initializer_list<at::Tensor> sources) {
  if (weights_.count(key)) {
    throw InternalError(StrCat("compute plan: weight '", key, "' is prepared twice"));
  }
  if (w.dim() != 2 || !w.device().is_cpu() || !w.is_floating_point()) {
    throw InvalidArgumentError(StrCat("compute plan: weight '", key, "' must be a 2-D floating CPU "
                                      "matrix [K, N], got ", w.sizes(), " ", w.scalar_type()));
  }
  PreparedWeight p;
  p.key = key;
  at::NoGradGuard no_grad;
  // Shared with the variable where it is already [K, N] contiguous (Find's check catches a write
  // to it); a transposed or fused form is made here, once.
  p.w = w.detach().contiguous();
  if (policy_.precision == Precision::kInt8) {
    p.int8 = QuantizeInt8(p.w);
  } else if (policy_.precision == Precision::kBf16 && p.w.scalar_type() == at::kFloat) {
    p.panels_bf16 = PackPanelsBf16(p.w);
    // Every path computes with the rounded weight, the reference (Affine) too.
    p.w = p.w.to(at::kBFloat16).to(at::kFloat);
  } else if (p.w.scalar_type() == at::kFloat) {
    p.panels = PackPanels(p.w);
  }
  for (const at::Tensor& s : sources) p.sources.push_back(SourceOf(s));
  weights_.emplace(key, std::move(p));
}

const PreparedWeight* ComputePlan::Find(const std::string& key,
                                        std::initializer_list<at::Tensor> sources) const {
  auto it = weights_.find(key);
  if (it == weights_.end()) return nullptr;
  const PreparedWeight& p = it->second;
  bool same = sources.size() == p.sources.size();
  size_t i = 0;
  for (const at::Tensor& s : sources) {
    if (!same) break;
    same = SameSource(s, p.sources[i++]);
  }
  if (!same) {
    throw InternalError(StrCat("compute plan: weight '", key, "' was prepared from other values "
                               "than theta holds now (the weights changed, or FProp ran on "
                               "another theta, after the plan was made): make the plan again"));
  }
  return &p;
}

at::Tensor ComputePlan::Affine(const PreparedWeight& w, const at::Tensor& x, const at::Tensor& b,
                               bool relu, bool float_out) const {
  if (x.dim() != 2 || x.size(1) != w.w.size(0)) {
    throw InvalidArgumentError(StrCat("compute plan: weight '", w.key, "' is ", w.w.sizes(),
                                      "; inputs must be [M, ", w.w.size(0), "], got ", x.sizes()));
  }
  const bool float_or_bf16 = x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16;
  if (w.int8 != nullptr && float_or_bf16 && x.device().is_cpu()) {
    const at::Tensor bias = b.defined() && b.numel() > 0 ? Widen(b) : at::Tensor();
    at::Tensor y = Int8Affine(Widen(x), *w.int8, bias, relu);
    return float_out || x.scalar_type() == at::kFloat ? y : Narrow(y, x.scalar_type());
  }
  if (x.scalar_type() == at::kFloat && w.w.scalar_type() == at::kFloat && x.device().is_cpu() &&
      (!b.defined() || b.scalar_type() == at::kFloat)) {
    const int64_t n = w.w.size(1);
    const at::Tensor bias = b.defined() && b.numel() > 0 ? b : at::Tensor();
    if (w.panels_bf16.defined() && !KernelsForcedToReference()) {
      return PackedAffineBf16(x, w.panels_bf16, n, bias, relu);
    }
    if (w.panels.defined() &&
        (BatchInvariantNow() || PackedKernelsFor(x.size(0), x.size(1), n))) {
      return PackedAffine(x, w.panels, n, bias, relu);
    }
    if (BatchInvariantNow()) return InvariantAffine(x, w.w, bias, relu);
    if (w.panels.defined() && x.size(0) > 0 && HasSgemm()) {
      // The panels measured slower than BLAS here: so would the row kernel on the same weight.
      at::Tensor y = bias.defined() ? at::addmm(bias, x, w.w) : at::mm(x, w.w);
      return relu ? y.relu_() : y;
    }
  }
  return glossa::Affine(x, w.w, b, relu, float_out);
}

bool ComputePlan::Count(std::vector<Note>& notes, const std::string& topic) {
  for (Note& n : notes) {
    if (n.topic == topic) {
      ++n.more;
      return true;
    }
  }
  return false;
}

void ComputePlan::AddNote(const std::string& topic, const std::string& note) {
  std::lock_guard<std::mutex> lock(notes_mu_);
  if (!Count(notes_, topic)) notes_.push_back({topic, note, 0});
}

void ComputePlan::NoteAtStep(const std::string& topic, const std::string& note) const {
  {
    std::lock_guard<std::mutex> lock(notes_mu_);
    // A reason the plan already gave at load is not said again.
    for (const Note& n : notes_) {
      if (n.topic == topic) return;
    }
    if (Count(step_notes_, topic)) return;
    step_notes_.push_back({topic, note, 0});
  }
  LOG(WARNING) << "compute: " << note;
}

std::vector<std::string> ComputePlan::notes() const {
  std::lock_guard<std::mutex> lock(notes_mu_);
  std::vector<std::string> out;
  for (const std::vector<Note>* list :
       std::initializer_list<const std::vector<Note>*>{&notes_, &step_notes_}) {
    for (const Note& n : *list) {
      out.push_back(n.more == 0 ? n.text : StrCat(n.text, " (and ", n.more, " more)"));
    }
  }
  return out;
}

std::vector<std::string> ComputePlan::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : weights_) out.push_back(k);
  return out;
}

}  // namespace glossa
