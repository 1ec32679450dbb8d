#include "glossa/tasks/image/image.h"

#include <ATen/ATen.h>
#include <png.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <sstream>

#include "glossa/base/base64.h"
#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/input/image_input.h"
#include "glossa/io/idx.h"
#include "glossa/layers/conv.h"
#include "glossa/layers/dropout.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/normalization.h"
#include "glossa/layers/softmax.h"

namespace glossa {
namespace {

std::vector<int64_t> IntList(const Params& p, const std::string& key, size_t n,
                             const std::string& where) {
  std::vector<int64_t> out;
  const ParamValue& v = p.Get(key);
  if (v.kind() != ParamValue::Kind::kList) {
    throw InvalidArgumentError(StrCat(where, ": ", key, " must be a list of ", n, " ints"));
  }
  for (const auto& x : v.AsList()) out.push_back(x.AsInt());
  if (out.size() != n) {
    throw InvalidArgumentError(StrCat(where, ": ", key, " must have ", n, " ints, got ", out.size()));
  }
  return out;
}

std::vector<int64_t> IntList(const ParamValue& v, size_t n, const std::string& what) {
  std::vector<int64_t> out;
  if (v.kind() != ParamValue::Kind::kList) {
    throw InvalidArgumentError(StrCat(what, " must be a list of ", n, " ints"));
  }
  for (const auto& x : v.AsList()) out.push_back(x.AsInt());
  if (out.size() != n) throw InvalidArgumentError(StrCat(what, " must have ", n, " ints"));
  return out;
}

ParamValue::List ToList(const std::vector<int64_t>& v) {
  ParamValue::List l;
  for (int64_t x : v) l.emplace_back(x);
  return l;
}

Params ConvParams(int64_t kh, int64_t kw, int64_t in, int64_t out, int64_t stride, bool bias,
                  const std::string& activation) {
  glossa::Params p = Conv2DLayer::Params();
  p.Set("filter_shape", ToList({kh, kw, in, out}));
  p.Set("filter_stride", ToList({stride, stride}));
  p.Set("bias", bias);
  p.Set("activation", activation);
  return p;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

// ---- ConvStack ----

glossa::Params ConvStack::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<ConvStack>());
  p.Define("input_shape", ParamValue::List{28, 28, 1}, "Input images [height, width, channels].");
  p.Define("filter_shapes", ParamValue::List{},
           "Conv filter shapes [[height, width, in_channels, out_channels], ...].");
  p.Define("window_shapes", ParamValue::List{},
           "Max pooling windows [[height, width], ...] (stride = window), one per filter.");
  p.Define("batch_norm", false, "Batch norm after each conv (instead of a bias).");
  p.Define("batch_norm_decay", 0.99,
           "Decay of batch norm's moving statistics (0.99: they settle within a few hundred steps).");
  p.Define("dropout_prob", 0.0, "Dropout after the last pooling (and the FC layer).");
  p.Define("fc_dim", 300, "Output dim of the final FC layer with ReLU (0: no FC layer).");
  return p;
}

ConvStack::ConvStack(const glossa::Params& p) : BaseLayer(p) {
  std::vector<int64_t> shape = IntList(p, "input_shape", 3, path());
  const auto& filters = p.Get("filter_shapes").AsList();
  const auto& windows = p.Get("window_shapes").AsList();
  if (filters.size() != windows.size()) {
    throw InvalidArgumentError(StrCat(path(), ": filter_shapes has ", filters.size(),
                                      " entries but window_shapes ", windows.size()));
  }
  const bool bn = p.GetBool("batch_norm");
  ParamValue::List conv_params, bn_params, pool_params;
  for (size_t i = 0; i < filters.size(); ++i) {
    const auto f = IntList(filters[i], 4, StrCat(path(), ": filter_shapes[", i, "]"));
    const auto w = IntList(windows[i], 2, StrCat(path(), ": window_shapes[", i, "]"));
    if (f[2] != shape[2]) {
      throw InvalidArgumentError(StrCat(path(), ": filter_shapes[", i, "] takes ", f[2],
                                        " input channels, but the input to it has ", shape[2]));
    }
    glossa::Params c = ConvParams(f[0], f[1], f[2], f[3], 1, !bn, bn ? "NONE" : "RELU");
    conv_params.emplace_back(c.Set("name", StrCat("conv", i)));
    if (bn) {
      bn_params.emplace_back(BatchNormLayer::Params().Set("name", StrCat("bn", i)).Set("dim", f[3])
                                 .Set("decay", p.GetFloat("batch_norm_decay")));
    }
    glossa::Params pool = PoolingLayer::Params().Set("name", StrCat("pool", i));
    pool.Set("window_shape", ToList(w)).Set("window_stride", ToList(w));
    pool_params.emplace_back(pool);
    shape = {CeilDiv(shape[0], w[0]), CeilDiv(shape[1], w[1]), f[3]};  // SAME conv, SAME pool
  }
  conv_ = CreateChildren<Conv2DLayer>("conv", conv_params);
  if (bn) bn_ = CreateChildren<BatchNormLayer>("bn", bn_params);
  pool_ = CreateChildren<PoolingLayer>("pool", pool_params);
  const double drop = p.GetFloat("dropout_prob");
  if (drop < 0 || drop >= 1) throw InvalidArgumentError(StrCat(path(), ": dropout_prob must be in [0, 1)"));
  if (drop > 0) {
    dropout_ = CreateChild<DropoutLayer>("dropout", DropoutLayer::Params().Set("keep_prob", 1.0 - drop));
  }
  output_dim_ = shape[0] * shape[1] * shape[2];
  const int64_t fc_dim = p.GetInt("fc_dim");
  if (fc_dim > 0) {
    glossa::Params fc = ProjectionLayer::Params();
    fc.Set("input_dim", output_dim_).Set("output_dim", fc_dim).Set("activation", "RELU");
    fc.Set("has_bias", true);
    fc_ = CreateChild<ProjectionLayer>("fc", fc);
    output_dim_ = fc_dim;
  }
}

at::Tensor ConvStack::FPropImages(const NestedMap& theta, const at::Tensor& images) const {
  if (images.dim() != 4) {
    throw InvalidArgumentError(StrCat(path(), ": images must be [B, H, W, C], got ", images.sizes()));
  }
  at::Tensor x = CastToFPropDtype(images);
  for (size_t i = 0; i < conv_.size(); ++i) {
    x = conv_[i]->FProp(conv_[i].Theta(theta), x).first;
    if (!bn_.empty()) x = at::relu(bn_[i]->FProp(bn_[i].Theta(theta), x));
    x = pool_[i]->FProp(pool_[i].Theta(theta), x).first;
  }
  if (dropout_) x = dropout_->FProp(dropout_.Theta(theta), x);
  x = x.reshape({x.size(0), -1});
  if (fc_) {
    x = fc_->FProp(fc_.Theta(theta), x);
    if (dropout_) x = dropout_->FProp(dropout_.Theta(theta), x);
  }
  return x;
}

// ---- ResNet ----

glossa::Params ResNet::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<ResNet>());
  p.Define("input_shape", ParamValue::List{28, 28, 1}, "Input images [height, width, channels].");
  p.Define("stem_channels", 32, "Channels of the 3x3 stem conv.");
  p.Define("stage_channels", ParamValue::List{32, 64, 128}, "Channels of each stage.");
  p.Define("blocks_per_stage", 2, "Basic residual blocks per stage.");
  p.Define("first_stride", 1, "Stride of the first stage (later stages use 2).");
  p.Define("batch_norm_decay", 0.99,
           "Decay of batch norm's moving statistics (0.99: they settle within a few hundred steps).");
  return p;
}

ResNet::ResNet(const glossa::Params& p) : BaseLayer(p) {
  const std::vector<int64_t> shape = IntList(p, "input_shape", 3, path());
  const double decay = p.GetFloat("batch_norm_decay");
  auto bn = [decay](int64_t dim) { return BatchNormLayer::Params().Set("dim", dim).Set("decay", decay); };
  const int64_t stem = p.GetInt("stem_channels");
  const int64_t per_stage = p.GetInt("blocks_per_stage");
  if (stem <= 0 || per_stage <= 0) {
    throw InvalidArgumentError(StrCat(path(), ": stem_channels and blocks_per_stage must be > 0"));
  }
  stem_ = CreateChild<Conv2DLayer>("stem", ConvParams(3, 3, shape[2], stem, 1, false, "NONE"));
  stem_bn_ = CreateChild<BatchNormLayer>("stem_bn", bn(stem));
  int64_t in = stem;
  int64_t stage = 0;
  ParamValue::List convs, bns, shortcuts, shortcut_bns;
  struct Plan {
    int64_t in, out, stride;
  };
  std::vector<Plan> plans;
  for (const auto& c : p.Get("stage_channels").AsList()) {
    const int64_t out = c.AsInt();
    if (out <= 0) throw InvalidArgumentError(StrCat(path(), ": stage_channels must be > 0"));
    for (int64_t b = 0; b < per_stage; ++b) {
      const int64_t stride = b > 0 ? 1 : (stage == 0 ? p.GetInt("first_stride") : 2);
      plans.push_back({in, out, stride});
      in = out;
    }
    ++stage;
  }
  for (size_t i = 0; i < plans.size(); ++i) {
    const Plan& pl = plans[i];
    Block blk;
    blk.conv1 = CreateChild<Conv2DLayer>(StrCat("block", i, "_conv1"),
                                         ConvParams(3, 3, pl.in, pl.out, pl.stride, false, "NONE"));
    blk.bn1 = CreateChild<BatchNormLayer>(StrCat("block", i, "_bn1"),
                                          bn(pl.out));
    blk.conv2 = CreateChild<Conv2DLayer>(StrCat("block", i, "_conv2"),
                                         ConvParams(3, 3, pl.out, pl.out, 1, false, "NONE"));
    blk.bn2 = CreateChild<BatchNormLayer>(StrCat("block", i, "_bn2"),
                                          bn(pl.out));
    if (pl.stride != 1 || pl.in != pl.out) {
      blk.shortcut = CreateChild<Conv2DLayer>(
          StrCat("block", i, "_shortcut"), ConvParams(1, 1, pl.in, pl.out, pl.stride, false, "NONE"));
      blk.shortcut_bn = CreateChild<BatchNormLayer>(StrCat("block", i, "_shortcut_bn"),
                                                    bn(pl.out));
    }
    blocks_.push_back(blk);
  }
  output_dim_ = in;
}

at::Tensor ResNet::FPropImages(const NestedMap& theta, const at::Tensor& images) const {
  if (images.dim() != 4) {
    throw InvalidArgumentError(StrCat(path(), ": images must be [B, H, W, C], got ", images.sizes()));
  }
  at::Tensor x = CastToFPropDtype(images);
  x = at::relu(stem_bn_->FProp(stem_bn_.Theta(theta), stem_->FProp(stem_.Theta(theta), x).first));
  for (const Block& b : blocks_) {
    at::Tensor y = b.conv1->FProp(b.conv1.Theta(theta), x).first;
    y = at::relu(b.bn1->FProp(b.bn1.Theta(theta), y));
    y = b.bn2->FProp(b.bn2.Theta(theta), b.conv2->FProp(b.conv2.Theta(theta), y).first);
    at::Tensor s = x;
    if (b.shortcut) {
      s = b.shortcut_bn->FProp(b.shortcut_bn.Theta(theta),
                               b.shortcut->FProp(b.shortcut.Theta(theta), x).first);
    }
    x = at::relu(y + s);
  }
  return x.mean({1, 2});  // global average pooling
}

// ---- ClassifierTask ----

glossa::Params ClassifierTask::Params() {
  glossa::Params p = BaseTask::Params();
  p.Set("cls", ClsOf<ClassifierTask>());
  p.Define("data_shape", ParamValue::List{28, 28, 1}, "Images [height, width, channels].");
  p.Define("extract", ConvStack::Params(),
           "The feature extractor (ConvStack or ResNet); its input_shape is set to data_shape.");
  p.Define("softmax", SimpleFullSoftmax::Params().Set("num_classes", 10),
           "The softmax (num_classes, label_smoothing); input_dim is the extractor's output.");
  p.Define("class_names", ParamValue::List{}, "Optional class names, one per class.");
  p.Define("classify_top_k", 5, "Classes `classify` returns per image by default.");
  p.Define("normalization", "per_image",
           "How `classify` normalises raw pixels: as the input's normalization.");
  p.Define("mean", 0.0, "As the input's mean (normalization 'dataset').");
  p.Define("stddev", 1.0, "As the input's stddev (normalization 'dataset').");
  return p;
}

ClassifierTask::ClassifierTask(const glossa::Params& p) : BaseTask(p) {
  data_shape_ = IntList(p, "data_shape", 3, path());
  glossa::Params ep = p.GetParams("extract").Copy();
  ep.Set("input_shape", ToList(data_shape_));
  extract_layer_ = &CreateChild("extract", ep);
  extract_ = dynamic_cast<const ImageFeatureExtractor*>(extract_layer_);
  if (extract_ == nullptr) {
    throw InvalidArgumentError(StrCat(path(), ": extract must be an image feature extractor "
                                      "(glossa.image.ConvStack or glossa.image.ResNet)"));
  }
  glossa::Params sp = p.GetParams("softmax").Copy();
  sp.Set("input_dim", extract_->output_dim());
  softmax_ = CreateChild<SimpleFullSoftmax>("softmax", sp);
  num_classes_ = sp.GetInt("num_classes");
  for (const auto& n : p.Get("class_names").AsList()) class_names_.push_back(n.AsString());
  if (!class_names_.empty() && static_cast<int64_t>(class_names_.size()) != num_classes_) {
    throw InvalidArgumentError(StrCat(path(), ": class_names has ", class_names_.size(),
                                      " names for ", num_classes_, " classes"));
  }
  top_k_ = p.GetInt("classify_top_k");
  normalization_ = p.GetString("normalization");
  mean_ = p.GetFloat("mean");
  stddev_ = p.GetFloat("stddev");
}

std::string ClassifierTask::ClassName(int64_t c) const {
  return class_names_.empty() ? std::to_string(c) : class_names_[static_cast<size_t>(c)];
}

at::Tensor ClassifierTask::Logits(const NestedMap& theta, const at::Tensor& images) const {
  const at::Tensor features = extract_->FPropImages(ChildTheta(theta, extract_layer_, "extract", -1), images);
  return softmax_->Logits(softmax_.Theta(theta), features);
}

NestedMap ClassifierTask::ComputePredictions(const NestedMap& theta, const NestedMap& batch) const {
  NestedMap out;
  out.Set("logits", Logits(theta, batch.GetTensor("data")));
  return out;
}

BaseTask::LossOutput ClassifierTask::ComputeLoss(const NestedMap& theta,
                                                 const NestedMap& predictions,
                                                 const NestedMap& batch) const {
  (void)theta;
  const at::Tensor logits = predictions.GetTensor("logits").to(at::kFloat);
  const at::Tensor labels = batch.GetTensor("label").to(at::kLong);
  const at::Tensor weight = batch.contains("weight") ? batch.GetTensor("weight").to(at::kFloat)
                                                     : at::ones({labels.size(0)}, at::kFloat);
  const NestedMap xent = softmax_->XentFromLogits(logits, labels, weight);
  const at::Tensor total = at::clamp_min(weight.sum(), 1e-8);
  const int64_t k = std::min<int64_t>(5, num_classes_);
  const at::Tensor topk = std::get<1>(logits.detach().topk(k, 1));
  const at::Tensor hit1 = (topk.select(1, 0) == labels).to(at::kFloat);
  const at::Tensor hit5 = (topk == labels.unsqueeze(1)).any(1).to(at::kFloat);
  const at::Tensor acc1 = (hit1 * weight).sum() / total;
  const at::Tensor acc5 = (hit5 * weight).sum() / total;
  LossOutput out;
  const at::Tensor avg = xent.GetTensor("avg_xent");
  out.metrics["loss"] = {avg, total.detach()};
  out.metrics["log_pplx"] = {avg.detach(), total.detach()};
  out.metrics["accuracy"] = {acc1, total.detach()};
  out.metrics["acc5"] = {acc5, total.detach()};
  out.metrics["error"] = {1 - acc1, total.detach()};
  out.metrics["num_preds"] = {total.detach(), at::ones({}, at::kFloat)};
  return out;
}

NestedMap ClassifierTask::Decode(const NestedMap& batch) {
  at::NoGradGuard no_grad;
  EvalModeScope eval;
  const at::Tensor logits = Logits(theta(), batch.GetTensor("data")).to(at::kFloat);
  NestedMap out;
  out.Set("probs", at::softmax(logits, 1));
  out.Set("label", batch.GetTensor("label").to(at::kLong));
  out.Set("weight", batch.contains("weight") ? batch.GetTensor("weight").to(at::kFloat)
                                             : at::ones({logits.size(0)}, at::kFloat));
  return out;
}

std::map<std::string, double> ClassifierTask::CreateDecoderMetrics() const {
  return {{"num_samples_in_batch", 0.0}, {"accuracy", 0.0}, {"acc5", 0.0}};
}

std::vector<std::string> ClassifierTask::PostProcessDecodeOut(const NestedMap& decode_out,
                                                              std::map<std::string, double>& metrics) {
  const at::Tensor probs = decode_out.GetTensor("probs");
  const at::Tensor labels = decode_out.GetTensor("label").contiguous();
  const at::Tensor weight = decode_out.GetTensor("weight").contiguous();
  const int64_t k = std::min<int64_t>(5, num_classes_);
  auto [top_p, top_c] = probs.topk(k, 1);
  top_p = top_p.contiguous();
  top_c = top_c.contiguous();
  const auto pa = top_p.accessor<float, 2>();
  const auto ca = top_c.accessor<int64_t, 2>();
  const auto la = labels.accessor<int64_t, 1>();
  const auto wa = weight.accessor<float, 1>();
  std::vector<std::string> lines;
  for (int64_t i = 0; i < probs.size(0); ++i) {
    if (wa[i] <= 0) continue;
    bool in5 = false;
    for (int64_t j = 0; j < k; ++j) in5 = in5 || ca[i][j] == la[i];
    metrics["num_samples_in_batch"] += 1;
    metrics["accuracy"] += ca[i][0] == la[i] ? 1 : 0;
    metrics["acc5"] += in5 ? 1 : 0;
    lines.push_back(StrCat("label ", ClassName(la[i]), " ||| predicted ", ClassName(ca[i][0]), " (",
                           pa[i][0], ")"));
  }
  return lines;
}

void ClassifierTask::DecodeFinalize(std::map<std::string, double>& metrics) {
  const double n = metrics["num_samples_in_batch"];
  if (n > 0) {
    metrics["accuracy"] /= n;
    metrics["acc5"] /= n;
  }
}

std::map<std::string, InferenceSubgraphSpec> ClassifierTask::Inference() const {
  std::map<std::string, InferenceSubgraphSpec> out;
  InferenceSubgraphSpec& c = out["classify"];
  c.doc = StrCat("Classifies images of ", data_shape_[0], "x", data_shape_[1], "x", data_shape_[2],
                 " pixels; give `images` or `encoded`.");
  c.feeds["images"] = {"float32", 4, true, "[B, H, W, C] raw pixel values 0..255."};
  c.feeds["encoded"] = {"string", 1, true,
                        "[B] images as IDX, PGM (P5/P2) or PNG bytes, or their base64 (JSON).", true};
  c.feeds["top_k"] = {"int64", 0, true, StrCat("Classes per image (default ", top_k_, ").")};
  c.fetches["classes"] = {"int64", 2, false, "[B, k] the top classes, most probable first."};
  c.fetches["scores"] = {"float32", 2, false, "[B, k] their probabilities."};
  c.fetches["names"] = {"string", 1, false, "[B] the top class's name."};
  return out;
}

namespace {


bool LooksEncoded(const std::string& b) {
  if (b.size() >= 8 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0) return true;
  if (b.size() >= 2 && b[0] == 'P' && (b[1] == '5' || b[1] == '2')) return true;
  if (b.size() >= 4 && b[0] == 0 && b[1] == 0) return true;                       // IDX
  if (b.size() >= 2 && static_cast<unsigned char>(b[0]) == 0x1f &&
      static_cast<unsigned char>(b[1]) == 0x8b)
    return true;  // gzipped IDX
  return false;
}

at::Tensor DecodePgm(const std::string& b, const std::string& what) {
  size_t pos = 2;
  auto next_token = [&]() -> int64_t {
    while (pos < b.size()) {
      if (b[pos] == '#') {
        while (pos < b.size() && b[pos] != '\n') ++pos;
      } else if (std::isspace(static_cast<unsigned char>(b[pos]))) {
        ++pos;
      } else {
        break;
      }
    }
    const size_t start = pos;
    while (pos < b.size() && std::isdigit(static_cast<unsigned char>(b[pos]))) ++pos;
    if (start == pos || pos - start > 9) {
      throw InvalidArgumentError(StrCat(what, ": malformed PGM header at byte ", start));
    }
    return std::stoll(b.substr(start, pos - start));
  };
  const int64_t w = next_token(), h = next_token(), maxval = next_token();
  if (w <= 0 || h <= 0 || w * h > (int64_t{1} << 26) || maxval <= 0 || maxval > 65535) {
    throw InvalidArgumentError(StrCat(what, ": PGM size ", w, "x", h, " or maxval ", maxval,
                                      " out of range"));
  }
  at::Tensor img = at::empty({1, h, w, 1}, at::kFloat);
  float* d = img.data_ptr<float>();
  if (b[1] == '5') {
    ++pos;  // the single whitespace after maxval
    const int64_t bpp = maxval > 255 ? 2 : 1;
    if (b.size() < pos + static_cast<size_t>(w * h * bpp)) {
      throw InvalidArgumentError(StrCat(what, ": truncated PGM: ", w, "x", h, " pixels need ",
                                        pos + w * h * bpp, " bytes, got ", b.size()));
    }
    for (int64_t i = 0; i < w * h; ++i) {
      const auto* u = reinterpret_cast<const unsigned char*>(b.data() + pos + i * bpp);
      const int64_t v = bpp == 2 ? (int64_t{u[0]} << 8) | u[1] : u[0];
      d[i] = static_cast<float>(v);
    }
  } else {
    for (int64_t i = 0; i < w * h; ++i) d[i] = static_cast<float>(next_token());
  }
  img.mul_(255.0 / static_cast<double>(maxval));
  return img.round().clamp(0, 255).to(at::kByte);
}

at::Tensor DecodePng(const std::string& b, int64_t channels, const std::string& what) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, b.data(), b.size())) {
    throw InvalidArgumentError(StrCat(what, ": not a readable PNG (", image.message, ")"));
  }
  image.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  if (static_cast<int64_t>(image.width) * image.height > (int64_t{1} << 26)) {
    png_image_free(&image);
    throw InvalidArgumentError(StrCat(what, ": PNG of ", image.width, "x", image.height, " is too large"));
  }
  at::Tensor img = at::empty({1, image.height, image.width, channels}, at::kByte);
  if (!png_image_finish_read(&image, nullptr, img.data_ptr(), 0, nullptr)) {
    throw InvalidArgumentError(StrCat(what, ": corrupt PNG (", image.message, ")"));
  }
  return img;
}

}  // namespace

at::Tensor DecodeImages(const std::string& raw, int64_t channels, const std::string& what) {
  std::string bytes = raw;
  if (!LooksEncoded(bytes)) {
    const std::optional<std::string> decoded = Base64Decode(raw);
    bytes = decoded.value_or("");
    if (!decoded || !LooksEncoded(bytes)) {
      throw InvalidArgumentError(StrCat(what, ": not an IDX, PGM (P5/P2) or PNG image, nor the "
                                        "base64 of one"));
    }
  }
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), "\x89PNG\r\n\x1a\n", 8) == 0) {
    return DecodePng(bytes, channels, what);
  }
  if (bytes[0] == 'P') return DecodePgm(bytes, what);
  IdxArray a;
  try {
    a = ParseIdx(bytes, what);
  } catch (const Error& e) {
    throw InvalidArgumentError(e.message());
  }
  at::Tensor t = a.data;
  if (t.dim() == 2) t = t.unsqueeze(0);
  if (t.dim() == 3) t = t.unsqueeze(-1);
  if (t.dim() != 4) throw InvalidArgumentError(StrCat(what, ": IDX images must have rank 2 to 4"));
  return t.clamp(0, 255).to(at::kByte);
}

InferenceMap ClassifierTask::RunInference(const NestedMap& theta, const std::string& subgraph,
                                          const InferenceMap& feeds,
                                          const BaseTokenizer* tokenizer) const {
  if (subgraph != "classify") return BaseTask::RunInference(theta, subgraph, feeds, tokenizer);
  at::NoGradGuard no_grad;
  EvalModeScope eval;
  const bool has_images = feeds.count("images") > 0, has_encoded = feeds.count("encoded") > 0;
  if (has_images == has_encoded) {
    throw InvalidArgumentError("classify: give exactly one of the feeds 'images' and 'encoded'");
  }
  at::Tensor pixels;
  if (has_images) {
    pixels = feeds.at("images").tensor.to(at::kFloat);
  } else {
    const auto& enc = feeds.at("encoded").strings;
    std::vector<at::Tensor> imgs;
    for (size_t i = 0; i < enc.size(); ++i) {
      at::Tensor t = DecodeImages(enc[i], data_shape_[2], StrCat("feed 'encoded'[", i, "]"));
      for (int64_t j = 0; j < t.size(0); ++j) imgs.push_back(t[j]);
    }
    pixels = at::stack(imgs).to(at::kFloat);
  }
  if (pixels.dim() != 4 || pixels.size(1) != data_shape_[0] || pixels.size(2) != data_shape_[1] ||
      pixels.size(3) != data_shape_[2]) {
    throw InvalidArgumentError(StrCat("classify: images must be [B, ", data_shape_[0], ", ",
                                      data_shape_[1], ", ", data_shape_[2], "], got ",
                                      pixels.sizes()));
  }
  int64_t k = top_k_;
  if (feeds.count("top_k")) k = feeds.at("top_k").tensor.item<int64_t>();
  if (k < 1) throw InvalidArgumentError("classify: top_k must be >= 1");
  k = std::min(k, num_classes_);
  const at::Tensor x = IdxImageInput::Normalize(pixels, normalization_, mean_, stddev_);
  const at::Tensor probs = at::softmax(Logits(theta, x).to(at::kFloat), 1);
  auto [scores, classes] = probs.topk(k, 1);
  std::vector<std::string> names;
  const at::Tensor top = classes.select(1, 0).contiguous();
  for (int64_t i = 0; i < top.size(0); ++i) names.push_back(ClassName(top[i].item<int64_t>()));
  InferenceMap out;
  out["classes"] = InferenceValue::Of(classes);
  out["scores"] = InferenceValue::Of(scores);
  out["names"] = InferenceValue::Strings(std::move(names));
  return out;
}

GLOSSA_REGISTER_CLASS(ConvStack, "glossa.image.ConvStack");
GLOSSA_REGISTER_CLASS(ResNet, "glossa.image.ResNet");
GLOSSA_REGISTER_CLASS(ClassifierTask, "glossa.image.ClassifierTask");

// ---- The uniform call (BaseLayer::FPropMap) ----

BaseLayer::FPropMapSignature ConvStack::FPropMapSpec() const {
  return {{"images"}, 1, {"features"}, false, "Tensor [B, D]"};
}

NestedMap ConvStack::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  NestedMap out;
  out.Put("features", FPropImages(theta, inputs.GetTensor("images")));
  return out;
}

BaseLayer::FPropMapSignature ResNet::FPropMapSpec() const {
  return {{"images"}, 1, {"features"}, false, "Tensor [B, D]"};
}

NestedMap ResNet::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  NestedMap out;
  out.Put("features", FPropImages(theta, inputs.GetTensor("images")));
  return out;
}

}  // namespace glossa
