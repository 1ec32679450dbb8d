// Input generators: Params-configured layers that produce batches (NestedMaps of tensors).
//
//   BaseInputGenerator        batch_size, num_samples; GetPreprocessedInputBatch(),
//                             SplitInputBatch(n), InfeedBatchSize(), GlobalBatchSize(), Reset().
//   BaseSequenceInputGenerator  records from file patterns through the yielder and the bucketing
//                             batcher; subclasses implement ProcessRecord. Tokenizer child.
//   TextLmInput               text lines -> {ids, labels, paddings} for language models.
//   DatasetInput              a registered C++ dataset function whose arguments are p.args.
//   ExampleFileInput          tf.Example files with a feature spec, epochs, drop-remainder batches.
//
//   auto p = TextLmInput::Params();
//   p.Set("name", "train").Set("file_pattern", "text:/data/lm/*.txt");
//   auto input = InstantiateLayer<BaseInputGenerator>(p);
//   NestedMap batch = input->GetPreprocessedInputBatch();   // OutOfRangeError at end of data
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "glossa/input/record_batcher.h"
#include "glossa/input/record_yielder.h"
#include "glossa/input/tokenizers.h"
#include "glossa/layers/base_layer.h"

namespace glossa {

class BaseInputGenerator : public BaseLayer {
 public:
  // + batch_size, num_samples, num_input_replicas.
  static glossa::Params Params();
  explicit BaseInputGenerator(const glossa::Params& p);

  // The next batch; OutOfRangeError at end of data.
  virtual NestedMap GetPreprocessedInputBatch() = 0;
  // Splits every tensor of `batch` along dim 0 into n equal parts (InvalidArgument when the batch
  // dimension does not divide).
  static std::vector<NestedMap> SplitInputBatch(const NestedMap& batch, int64_t n);
  // Examples per batch this generator produces, and across all input replicas.
  virtual int64_t InfeedBatchSize() const;
  int64_t GlobalBatchSize() const;
  // Starts the data over (Unimplemented for generators that cannot).
  virtual void Reset();

  // The training position: batches the trainer has taken (TakeTrainBatch). Checkpoints store it,
  // and a resumed run skips that many batches (SkipBatches) to go on where the saved one stopped,
  // as tf.data's iterator checkpoints do: bit for bit when the stream is deterministic given its
  // seeds (one reader, one batcher thread, a fixed file_random_seed), otherwise without replaying
  // the data the run already trained on.
  NestedMap TakeTrainBatch() {
    NestedMap batch = GetPreprocessedInputBatch();
    ++position_;
    return batch;
  }
  int64_t position() const { return position_; }
  // Reads and drops n batches and adds them to the position (OutOfRange when the data ends first).
  virtual void SkipBatches(int64_t n);

 private:
  int64_t position_ = 0;
};

class BaseSequenceInputGenerator : public BaseInputGenerator {
 public:
  // + file_pattern (a pattern or a list, one per source), input_source_weights, file_random_seed,
  // file_buffer_size, file_parallelism, require_sequential_order, repeat_count,
  // skip_corrupt_records, num_batcher_threads, bucket_upper_bound, bucket_batch_limit,
  // flush_every_n, prefetch, source_max_length, target_max_length, tokenizer, packed_input,
  // packed_rows.
  static glossa::Params Params();
  explicit BaseSequenceInputGenerator(const glossa::Params& p);
  ~BaseSequenceInputGenerator() override;

  NestedMap GetPreprocessedInputBatch() override;
  int64_t InfeedBatchSize() const override;
  void Reset() override;

  // Record -> (example, bucket key); nullopt drops it. Called from batcher threads: a subclass's
  // destructor must call StopReading() first, so that no thread calls it on a half-destroyed
  // object.
  virtual std::optional<std::pair<NestedMap, int64_t>> ProcessRecord(
      const Record& record) const = 0;

  // The tokenizer's (ids, labels, paddings) with max length source_ or target_max_length.
  NestedMap StringsToIds(const std::vector<std::string>& strs, bool is_source = false) const;
  std::vector<std::string> IdsToStrings(const at::Tensor& ids, const at::Tensor& lens) const;
  const BaseTokenizer& tokenizer() const;
  // With packed_input: the row length of each group of an example's keys (SequencePacker): here
  // {"": target_max_length}.
  virtual std::map<std::string, int64_t> PackedRowLengths() const;

  // Counters of the batcher (records skipped as too long, dropped).
  int64_t num_skipped_too_long() const;

 protected:
  // Stops and joins the reader and batcher threads (the next batch starts them again).
  void StopReading();
  std::map<std::string, double> pad_values_;
  // When set (by a subclass's constructor), read these patterns instead of p.file_pattern.
  std::vector<std::string> file_pattern_override_;

 private:
  void EnsureStarted();
  std::mutex mu_;
  std::shared_ptr<RecordYielder> yielder_;
  std::unique_ptr<RecordBatcher> batcher_;
};

// Text lines -> {ids, labels, paddings} (unpadded per example; the batcher pads to the longest in
// the batch), bucketed by length. Lines longer than target_max_length are truncated.
class TextLmInput : public BaseSequenceInputGenerator {
 public:
  static glossa::Params Params();
  explicit TextLmInput(const glossa::Params& p);
  ~TextLmInput() override { StopReading(); }
  std::optional<std::pair<NestedMap, int64_t>> ProcessRecord(const Record& record) const override;
};

// ---- Dataset functions (Lingvo's DefineTFDataInput) ----

// A stream of examples; Next throws OutOfRangeError when a non-repeating dataset ends.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual NestedMap Next() = 0;
};

struct DatasetArg {
  std::string name;
  std::optional<ParamValue> default_value;  // none: the argument must be set (p.args.<name>)
  std::string doc;
};
using DatasetFn = std::function<std::unique_ptr<Dataset>(const Params& args)>;

// Part of a dataset function's definition, as in Lingvo's DefineTFDataInput: ignore_args are
// never passed (their defaults apply) and map_args {argument: layer param} take an argument from
// a param of the input generator (e.g. end <- num_samples). Neither appears in p.args.
struct DatasetFnOptions {
  std::vector<std::string> ignore_args;
  std::map<std::string, std::string> map_args;
};

// Registers a dataset function under `key` with its declared arguments (InvalidArgument for a
// duplicate key, bad argument names, ignore_args or map_args naming undeclared arguments, or an
// ignored argument without a default). The function may be bound to an object (a lambda or
// std::bind capturing it): only the declared arguments are exposed.
void RegisterDatasetFn(const std::string& key, std::vector<DatasetArg> args, DatasetFn fn,
                       std::string doc = "", DatasetFnOptions options = {});
std::vector<std::string> DatasetFnKeys();

// A dataset function as an input generator: p.dataset_fn names it and p.args holds one entry per
// argument (defaulted, or None when it has no default and must be set), except the definition's
// ignore_args and map_args (recorded in p.ignore_args and p.map_args; a mapped or ignored
// argument found in p.args is an InvalidArgument, as Lingvo asserts). Each
// GetPreprocessedInputBatch returns the dataset's next element.
class DatasetInput : public BaseInputGenerator {
 public:
  // + dataset_fn, args, ignore_args, map_args.
  static glossa::Params Params();
  // DatasetInput::Params() for `dataset_fn` with its p.args filled in.
  static glossa::Params ParamsFor(const std::string& dataset_fn);
  explicit DatasetInput(const glossa::Params& p);
  NestedMap GetPreprocessedInputBatch() override;
  void Reset() override;

 private:
  glossa::Params ResolvedArgs() const;
  std::unique_ptr<Dataset> dataset_;
};

// tf.Example files: input_files ("type:glob", default type tfrecord), randomize_order,
// parallel_readers, num_examples (-1: all), num_epochs (-1: forever), batch_size with
// drop-remainder, and a feature spec `features` {name: {type, shape, var_len, default}}.
class ExampleFileInput : public BaseInputGenerator {
 public:
  static glossa::Params Params();
  // The Params of one feature of `features`.
  static glossa::Params FeatureParams(const std::string& type, std::vector<int64_t> shape = {},
                                      bool var_len = false);
  explicit ExampleFileInput(const glossa::Params& p);
  NestedMap GetPreprocessedInputBatch() override;
  void Reset() override;

 private:
  std::unique_ptr<RecordYielder> yielder_;
  int64_t examples_read_ = 0;
};

}  // namespace glossa
