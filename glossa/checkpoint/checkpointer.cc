#include "glossa/checkpoint/checkpointer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

// The training input's position, per task ("<task>/" prefix in a multi-task model).
constexpr const char* kInputPosition = "__input_position__";

bool IsEmaName(const std::string& name) {
  const std::string suffix = ExponentialMovingAverage::kSuffix;
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::map<std::string, at::Tensor> CheckpointTensors(const BaseModel& model,
                                                    const ExponentialMovingAverage* ema,
                                                    int64_t global_step) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [info, t] : model.AllVariables()) out[info.full_name] = t;
  // Learner slots; a multi-task model's under "<task>/" (each task has its own learner).
  for (const auto& task_name : model.task_names()) {
    const std::string prefix = model.is_multi_task() ? task_name + "/" : "";
    for (const auto& [name, t] : model.GetTask(task_name).learner().Slots()) out[prefix + name] = t;
  }
  if (ema) {
    for (const auto& [name, t] : ema->Shadows()) out[name] = t;
  }
  for (const auto& task_name : model.task_names()) {
    const std::string prefix = model.is_multi_task() ? task_name + "/" : "";
    if (!model.GetTask(task_name).has_input()) continue;
    out[prefix + kInputPosition] =
        at::full({}, model.GetTask(task_name).input().position(), at::kLong);
  }
  out["global_step"] = at::full({}, global_step, at::kLong);
  return out;
}

std::shared_ptr<ExponentialMovingAverage> MakeModelEma(BaseModel& model) {
  const Params& tp = model.task().train_params();
  if (!(tp.GetFloat("ema_decay") > 0) && !tp.IsSet("ema_schedule")) return nullptr;
  Params ep = ExponentialMovingAverage::Params();
  ep.Set("decay", tp.GetFloat("ema_decay") > 0 ? tp.GetFloat("ema_decay") : 0.999);
  if (tp.IsSet("ema_schedule")) ep.Set("ema_schedule", tp.Get("ema_schedule"));
  auto ema = std::make_shared<ExponentialMovingAverage>(ep);
  ema->Track(model);
  model.SetEma(ema);
  return ema;
}

std::optional<int64_t> RestoreForEval(const SafetensorsContents& ckpt, BaseModel& model,
                                      ExponentialMovingAverage* ema,
                                      bool missing_shadows_from_variables) {
  std::map<std::string, at::Tensor> vars;
  for (const auto& [info, t] : model.AllVariables()) vars[info.full_name] = t;
  RestoreVariables(ckpt, vars);
  if (ema) {
    std::vector<std::string> missing;
    for (const auto& [name, shadow] : ema->Shadows()) {
      auto it = ckpt.tensors.find(name);
      if (it != ckpt.tensors.end()) {
        ema->SetShadow(name, it->second);
        continue;
      }
      const std::string var = name.substr(0, name.size() - std::string(ExponentialMovingAverage::kSuffix).size());
      if (missing_shadows_from_variables && vars.count(var)) {
        ema->SetShadow(name, vars.at(var));
      } else {
        missing.push_back(var);
      }
    }
    if (!missing.empty()) {
      const size_t shown = std::min<size_t>(missing.size(), 5);
      throw NotFoundError(StrCat(
          "the checkpoint has no ExponentialMovingAverage for ", missing.size(), " variable(s) (",
          Join(std::vector<std::string>(missing.begin(), missing.begin() + shown), ", "),
          missing.size() > shown ? ", ..." : "",
          "): it was saved without EMA; evaluating would score the averages' initial values. "
          "Evaluate its raw weights with task.train.ema_decay : 0"));
    }
  }
  auto it = ckpt.tensors.find("global_step");
  if (it == ckpt.tensors.end()) return std::nullopt;
  return it->second.item<int64_t>();
}

namespace {

// The input position stored under `key`: an integer scalar in [0, global_step] (training takes
// one batch per step: a position past the step is damage, not a reason to read the data for
// hours). DataLoss otherwise.
int64_t CheckedInputPosition(const SafetensorsContents& ckpt, const std::string& key) {
  const at::Tensor& t = ckpt.tensors.at(key);
  if (t.numel() != 1 || at::isFloatingType(t.scalar_type()) || t.scalar_type() == at::kBool) {
    throw DataLossError(StrCat("checkpoint tensor '", key, "' is not an integer scalar"));
  }
  const int64_t n = t.to(at::kLong).reshape({}).item<int64_t>();
  auto step_it = ckpt.tensors.find("global_step");
  const int64_t step = step_it == ckpt.tensors.end()
                           ? 0
                           : step_it->second.to(at::kLong).reshape({-1})[0].item<int64_t>();
  if (n < 0 || n > step) {
    throw DataLossError(StrCat("checkpoint tensor '", key, "' is ", n,
                               ", outside [0, global_step ", step, "] (one batch per step)"));
  }
  return n;
}

}  // namespace

std::optional<int64_t> CheckedGlobalStep(const SafetensorsContents& ckpt,
                                         const std::string& prefix) {
  auto it = ckpt.tensors.find("global_step");
  if (it == ckpt.tensors.end()) return std::nullopt;
  const at::Tensor& t = it->second;
  if (t.numel() != 1 || at::isFloatingType(t.scalar_type()) || t.scalar_type() == at::kBool) {
    throw DataLossError(StrCat("checkpoint '", prefix, "': global_step is ",
                               c10::toString(t.scalar_type()), " ", t.sizes(),
                               ", not an integer scalar"));
  }
  const int64_t step = t.to(at::kLong).reshape({}).item<int64_t>();
  if (step < 0) {
    throw DataLossError(StrCat("checkpoint '", prefix, "': global_step is ", step, " (negative)"));
  }
  const std::string name = prefix.substr(prefix.rfind('/') + 1);
  if (name.rfind("ckpt-", 0) == 0 && name.size() > 5 && name.size() <= 5 + 18 &&
      name.find_first_not_of("0123456789", 5) == std::string::npos &&
      std::stoll(name.substr(5)) != step) {
    throw DataLossError(StrCat("checkpoint '", prefix, "': global_step is ", step,
                               ", but the name says step ", std::stoll(name.substr(5))));
  }
  return step;
}

int64_t RestoreCheckpoint(const SafetensorsContents& whole, BaseModel& model,
                          ExponentialMovingAverage* ema) {
  // A pipeline stage's model: the other stages' tensors (variables, slots, averages) are theirs.
  const std::vector<std::string> remote = model.RemoteScopes();
  SafetensorsContents own;
  if (!remote.empty()) {
    own.metadata = whole.metadata;
    for (const auto& [name, t] : whole.tensors) {
      const bool theirs = std::any_of(remote.begin(), remote.end(), [&](const std::string& s) {
        return name.size() > s.size() && name.compare(0, s.size(), s) == 0 && name[s.size()] == '/';
      });
      if (!theirs) own.tensors.emplace(name, t);
    }
  }
  const SafetensorsContents& ckpt = remote.empty() ? whole : own;
  const std::optional<int64_t> step =
      RestoreForEval(ckpt, model, ema, /*missing_shadows_from_variables=*/true);
  if (!step) throw DataLossError("checkpoint has no global_step");
  std::map<std::string, at::Tensor> vars;
  for (const auto& [info, t] : model.AllVariables()) vars[info.full_name] = t;
  for (const auto& [name, t] : ckpt.tensors) {
    if (vars.count(name) || name == "global_step" || IsEmaName(name)) continue;
    const std::string pos_suffix = kInputPosition;
    if (name.size() >= pos_suffix.size() &&
        name.compare(name.size() - pos_suffix.size(), pos_suffix.size(), pos_suffix) == 0) {
      continue;  // the input position: RestoreInputPositions
    }
    // A slot of a variable ("<var>/<optimizer>/<slot>") must match it in dtype and shape: look
    // the name's prefixes up, longest first.
    for (size_t slash = name.rfind('/'); slash != std::string::npos && slash > 0;
         slash = name.rfind('/', slash - 1)) {
      auto v = vars.find(name.substr(0, slash));
      if (v == vars.end()) continue;
      if (t.scalar_type() != v->second.scalar_type() || t.sizes() != v->second.sizes()) {
        throw InvalidArgumentError(StrCat(
            "checkpoint tensor '", name, "' (a learner slot of '", v->first, "') is ",
            c10::toString(t.scalar_type()), " ", t.sizes(), ", but the variable is ",
            c10::toString(v->second.scalar_type()), " ", v->second.sizes()));
      }
      break;
    }
    // Optimizer slots and tracker state.
    if (!model.is_multi_task()) {
      model.task().learner().SetSlot(name, t);
      continue;
    }
    const auto slash = name.find('/');
    const std::string task_name = slash == std::string::npos ? "" : name.substr(0, slash);
    const auto names = model.task_names();
    if (std::find(names.begin(), names.end(), task_name) == names.end()) {
      throw DataLossError(
          StrCat("checkpoint tensor '", name, "' is neither a variable nor a task's learner slot"));
    }
    model.GetTask(task_name).learner().SetSlot(name.substr(slash + 1), t);
  }
  return *step;
}

std::map<std::string, InitRules> ParseInitFromCheckpointRules(const ParamValue& value) {
  std::map<std::string, InitRules> rules;
  for (const auto& [ckpt, v] : value.AsDict()) {
    const std::string where = StrCat("init_from_checkpoint_rules['", ckpt, "']");
    const auto& pair = v.AsList();
    if (pair.size() != 2) {
      throw InvalidArgumentError(StrCat(where,
                                        " must be [[(regex, format), ...], [ignore, ...]], got ",
                                        pair.size(), " elements"));
    }
    InitRules r;
    for (const auto& rule : pair[0].AsList()) {
      const auto& rf = rule.AsList();
      if (rf.size() != 2) {
        throw InvalidArgumentError(
            StrCat(where, ": each rule must be a (var_regex, name_format) pair"));
      }
      r.rules.emplace_back(rf[0].AsString(), rf[1].AsString());
    }
    for (const auto& ig : pair[1].AsList()) r.ignore.push_back(ig.AsString());
    rules[ckpt] = std::move(r);
  }
  return rules;
}

Checkpointer::Checkpointer(const std::string& train_dir, BaseModel& model,
                           ExponentialMovingAverage* ema, std::function<double()> clock)
    : train_dir_(train_dir), model_(model), ema_(ema), clock_(std::move(clock)) {
  const Params& tp = model_.task().train_params();
  SaverOptions so;
  so.dir = train_dir_;
  so.keep_latest_n = tp.GetInt("save_max_to_keep");
  so.keep_every_n_hours = tp.GetFloat("save_keep_checkpoint_every_n_hours");
  so.async = tp.GetBool("async_checkpointing");
  so.clock = clock_;
  saver_ = std::make_unique<Saver>(so);
  if (tp.GetBool("checkpoint_finite_check")) saver_->AddIsFiniteCheck(".*");
  saver_->AddInRangeCheck(
      "global_step", 0, static_cast<double>(tp.GetInt("max_steps") + tp.GetInt("steps_per_loop")));
  if (tp.IsSet("save_interval_steps")) save_interval_steps_ = tp.GetInt("save_interval_steps");
  save_interval_seconds_ = tp.GetFloat("save_interval_seconds");
  last_save_time_ = clock_();
}

Checkpointer::~Checkpointer() = default;

namespace {

using LogFn = std::function<void(const std::string&)>;

// The state file lists the checkpoints. Missing, empty or unreadable while checkpoint files
// exist, it is rebuilt from them: a run never starts over on top of its checkpoints.
CheckpointState ReadOrRebuildState(const std::string& train_dir, const std::string& state_path,
                                   const LogFn& log) {
  CheckpointState state;
  std::string state_problem;
  try {
    state = ReadCheckpointState(train_dir);
    if (state.model_checkpoint_path.empty()) {
      state_problem = FileExists(state_path) ? "is empty" : "is missing";
    }
  } catch (const DataLossError& e) {
    state_problem = StrCat("is unreadable (", e.message(), ")");
  }
  if (!state_problem.empty()) {
    CheckpointState rebuilt = CheckpointStateFromFiles(train_dir);
    if (!rebuilt.model_checkpoint_path.empty()) {
      log(StrCat("WARNING: the checkpoint state file ", state_path, " ", state_problem,
                 "; rebuilt it from the ", rebuilt.all_model_checkpoint_paths.size(),
                 " checkpoint(s) on disk"));
      AtomicWriteFile(state_path, FormatCheckpointState(rebuilt));
      state = rebuilt;
    } else if (state_problem.rfind("is unreadable", 0) == 0) {
      throw DataLossError(StrCat("the checkpoint state file ", state_path, " ", state_problem,
                                 " and no checkpoint files are in ", train_dir,
                                 "; remove it to start from step 0"));
    }
  }
  return state;
}

// The checkpoints to try, in order: newest first, so that a corrupt or missing latest checkpoint
// falls back to the newest good one.
std::vector<std::string> RestoreCandidates(const CheckpointState& state,
                                           const std::string& train_dir) {
  std::vector<std::string> candidates = {state.model_checkpoint_path};
  for (auto it = state.all_model_checkpoint_paths.rbegin();
       it != state.all_model_checkpoint_paths.rend(); ++it) {
    if (*it != state.model_checkpoint_path) candidates.push_back(*it);
  }
  // Then checkpoints on disk the state file does not list, newest first: a state file that
  // names only deleted or corrupt checkpoints must not hide good ones.
  const CheckpointState on_disk = CheckpointStateFromFiles(train_dir);
  for (auto it = on_disk.all_model_checkpoint_paths.rbegin();
       it != on_disk.all_model_checkpoint_paths.rend(); ++it) {
    if (std::find(candidates.begin(), candidates.end(), *it) == candidates.end()) {
      candidates.push_back(*it);
    }
  }
  return candidates;
}

// What restoring found: the checkpoint restored, its step and contents, and the candidates tried
// before it that could not be restored ("name: why").
struct Restored {
  std::string name;
  int64_t step = 0;
  SafetensorsContents contents;
  std::vector<std::string> bad;
};

// Restores the first of `candidates` that loads and passes its checks into `model` (and `ema`);
// DataLoss listing why each failed when none does (nothing was changed then).

Restored RestoreFirstGood(const std::vector<std::string>& candidates,
                          const std::string& train_dir, BaseModel& model,
                          ExponentialMovingAverage* ema, const ShardLayout& shards) {
  Restored out;
  std::optional<std::string> restored;
  for (const auto& name : candidates) {
    const std::string prefix = JoinPath(train_dir, name);
    try {
      out.contents = LoadCheckpoint(prefix);
      CheckedGlobalStep(out.contents, prefix);
      SlicePieces(out.contents, shards);  // this rank's pieces of the variables it shares
      for (const auto& [name, t] : out.contents.tensors) {
        const std::string pos = kInputPosition;
        if (name.size() >= pos.size() &&
            name.compare(name.size() - pos.size(), pos.size(), pos) == 0) {
          CheckedInputPosition(out.contents, name);
        }
      }
      out.step = RestoreCheckpoint(out.contents, model, ema);
      restored = name;
      break;
    } catch (const DataLossError& e) {
      out.bad.push_back(StrCat(name, ": ", e.message()));
    } catch (const NotFoundError& e) {
      out.bad.push_back(StrCat(name, ": ", e.message()));
    }
  }
  if (!restored) {
    throw DataLossError(StrCat("no checkpoint in ", train_dir, " can be restored (",
                               Join(out.bad, "; "), "); nothing was changed"));
  }
  out.name = *restored;
  return out;
}

// After a restore that skipped bad checkpoints or restored one the state file did not list: the
// bad ones are set aside (renamed *.corrupt, not deleted) and the state file is rewritten without
// them, with the restored one (stamped `now()` when the file keeps timestamps).
void RepairStateFile(const CheckpointState& state, const Restored& r, const std::string& train_dir,
                     const std::string& state_path, const std::function<double()>& now,
                     const LogFn& log) {
  const auto& listed = state.all_model_checkpoint_paths;
  if (r.bad.empty() && std::find(listed.begin(), listed.end(), r.name) != listed.end()) return;
  // Set the bad ones aside (renamed, not deleted) and drop them from the state file.
  CheckpointState next;
  next.last_preserved_timestamp = state.last_preserved_timestamp;
  next.model_checkpoint_path = r.name;
  for (size_t i = 0; i < state.all_model_checkpoint_paths.size(); ++i) {
    const std::string& p = state.all_model_checkpoint_paths[i];
    if (std::any_of(r.bad.begin(), r.bad.end(),
                    [&](const std::string& b) { return b.rfind(p + ": ", 0) == 0; })) {
      continue;
    }
    next.all_model_checkpoint_paths.push_back(p);
    if (i < state.all_model_checkpoint_timestamps.size()) {
      next.all_model_checkpoint_timestamps.push_back(state.all_model_checkpoint_timestamps[i]);
    }
  }
  if (std::find(listed.begin(), listed.end(), r.name) == listed.end()) {
    log(StrCat("WARNING: the checkpoint state file ", state_path, " did not list ", r.name,
               " (found on disk); added it"));
    next.all_model_checkpoint_paths.push_back(r.name);
    if (!next.all_model_checkpoint_timestamps.empty() ||
        next.all_model_checkpoint_paths.size() == 1) {
      next.all_model_checkpoint_timestamps.push_back(now());
    }
  }
  for (const auto& b : r.bad) {
    const std::string name = b.substr(0, b.find(": "));
    for (const auto& file : SafetensorsFiles(JoinPath(train_dir, name))) {
      std::rename(file.c_str(), (file + ".corrupt").c_str());
    }
    log(StrCat("WARNING: checkpoint ", JoinPath(train_dir, name), " cannot be restored (",
               b.substr(b.find(": ") + 2), "); set aside as *.corrupt"));
  }
  AtomicWriteFile(state_path, FormatCheckpointState(next));
}

// Without a checkpoint to restore: the variables task.train.init_from_checkpoint_rules names, when
// it names any, from their checkpoints.
void InitializeFromRules(BaseModel& model, const LogFn& log) {
  const ParamValue& rules = model.task().train_params().Get("init_from_checkpoint_rules");
  if (!rules.AsDict().empty()) {
    std::map<std::string, at::Tensor> vars;
    for (const auto& [info, t] : model.AllVariables()) vars[info.full_name] = t;
    const auto done = InitFromCheckpointRules(ParseInitFromCheckpointRules(rules), vars);
    log(StrCat("initialized ", done.size(), " variables from init_from_checkpoint_rules"));
  }
}

}  // namespace

int64_t Checkpointer::RestoreOrInitialize(const std::function<void(const std::string&)>& log) {
  int64_t step = 0;
  const std::string state_path = JoinPath(train_dir_, "checkpoint");
  const CheckpointState state = ReadOrRebuildState(train_dir_, state_path, log);
  if (!state.model_checkpoint_path.empty()) {
    const Restored r = RestoreFirstGood(RestoreCandidates(state, train_dir_), train_dir_, model_,
                                        ema_, shard_layout_);
    step = r.step;
    restored_prefix_ = JoinPath(train_dir_, r.name);
    RepairStateFile(state, r, train_dir_, state_path, clock_, log);
    log(StrCat("restored ", JoinPath(train_dir_, r.name), " at step ", step));
    restored_ = true;
    RestoreInputPositions(r.contents, model_, log, stop_requested_);
  } else {
    InitializeFromRules(model_, log);
  }
  last_save_step_ = step;
  last_save_time_ = clock_();
  return step;
}

void Checkpointer::RestoreInputPositions(const SafetensorsContents& ckpt, BaseModel& model_,
                                         const std::function<void(const std::string&)>& log,
                                         const std::function<bool()>& stop) {
  for (const auto& task_name : model_.task_names()) {
    const std::string key = (model_.is_multi_task() ? task_name + "/" : "") + kInputPosition;
    auto it = ckpt.tensors.find(key);
    if (it == ckpt.tensors.end() || !model_.GetTask(task_name).has_input()) continue;
    const int64_t n = CheckedInputPosition(ckpt, key);
    BaseInputGenerator& input = model_.GetTask(task_name).input();
    if (n <= input.position()) continue;
    const auto start = std::chrono::steady_clock::now();
    // In chunks, asking `stop` between them: a stop request ends a long skip at once.
    while (input.position() < n) {
      if (stop && stop()) {
        log(StrCat("input", model_.is_multi_task() ? StrCat(" of task ", task_name) : std::string(),
                   ": stopped at batch ", input.position(), " of the ", n,
                   " to skip to the checkpoint's input position"));
        return;
      }
      input.SkipBatches(std::min<int64_t>(64, n - input.position()));
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f", secs);
    log(StrCat("input", model_.is_multi_task() ? StrCat(" of task ", task_name) : std::string(),
               ": skipped ", n, " batches to the checkpoint's input position (", buf, " s)"));
  }
}

bool Checkpointer::SaveDue(int64_t global_step) const {
  return save_interval_steps_ ? global_step - last_save_step_ >= *save_interval_steps_
                              : clock_() - last_save_time_ >= save_interval_seconds_;
}

bool Checkpointer::IsNew(int64_t global_step) const {
  return !(global_step == last_save_step_ && Saver::LatestCheckpoint(train_dir_));
}

bool Checkpointer::MaybeSave(int64_t global_step, bool healthy) {
  if (!SaveDue(global_step)) return false;
  Save(global_step, healthy);
  return true;
}

bool Checkpointer::SaveIfNew(int64_t global_step, bool healthy) {
  if (!IsNew(global_step)) return false;
  Save(global_step, healthy);
  return true;
}

void Checkpointer::SetShards(ShardLayout layout, int ranks) {
  shard_layout_ = std::move(layout);
  shard_ranks_ = ranks;
}

void Checkpointer::Save(int64_t global_step, bool healthy) {
  std::map<std::string, at::Tensor> tensors = CheckpointTensors(model_, ema_, global_step);
  std::map<std::string, std::string> metadata;
  if (shard_ranks_ > 0 && !shard_layout_.empty()) {
    for (auto it = tensors.begin(); it != tensors.end();) {
      it = FindPiece(shard_layout_, it->first) != nullptr ? tensors.erase(it) : std::next(it);
    }
    metadata[kShardedRanksMetadata] = StrCat(shard_ranks_);
  }
  saver_->Save(global_step, tensors, std::move(metadata), healthy);
  last_save_step_ = global_step;
  last_save_time_ = clock_();
}

void Checkpointer::Wait() { saver_->Wait(); }

}  // namespace glossa
