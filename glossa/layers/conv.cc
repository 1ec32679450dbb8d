#include "glossa/layers/conv.h"

#include <ATen/ATen.h>

#include <limits>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/activations.h"

namespace glossa {
namespace {

std::vector<int64_t> IntList(const Params& p, const char* key, size_t size,
                             const std::string& path) {
  std::vector<int64_t> out;
  for (const auto& v : p.Get(key).AsList()) out.push_back(v.AsInt());
  if (out.size() != size) {
    throw InvalidArgumentError(
        StrCat("layer '", path, "': ", key, " must have ", size, " entries"));
  }
  for (int64_t v : out) {
    if (v <= 0)
      throw InvalidArgumentError(StrCat("layer '", path, "': ", key, " entries must be > 0"));
  }
  return out;
}

bool IsSame(const Params& p, const std::string& path) {
  const std::string& padding = p.GetString("padding");
  if (padding != "SAME" && padding != "VALID") {
    throw InvalidArgumentError(
        StrCat("layer '", path, "': padding must be 'SAME' or 'VALID', got '", padding, "'"));
  }
  return padding == "SAME";
}

// Pads NCHW `x` for TF-SAME windows over H and W with `value`.
at::Tensor PadSame(const at::Tensor& x, const std::vector<int64_t>& window,
                   const std::vector<int64_t>& stride, const std::vector<int64_t>& dilation,
                   double value) {
  auto [ht, hb] = SamePadding(x.size(2), window[0], stride[0], dilation[0]);
  auto [wl, wr] = SamePadding(x.size(3), window[1], stride[1], dilation[1]);
  return at::constant_pad_nd(x, {wl, wr, ht, hb}, value);
}

// Output paddings of a strided window over H: the padding of every stride-th input frame (Lingvo's
// ComputeConvOutputPadding for SAME padding).
at::Tensor StridePaddings(const at::Tensor& paddings, int64_t out_len, int64_t stride) {
  at::Tensor idx =
      at::arange(out_len, at::TensorOptions().dtype(at::kLong).device(paddings.device())) * stride;
  idx = at::clamp_max(idx, paddings.size(1) - 1);
  return paddings.index_select(1, idx);
}

at::Tensor MaskInput(const at::Tensor& nhwc, const at::Tensor& paddings) {
  if (!paddings.defined()) return nhwc;
  return nhwc *
         (1 - paddings.to(nhwc.scalar_type())).view({paddings.size(0), paddings.size(1), 1, 1});
}

}  // namespace

std::pair<int64_t, int64_t> SamePadding(int64_t in, int64_t window, int64_t stride,
                                        int64_t dilation) {
  const int64_t effective = (window - 1) * dilation + 1;
  const int64_t out = (in + stride - 1) / stride;
  const int64_t total = std::max<int64_t>((out - 1) * stride + effective - in, 0);
  return {total / 2, total - total / 2};
}

glossa::Params Conv2DLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<Conv2DLayer>());
  p.Define("filter_shape", ParamValue::List{3, 3, 1, 1},
           "Filter shape [height, width, in_channels, out_channels].");
  p.Define("filter_stride", ParamValue::List{1, 1}, "Stride [height, width].");
  p.Define("dilation_rate", ParamValue::List{1, 1}, "Dilation [height, width].");
  p.Define("padding", "SAME", "'SAME' or 'VALID' (TensorFlow's rules).");
  p.Define("bias", false, "Whether to add a bias.");
  p.Define("activation", "NONE", "Activation applied to the output.");
  return p;
}

Conv2DLayer::Conv2DLayer(const glossa::Params& p) : BaseLayer(p) {
  filter_shape_ = IntList(params(), "filter_shape", 4, path());
  stride_ = IntList(params(), "filter_stride", 2, path());
  dilation_ = IntList(params(), "dilation_rate", 2, path());
  same_ = IsSame(params(), path());
  bias_ = params().GetBool("bias");
  activation_ = params().GetString("activation");
  CheckActivation(params().GetString("activation"), StrCat("layer '", path(), "'"));
  const DType dtype = params().Get("dtype").AsDType();
  CreateVariable(
      "w", WeightParams(filter_shape_, WeightInit::FromParams(params().GetParams("params_init")),
                        dtype));
  if (params().GetBool("bias")) {
    CreateVariable("b", WeightParams({filter_shape_[3]}, WeightInit::Constant(0.0), dtype));
  }
}

std::pair<at::Tensor, at::Tensor> Conv2DLayer::FProp(const NestedMap& theta,
                                                     const at::Tensor& inputs,
                                                     const at::Tensor& paddings) const {
  if (inputs.dim() != 4 || inputs.size(3) != filter_shape_[2]) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': inputs must be [B, H, W, ",
                                      filter_shape_[2], "], got ", inputs.sizes()));
  }
  // Channels-last end to end: the NHWC input viewed as NCHW has ATen's channels-last strides, the
  // HWIO filter is laid out O,H,W,I once per call (an OIHW view with channels-last strides), so
  // the convolution (oneDNN's, forward and backward) reads and writes NHWC memory and the result
  // viewed back as NHWC is contiguous: no layout copies around it.
  at::Tensor x = MaskInput(CastToFPropDtype(inputs), paddings).permute({0, 3, 1, 2});
  std::vector<int64_t> padding = {0, 0};
  if (same_) {
    auto [ht, hb] = SamePadding(x.size(2), filter_shape_[0], stride_[0], dilation_[0]);
    auto [wl, wr] = SamePadding(x.size(3), filter_shape_[1], stride_[1], dilation_[1]);
    if (ht == hb && wl == wr) {
      padding = {ht, wl};  // symmetric: the convolution pads, no padded copy
    } else {
      x = at::constant_pad_nd(x, {wl, wr, ht, hb}, 0.0);
    }
  }
  at::Tensor w = theta.GetTensor("w").permute({3, 0, 1, 2}).contiguous().permute({0, 3, 1, 2});
  at::Tensor b = bias_ ? theta.GetTensor("b") : at::Tensor();
  at::Tensor y = at::conv2d(x, w, b, stride_, padding, dilation_).permute({0, 2, 3, 1});
  y = Activate(activation_, y);
  at::Tensor out_paddings;
  if (paddings.defined()) {
    out_paddings = StridePaddings(paddings, y.size(1), stride_[0]);
    y = MaskInput(y, out_paddings);
  }
  return {y, out_paddings};
}

glossa::Params PoolingLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<PoolingLayer>());
  p.Define("window_shape", ParamValue::List{2, 2}, "Window shape [height, width].");
  p.Define("window_stride", ParamValue::List{2, 2}, "Window stride [height, width].");
  p.Define("pooling_type", "MAX", "'MAX' or 'AVG'.");
  p.Define("padding", "SAME", "'SAME' or 'VALID' (TensorFlow's rules).");
  return p;
}

PoolingLayer::PoolingLayer(const glossa::Params& p) : BaseLayer(p) {
  window_ = IntList(params(), "window_shape", 2, path());
  stride_ = IntList(params(), "window_stride", 2, path());
  same_ = IsSame(params(), path());
  const std::string& type = params().GetString("pooling_type");
  if (type != "MAX" && type != "AVG") {
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': pooling_type must be 'MAX' or 'AVG', got '", type, "'"));
  }
  max_ = type == "MAX";
}

std::pair<at::Tensor, at::Tensor> PoolingLayer::FProp(const NestedMap&, const at::Tensor& inputs,
                                                      const at::Tensor& paddings) const {
  if (inputs.dim() != 4) {
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': inputs must be [B, H, W, C], got ", inputs.sizes()));
  }
  at::Tensor x = CastToFPropDtype(inputs);
  if (paddings.defined() && max_) {
    // Padded frames never win the max.
    at::Tensor mask = (paddings > 0.5).view({paddings.size(0), paddings.size(1), 1, 1});
    x = at::masked_fill(x, mask, -std::numeric_limits<float>::infinity());
  } else {
    x = MaskInput(x, paddings);
  }
  x = x.permute({0, 3, 1, 2});
  const std::vector<int64_t> ones = {1, 1};
  at::Tensor y;
  if (max_) {
    if (same_) x = PadSame(x, window_, stride_, ones, -std::numeric_limits<double>::infinity());
    y = at::max_pool2d(x, window_, stride_);
  } else {
    at::Tensor valid = at::ones_like(x.select(1, 0).unsqueeze(1));
    if (paddings.defined()) {
      valid = valid *
              (1 - paddings.to(x.scalar_type())).view({paddings.size(0), 1, paddings.size(1), 1});
    }
    if (same_) {
      x = PadSame(x, window_, stride_, ones, 0.0);
      valid = PadSame(valid, window_, stride_, ones, 0.0);
    }
    // Average of the real values only: sum of values / count of real positions.
    at::Tensor sums = at::avg_pool2d(x, window_, stride_) * (window_[0] * window_[1]);
    at::Tensor counts = at::avg_pool2d(valid, window_, stride_) * (window_[0] * window_[1]);
    y = sums / at::clamp_min(counts, 1.0);
  }
  y = y.permute({0, 2, 3, 1});
  at::Tensor out_paddings;
  if (paddings.defined()) {
    out_paddings = StridePaddings(paddings, y.size(1), stride_[0]);
    y = MaskInput(at::nan_to_num(y, 0.0, 0.0, 0.0), out_paddings);
  }
  return {y, out_paddings};
}

GLOSSA_REGISTER_CLASS(Conv2DLayer, "glossa.layers.Conv2DLayer");
GLOSSA_REGISTER_CLASS(PoolingLayer, "glossa.layers.PoolingLayer");

// ---- The uniform call (BaseLayer::FPropMap) ----

BaseLayer::FPropMapSignature Conv2DLayer::FPropMapSpec() const {
  return {{"inputs", "paddings"}, 1, {"outputs", "paddings"}, true, "(outputs, paddings)"};
}

NestedMap Conv2DLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  auto [y, p] = FProp(theta, inputs.GetTensor("inputs"), OptionalInput(inputs, "paddings"));
  NestedMap out;
  out.Put("outputs", y);
  out.Put("paddings", p);
  return out;
}

BaseLayer::FPropMapSignature PoolingLayer::FPropMapSpec() const {
  return {{"inputs", "paddings"}, 1, {"outputs", "paddings"}, true, "(outputs, paddings)"};
}

NestedMap PoolingLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  auto [y, p] = FProp(theta, inputs.GetTensor("inputs"), OptionalInput(inputs, "paddings"));
  NestedMap out;
  out.Put("outputs", y);
  out.Put("paddings", p);
  return out;
}

}  // namespace glossa
