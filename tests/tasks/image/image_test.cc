// Image classification: the IDX reader, the image input generator, the ConvStack / ResNet
// extractors (finite differences in float64), the classifier's metrics, the `classify` subgraph on
// IDX, PGM, PNG and base64 bytes, and a few LeNet-5 training steps on Fashion-MNIST when Debian's
// dataset-fashion-mnist is installed.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <png.h>
#include <torch/csrc/autograd/autograd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "glossa/base/base64.h"
#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/core/step_seed.h"
#include "glossa/input/image_input.h"
#include "glossa/io/idx.h"
#include "glossa/model/model_registry.h"
#include "glossa/tasks/image/image.h"
#include "glossa/optim/learner.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

std::string IdxBytes(int type, const std::vector<uint32_t>& dims, const std::string& body) {
  std::string b = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<char>((d >> s) & 0xFF));
  }
  return b + body;
}

std::string Gzip(const std::string& data) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, data.size()) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string TempDir() {
  static int n = 0;
  const std::string dir = StrCat(::glossa::testing::TestRoot().string(), "/image_", n++);
  std::filesystem::create_directories(dir);
  return dir;
}

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(IdxTest, ReadsEveryTypeBigEndianAndGzipped) {
  // int32 [2, 2]: 1, -2, 65536, 7.
  std::string body;
  for (int32_t v : {1, -2, 65536, 7}) {
    const uint32_t u = static_cast<uint32_t>(v);
    for (int s = 24; s >= 0; s -= 8) body.push_back(static_cast<char>((u >> s) & 0xFF));
  }
  for (const std::string& bytes : {IdxBytes(0x0C, {2, 2}, body), Gzip(IdxBytes(0x0C, {2, 2}, body))}) {
    const IdxArray a = ParseIdx(bytes, "x.idx");
    ASSERT_EQ(a.data.scalar_type(), at::kInt);
    EXPECT_TRUE(at::equal(a.data, at::tensor({1, -2, 65536, 7}, at::kInt).reshape({2, 2})));
  }
  const IdxArray f = ParseIdx(IdxBytes(0x0D, {1}, std::string("\x3f\xc0\x00\x00", 4)), "f.idx");
  EXPECT_EQ(f.data.item<float>(), 1.5f);
  const IdxArray u = ParseIdx(IdxBytes(0x08, {3}, "\x01\x02\xff"), "u.idx");
  EXPECT_TRUE(at::equal(u.data, at::tensor({1, 2, 255}, at::kByte)));
}

TEST(IdxTest, MalformedFilesAreDataLossNamingTheOffset) {
  EXPECT_ERROR_CONTAINS(ParseIdx(std::string("\x00\x00", 2), "a"), DataLossError, "a: truncated IDX header (2 bytes, need 4)");
  EXPECT_ERROR_CONTAINS(ParseIdx(std::string("\x01\x00\x08\x01", 4), "b"), DataLossError, "b: not an IDX file (byte 0");
  EXPECT_ERROR_CONTAINS(ParseIdx(IdxBytes(0x07, {1}, "x"), "c"), DataLossError, "c: byte 2: unknown IDX type code 0x07");
  EXPECT_ERROR_CONTAINS(ParseIdx(IdxBytes(0x08, {2, 3}, "abcde"), "d"), DataLossError, "d: truncated IDX data: dims 2x3 need 18 bytes, the file ends at byte 17");
  EXPECT_ERROR_CONTAINS(ParseIdx(IdxBytes(0x08, {2}, "abc"), "e"), DataLossError, "e: 1 unexpected bytes after the IDX data at byte 10");
  std::string gz = Gzip(IdxBytes(0x08, {100}, std::string(100, 'x')));
  EXPECT_ERROR_CONTAINS(ParseIdx(gz.substr(0, gz.size() / 2), "f.gz"), DataLossError, "f.gz: truncated gzip data");
  gz[12] ^= 0x55;
  EXPECT_THROW(ParseIdx(gz, "g.gz"), DataLossError);
  EXPECT_ERROR_CONTAINS(ReadIdx("/nonexistent/x.idx"), NotFoundError, "/nonexistent/x.idx");
}

// N images of 4x4 where image i has every pixel = i, labels i % 3.
struct TinySet {
  std::string images, labels;
};
TinySet MakeTinySet(int n) {
  const std::string dir = TempDir();
  std::string pix, lab;
  for (int i = 0; i < n; ++i) {
    pix += std::string(16, static_cast<char>(i));
    lab.push_back(static_cast<char>(i % 3));
  }
  TinySet s{dir + "/images.idx.gz", dir + "/labels.idx"};
  Write(s.images, Gzip(IdxBytes(0x08, {static_cast<uint32_t>(n), 4, 4}, pix)));
  Write(s.labels, IdxBytes(0x08, {static_cast<uint32_t>(n)}, lab));
  return s;
}

Params TinyInput(const TinySet& s) {
  Params p = IdxImageInput::Params();
  p.Set("images_file", s.images).Set("labels_file", s.labels).Set("batch_size", 4);
  p.Set("normalization", "none");
  return p;
}

std::vector<int64_t> Ids(const NestedMap& batch) {  // image i has pixels i/255
  const at::Tensor d = (batch.GetTensor("data").select(1, 0).select(1, 0).select(1, 0) * 255).round();
  std::vector<int64_t> out;
  for (int64_t i = 0; i < d.size(0); ++i) out.push_back(d[i].item<int64_t>());
  return out;
}

TEST(IdxImageInputTest, EpochsShuffleSplitsAndReplicas) {
  const TinySet s = MakeTinySet(10);
  // A finite, unshuffled split [2, 9): batches of 4 then a partial one, then the end.
  Params p = TinyInput(s);
  p.Set("first_example", 2).Set("num_examples", 7).Set("repeat_count", 1).Set("shuffle", false);
  auto in = p.Instantiate<IdxImageInput>();
  NestedMap b = in->GetPreprocessedInputBatch();
  EXPECT_EQ(b.GetTensor("data").sizes(), (std::vector<int64_t>{4, 4, 4, 1}));
  EXPECT_EQ(Ids(b), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_TRUE(at::equal(b.GetTensor("label"), at::tensor({2, 0, 1, 2}, at::kLong)));
  EXPECT_EQ(Ids(in->GetPreprocessedInputBatch()), (std::vector<int64_t>{6, 7, 8}));
  EXPECT_THROW(in->GetPreprocessedInputBatch(), OutOfRangeError);
  in->Reset();
  EXPECT_EQ(Ids(in->GetPreprocessedInputBatch()), (std::vector<int64_t>{2, 3, 4, 5}));
  // Repeating and shuffled: every epoch is a permutation, batches stay full across epochs, and
  // the same seed gives the same stream.
  Params r = TinyInput(s);
  auto a = r.Instantiate<IdxImageInput>(), a2 = r.Instantiate<IdxImageInput>();
  std::vector<int64_t> stream;
  for (int i = 0; i < 5; ++i) {
    const auto ids = Ids(a->GetPreprocessedInputBatch());
    EXPECT_EQ(ids.size(), 4u);
    EXPECT_EQ(Ids(a2->GetPreprocessedInputBatch()), ids);
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  for (int e = 0; e < 2; ++e) {
    std::set<int64_t> epoch(stream.begin() + 10 * e, stream.begin() + 10 * (e + 1));
    EXPECT_EQ(epoch.size(), 10u) << "epoch " << e;
  }
  EXPECT_NE(std::vector<int64_t>(stream.begin(), stream.begin() + 10),
            std::vector<int64_t>(stream.begin() + 10, stream.end())) << "epochs reshuffle";
  // Two replicas read disjoint halves of each epoch.
  std::set<int64_t> seen;
  for (int rep = 0; rep < 2; ++rep) {
    Params q = TinyInput(s);
    q.Set("num_input_replicas", 2).Set("input_replica_id", rep).Set("repeat_count", 1);
    q.Set("batch_size", 5);
    auto rin = q.Instantiate<IdxImageInput>();
    for (int64_t id : Ids(rin->GetPreprocessedInputBatch())) EXPECT_TRUE(seen.insert(id).second);
    EXPECT_THROW(rin->GetPreprocessedInputBatch(), OutOfRangeError);
  }
  EXPECT_EQ(seen.size(), 10u);
  Params bad = TinyInput(s);
  bad.Set("first_example", 8).Set("num_examples", 5);
  EXPECT_ERROR_CONTAINS(bad.Instantiate<IdxImageInput>(), InvalidArgumentError, "examples [8, 13) are not inside the 10 examples");
}

TEST(IdxImageInputTest, NormalizationAndAugmentation) {
  // Lingvo's per_image_standardization: mean 0, stddev 1 per image; a constant image gives 0.
  at::Tensor imgs = at::randint(0, 256, {3, 5, 6, 1}, at::kByte);
  imgs[2].fill_(7);
  const at::Tensor x = IdxImageInput::Normalize(imgs, "per_image", 0, 1).reshape({3, -1});
  EXPECT_LT(x.slice(0, 0, 2).mean(1).abs().max().item<double>(), 1e-5);
  EXPECT_NEAR(x[0].to(at::kDouble).square().mean().sqrt().item<double>(), 1.0, 1e-4);
  EXPECT_EQ(x[2].abs().max().item<double>(), 0.0);
  EXPECT_TRUE(at::allclose(IdxImageInput::Normalize(imgs, "dataset", 0.5, 0.25),
                           (imgs.to(at::kFloat) / 255 - 0.5) / 0.25));
  // Crops keep the shape, move the content by at most the padding, and are deterministic.
  const TinySet s = MakeTinySet(10);
  Params p = TinyInput(s);
  p.Set("random_crop_padding", 2).Set("random_flip_left_right", true).Set("shuffle", false);
  auto a = p.Instantiate<IdxImageInput>(), b = p.Instantiate<IdxImageInput>();
  bool any_zero = false;
  for (int i = 0; i < 5; ++i) {
    const at::Tensor da = a->GetPreprocessedInputBatch().GetTensor("data");
    EXPECT_TRUE(at::equal(da, b->GetPreprocessedInputBatch().GetTensor("data")));
    EXPECT_EQ(da.sizes(), (std::vector<int64_t>{4, 4, 4, 1}));
    any_zero = any_zero || (da == 0).any().item<bool>();
  }
  EXPECT_TRUE(any_zero) << "some crops take in the zero padding";
}

// Central differences in float64 of sum(out · cot) w.r.t. every variable.
void CheckGradients(BaseLayer& layer, const std::function<at::Tensor(const NestedMap&)>& f) {
  const NestedMap theta = layer.theta();
  at::Tensor out = f(theta);
  const at::Tensor cot = at::randn_like(out);
  std::vector<at::Tensor> leaves;  // the trainable ones (not batch norm's moving statistics)
  for (const at::Tensor& t : theta.FlattenTensors()) {
    if (t.requires_grad()) leaves.push_back(t);
  }
  const auto grads = torch::autograd::grad({(out * cot).sum()}, leaves);
  for (size_t i = 0; i < leaves.size(); ++i) {
    at::Tensor v = leaves[i];
    for (int64_t j = 0; j < std::min<int64_t>(v.numel(), 6); ++j) {
      const int64_t k = (j * 7919) % v.numel();
      at::NoGradGuard ng;
      at::Tensor e = v, g = grads[i];  // element k (row-major) as a 0-dim view
      for (int64_t d = 0, rest = k; d < v.dim(); ++d) {
        int64_t inner = 1;
        for (int64_t j = d + 1; j < v.dim(); ++j) inner *= v.size(j);
        e = e.select(0, rest / inner);
        g = g.select(0, rest / inner);
        rest %= inner;
      }
      const double old = e.item<double>();
      e.fill_(old + 1e-6);
      const double up = (f(theta) * cot).sum().item<double>();
      e.fill_(old - 1e-6);
      const double down = (f(theta) * cot).sum().item<double>();
      e.fill_(old);
      EXPECT_NEAR(g.item<double>(), (up - down) / 2e-6, 1e-5)
          << "variable " << i << " element " << k;
    }
  }
}

TEST(ImageLayersTest, ConvStackAndResNetShapesAndGradients) {
  EvalModeScope eval;  // batch norm on its moving statistics: a pure function of theta
  Params cs = ConvStack::Params();
  cs.Set("name", "lenet").Set("dtype", DType::kFloat64).Set("random_seed", 3);
  cs.Set("input_shape", ParamValue::List{8, 8, 1});
  cs.Set("filter_shapes", ParamValue::List{ParamValue::List{3, 3, 1, 4}, ParamValue::List{3, 3, 4, 5}});
  cs.Set("window_shapes", ParamValue::List{ParamValue::List{2, 2}, ParamValue::List{2, 2}});
  cs.Set("fc_dim", 6).Set("batch_norm", true);
  auto lenet = cs.Instantiate<ConvStack>();
  EXPECT_EQ(lenet->output_dim(), 6);
  const at::Tensor x = at::randn({2, 8, 8, 1}, at::kDouble);
  EXPECT_EQ(lenet->FPropImages(lenet->theta(), x).sizes(), (std::vector<int64_t>{2, 6}));
  CheckGradients(*lenet, [&](const NestedMap& th) { return lenet->FPropImages(th, x); });

  Params rp = ResNet::Params();
  rp.Set("name", "resnet").Set("dtype", DType::kFloat64).Set("random_seed", 4);
  rp.Set("input_shape", ParamValue::List{8, 8, 2}).Set("stem_channels", 3);
  rp.Set("stage_channels", ParamValue::List{3, 4}).Set("blocks_per_stage", 1);
  auto resnet = rp.Instantiate<ResNet>();
  EXPECT_EQ(resnet->output_dim(), 4);
  const at::Tensor y = at::randn({2, 8, 8, 2}, at::kDouble);
  EXPECT_EQ(resnet->FPropImages(resnet->theta(), y).sizes(), (std::vector<int64_t>{2, 4}));
  CheckGradients(*resnet, [&](const NestedMap& th) { return resnet->FPropImages(th, y); });

  Params bad = ConvStack::Params();
  bad.Set("name", "bad").Set("filter_shapes", ParamValue::List{ParamValue::List{3, 3, 2, 4}});
  bad.Set("window_shapes", ParamValue::List{ParamValue::List{2, 2}});
  EXPECT_ERROR_CONTAINS(bad.Instantiate<ConvStack>(), InvalidArgumentError, "filter_shapes[0] takes 2 input channels, but the input to it has 1");
}

Params TinyClassifier() {
  Params p = ClassifierTask::Params();
  p.Set("name", "clf").Set("random_seed", 5).Set("data_shape", ParamValue::List{4, 4, 1});
  p.Set("extract.fc_dim", 0);
  p.Set("softmax.num_classes", 6).Set("normalization", "none");
  p.Set("class_names", ParamValue::List{"a", "b", "c", "d", "e", "f"});
  return p;
}

TEST(ClassifierTaskTest, MetricsCountTopOneAndTopFive) {
  auto task = TinyClassifier().Instantiate<ClassifierTask>();
  // Logits by hand: example 0 correct at top-1; example 1 correct only within top-5; example 2
  // wrong at top-5 (label ranked last); example 3 weight 0.
  NestedMap preds;
  preds.Set("logits", at::tensor(std::vector<float>{6, 5, 4, 3, 2, 1, 6, 5, 4, 3, 2, 1, 6, 5, 4, 3, 2, 1, 1, 2, 3, 4, 5, 6})
                          .reshape({4, 6}));
  NestedMap batch;
  batch.Set("label", at::tensor({0, 3, 5, 0}, at::kLong));
  batch.Set("weight", at::tensor(std::vector<float>{1, 1, 1, 0}));
  const auto out = task->ComputeLoss(task->theta(), preds, batch);
  EXPECT_NEAR(out.metrics.at("accuracy").value.item<double>(), 1.0 / 3, 1e-6);
  EXPECT_NEAR(out.metrics.at("acc5").value.item<double>(), 2.0 / 3, 1e-6);
  EXPECT_NEAR(out.metrics.at("error").value.item<double>(), 2.0 / 3, 1e-6);
  EXPECT_EQ(out.metrics.at("accuracy").weight.item<double>(), 3.0);
  const at::Tensor lp = at::log_softmax(preds.GetTensor("logits"), 1);
  const double xent = -(lp[0][0] + lp[1][3] + lp[2][5]).item<double>() / 3;
  EXPECT_NEAR(out.metrics.at("loss").value.item<double>(), xent, 1e-5);
}

std::string PngBytes(const at::Tensor& gray) {  // [H, W] uint8
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<uint32_t>(gray.size(1));
  image.height = static_cast<uint32_t>(gray.size(0));
  image.format = PNG_FORMAT_GRAY;
  png_alloc_size_t size = 0;
  const at::Tensor c = gray.contiguous();
  png_image_write_to_memory(&image, nullptr, &size, 0, c.data_ptr(), 0, nullptr);
  std::string out(size, '\0');
  EXPECT_TRUE(png_image_write_to_memory(&image, out.data(), &size, 0, c.data_ptr(), 0, nullptr));
  out.resize(size);
  return out;
}


TEST(ClassifierTaskTest, ClassifyTakesTensorsIdxPgmPngAndBase64) {
  auto task = TinyClassifier().Instantiate<ClassifierTask>();
  const at::Tensor img = at::randint(0, 256, {4, 4}, at::kByte);
  InferenceMap feeds;
  feeds["images"] = InferenceValue::Of(img.to(at::kFloat).reshape({1, 4, 4, 1}));
  feeds["top_k"] = InferenceValue::Of(at::tensor(3, at::kLong).reshape({}));
  const InferenceMap ref = task->RunInference(task->theta(), "classify", feeds, nullptr);
  EXPECT_EQ(ref.at("classes").tensor.sizes(), (std::vector<int64_t>{1, 3}));
  EXPECT_NEAR(at::softmax(task->Logits(task->theta(), img.to(at::kFloat).reshape({1, 4, 4, 1}) / 255), 1)
                  .max().item<double>(),
              ref.at("scores").tensor[0][0].item<double>(), 1e-6);
  EXPECT_EQ(ref.at("names").strings[0], task->ClassName(ref.at("classes").tensor[0][0].item<int64_t>()));
  std::string p5 = "P5\n# a comment\n4 4\n255\n";
  std::string p2 = "P2 4 4 255\n";
  for (int64_t i = 0; i < 16; ++i) {
    const int v = img.view(-1)[i].item<int>();
    p5.push_back(static_cast<char>(v));
    p2 += StrCat(v, i % 4 == 3 ? "\n" : " ");
  }
  const std::string idx = IdxBytes(0x08, {4, 4}, p5.substr(p5.size() - 16));
  for (const std::string& enc : {idx, p5, p2, PngBytes(img), Base64Encode(PngBytes(img)), Base64Encode(idx)}) {
    InferenceMap f;
    f["encoded"] = InferenceValue::Strings({enc});
    f["top_k"] = feeds["top_k"];
    const InferenceMap out = task->RunInference(task->theta(), "classify", f, nullptr);
    EXPECT_TRUE(at::equal(out.at("classes").tensor, ref.at("classes").tensor));
    EXPECT_TRUE(at::allclose(out.at("scores").tensor, ref.at("scores").tensor));
  }
  InferenceMap junk;
  junk["encoded"] = InferenceValue::Strings({"hello"});
  EXPECT_ERROR_CONTAINS(task->RunInference(task->theta(), "classify", junk, nullptr), InvalidArgumentError, "feed 'encoded'[0]: not an IDX, PGM (P5/P2) or PNG image");
  InferenceMap truncated;
  truncated["encoded"] = InferenceValue::Strings({p5.substr(0, p5.size() - 3)});
  EXPECT_ERROR_CONTAINS(task->RunInference(task->theta(), "classify", truncated, nullptr), InvalidArgumentError, "truncated PGM");
  InferenceMap wrong;
  wrong["images"] = InferenceValue::Of(at::zeros({1, 5, 4, 1}));
  EXPECT_ERROR_CONTAINS(task->RunInference(task->theta(), "classify", wrong, nullptr), InvalidArgumentError, "classify: images must be [B, 4, 4, 1], got [1, 5, 4, 1]");
}

TEST(FashionMnistTest, LeNet5LossFalls) {
  if (!FileExists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz") &&
      std::getenv("GLOSSA_FASHION_MNIST_DIR") == nullptr) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (bash scripts/setup.sh installs it)";
  }
  for (const char* key : {"image.fmnist.LeNet5", "image.fmnist.ResNetSmall", "image.fmnist.LogReg"}) {
    Params p = GetModelParams(key, "Train");
    p.Set("task.input.batch_size", 32);
    p.Set("task.train.learner.lr_schedule.warmup_steps", 1);
    if (std::string(key) == "image.fmnist.ResNetSmall") {
      p.Set("task.extract.stage_channels", ParamValue::List{8, 16});
      p.Set("task.extract.blocks_per_stage", 1);
    }
    p.Set("random_seed", 1).Set("task.random_seed", 1);
    auto model = p.Instantiate<BaseModel>();
    BaseTask& task = model->task();
    const NestedMap batch = task.input().GetPreprocessedInputBatch();
    double first = 0, last = 0;
    for (int step = 0; step < 40; ++step) {
      SetGlobalStep(step);
      auto r = task.FPropDefaultTheta(batch);  // one batch, learned by heart
      if (step == 0) first = r.metrics.at("loss").value.item<double>();
      last = r.metrics.at("loss").value.item<double>();
      task.learner().Apply(r.metrics, LearnerVariables(*model), step);
    }
    EXPECT_LT(last, first * 0.6) << key << ": loss " << first << " -> " << last;
  }
}

}  // namespace
}  // namespace glossa
