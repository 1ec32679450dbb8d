// image.fmnist.*: image classifiers on Fashion-MNIST (Zalando's 28x28 gray clothing images, 10
// classes), read from Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist, installed
// by scripts/setup.sh; $GLOSSA_FASHION_MNIST_DIR overrides). Splits: Train is the first 55,000
// training images, Dev the last 5,000 (never trained on), Test the 10,000 t10k images.
//
//   image.fmnist.LeNet5       Lingvo's params/mnist.py LeNet5: conv 5x5x20, pool 2, conv 5x5x50,
//                             pool 2, fc 300, dropout 0.2; ~3 epochs.
//   image.fmnist.ResNetSmall  a 6-block ResNet (16-32-64 channels), random crops.
//   image.fmnist.LogReg       logistic regression on the pixels: the baseline.
#include <cstdlib>
#include <string>

#include "glossa/base/strings.h"
#include "glossa/input/image_input.h"
#include "glossa/layers/softmax.h"
#include "glossa/model/model_registry.h"
#include "glossa/tasks/image/image.h"
#include "glossa/optim/optimizer.h"
#include "glossa/optim/schedule.h"

namespace glossa {
namespace {

std::string FashionMnistDir() {
  const char* env = std::getenv("GLOSSA_FASHION_MNIST_DIR");
  return env != nullptr && *env ? env : "/usr/share/datasets/fashion-mnist";
}

constexpr int64_t kTrainExamples = 55000;

class FashionMnistBase : public ModelParamsBase {
 protected:
  virtual int64_t BatchSize() const { return 128; }
  virtual int64_t CropPadding() const { return 0; }

  Params Input(const std::string& file, int64_t first, int64_t count, bool train) const {
    Params p = IdxImageInput::Params();
    p.Set("name", "input");
    p.Set("images_file", StrCat(FashionMnistDir(), "/", file, "-images-idx3-ubyte.gz"));
    p.Set("labels_file", StrCat(FashionMnistDir(), "/", file, "-labels-idx1-ubyte.gz"));
    p.Set("first_example", first).Set("num_examples", count);
    p.Set("batch_size", train ? BatchSize() : 500);
    if (train) {
      p.Set("random_crop_padding", CropPadding());
    } else {
      p.Set("repeat_count", 1).Set("shuffle", false);
    }
    return p;
  }

  Params Classifier(const Params& extract, int64_t max_steps, double lr) const {
    Params p = ClassifierTask::Params();
    p.Set("name", "classifier");
    p.Set("extract", extract);
    p.Set("class_names", ParamValue::List{"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                          "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"});
    Params& tp = p.GetParams("train");
    tp.Set("max_steps", max_steps).Set("steps_per_loop", 100).Set("summary_interval_steps", 100);
    tp.Set("save_interval_seconds", 60).Set("save_max_to_keep", 3);
    Params& lp = tp.GetParams("learner");
    lp.Set("learning_rate", lr);
    lp.Set("lr_schedule", LinearRampupCosineSchedule::Params()
                              .Set("warmup_steps", 100)
                              .Set("total_steps", max_steps)
                              .Set("final_value", 0.05));
    lp.Set("optimizer", Adam::Params());
    p.GetParams("eval").Set("samples_per_summary", 0);
    return p;
  }

 public:
  std::map<std::string, std::function<Params()>> Datasets() const override {
    return {{"Train", [this] { return Input("train", 0, kTrainExamples, true); }},
            {"Dev", [this] { return Input("train", kTrainExamples, 60000 - kTrainExamples, false); }},
            {"Test", [this] { return Input("t10k", 0, 10000, false); }}};
  }
};

class LeNet5 : public FashionMnistBase {
 public:
  Params Task() const override {
    Params e = ConvStack::Params();
    e.Set("filter_shapes", ParamValue::List{ParamValue::List{5, 5, 1, 20}, ParamValue::List{5, 5, 20, 50}});
    e.Set("window_shapes", ParamValue::List{ParamValue::List{2, 2}, ParamValue::List{2, 2}});
    e.Set("dropout_prob", 0.2).Set("fc_dim", 300);
    return Classifier(e, 1300, 2e-3);
  }
};
GLOSSA_REGISTER_MODEL(LeNet5, "image.fmnist.LeNet5");

class ResNetSmall : public FashionMnistBase {
 protected:
  int64_t CropPadding() const override { return 2; }

 public:
  Params Task() const override {
    Params e = ResNet::Params();
    e.Set("stem_channels", 16).Set("stage_channels", ParamValue::List{16, 32, 64});
    e.Set("blocks_per_stage", 2);
    return Classifier(e, 1300, 2e-3);
  }
};
GLOSSA_REGISTER_MODEL(ResNetSmall, "image.fmnist.ResNetSmall");

class LogReg : public FashionMnistBase {
 public:
  Params Task() const override {
    Params e = ConvStack::Params();
    e.Set("fc_dim", 0);
    return Classifier(e, 1300, 5e-3);
  }
};
GLOSSA_REGISTER_MODEL(LogReg, "image.fmnist.LogReg");

}  // namespace
}  // namespace glossa
