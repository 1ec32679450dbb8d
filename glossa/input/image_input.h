// Image classification input (Lingvo's tasks/image input generators): IDX image and label files
// (the MNIST format, e.g. Debian's dataset-fashion-mnist), a contiguous range of examples as the
// split, epochs, per-epoch shuffling, Lingvo's augmentations and normalisation.
//
//   auto p = IdxImageInput::Params();
//   p.Set("images_file", "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
//    .Set("labels_file", "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz")
//    .Set("num_examples", 55000).Set("batch_size", 128).Set("random_crop_padding", 2);
//   NestedMap batch = InstantiateLayer<BaseInputGenerator>(p)->GetPreprocessedInputBatch();
//   // batch.data [128, 28, 28, 1] float32, batch.label [128] int64, batch.weight [128] float32
//
// Deterministic given shuffle_seed: epoch e's order is a permutation drawn from (seed, e), and an
// example's crop offsets and flip from (seed, e, its index). Data-parallel replicas take every
// num_input_replicas-th example of each epoch's order. A finite run (repeat_count > 0) ends with
// OutOfRange after its last, possibly partial, batch.
#pragma once

#include <cstdint>
#include <vector>

#include "glossa/input/input_generator.h"

namespace glossa {

class IdxImageInput : public BaseInputGenerator {
 public:
  // + images_file, labels_file, first_example, num_examples, repeat_count, shuffle, shuffle_seed,
  // random_crop_padding, random_flip_left_right, normalization, mean, stddev, drop_remainder.
  static glossa::Params Params();
  explicit IdxImageInput(const glossa::Params& p);

  NestedMap GetPreprocessedInputBatch() override;
  void Reset() override;

  // [height, width, channels] of one image.
  std::vector<int64_t> data_shape() const;
  int64_t num_examples() const { return images_.size(0); }
  // uint8 (or any) images [N, H, W, C] -> float32, as `normalization` says: 'per_image' (Lingvo's
  // tf.image.per_image_standardization: (x - mean) / max(stddev, 1/sqrt(H*W*C)) per image),
  // 'dataset' ((x/255 - mean) / stddev), 'none' (x/255).
  static at::Tensor Normalize(const at::Tensor& images, const std::string& normalization,
                              double mean, double stddev);

 private:
  void StartEpoch();
  at::Tensor Augment(const at::Tensor& image, int64_t example, int64_t epoch) const;

  at::Tensor images_;  // [N, H, W, C] uint8
  at::Tensor labels_;  // [N] int64
  int64_t batch_size_, repeat_count_, shuffle_seed_, crop_padding_, replicas_, replica_id_;
  bool shuffle_, flip_, drop_remainder_;
  std::string normalization_;
  double mean_, stddev_;
  int64_t epoch_ = 0;
  int64_t cursor_ = 0;         // into order_
  std::vector<int64_t> order_;  // this replica's examples in this epoch
};

}  // namespace glossa
