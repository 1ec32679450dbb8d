// A user's own C++ layer, in a library of its own, with no Python binding code: Python loads it
// (glossa.load_library) and calls it through the uniform call, FPropMap (test_layers.py).
#include <ATen/ATen.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/layers/base_layer.h"

namespace user {

using glossa::NestedMap;

// y = x · scale + shift (per feature), and the mean of y over the last dimension.
class ScaleShiftLayer : public glossa::BaseLayer {
 public:
  static glossa::Params Params() {
    glossa::Params p = BaseLayer::Params();
    p.Set("cls", glossa::ClsOf<ScaleShiftLayer>());
    p.Define("dim", 0, "Features.");
    return p;
  }
  explicit ScaleShiftLayer(const glossa::Params& p) : BaseLayer(p) {
    dim_ = params().GetInt("dim");
    if (dim_ <= 0) throw glossa::InvalidArgumentError("ScaleShiftLayer: dim must be > 0");
    CreateVariable("scale", glossa::WeightParams({dim_}, glossa::WeightInit::Constant(2.0),
                                                 glossa::DType::kFloat32));
    CreateVariable("shift", glossa::WeightParams({dim_}, glossa::WeightInit::Constant(0.5),
                                                 glossa::DType::kFloat32));
  }
  FPropMapSignature FPropMapSpec() const override {
    return {{"inputs", "mask"}, 1, {"outputs", "mean"}, true, "(outputs, mean)"};
  }
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override {
    at::Tensor y = inputs.GetTensor("inputs") * theta.GetTensor("scale") + theta.GetTensor("shift");
    const at::Tensor mask = glossa::OptionalInput(inputs, "mask");
    if (mask.defined()) y = y * mask;
    NestedMap out;
    out.Put("outputs", y);
    out.Put("mean", y.mean(-1));
    return out;
  }

 private:
  int64_t dim_ = 0;
};

GLOSSA_REGISTER_CLASS(ScaleShiftLayer, "user.ScaleShiftLayer");

}  // namespace user
