// Image classification (Lingvo's tasks/image): feature extractors over NHWC images and the
// classifier task.
//
//   ConvStack   Lingvo's ModelV1 body: conv (+ batch norm) + ReLU + max pooling per stage,
//               dropout, then an FC layer with ReLU (LeNet-5: conv 5x5x20, pool 2, conv 5x5x50,
//               pool 2, fc 300). No stages and fc_dim 0: the flattened pixels (logistic
//               regression under the softmax).
//   ResNet      a small residual network (He et al. 2016, v1 blocks): a 3x3 stem, stages of basic
//               blocks (conv-BN-ReLU-conv-BN plus the shortcut, 1x1 conv when the shape changes),
//               global average pooling.
//   ClassifierTask  extract (either) -> softmax over num_classes; metrics loss, log_pplx,
//               accuracy (top-1), acc5 (top-5), error; the `classify` inference subgraph.
//
// Both extractors map images [B, H, W, C] (the input's data, normalised) to features [B, D] and
// report D from the input shape they are given (`input_shape`, [H, W, C]).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "glossa/model/base_task.h"

namespace glossa {

class Conv2DLayer;
class PoolingLayer;
class BatchNormLayer;
class DropoutLayer;
class ProjectionLayer;
class SimpleFullSoftmax;

// What the classifier needs from its feature extractor.
class ImageFeatureExtractor {
 public:
  virtual ~ImageFeatureExtractor() = default;
  virtual at::Tensor FPropImages(const NestedMap& theta, const at::Tensor& images) const = 0;
  virtual int64_t output_dim() const = 0;
};

class ConvStack : public BaseLayer, public ImageFeatureExtractor {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, images) -> Tensor [B, D].
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + input_shape [H, W, C], filter_shapes ([[h, w, in, out], ...]), window_shapes ([[h, w], ...],
  // one per filter), batch_norm, dropout_prob, fc_dim (0: no FC layer).
  static glossa::Params Params();
  explicit ConvStack(const glossa::Params& p);
  at::Tensor FPropImages(const NestedMap& theta, const at::Tensor& images) const override;
  int64_t output_dim() const override { return output_dim_; }

 private:
  std::vector<Child<Conv2DLayer>> conv_;
  std::vector<Child<BatchNormLayer>> bn_;
  std::vector<Child<PoolingLayer>> pool_;
  Child<DropoutLayer> dropout_;
  Child<ProjectionLayer> fc_;
  int64_t output_dim_ = 0;
};

class ResNet : public BaseLayer, public ImageFeatureExtractor {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, images) -> Tensor [B, D].
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + input_shape [H, W, C], stem_channels, stage_channels ([c1, c2, ...]), blocks_per_stage,
  // first_stride (stride of the first stage; the others halve the size).
  static glossa::Params Params();
  explicit ResNet(const glossa::Params& p);
  at::Tensor FPropImages(const NestedMap& theta, const at::Tensor& images) const override;
  int64_t output_dim() const override { return output_dim_; }

 private:
  struct Block {
    Child<Conv2DLayer> conv1, conv2, shortcut;
    Child<BatchNormLayer> bn1, bn2, shortcut_bn;
  };
  Child<Conv2DLayer> stem_;
  Child<BatchNormLayer> stem_bn_;
  std::vector<Block> blocks_;
  int64_t output_dim_ = 0;
};

class ClassifierTask : public BaseTask {
 public:
  // + extract (ConvStack or ResNet Params; input_shape is filled from data_shape), data_shape
  // [H, W, C], softmax (SimpleFullSoftmax; input_dim filled from the extractor; label_smoothing),
  // class_names (optional, one per class), classify_top_k (5), normalization, mean, stddev (how
  // `classify` normalises raw pixels: the input's settings).
  static glossa::Params Params();
  explicit ClassifierTask(const glossa::Params& p);

  // Logits [B, num_classes] of normalised images [B, H, W, C].
  at::Tensor Logits(const NestedMap& theta, const at::Tensor& images) const;
  NestedMap ComputePredictions(const NestedMap& theta, const NestedMap& batch) const override;
  LossOutput ComputeLoss(const NestedMap& theta, const NestedMap& predictions,
                         const NestedMap& batch) const override;
  std::map<std::string, bool> TrackedMetrics() const override {
    return {{"accuracy", false}, {"log_pplx", true}};
  }

  // Decoding: every example's top classes; the decoder metrics are dataset accuracy and acc5.
  NestedMap Decode(const NestedMap& batch) override;
  std::map<std::string, double> CreateDecoderMetrics() const override;
  std::vector<std::string> PostProcessDecodeOut(const NestedMap& decode_out,
                                                std::map<std::string, double>& metrics) override;
  void DecodeFinalize(std::map<std::string, double>& metrics) override;

  // `classify`: images (float32 [B, H, W, C] raw pixel values 0..255) or encoded (IDX, binary or
  // ASCII PGM, or PNG bytes, or their base64) -> top-k classes, probabilities and names.
  std::map<std::string, InferenceSubgraphSpec> Inference() const override;
  InferenceMap RunInference(const NestedMap& theta, const std::string& subgraph,
                            const InferenceMap& feeds,
                            const BaseTokenizer* tokenizer) const override;

  int64_t num_classes() const { return num_classes_; }
  std::string ClassName(int64_t c) const;

 private:
  const BaseLayer* extract_layer_ = nullptr;
  const ImageFeatureExtractor* extract_ = nullptr;
  Child<SimpleFullSoftmax> softmax_;
  std::vector<int64_t> data_shape_;
  std::vector<std::string> class_names_;
  int64_t num_classes_, top_k_;
  std::string normalization_;
  double mean_, stddev_;
};

// Images [N, H, W, C] uint8 from encoded bytes: IDX ([N, H, W] or [N, H, W, C], or one [H, W]),
// PGM (P5 binary or P2 ASCII, maxval up to 65535 scaled to 255), PNG (any colour type, converted to
// gray or kept RGB as `channels` says). InvalidArgument naming `what` for anything else.
at::Tensor DecodeImages(const std::string& bytes, int64_t channels, const std::string& what);

}  // namespace glossa
