#include "glossa/input/input_generator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/io/example.h"

namespace glossa {
namespace {

std::vector<int64_t> IntList(const Params& p, const char* key) {
  std::vector<int64_t> out;
  for (const auto& v : p.Get(key).AsList()) out.push_back(v.AsInt());
  return out;
}

std::vector<std::string> StringOrList(const ParamValue& v) {
  std::vector<std::string> out;
  if (v.kind() == ParamValue::Kind::kString) {
    out.push_back(v.AsString());
  } else if (v.is_list()) {
    for (const auto& x : v.AsList()) out.push_back(x.AsString());
  }
  return out;
}

// A thread-count or queue-size param outside [lo, hi] is InvalidArgument naming it.
void CheckRange(const Params& p, const std::string& layer, const char* key, int64_t lo,
                int64_t hi) {
  const int64_t v = p.GetInt(key);
  if (v < lo || v > hi) {
    throw InvalidArgumentError(StrCat("input '", layer, "': ", key, " is ", v, "; it must be in [",
                                      lo, ", ", hi, "]"));
  }
}

}  // namespace

// ---- BaseInputGenerator ----

glossa::Params BaseInputGenerator::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("name", "input");
  p.Define("batch_size", 0, "Batch size (examples per batch).");
  p.Define("num_samples", 0, "If > 0, the number of samples in the dataset (e.g. for eval).");
  p.Define("num_input_replicas", 1, "Number of data-parallel input replicas.");
  p.Define("input_replica_id", 0, "This replica's index in [0, num_input_replicas).");
  return p;
}

BaseInputGenerator::BaseInputGenerator(const glossa::Params& p) : BaseLayer(p) {}

std::vector<NestedMap> BaseInputGenerator::SplitInputBatch(const NestedMap& batch, int64_t n) {
  if (n <= 0) throw InvalidArgumentError("SplitInputBatch: n must be > 0");
  std::vector<std::vector<NestedValue>> parts(n);
  for (const auto& [key, v] : batch.FlattenItems()) {
    if (!v.is_tensor() || v.AsTensor().dim() == 0) {
      throw InvalidArgumentError(StrCat("SplitInputBatch: '", key, "' is not a batched tensor"));
    }
    const at::Tensor& t = v.AsTensor();
    if (t.size(0) % n != 0) {
      throw InvalidArgumentError(StrCat("SplitInputBatch: '", key, "' has batch dimension ",
                                        t.size(0), ", which does not divide into ", n, " splits"));
    }
    auto chunks = t.chunk(n, 0);
    for (int64_t i = 0; i < n; ++i) parts[i].emplace_back(chunks[i]);
  }
  std::vector<NestedMap> out;
  for (auto& part : parts) out.push_back(batch.Pack(part));
  return out;
}

int64_t BaseInputGenerator::InfeedBatchSize() const { return params().GetInt("batch_size"); }

int64_t BaseInputGenerator::GlobalBatchSize() const {
  return InfeedBatchSize() * params().GetInt("num_input_replicas");
}

void BaseInputGenerator::Reset() {
  throw UnimplementedError(StrCat("input generator '", path(), "' cannot be reset"));
}

void BaseInputGenerator::SkipBatches(int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    try {
      GetPreprocessedInputBatch();
    } catch (const OutOfRangeError&) {
      throw OutOfRangeError(StrCat("input '", path(), "': the data ended after ", i, " of the ", n,
                                   " batches to skip to the checkpoint's input position"));
    }
    ++position_;
  }
}

// ---- BaseSequenceInputGenerator ----

glossa::Params BaseSequenceInputGenerator::Params() {
  glossa::Params p = BaseInputGenerator::Params();
  p.Define("file_pattern", "", "File pattern(s) '<type>:<glob>' (a list for several sources).");
  p.Define("input_source_weights", ParamValue::List{}, "Mixing weights, one per file_pattern.");
  p.Define("file_random_seed", 301,
           "Seed of the file order and shuffling; 0 means nondeterministic.");
  p.Define("file_buffer_size", 10000, "Records in the shuffle buffer.");
  p.Define("file_parallelism", 16, "Number of parallel file readers (1 to 256).");
  p.Define("require_sequential_order", false, "Read files and records in order (no shuffling).");
  p.Define("repeat_count", -1, "Epochs to read; -1 repeats forever.");
  p.Define("skip_corrupt_records", false, "Skip (and count) corrupt records instead of failing.");
  p.Define("max_line_bytes", int64_t{1} << 20,
           "Text files: a longer line is a DataLoss error naming the file and offset.");
  p.Define("num_batcher_threads", 1, "Number of record processor threads (1 to 256).");
  p.Define("bucket_upper_bound", ParamValue::List{100},
           "Bucket upper bounds of the bucket key (sorted).");
  p.Define("bucket_batch_limit", ParamValue::List{16}, "Batch size of each bucket.");
  p.Define("flush_every_n", 0, "Flush every bucket after this many records; 0: never.");
  p.Define("prefetch", 4,
           "Batches prepared ahead of the consumer (the infeed queue; 1 to 4096).");
  p.Define("source_max_length", 300, "Maximum length of source sequences.");
  p.Define("target_max_length", 300, "Maximum length of target sequences.");
  p.Define("tokenizer", AsciiTokenizer::Params(), "Tokenizer params.");
  p.Define("packed_input", false,
           "Pack several examples into each row (Lingvo's packed_input): rows of "
           "target_max_length (and source_max_length for pairs) with segment_ids and segment_pos "
           "beside the tensors, packed_rows a batch, instead of bucketing.");
  p.Define("packed_rows", 0, "Rows of a packed batch (with packed_input; must be > 0 then).");
  return p;
}

BaseSequenceInputGenerator::BaseSequenceInputGenerator(const glossa::Params& p)
    : BaseInputGenerator(p) {
  CheckRange(params(), path(), "num_batcher_threads", 1, 256);
  CheckRange(params(), path(), "file_parallelism", 1, 256);
  CheckRange(params(), path(), "prefetch", 1, 4096);
  CheckRange(params(), path(), "file_buffer_size", 1, int64_t{1} << 24);
  CheckRange(params(), path(), "max_line_bytes", 1, int64_t{1} << 30);
  if (p.GetBool("packed_input")) CheckRange(params(), path(), "packed_rows", 1, int64_t{1} << 20);
  CreateChild("tokenizer", params().GetParams("tokenizer"));
}

const BaseTokenizer& BaseSequenceInputGenerator::tokenizer() const {
  return GetChildAs<BaseTokenizer>("tokenizer");
}

void BaseSequenceInputGenerator::EnsureStarted() {
  if (batcher_) return;
  YielderOptions yo;
  yo.file_pattern = file_pattern_override_.empty() ? StringOrList(params().Get("file_pattern"))
                                                  : file_pattern_override_;
  if (yo.file_pattern.empty() || yo.file_pattern[0].empty()) {
    throw InvalidArgumentError(StrCat("input '", path(), "': file_pattern is not set"));
  }
  for (const auto& w : params().Get("input_source_weights").AsList()) {
    yo.input_source_weights.push_back(w.AsFloat());
  }
  yo.file_random_seed = params().GetInt("file_random_seed");
  yo.file_buffer_size = params().GetInt("file_buffer_size");
  yo.file_parallelism = params().GetInt("file_parallelism");
  yo.require_sequential_order = params().GetBool("require_sequential_order");
  yo.repeat_count = params().GetInt("repeat_count");
  yo.num_input_replicas = params().GetInt("num_input_replicas");
  yo.input_replica_id = params().GetInt("input_replica_id");
  yo.skip_corrupt_records = params().GetBool("skip_corrupt_records");
  yo.max_line_bytes = params().GetInt("max_line_bytes");
  yielder_ = std::make_shared<RecordYielder>(yo);
  BatcherOptions bo;
  bo.bucket_upper_bound = IntList(params(), "bucket_upper_bound");
  bo.bucket_batch_limit = IntList(params(), "bucket_batch_limit");
  bo.num_batcher_threads = params().GetInt("num_batcher_threads");
  bo.flush_every_n = params().GetInt("flush_every_n");
  bo.prefetch = params().GetInt("prefetch");
  bo.pad_values = pad_values_;
  if (params().GetBool("packed_input")) {
    bo.packing.rows = params().GetInt("packed_rows");
    bo.packing.row_length = PackedRowLengths();
  }
  batcher_ = std::make_unique<RecordBatcher>(yielder_, bo,
                                             [this](const Record& r) { return ProcessRecord(r); });
}

NestedMap BaseSequenceInputGenerator::GetPreprocessedInputBatch() {
  std::lock_guard<std::mutex> lock(mu_);
  EnsureStarted();
  return batcher_->Next();
}

int64_t BaseSequenceInputGenerator::InfeedBatchSize() const {
  if (params().GetBool("packed_input")) return params().GetInt("packed_rows");
  const auto limits = IntList(params(), "bucket_batch_limit");
  return limits.empty() ? 0 : *std::max_element(limits.begin(), limits.end());
}

void BaseSequenceInputGenerator::Reset() { StopReading(); }

std::map<std::string, int64_t> BaseSequenceInputGenerator::PackedRowLengths() const {
  return {{"", params().GetInt("target_max_length")}};
}

void BaseSequenceInputGenerator::StopReading() {
  std::lock_guard<std::mutex> lock(mu_);
  batcher_.reset();
  yielder_.reset();
}

BaseSequenceInputGenerator::~BaseSequenceInputGenerator() { StopReading(); }

NestedMap BaseSequenceInputGenerator::StringsToIds(const std::vector<std::string>& strs,
                                                   bool is_source) const {
  return tokenizer().StringsToIds(
      strs, params().GetInt(is_source ? "source_max_length" : "target_max_length"));
}

std::vector<std::string> BaseSequenceInputGenerator::IdsToStrings(const at::Tensor& ids,
                                                                  const at::Tensor& lens) const {
  return tokenizer().IdsToStrings(ids, lens);
}

int64_t BaseSequenceInputGenerator::num_skipped_too_long() const {
  return batcher_ ? batcher_->num_skipped_too_long() : 0;
}

// ---- TextLmInput ----

glossa::Params TextLmInput::Params() {
  glossa::Params p = BaseSequenceInputGenerator::Params();
  p.Set("cls", ClsOf<TextLmInput>());
  return p;
}

TextLmInput::TextLmInput(const glossa::Params& p) : BaseSequenceInputGenerator(p) {
  pad_values_["ids"] = static_cast<double>(tokenizer().eos_id());
  pad_values_["labels"] = static_cast<double>(tokenizer().eos_id());
}

std::optional<std::pair<NestedMap, int64_t>> TextLmInput::ProcessRecord(
    const Record& record) const {
  std::string_view line = Strip(record.value);
  if (line.empty()) return std::nullopt;
  NestedMap t = StringsToIds({std::string(line)}, /*is_source=*/false);
  const at::Tensor paddings = t.GetTensor("paddings")[0];
  const int64_t length = static_cast<int64_t>((1 - paddings).sum().item<float>());
  NestedMap ex;
  ex.Put("ids", t.GetTensor("ids")[0].slice(0, 0, length));
  ex.Put("labels", t.GetTensor("labels")[0].slice(0, 0, length));
  ex.Put("paddings", paddings.slice(0, 0, length));
  ex.Put("weights", at::ones({length}, at::kFloat));
  return std::make_pair(std::move(ex), length);
}

// ---- Dataset functions ----

namespace {

struct DatasetFnEntry {
  std::vector<DatasetArg> args;
  DatasetFn fn;
  std::string doc;
  DatasetFnOptions options;
};

std::mutex& DatasetMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::map<std::string, DatasetFnEntry>& DatasetFns() {
  static auto* fns = new std::map<std::string, DatasetFnEntry>;
  return *fns;
}

const DatasetFnEntry& FindDatasetFn(const std::string& key) {
  std::lock_guard<std::mutex> lock(DatasetMutex());
  auto it = DatasetFns().find(key);
  if (it == DatasetFns().end()) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : DatasetFns()) keys.push_back(k);
    throw NotFoundError(StrCat("unregistered dataset function ", KeyErrorString(key, keys)));
  }
  return it->second;
}

// Range(begin, end): {value: int64 scalar} for begin, begin+1, ..., end-1.
class RangeDataset : public Dataset {
 public:
  RangeDataset(int64_t begin, int64_t end) : next_(begin), end_(end) {}
  NestedMap Next() override {
    if (next_ >= end_) throw OutOfRangeError("end of input: Range dataset exhausted");
    return NestedMap{{"value", at::full({}, next_++, at::kLong)}};
  }

 private:
  int64_t next_, end_;
};

[[maybe_unused]] const bool kRangeRegistered = [] {
  RegisterDatasetFn(
      "glossa.input.Range",
      {{"begin", ParamValue(0), "First value."},
       {"end", ParamValue(10), "One past the last value."}},
      [](const Params& args) {
        return std::make_unique<RangeDataset>(args.GetInt("begin"), args.GetInt("end"));
      },
      "The integers in [begin, end), one per batch; ends with OutOfRange.");
  return true;
}();

}  // namespace

void RegisterDatasetFn(const std::string& key, std::vector<DatasetArg> args, DatasetFn fn,
                       std::string doc, DatasetFnOptions options) {
  Params check;
  for (const auto& a : args) check.Define(a.name, nullptr, "");  // validates the names
  auto find = [&](const std::string& name) {
    return std::find_if(args.begin(), args.end(),
                        [&](const DatasetArg& a) { return a.name == name; });
  };
  for (const auto& name : options.ignore_args) {
    auto a = find(name);
    if (a == args.end()) {
      throw InvalidArgumentError(StrCat("dataset function '", key, "': ignore_args names '", name,
                                        "', which is not one of its arguments"));
    }
    if (!a->default_value || a->default_value->is_none()) {
      throw InvalidArgumentError(StrCat("dataset function '", key, "': ignore_args '", name,
                                        "' has no default to apply"));
    }
  }
  for (const auto& [name, layer_param] : options.map_args) {
    if (find(name) == args.end()) {
      throw InvalidArgumentError(StrCat("dataset function '", key, "': map_args names '", name,
                                        "', which is not one of its arguments"));
    }
    if (layer_param.empty()) {
      throw InvalidArgumentError(
          StrCat("dataset function '", key, "': map_args '", name, "' names no layer param"));
    }
  }
  std::lock_guard<std::mutex> lock(DatasetMutex());
  if (DatasetFns().count(key)) {
    throw InvalidArgumentError(StrCat("dataset function '", key, "' is already registered"));
  }
  DatasetFns()[key] =
      DatasetFnEntry{std::move(args), std::move(fn), std::move(doc), std::move(options)};
}

std::vector<std::string> DatasetFnKeys() {
  std::lock_guard<std::mutex> lock(DatasetMutex());
  std::vector<std::string> keys;
  for (const auto& [k, v] : DatasetFns()) keys.push_back(k);
  return keys;
}

glossa::Params DatasetInput::Params() {
  glossa::Params p = BaseInputGenerator::Params();
  p.Set("cls", ClsOf<DatasetInput>());
  p.Define("dataset_fn", "", "Registry key of the dataset function.");
  p.Define("args", glossa::Params(), "The dataset function's arguments.");
  p.Define("ignore_args", ParamValue::List{},
           "Arguments not passed to the function (their defaults apply); from its definition.");
  p.Define("map_args", ParamValue::Dict{},
           "{function argument: layer param}: arguments taken from this layer's params; from "
           "its definition.");
  return p;
}

glossa::Params DatasetInput::ParamsFor(const std::string& dataset_fn) {
  const auto& entry = FindDatasetFn(dataset_fn);
  glossa::Params p = Params();
  p.Set("dataset_fn", dataset_fn);
  const auto& opt = entry.options;
  glossa::Params args;
  for (const auto& a : entry.args) {
    if (std::find(opt.ignore_args.begin(), opt.ignore_args.end(), a.name) !=
            opt.ignore_args.end() ||
        opt.map_args.count(a.name)) {
      continue;  // Lingvo: 'end' not in p.args for map_args={'end': 'num_samples'}
    }
    args.Define(a.name, a.default_value ? *a.default_value : ParamValue(), a.doc);
  }
  p.Set("args", args);
  ParamValue::List ignore;
  for (const auto& name : opt.ignore_args) ignore.push_back(ParamValue(name));
  ParamValue::Dict map;
  for (const auto& [name, layer_param] : opt.map_args) map[name] = ParamValue(layer_param);
  p.Set("ignore_args", ignore);
  p.Set("map_args", map);
  return p;
}

DatasetInput::DatasetInput(const glossa::Params& p) : BaseInputGenerator(p) {
  ResolvedArgs();  // validates early
}

glossa::Params DatasetInput::ResolvedArgs() const {
  const auto& entry = FindDatasetFn(params().GetString("dataset_fn"));
  glossa::Params args = params().GetParams("args").Copy();
  std::vector<std::string> ignore;
  for (const auto& v : params().Get("ignore_args").AsList()) {
    ignore.push_back(v.AsString());
    if (args.Contains(ignore.back())) {
      throw InvalidArgumentError(StrCat("input '", path(), "': ignored argument '", ignore.back(),
                                        "' must not be in p.args"));
    }
  }
  std::map<std::string, ParamValue> mapped;
  for (const auto& [arg, layer_param] : params().Get("map_args").AsDict()) {
    const bool declared = std::any_of(entry.args.begin(), entry.args.end(),
                                      [&](const DatasetArg& a) { return a.name == arg; });
    if (!declared) {
      throw InvalidArgumentError(StrCat("input '", path(), "': map_args names '", arg,
                                        "', which is not an argument of ",
                                        params().GetString("dataset_fn")));
    }
    if (args.Contains(arg)) {
      throw InvalidArgumentError(StrCat("input '", path(), "': argument '", arg,
                                        "' is taken from p.", layer_param.AsString(),
                                        " (map_args) and must not be in p.args"));
    }
    mapped[arg] = params().Get(layer_param.AsString());
    // The generator's batch_size defaults to 0: mapped into the function, every batch would be
    // empty (and training would skip every step as if it had diverged).
    if (layer_param.AsString() == "batch_size" && mapped[arg].kind() == ParamValue::Kind::kInt &&
        mapped[arg].AsInt() <= 0) {
      throw InvalidArgumentError(StrCat(
          "input '", path(), "': batch_size is ", mapped[arg].AsInt(), " (its default is 0), and ",
          params().GetString("dataset_fn"), " takes its argument '", arg,
          "' from it (map_args): every batch would be empty; set batch_size on the input"));
    }
  }
  glossa::Params resolved;
  for (const auto& a : entry.args) {
    if (std::find(ignore.begin(), ignore.end(), a.name) != ignore.end()) {
      if (a.default_value) resolved.Define(a.name, *a.default_value, a.doc);  // the default applies
      continue;
    }
    if (mapped.count(a.name)) {
      resolved.Define(a.name, mapped.at(a.name), a.doc);
      continue;
    }
    if (!args.Contains(a.name) || args.Get(a.name).is_none()) {
      if (a.default_value && !a.default_value->is_none()) {
        resolved.Define(a.name, *a.default_value, a.doc);
        continue;
      }
      throw InvalidArgumentError(StrCat("input '", path(), "': argument '", a.name, "' of ",
                                        params().GetString("dataset_fn"),
                                        " has no default and must be set (p.args.", a.name, ")"));
    }
    resolved.Define(a.name, args.Get(a.name), a.doc);
  }
  for (const auto& e : args) {
    const bool declared = std::any_of(entry.args.begin(), entry.args.end(),
                                      [&](const DatasetArg& a) { return a.name == e.name; });
    if (!declared) {
      throw NotFoundError(StrCat("input '", path(), "': p.args has '", e.name, "', which ",
                                 params().GetString("dataset_fn"), " does not take"));
    }
  }
  return resolved;
}

NestedMap DatasetInput::GetPreprocessedInputBatch() {
  if (!dataset_) dataset_ = FindDatasetFn(params().GetString("dataset_fn")).fn(ResolvedArgs());
  return dataset_->Next();
}

void DatasetInput::Reset() { dataset_.reset(); }

// ---- ExampleFileInput ----

glossa::Params ExampleFileInput::Params() {
  glossa::Params p = BaseInputGenerator::Params();
  p.Set("cls", ClsOf<ExampleFileInput>());
  p.Define("input_files", "", "Files of tf.Examples: '[type:]glob' (type tfrecord by default).");
  p.Define("randomize_order", true, "Shuffle files and records.");
  p.Define("parallel_readers", 1, "Number of parallel file readers.");
  p.Define("num_examples", -1, "Stop after this many examples in total; -1: no limit.");
  p.Define("num_epochs", -1, "Epochs over the files; -1 repeats forever.");
  p.Define("file_random_seed", 301, "Seed of the shuffling; 0 means nondeterministic.");
  p.Define("file_buffer_size", 1000, "Records in the shuffle buffer.");
  p.Define("features", ParamValue::Dict{},
           "Feature spec: {name: FeatureParams(type, shape, var_len)}.");
  return p;
}

glossa::Params ExampleFileInput::FeatureParams(const std::string& type, std::vector<int64_t> shape,
                                               bool var_len) {
  glossa::Params f;
  f.Define("type", type, "'int64', 'float' or 'bytes'.");
  ParamValue::List s;
  for (int64_t d : shape) s.push_back(d);
  f.Define("shape", s, "Shape of a fixed-length feature ([] is a scalar).");
  f.Define("var_len", var_len, "Variable-length (1-D) feature.");
  f.Define("default", nullptr, "Default values for a missing fixed-length feature.");
  return f;
}

ExampleFileInput::ExampleFileInput(const glossa::Params& p) : BaseInputGenerator(p) {
  if (params().GetInt("batch_size") <= 0) {
    throw InvalidArgumentError(StrCat("input '", path(), "': batch_size must be > 0"));
  }
}

NestedMap ExampleFileInput::GetPreprocessedInputBatch() {
  if (!yielder_) {
    YielderOptions yo;
    std::string files = params().GetString("input_files");
    if (files.find(':') == std::string::npos) files = "tfrecord:" + files;
    yo.file_pattern = {files};
    yo.require_sequential_order = !params().GetBool("randomize_order");
    yo.file_parallelism = params().GetInt("parallel_readers");
    yo.repeat_count = params().GetInt("num_epochs");
    yo.file_random_seed = params().GetInt("file_random_seed");
    yo.file_buffer_size = params().GetInt("file_buffer_size");
    yo.num_input_replicas = params().GetInt("num_input_replicas");
    yo.input_replica_id = params().GetInt("input_replica_id");
    yielder_ = std::make_unique<RecordYielder>(yo);
  }
  FeatureSpecs spec;
  for (const auto& [name, fv] : params().Get("features").AsDict()) {
    const glossa::Params& f = fv.AsParams();
    const std::string& type = f.GetString("type");
    FeatureSpec s;
    s.type = type == "int64"   ? FeatureType::kInt64
             : type == "float" ? FeatureType::kFloat
             : type == "bytes" ? FeatureType::kBytes
                               : throw InvalidArgumentError(StrCat("feature '", name,
                                                                   "': type must be "
                                                                   "int64, float or bytes, got '",
                                                                   type, "'"));
    s.var_len = f.GetBool("var_len");
    for (const auto& d : f.Get("shape").AsList()) s.shape.push_back(d.AsInt());
    if (f.IsSet("default")) {
      std::vector<double> d;
      for (const auto& x : f.Get("default").AsList()) d.push_back(x.AsFloat());
      s.default_numbers = d;
    }
    spec[name] = s;
  }
  const int64_t batch_size = params().GetInt("batch_size");
  const int64_t limit = params().GetInt("num_examples");
  std::vector<NestedMap> examples;
  while (static_cast<int64_t>(examples.size()) < batch_size) {
    if (limit >= 0 && examples_read_ >= limit) {
      throw OutOfRangeError(StrCat("end of input: ", limit, " examples read"));
    }
    Record r = yielder_->Next();  // OutOfRange at the end: the partial batch is dropped
    ++examples_read_;
    examples.push_back(ParseExample(r.value, spec, params().GetString("input_files")));
  }
  return PadAndStack(examples);
}

void ExampleFileInput::Reset() {
  yielder_.reset();
  examples_read_ = 0;
}

GLOSSA_REGISTER_CLASS(TextLmInput, "glossa.input.TextLmInput");
GLOSSA_REGISTER_CLASS(DatasetInput, "glossa.input.DatasetInput");
GLOSSA_REGISTER_CLASS(ExampleFileInput, "glossa.input.ExampleFileInput");

}  // namespace glossa
