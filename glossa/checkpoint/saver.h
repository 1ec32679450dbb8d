// Checkpoints with Lingvo's saver semantics. A checkpoint `<dir>/ckpt-%08d` (the global step) is a
// safetensors file `ckpt-00001000.safetensors`, or shards
// `ckpt-00001000-00000-of-0000N.safetensors` with `ckpt-00001000.safetensors.index.json` when
// larger than max_shard_bytes. Keys are full variable names, "global_step", optimizer slots and
// "<var>/ExponentialMovingAverage" shadows;
// __metadata__ carries format_version (and whatever the caller adds, e.g. the input position).
// The state file `<dir>/checkpoint` lists the checkpoints (TensorFlow's CheckpointState text
// format), is written atomically and re-read at every save. docs/formats.md specifies both.
//
//   SaverOptions o;  o.dir = "/logdir/train";  o.keep_latest_n = 5;
//   Saver saver(o);
//   saver.AddIsFiniteCheck(".*");
//   saver.Save(1000, tensors);
//   SafetensorsContents latest = LoadCheckpoint(*Saver::LatestCheckpoint(o.dir));
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "glossa/io/safetensors.h"

namespace glossa {

// "2": every file carries its CRC32C checksums (glossa/io/safetensors.h), which the loader then
// requires; "1" (waves 1 and 2) files may lack them.
inline constexpr const char* kCheckpointFormatVersion = "2";

struct SaverOptions {
  std::string dir;
  // Keep the last N checkpoints; 0 keeps all.
  int64_t keep_latest_n = 0;
  // Also keep one checkpoint every N hours (0: none).
  double keep_every_n_hours = 0;
  uint64_t max_shard_bytes = uint64_t{2} << 30;
  // Write in a background thread (values are copied first); the next save or Wait() surfaces
  // errors.
  bool async = false;
  // Wall time in seconds; injectable for tests.
  std::function<double()> clock;
};

// The state file.
struct CheckpointState {
  std::string model_checkpoint_path;  // relative to the directory, e.g. "ckpt-00001000"
  std::vector<std::string> all_model_checkpoint_paths;
  std::vector<double> all_model_checkpoint_timestamps;
  double last_preserved_timestamp = 0;
};
// Reads `<dir>/checkpoint`: an empty state when absent; DataLoss naming the file and line when
// malformed.
CheckpointState ReadCheckpointState(const std::string& dir);
std::string FormatCheckpointState(const CheckpointState& state);

// Lingvo's retention: sort (timestamp, path); keep-every-N-hours keeps the first and then one
// whenever its timestamp is more than 3600·N seconds after the last kept; keep-latest-N keeps the
// last N (0 keeps all); the union is kept. Returns the kept paths in order.
std::vector<std::string> CheckpointsToKeep(const std::vector<std::pair<double, std::string>>& all,
                                           int64_t keep_latest_n, double keep_every_n_hours);

class Saver {
 public:
  explicit Saver(SaverOptions options);
  ~Saver();  // waits for an asynchronous save (errors are logged)
  Saver(const Saver&) = delete;
  Saver& operator=(const Saver&) = delete;

  // Sanity checks run before a checkpoint becomes visible; a failure writes `<prefix>.failed`
  // with the reason, leaves the state file unchanged and raises Aborted.
  void AddIsFiniteCheck(const std::string& name_regex);
  void AddInRangeCheck(const std::string& name_regex, double low, double high);

  // Saves `tensors` as checkpoint `global_step` and applies retention. Returns the prefix
  // ("<dir>/ckpt-%08d"). Adds "global_step" when absent.
  // `healthy`: training was sound when it was taken (no skipped steps since the previous save).
  // The newest healthy checkpoint is named in `<dir>/healthy_checkpoint` and retention never
  // deletes it, however many unhealthy ones follow.
  std::string Save(int64_t global_step, const std::map<std::string, at::Tensor>& tensors,
                   std::map<std::string, std::string> metadata = {}, bool healthy = true);
  // Waits for a pending asynchronous save; rethrows its error.
  void Wait();

  // The latest checkpoint prefix of `dir` per its state file, if any.
  static std::optional<std::string> LatestCheckpoint(const std::string& dir);
  // The prefix of the newest checkpoint saved while training was healthy, if any.
  static std::optional<std::string> LastHealthyCheckpoint(const std::string& dir);
  // "<dir>/ckpt-%08d" for a step.
  static std::string CheckpointPrefix(const std::string& dir, int64_t step);

 private:
  void Write(std::string prefix, std::map<std::string, at::Tensor> tensors,
             std::map<std::string, std::string> metadata, double timestamp, bool healthy);
  struct Check {
    std::regex regex;
    std::string pattern;
    bool finite_only;
    double low, high;
  };
  SaverOptions options_;
  std::vector<Check> checks_;
  struct Pending;
  std::unique_ptr<Pending> pending_;
};

// The state a directory's checkpoint files imply (`ckpt-<step>.safetensors` or its index; files
// set aside as `*.corrupt` ignored), oldest first, timestamps from the files' modification times:
// for a state file that is missing, empty or unreadable while checkpoints exist.
CheckpointState CheckpointStateFromFiles(const std::string& dir);

// The checkpoints of `dir` that exist: those its state file lists whose files are there, and those
// on disk it does not list (a state file from before a crash or a backup), oldest first by step;
// model_checkpoint_path is the newest. A missing or unreadable state file gives the files on disk.
CheckpointState ExistingCheckpoints(const std::string& dir);

// The checkpoint a user names: `given` (a prefix, or one of its files: ".safetensors" and
// ".safetensors.index.json" are dropped) when its files exist, or with `given` empty the newest
// checkpoint of `train_dir` (ExistingCheckpoints). NotFound naming what is missing.
std::string ResolveCheckpoint(const std::string& given, const std::string& train_dir);

// Model-parallel checkpoints. Variables no rank holds whole, or that some ranks lack (GShard's
// experts, a pipeline stage's layers, a model axis's blocks of heads and hidden units, with their
// optimizer slots and averages), are written by the ranks that hold them, rank r of n to
// `<prefix>-rank-%05d-of-%05d.safetensors` (SaveRankPieces), before the chief writes the
// checkpoint itself with metadata sharded_ranks = n; a checkpoint is visible only through the
// chief's file and the state file, so one whose ranks did not all finish never is. Each tensor of
// a rank file is a piece of its variable: block `index` of `count` along `dim`, or the whole
// variable (count 1). LoadCheckpoint joins every variable's pieces: a sharded checkpoint loads as
// the whole model, which SlicePieces cuts for any other mesh (re-meshing), or not at all (export,
// eval in one process).
inline constexpr const char* kShardedRanksMetadata = "sharded_ranks";
std::string RankShardPath(const std::string& prefix, int rank, int ranks);
// Where a rank's values of a variable sit in the whole variable: block `index` of `count` equal
// blocks along `dim` (count 1: the whole variable).
struct ShardPiece {
  int64_t dim = 0;
  int index = 0;
  int count = 1;
  bool operator==(const ShardPiece&) const = default;
};
// By variable name; a variable's slots and averages ("<variable>/...") are its pieces alike.
using ShardLayout = std::map<std::string, ShardPiece>;
// The piece of tensor `name` (its variable's, or that of the variable it is a slot of), or null;
// with `variable`, that variable's name there.
const ShardPiece* FindPiece(const ShardLayout& layout, const std::string& name,
                            std::string* variable = nullptr);
// Rank `rank` of `ranks` writes `tensors`, each with its piece in `layout` (InvalidArgument for a
// tensor `layout` does not place).
void SaveRankPieces(const std::string& prefix, int rank, int ranks,
                    const std::map<std::string, at::Tensor>& tensors, const ShardLayout& layout);
// Replaces every tensor of `contents` that `layout` places by its piece of it. InvalidArgument
// naming a tensor whose dim does not divide (or is missing).
void SlicePieces(SafetensorsContents& contents, const ShardLayout& layout);
// Older checkpoints' rank files: blocks of dim 0 in every rank's file ("blocks"), or variables
// each in one rank's file ("whole"); tests write them to check they still load.
void SaveRankShard(const std::string& prefix, int rank, int ranks,
                   const std::map<std::string, at::Tensor>& tensors, bool whole = false);

// Adds the rank files' pieces of a checkpoint sharded over `ranks` ranks to `contents`, each
// variable's pieces joined (what LoadCheckpoint does for sharded_ranks). DataLoss naming the file
// for a missing file, a piece that is also elsewhere, pieces that do not make up their variable.
void MergeRankShards(const std::string& prefix, int ranks, SafetensorsContents& contents);

// Loads a checkpoint by prefix ("<dir>/ckpt-00001000"), or the latest in a directory. A sharded
// checkpoint's rank files must all be there, name the same tensors with the same trailing shapes
// and dtypes, and hold none of the chief's; otherwise DataLoss naming the file.
SafetensorsContents LoadCheckpoint(const std::string& prefix);
SafetensorsContents LoadLatestCheckpoint(const std::string& dir);  // NotFound when none

// Copies checkpoint values into `variables` (full name -> tensor, updated in place). Every missing
// name, every shape or dtype mismatch, and every tensor inside the model's layers that is no
// variable (nor a slot or average of one: another model's checkpoint) is reported at once
// (InvalidArgument).
void RestoreVariables(const SafetensorsContents& checkpoint,
                      const std::map<std::string, at::Tensor>& variables);

// Lingvo's init_from_checkpoint_rules for warm starts: for each checkpoint, rules
// [(var_regex, name_format)] and ignore regexes. Each variable takes the first rule whose regex
// matches its whole name (and no ignore regex), reading the checkpoint tensor named
// name_format with %s replaced by the match groups in order. A rule set that matches no variable
// is InvalidArgument. Returns the names initialized.
struct InitRules {
  std::vector<std::pair<std::string, std::string>> rules;
  std::vector<std::string> ignore;
};
std::vector<std::string> InitFromCheckpointRules(
    const std::map<std::string, InitRules>& rules_by_checkpoint,
    const std::map<std::string, at::Tensor>& variables);

}  // namespace glossa
