#include "glossa/input/image_input.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/io/idx.h"

namespace glossa {
namespace {

uint64_t Mix(uint64_t a, uint64_t b) {  // splitmix64 of a combined with b
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

glossa::Params IdxImageInput::Params() {
  glossa::Params p = BaseInputGenerator::Params();
  p.Set("cls", ClsOf<IdxImageInput>());
  p.Set("batch_size", 256);
  p.Define("images_file", "", "IDX file of images [N, H, W] or [N, H, W, C] (may be gzipped).");
  p.Define("labels_file", "", "IDX file of labels [N] (may be gzipped).");
  p.Define("first_example", 0, "The split: examples [first_example, first_example + num_examples).");
  p.Define("num_examples", -1, "Examples in the split; -1: to the end of the files.");
  p.Define("repeat_count", -1, "Epochs to read; -1 repeats forever.");
  p.Define("shuffle", true, "Shuffle the examples every epoch.");
  p.Define("shuffle_seed", 301, "Seed of the shuffles and the augmentations.");
  p.Define("random_crop_padding", 0,
           "Pad every side with this many zero pixels and crop a random window of the original "
           "size (0: no cropping).");
  p.Define("random_flip_left_right", false, "Flip each image horizontally with probability 0.5.");
  p.Define("normalization", "per_image",
           "'per_image' (Lingvo's per_image_standardization), 'dataset' ((x/255 - mean) / "
           "stddev) or 'none' (x/255).");
  p.Define("mean", 0.0, "Mean for normalization 'dataset'.");
  p.Define("stddev", 1.0, "Standard deviation for normalization 'dataset'.");
  p.Define("drop_remainder", false, "Drop the last partial batch of a finite run.");
  return p;
}

IdxImageInput::IdxImageInput(const glossa::Params& p) : BaseInputGenerator(p) {
  const std::string& images_file = p.GetString("images_file");
  const std::string& labels_file = p.GetString("labels_file");
  if (images_file.empty() || labels_file.empty()) {
    throw InvalidArgumentError(StrCat("input '", path(), "': images_file and labels_file must be set"));
  }
  IdxArray images = ReadIdx(images_file);
  IdxArray labels = ReadIdx(labels_file);
  if (images.data.dim() == 3) images.data = images.data.unsqueeze(-1);
  if (images.data.dim() != 4) {
    throw InvalidArgumentError(StrCat(images_file, ": images must be [N, H, W] or [N, H, W, C], got ",
                                      images.data.sizes()));
  }
  if (labels.data.dim() != 1 || labels.data.size(0) != images.data.size(0)) {
    throw InvalidArgumentError(StrCat(labels_file, ": labels must be [N] with N = ",
                                      images.data.size(0), " (the images), got ",
                                      labels.data.sizes()));
  }
  const int64_t n = images.data.size(0);
  const int64_t first = p.GetInt("first_example");
  int64_t count = p.GetInt("num_examples");
  if (count < 0) count = n - first;
  if (first < 0 || count <= 0 || first + count > n) {
    throw InvalidArgumentError(StrCat("input '", path(), "': examples [", first, ", ", first + count,
                                      ") are not inside the ", n, " examples of ", images_file));
  }
  images_ = images.data.narrow(0, first, count).contiguous();
  labels_ = labels.data.narrow(0, first, count).to(at::kLong).contiguous();
  batch_size_ = p.GetInt("batch_size");
  repeat_count_ = p.GetInt("repeat_count");
  shuffle_ = p.GetBool("shuffle");
  shuffle_seed_ = p.GetInt("shuffle_seed");
  crop_padding_ = p.GetInt("random_crop_padding");
  flip_ = p.GetBool("random_flip_left_right");
  normalization_ = p.GetString("normalization");
  mean_ = p.GetFloat("mean");
  stddev_ = p.GetFloat("stddev");
  drop_remainder_ = p.GetBool("drop_remainder");
  replicas_ = p.GetInt("num_input_replicas");
  replica_id_ = p.GetInt("input_replica_id");
  if (batch_size_ <= 0) throw InvalidArgumentError(StrCat("input '", path(), "': batch_size must be > 0"));
  if (repeat_count_ == 0 || repeat_count_ < -1) {
    throw InvalidArgumentError(StrCat("input '", path(), "': repeat_count must be -1 or > 0"));
  }
  if (crop_padding_ < 0) {
    throw InvalidArgumentError(StrCat("input '", path(), "': random_crop_padding must be >= 0"));
  }
  if (normalization_ != "per_image" && normalization_ != "dataset" && normalization_ != "none") {
    throw InvalidArgumentError(StrCat("input '", path(), "': normalization must be 'per_image', "
                                      "'dataset' or 'none', not '", normalization_, "'"));
  }
  if (normalization_ == "dataset" && !(stddev_ > 0)) {
    throw InvalidArgumentError(StrCat("input '", path(), "': stddev must be > 0"));
  }
  if (replicas_ < 1 || replica_id_ < 0 || replica_id_ >= replicas_) {
    throw InvalidArgumentError(StrCat("input '", path(), "': input_replica_id ", replica_id_,
                                      " must be in [0, num_input_replicas = ", replicas_, ")"));
  }
  StartEpoch();
}

std::vector<int64_t> IdxImageInput::data_shape() const {
  return {images_.size(1), images_.size(2), images_.size(3)};
}

void IdxImageInput::StartEpoch() {
  const int64_t n = images_.size(0);
  std::vector<int64_t> all(n);
  for (int64_t i = 0; i < n; ++i) all[i] = i;
  if (shuffle_) {
    std::mt19937_64 rng(Mix(static_cast<uint64_t>(shuffle_seed_), static_cast<uint64_t>(epoch_)));
    for (int64_t i = n - 1; i > 0; --i) {
      std::uniform_int_distribution<int64_t> pick(0, i);
      std::swap(all[i], all[pick(rng)]);
    }
  }
  order_.clear();
  for (int64_t i = replica_id_; i < n; i += replicas_) order_.push_back(all[i]);
  cursor_ = 0;
}

at::Tensor IdxImageInput::Normalize(const at::Tensor& images, const std::string& normalization,
                                    double mean, double stddev) {
  at::Tensor x = images.to(at::kFloat);
  if (normalization == "per_image") {
    const int64_t b = x.size(0);
    at::Tensor flat = x.reshape({b, -1});
    const double n = static_cast<double>(flat.size(1));
    at::Tensor m = flat.mean(1, /*keepdim=*/true);
    at::Tensor sd = (flat - m).square().mean(1, true).sqrt();
    at::Tensor adjusted = at::clamp_min(sd, 1.0 / std::sqrt(n));
    return ((flat - m) / adjusted).reshape(x.sizes());
  }
  if (normalization == "dataset") return (x / 255.0 - mean) / stddev;
  return x / 255.0;
}

at::Tensor IdxImageInput::Augment(const at::Tensor& image, int64_t example, int64_t epoch) const {
  if (crop_padding_ == 0 && !flip_) return image;
  std::mt19937_64 rng(Mix(Mix(static_cast<uint64_t>(shuffle_seed_), static_cast<uint64_t>(epoch)),
                          static_cast<uint64_t>(example)));
  at::Tensor x = image;  // [H, W, C]
  if (crop_padding_ > 0) {
    const int64_t h = x.size(0), w = x.size(1), pad = crop_padding_;
    at::Tensor padded = at::zeros({h + 2 * pad, w + 2 * pad, x.size(2)}, x.options());
    padded.narrow(0, pad, h).narrow(1, pad, w).copy_(x);
    std::uniform_int_distribution<int64_t> off(0, 2 * pad);
    const int64_t dy = off(rng), dx = off(rng);
    x = padded.narrow(0, dy, h).narrow(1, dx, w);
  }
  if (flip_ && std::uniform_int_distribution<int>(0, 1)(rng) == 1) x = x.flip({1});
  return x;
}

NestedMap IdxImageInput::GetPreprocessedInputBatch() {
  std::vector<int64_t> ids, epochs;
  while (static_cast<int64_t>(ids.size()) < batch_size_) {
    if (cursor_ >= static_cast<int64_t>(order_.size())) {
      if (!ids.empty() && repeat_count_ > 0) {
        if (!drop_remainder_) break;  // the epoch's last, partial batch
        ids.clear();
        epochs.clear();
      }
      if (repeat_count_ > 0 && epoch_ + 1 >= repeat_count_) {
        throw OutOfRangeError(StrCat("input '", path(), "': end of data after ", repeat_count_,
                                     " epoch(s)"));
      }
      ++epoch_;
      StartEpoch();
      continue;
    }
    // Repeating runs fill every batch, across the epoch boundary.
    ids.push_back(order_[cursor_++]);
    epochs.push_back(epoch_);
  }
  std::vector<at::Tensor> imgs;
  imgs.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) imgs.push_back(Augment(images_[ids[i]], ids[i], epochs[i]));
  NestedMap batch;
  batch.Set("data", Normalize(at::stack(imgs), normalization_, mean_, stddev_));
  batch.Set("label", labels_.index_select(0, at::tensor(ids, at::kLong)));
  batch.Set("weight", at::ones({static_cast<int64_t>(ids.size())}, at::kFloat));
  return batch;
}

void IdxImageInput::Reset() {
  epoch_ = 0;
  StartEpoch();
}

GLOSSA_REGISTER_CLASS(IdxImageInput, "glossa.input.IdxImageInput");

}  // namespace glossa
