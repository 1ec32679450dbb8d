#include "glossa/input/nmt_input.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/core/registry.h"
#include "glossa/io/example.h"

namespace glossa {
namespace {

at::Tensor LongTensor(const std::vector<int64_t>& v) {
  return at::tensor(at::ArrayRef<int64_t>(v), at::kLong);
}

// The example of source ids (</s> included) and target tokens; bucket key max(|src|, |tgt|).
std::pair<NestedMap, int64_t> PairExample(const std::vector<int64_t>& src,
                                          const at::Tensor& tgt_ids, const at::Tensor& tgt_labels,
                                          const at::Tensor& tgt_weights) {
  const int64_t s = static_cast<int64_t>(src.size()), t = tgt_ids.size(0);
  NestedMap ex;
  ex.Set("src.ids", LongTensor(src));
  ex.Set("src.paddings", at::zeros({s}, at::kFloat));
  ex.Set("tgt.ids", tgt_ids);
  ex.Set("tgt.labels", tgt_labels);
  ex.Set("tgt.paddings", at::zeros({t}, at::kFloat));
  ex.Set("tgt.weights", tgt_weights);
  return {std::move(ex), std::max(s, t)};
}

// A packed row's lengths of a pair: sources and targets side by side.
std::map<std::string, int64_t> PairRowLengths(const Params& p) {
  return {{"src", p.GetInt("source_max_length")}, {"tgt", p.GetInt("target_max_length")}};
}

}  // namespace

// ---- NmtInput ----

glossa::Params NmtInput::Params() {
  glossa::Params p = BaseSequenceInputGenerator::Params();
  p.Set("cls", ClsOf<NmtInput>());
  return p;
}

NmtInput::NmtInput(const glossa::Params& p) : BaseSequenceInputGenerator(p) {}

std::map<std::string, int64_t> NmtInput::PackedRowLengths() const {
  return PairRowLengths(params());
}

std::map<std::string, int64_t> TextPairInput::PackedRowLengths() const {
  return PairRowLengths(params());
}

std::optional<std::pair<NestedMap, int64_t>> NmtInput::ProcessRecord(const Record& record) const {
  static const FeatureSpecs* spec = new FeatureSpecs{
      {"source_id", FeatureSpec::VarLen(FeatureType::kInt64)},
      {"source_padding", FeatureSpec::VarLen(FeatureType::kFloat)},
      {"target_id", FeatureSpec::VarLen(FeatureType::kInt64)},
      {"target_label", FeatureSpec::VarLen(FeatureType::kInt64)},
      {"target_weight", FeatureSpec::VarLen(FeatureType::kFloat)},
      {"target_padding", FeatureSpec::VarLen(FeatureType::kFloat)},
  };
  const std::string where = StrCat("input '", path(), "' (NmtInput record of source ", record.source_id, ")");
  const NestedMap f = ParseExample(record.value, *spec, where);
  at::Tensor src = f.GetTensor("source_id"), tgt_ids = f.GetTensor("target_id");
  at::Tensor labels = f.GetTensor("target_label"), weights = f.GetTensor("target_weight");
  if (src.numel() == 0 || tgt_ids.numel() == 0) {
    throw InvalidArgumentError(StrCat(where, ": source_id and target_id must be non-empty"));
  }
  if (labels.numel() != tgt_ids.numel() || weights.numel() != tgt_ids.numel()) {
    throw InvalidArgumentError(StrCat(where, ": target_id (", tgt_ids.numel(), "), target_label (",
                                      labels.numel(), ") and target_weight (", weights.numel(),
                                      ") must have one length"));
  }
  // Lingvo's writers pad nothing (the paddings are all 0); honour explicit paddings anyway by
  // keeping only the unpadded prefix.
  auto unpadded = [&](const char* key, int64_t n) {
    const at::Tensor pad = f.GetTensor(key);
    if (pad.numel() == 0) return n;
    if (pad.numel() != n) {
      throw InvalidArgumentError(StrCat(where, ": ", key, " has ", pad.numel(),
                                        " values for ", n, " ids"));
    }
    return static_cast<int64_t>((pad < 0.5).to(at::kLong).sum().item<int64_t>());
  };
  const int64_t s = unpadded("source_padding", src.numel());
  const int64_t t = unpadded("target_padding", tgt_ids.numel());
  for (const auto& [key, ids] : {std::pair<const char*, at::Tensor>{"source_id", src},
                                 {"target_id", tgt_ids}, {"target_label", labels}}) {
    // (Ids past the vocabulary are caught by the model's embedding and loss, which know it.)
    if (ids.min().item<int64_t>() < 0) {
      throw InvalidArgumentError(StrCat(where, ": ", key, " has negative ids"));
    }
  }
  const int64_t max_src = params().GetInt("source_max_length");
  const int64_t max_tgt = params().GetInt("target_max_length");
  if (s > max_src || t > max_tgt) return std::nullopt;
  std::vector<int64_t> src_v(src.data_ptr<int64_t>(), src.data_ptr<int64_t>() + s);
  return PairExample(src_v, tgt_ids.slice(0, 0, t).clone(), labels.slice(0, 0, t).clone(),
                     weights.slice(0, 0, t).clone());
}

// ---- TextPairInput ----

glossa::Params TextPairInput::Params() {
  glossa::Params p = BaseSequenceInputGenerator::Params();
  p.Set("cls", ClsOf<TextPairInput>());
  p.Define("source_file", "", "Source sentences, one per line (with target_file).");
  p.Define("target_file", "", "Target sentences, line-aligned with source_file.");
  p.Define("drop_misformatted", false,
           "Drop lines without a tab instead of failing on them (file_pattern input).");
  return p;
}

TextPairInput::TextPairInput(const glossa::Params& p) : BaseSequenceInputGenerator(p) {
  drop_misformatted_ = p.GetBool("drop_misformatted");
  const std::string src = p.GetString("source_file"), tgt = p.GetString("target_file");
  if (src.empty() != tgt.empty()) {
    throw InvalidArgumentError(
        StrCat("input '", path(), "': set both source_file and target_file, or neither"));
  }
  if (src.empty()) return;
  std::ifstream fs(src), ft(tgt);
  if (!fs) throw NotFoundError(StrCat("input '", path(), "': cannot read source_file '", src, "'"));
  if (!ft) throw NotFoundError(StrCat("input '", path(), "': cannot read target_file '", tgt, "'"));
  char name[] = "/tmp/glossa_textpair_XXXXXX";
  const int fd = ::mkstemp(name);
  if (fd < 0) throw InternalError(StrCat("input '", path(), "': cannot create a temporary file"));
  ::close(fd);
  joined_file_ = name;
  std::ofstream out(joined_file_, std::ios::trunc);
  std::string a, b;
  int64_t line = 0;
  while (true) {
    const bool ha = static_cast<bool>(std::getline(fs, a));
    const bool hb = static_cast<bool>(std::getline(ft, b));
    if (!ha && !hb) break;
    ++line;
    if (ha != hb) {
      std::remove(joined_file_.c_str());
      throw InvalidArgumentError(StrCat("input '", path(), "': '", ha ? tgt : src,
                                        "' ends at line ", line - 1, " but '", ha ? src : tgt,
                                        "' goes on: the files must be line-aligned"));
    }
    if (a.find('\t') != std::string::npos || b.find('\t') != std::string::npos) {
      std::remove(joined_file_.c_str());
      throw InvalidArgumentError(StrCat("input '", path(), "': line ", line, " of '",
                                        a.find('\t') != std::string::npos ? src : tgt,
                                        "' contains a tab"));
    }
    out << a << '\t' << b << '\n';
  }
  out.close();
  if (!out) {
    std::remove(joined_file_.c_str());
    throw InternalError(StrCat("input '", path(), "': cannot write ", joined_file_));
  }
  file_pattern_override_ = {StrCat("text:", joined_file_)};
}

TextPairInput::~TextPairInput() {
  StopReading();
  if (!joined_file_.empty()) std::remove(joined_file_.c_str());
}

std::optional<std::pair<NestedMap, int64_t>> TextPairInput::MakeExample(
    const std::string& source, const std::string& target) const {
  const BaseTokenizer& tok = tokenizer();
  std::vector<int64_t> src = tok.StringToIds(source);
  std::vector<int64_t> tgt = tok.StringToIds(target);
  if (src.empty() || tgt.empty()) return std::nullopt;
  src.push_back(tok.eos_id());
  const int64_t t = static_cast<int64_t>(tgt.size()) + 1;
  if (static_cast<int64_t>(src.size()) > params().GetInt("source_max_length") ||
      t > params().GetInt("target_max_length")) {
    return std::nullopt;
  }
  std::vector<int64_t> ids{tok.sos_id()};
  ids.insert(ids.end(), tgt.begin(), tgt.end());
  tgt.push_back(tok.eos_id());
  return PairExample(src, LongTensor(ids), LongTensor(tgt), at::ones({t}, at::kFloat));
}

std::optional<std::pair<NestedMap, int64_t>> TextPairInput::ProcessRecord(
    const Record& record) const {
  std::string_view line = record.value;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (Strip(line).empty()) return std::nullopt;
  const size_t tab = line.find('\t');
  if (tab == std::string_view::npos) {
    if (drop_misformatted_) return std::nullopt;
    throw InvalidArgumentError(StrCat("input '", path(), "': a line has no tab (want source<TAB>",
                                      "target): '", line.substr(0, 80), "'"));
  }
  return MakeExample(std::string(Strip(line.substr(0, tab))),
                     std::string(Strip(line.substr(tab + 1))));
}

GLOSSA_REGISTER_CLASS(NmtInput, "glossa.input.NmtInput");
GLOSSA_REGISTER_CLASS(TextPairInput, "glossa.input.TextPairInput");

}  // namespace glossa
