#include "glossa/checkpoint/saver.h"

#include <ATen/ATen.h>
#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <set>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sys/stat.h>

#include <exception>
#include <sstream>
#include <thread>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/base/thread_state.h"

namespace glossa {
namespace {

double SystemNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

bool IsCheckpointFile(const std::string& name) {
  if (name.rfind("ckpt-", 0) != 0) return false;
  size_t i = 5;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  return i > 5 && i - 5 <= 18;  // a step fits an int64
}

}  // namespace

std::string FormatCheckpointState(const CheckpointState& s) {
  std::ostringstream out;
  out.precision(17);
  out << "model_checkpoint_path: " << Quote(s.model_checkpoint_path) << "\n";
  for (const auto& p : s.all_model_checkpoint_paths) {
    out << "all_model_checkpoint_paths: " << Quote(p) << "\n";
  }
  for (double t : s.all_model_checkpoint_timestamps) {
    out << "all_model_checkpoint_timestamps: " << PyFloatRepr(t) << "\n";
  }
  out << "last_preserved_timestamp: " << PyFloatRepr(s.last_preserved_timestamp) << "\n";
  return out.str();
}

CheckpointState ReadCheckpointState(const std::string& dir) {
  const std::string path = JoinPath(dir, "checkpoint");
  CheckpointState s;
  if (!FileExists(path)) return s;
  const std::string text = ReadFileToString(path, 64 << 20);
  int line_no = 0;
  for (const std::string& raw : Split(text, '\n')) {
    ++line_no;
    std::string_view line = Strip(raw);
    if (line.empty()) continue;
    const size_t colon = line.find(':');
    auto fail = [&](const std::string& why) {
      return DataLossError(StrCat("checkpoint state file '", path, "' line ", line_no, ": ", why));
    };
    if (colon == std::string_view::npos) throw fail("expected <field>: <value>");
    const std::string key(Strip(line.substr(0, colon)));
    const std::string value(Strip(line.substr(colon + 1)));
    auto unquote = [&]() {
      if (value.size() < 2 || value.front() != '"' || value.back() != '"')
        throw fail("expected a quoted path");
      std::string out;
      for (size_t i = 1; i + 1 < value.size(); ++i) {
        if (value[i] == '\\' && i + 2 < value.size()) ++i;
        out += value[i];
      }
      return out;
    };
    auto number = [&]() {
      char* end = nullptr;
      const double d = std::strtod(value.c_str(), &end);
      if (value.empty() || end != value.c_str() + value.size()) throw fail("expected a number");
      return d;
    };
    // The saver writes names of this directory's checkpoints; a path elsewhere (another run's
    // "../../other/train/ckpt-N", an absolute one) would resume weights that are not this run's.
    auto name = [&](bool empty_ok) {
      std::string n = unquote();
      if (n.empty() && empty_ok) return n;  // no checkpoint yet
      if (n.empty() || n == "." || n == ".." || n.find('/') != std::string::npos) {
        throw fail(StrCat("'", n, "' is not a checkpoint name in ", dir,
                          " (entries name checkpoints of this directory, e.g. ckpt-00000100)"));
      }
      return n;
    };
    if (key == "model_checkpoint_path") {
      s.model_checkpoint_path = name(true);
    } else if (key == "all_model_checkpoint_paths") {
      s.all_model_checkpoint_paths.push_back(name(false));
    } else if (key == "all_model_checkpoint_timestamps") {
      s.all_model_checkpoint_timestamps.push_back(number());
    } else if (key == "last_preserved_timestamp") {
      s.last_preserved_timestamp = number();
    } else {
      throw fail(StrCat("unknown field '", key, "'"));
    }
  }
  if (!s.all_model_checkpoint_timestamps.empty() &&
      s.all_model_checkpoint_timestamps.size() != s.all_model_checkpoint_paths.size()) {
    throw DataLossError(StrCat("checkpoint state file '", path,
                               "': ", s.all_model_checkpoint_paths.size(), " paths but ",
                               s.all_model_checkpoint_timestamps.size(), " timestamps"));
  }
  return s;
}

std::vector<std::string> CheckpointsToKeep(const std::vector<std::pair<double, std::string>>& all,
                                           int64_t keep_latest_n, double keep_every_n_hours) {
  auto sorted = all;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<bool> keep(sorted.size(), keep_latest_n <= 0);
  if (keep_latest_n > 0) {
    for (size_t i =
             sorted.size() > static_cast<size_t>(keep_latest_n) ? sorted.size() - keep_latest_n : 0;
         i < sorted.size(); ++i) {
      keep[i] = true;
    }
  }
  if (keep_every_n_hours > 0) {
    double last_kept = 0;
    for (size_t i = 0; i < sorted.size(); ++i) {
      if (i == 0 || sorted[i].first > last_kept + 3600.0 * keep_every_n_hours) {
        keep[i] = true;
        last_kept = sorted[i].first;
      }
    }
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (keep[i]) out.push_back(sorted[i].second);
  }
  return out;
}

struct Saver::Pending {
  std::thread thread;
  std::exception_ptr error;
};

Saver::Saver(SaverOptions options) : options_(std::move(options)) {
  if (options_.dir.empty()) throw InvalidArgumentError("Saver: dir is empty");
  if (!options_.clock) options_.clock = SystemNow;
  CreateDirectories(options_.dir);
}

Saver::~Saver() {
  try {
    Wait();
  } catch (const std::exception& e) {
    LOG(ERROR) << "asynchronous checkpoint save failed: " << e.what();
  }
}

void Saver::AddIsFiniteCheck(const std::string& name_regex) {
  checks_.push_back({std::regex(name_regex), name_regex, true, 0, 0});
}

void Saver::AddInRangeCheck(const std::string& name_regex, double low, double high) {
  checks_.push_back({std::regex(name_regex), name_regex, false, low, high});
}

std::string Saver::CheckpointPrefix(const std::string& dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "ckpt-%08ld", static_cast<long>(step));
  return JoinPath(dir, name);
}

void Saver::Wait() {
  if (!pending_) return;
  if (pending_->thread.joinable()) pending_->thread.join();
  std::exception_ptr error = pending_->error;
  pending_.reset();
  if (error) std::rethrow_exception(error);
}

std::string Saver::Save(int64_t global_step, const std::map<std::string, at::Tensor>& tensors,
                        std::map<std::string, std::string> metadata, bool healthy) {
  Wait();  // the previous asynchronous save, if any, first
  const std::string prefix = CheckpointPrefix(options_.dir, global_step);
  std::map<std::string, at::Tensor> copy;
  for (const auto& [k, t] : tensors) copy[k] = t.detach().to(at::kCPU).clone();
  if (!copy.count("global_step")) copy["global_step"] = at::full({}, global_step, at::kLong);
  metadata["format_version"] = kCheckpointFormatVersion;
  if (!healthy) metadata["healthy"] = "false";
  // Sanity checks, before anything becomes visible.
  for (const auto& check : checks_) {
    for (const auto& [name, t] : copy) {
      if (check.pattern != ".*" && !std::regex_match(name, check.regex)) continue;
      std::string reason;
      if (check.finite_only) {
        if (t.is_floating_point() && !at::isfinite(t).all().item<bool>()) {
          reason = StrCat("variable '", name, "' has NaN or Inf values (IsFinite)");
        }
      } else {
        const at::Tensor d = t.to(at::kDouble);
        if (d.numel() &&
            (d.min().item<double>() < check.low || d.max().item<double>() > check.high)) {
          reason = StrCat("variable '", name, "' is outside [", PyFloatRepr(check.low), ", ",
                          PyFloatRepr(check.high), "] (InRange): min ",
                          PyFloatRepr(d.min().item<double>()), ", max ",
                          PyFloatRepr(d.max().item<double>()));
        }
      }
      if (!reason.empty()) {
        AtomicWriteFile(prefix + ".failed", reason + "\n");
        throw AbortedError(StrCat("checkpoint '", prefix, "' failed its sanity check: ", reason));
      }
    }
  }
  const double timestamp = options_.clock();
  if (!options_.async) {
    Write(prefix, std::move(copy), std::move(metadata), timestamp, healthy);
    return prefix;
  }
  pending_ = std::make_unique<Pending>();
  Pending* p = pending_.get();
  p->thread = StartThread(ThreadState::Fresh(), [this, p, prefix, copy = std::move(copy),
                                                 metadata = std::move(metadata), timestamp,
                                                 healthy]() mutable {
    try {
      Write(prefix, std::move(copy), std::move(metadata), timestamp, healthy);
    } catch (...) {
      p->error = std::current_exception();
    }
  });
  return prefix;
}

void Saver::Write(std::string prefix, std::map<std::string, at::Tensor> tensors,
                  std::map<std::string, std::string> metadata, double timestamp, bool healthy) {
  SaveSafetensorsSharded(prefix, tensors, metadata, options_.max_shard_bytes);
  // The state file is re-read so that retention survives restarts.
  CheckpointState state = ReadCheckpointState(options_.dir);
  const std::string name = prefix.substr(prefix.rfind('/') + 1);
  std::vector<std::pair<double, std::string>> all;
  for (size_t i = 0; i < state.all_model_checkpoint_paths.size(); ++i) {
    if (state.all_model_checkpoint_paths[i] == name) continue;  // re-saved: the new one replaces it
    all.emplace_back(i < state.all_model_checkpoint_timestamps.size()
                         ? state.all_model_checkpoint_timestamps[i]
                         : 0.0,
                     state.all_model_checkpoint_paths[i]);
  }
  all.emplace_back(timestamp, name);
  std::vector<std::string> keep =
      CheckpointsToKeep(all, options_.keep_latest_n, options_.keep_every_n_hours);
  // The newest checkpoint of healthy training survives any number of unhealthy ones.
  const std::string healthy_file = JoinPath(options_.dir, "healthy_checkpoint");
  std::string protect = name;
  if (!healthy) {
    protect.clear();
    if (auto h = LastHealthyCheckpoint(options_.dir)) protect = h->substr(h->rfind('/') + 1);
  }
  if (!protect.empty() && std::find(keep.begin(), keep.end(), protect) == keep.end() &&
      std::any_of(all.begin(), all.end(), [&](const auto& a) { return a.second == protect; })) {
    keep.push_back(protect);
  }
  CheckpointState next;
  next.model_checkpoint_path = name;
  next.last_preserved_timestamp = state.last_preserved_timestamp;
  for (const auto& [ts, path] : all) {
    if (std::find(keep.begin(), keep.end(), path) == keep.end()) continue;
    next.all_model_checkpoint_paths.push_back(path);
    next.all_model_checkpoint_timestamps.push_back(ts);
  }
  if (options_.keep_every_n_hours > 0 && !keep.empty()) {
    next.last_preserved_timestamp =
        std::max(next.last_preserved_timestamp, next.all_model_checkpoint_timestamps.front());
  }
  AtomicWriteFile(JoinPath(options_.dir, "checkpoint"), FormatCheckpointState(next));
  if (healthy) AtomicWriteFile(healthy_file, name + "\n");
  // Delete the files of checkpoints no longer kept (only files named ckpt-<digits>...).
  for (const auto& [ts, path] : all) {
    if (std::find(keep.begin(), keep.end(), path) != keep.end()) continue;
    for (const auto& file : ListDirectory(options_.dir)) {
      if (IsCheckpointFile(file) &&
          (file == path + ".safetensors" || file.rfind(path + "-", 0) == 0 ||
           file == path + ".safetensors.index.json")) {
        RemoveFileIfExists(JoinPath(options_.dir, file));
      }
    }
  }
}

std::optional<std::string> Saver::LatestCheckpoint(const std::string& dir) {
  const CheckpointState s = ReadCheckpointState(dir);
  if (s.model_checkpoint_path.empty()) return std::nullopt;
  return JoinPath(dir, s.model_checkpoint_path);
}

CheckpointState CheckpointStateFromFiles(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  for (const auto& file : ListDirectory(dir)) {
    if (!IsCheckpointFile(file)) continue;
    std::string name;
    for (const char* suffix : {".safetensors", ".safetensors.index.json"}) {
      const std::string s = suffix;
      if (file.size() > s.size() && file.compare(file.size() - s.size(), s.size(), s) == 0) {
        name = file.substr(0, file.size() - s.size());
      }
    }
    // Only whole names "ckpt-<digits>" (not shards "ckpt-<digits>-00000-of-00002").
    if (name.empty() || name.find('-', 5) != std::string::npos) continue;
    found.emplace_back(std::stoll(name.substr(5)), name);
  }
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  CheckpointState s;
  for (const auto& [step, name] : found) {
    s.all_model_checkpoint_paths.push_back(name);
    const std::string file = JoinPath(dir, name + ".safetensors");
    const std::string path = FileExists(file) ? file : file + ".index.json";
    struct stat st;
    s.all_model_checkpoint_timestamps.push_back(
        ::stat(path.c_str(), &st) == 0 ? static_cast<double>(st.st_mtime) : 0.0);
  }
  if (!found.empty()) s.model_checkpoint_path = found.back().second;
  return s;
}

CheckpointState ExistingCheckpoints(const std::string& dir) {
  if (!FileExists(dir)) return {};
  CheckpointState listed;
  try {
    listed = ReadCheckpointState(dir);
  } catch (const DataLossError&) {
    // Unreadable: the files on disk say what exists.
  }
  const CheckpointState on_disk = CheckpointStateFromFiles(dir);
  std::map<int64_t, std::pair<std::string, double>> by_step;  // step -> (name, timestamp)
  for (size_t i = 0; i < on_disk.all_model_checkpoint_paths.size(); ++i) {
    const std::string& name = on_disk.all_model_checkpoint_paths[i];
    by_step[std::stoll(name.substr(5))] = {name, on_disk.all_model_checkpoint_timestamps[i]};
  }
  // The state file's timestamps win for the checkpoints it lists (retention keys on them).
  for (size_t i = 0; i < listed.all_model_checkpoint_paths.size(); ++i) {
    const std::string& name = listed.all_model_checkpoint_paths[i];
    if (!IsCheckpointFile(name) || name.find('/') != std::string::npos) continue;
    auto it = by_step.find(std::stoll(name.substr(5)));
    if (it != by_step.end() && it->second.first == name &&
        i < listed.all_model_checkpoint_timestamps.size()) {
      it->second.second = listed.all_model_checkpoint_timestamps[i];
    }
  }
  CheckpointState s;
  s.last_preserved_timestamp = listed.last_preserved_timestamp;
  for (const auto& [step, nt] : by_step) {
    s.all_model_checkpoint_paths.push_back(nt.first);
    s.all_model_checkpoint_timestamps.push_back(nt.second);
  }
  if (!by_step.empty()) s.model_checkpoint_path = by_step.rbegin()->second.first;
  return s;
}

std::optional<std::string> Saver::LastHealthyCheckpoint(const std::string& dir) {
  const std::string path = JoinPath(dir, "healthy_checkpoint");
  if (!FileExists(path)) return std::nullopt;
  const std::string name(Strip(ReadFileToString(path, 4096)));
  if (!IsCheckpointFile(name) || name.find('/') != std::string::npos) return std::nullopt;
  return JoinPath(dir, name);
}

std::string ResolveCheckpoint(const std::string& given, const std::string& train_dir) {
  if (given.empty()) {
    const CheckpointState existing = ExistingCheckpoints(train_dir);
    if (existing.model_checkpoint_path.empty()) {
      throw NotFoundError(StrCat("no checkpoint in ", train_dir));
    }
    return JoinPath(train_dir, existing.model_checkpoint_path);
  }
  std::string prefix = given;
  for (const std::string suffix : {".safetensors.index.json", ".safetensors"}) {
    if (prefix.size() > suffix.size() &&
        prefix.compare(prefix.size() - suffix.size(), suffix.size(), suffix) == 0) {
      prefix.resize(prefix.size() - suffix.size());
    }
  }
  const std::string dir = prefix.rfind('/') == std::string::npos
                              ? std::string(".")
                              : prefix.substr(0, prefix.rfind('/') + 1);
  if (!FileExists(dir) || SafetensorsFiles(prefix).empty()) {
    throw NotFoundError(StrCat("no checkpoint files at '", prefix, "'"));
  }
  return prefix;
}

SafetensorsContents LoadCheckpoint(const std::string& prefix) {
  SafetensorsContents c = LoadSafetensorsSharded(prefix);
  auto it = c.metadata.find(kShardedRanksMetadata);
  if (it == c.metadata.end()) return c;
  char* end = nullptr;
  const long ranks = std::strtol(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0' || ranks < 1 || ranks > 65536) {
    throw DataLossError(StrCat("checkpoint ", prefix, ": metadata ", kShardedRanksMetadata, " '",
                               it->second, "' is not a rank count"));
  }
  MergeRankShards(prefix, static_cast<int>(ranks), c);
  return c;
}

SafetensorsContents LoadLatestCheckpoint(const std::string& dir) {
  auto latest = Saver::LatestCheckpoint(dir);
  if (!latest) throw NotFoundError(StrCat("no checkpoint in '", dir, "'"));
  return LoadCheckpoint(*latest);
}

void RestoreVariables(const SafetensorsContents& ckpt,
                      const std::map<std::string, at::Tensor>& variables) {
  std::vector<std::string> problems;
  bool missing = false;
  for (const auto& [name, var] : variables) {
    auto it = ckpt.tensors.find(name);
    if (it == ckpt.tensors.end()) {
      missing = true;
      problems.push_back(StrCat("'", name, "' is missing from the checkpoint"));
    } else if (it->second.sizes() != var.sizes()) {
      problems.push_back(StrCat("'", name, "' has shape ", it->second.sizes(),
                                " in the checkpoint, ", var.sizes(), " in the model"));
    } else if (it->second.scalar_type() != var.scalar_type()) {
      problems.push_back(StrCat("'", name, "' is ", c10::toString(it->second.scalar_type()),
                                " in the checkpoint, ", c10::toString(var.scalar_type()),
                                " in the model"));
    }
  }
  // A tensor inside one of the model's layers (below its root) that is neither a variable nor
  // state of one ("<variable>/..." slots and averages): a checkpoint of another model, e.g. with
  // more layers. Restoring the rest would silently drop it.
  std::set<std::string> layers;  // every variable's enclosing layer paths, two levels deep or more
  for (const auto& [name, var] : variables) {
    for (size_t slash = name.rfind('/'); slash != std::string::npos && slash > 0;
         slash = name.rfind('/', slash - 1)) {
      if (name.find('/') < slash) layers.insert(name.substr(0, slash));
    }
  }
  std::vector<std::string> extra;
  for (const auto& [name, t] : ckpt.tensors) {
    bool known = variables.count(name) > 0, in_layer = false;
    for (size_t slash = name.rfind('/'); !known && slash != std::string::npos && slash > 0;
         slash = name.rfind('/', slash - 1)) {
      const std::string prefix = name.substr(0, slash);
      known = variables.count(prefix) > 0;
      in_layer = in_layer || layers.count(prefix) > 0;
    }
    if (!known && in_layer) extra.push_back(name);
  }
  if (!extra.empty()) {
    const size_t shown = std::min<size_t>(extra.size(), 3);
    problems.push_back(StrCat(
        extra.size(), " tensor(s) in the checkpoint are not variables of the model (",
        Join(std::vector<std::string>(extra.begin(), extra.begin() + shown), ", "),
        extra.size() > shown ? ", ..." : "", "): a checkpoint of another model"));
  }
  if (!problems.empty()) {
    throw InvalidArgumentError(StrCat(
        "cannot restore the checkpoint: ", problems.size(), " problem(s): ", Join(problems, "; "),
        missing ? ". To start from a checkpoint whose variable names differ (another model, or an "
                  "older layout), map its names with task.train.init_from_checkpoint_rules in a "
                  "fresh logdir (docs/formats.md, 'Variable names')"
                : ""));
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, var] : variables) var.copy_(ckpt.tensors.at(name));
}

std::vector<std::string> InitFromCheckpointRules(
    const std::map<std::string, InitRules>& rules_by_ckpt,
    const std::map<std::string, at::Tensor>& variables) {
  std::vector<std::string> initialized;
  for (const auto& [ckpt_path, rules] : rules_by_ckpt) {
    SafetensorsContents ckpt = FileExists(JoinPath(ckpt_path, "checkpoint"))
                                   ? LoadLatestCheckpoint(ckpt_path)
                                   : LoadCheckpoint(ckpt_path);
    std::vector<std::regex> ignore;
    for (const auto& r : rules.ignore) ignore.emplace_back(r);
    std::vector<std::regex> compiled;
    for (const auto& [re, fmt] : rules.rules) compiled.emplace_back(re);
    std::map<std::string, at::Tensor> values;
    std::vector<std::string> problems;
    for (const auto& [name, var] : variables) {
      if (std::any_of(ignore.begin(), ignore.end(),
                      [&](const std::regex& r) { return std::regex_match(name, r); })) {
        continue;
      }
      for (size_t i = 0; i < compiled.size(); ++i) {
        std::smatch m;
        if (!std::regex_match(name, m, compiled[i])) continue;
        // Python's `format % groups`: each %s takes the next group.
        std::string source;
        const std::string& fmt = rules.rules[i].second;
        size_t group = 1;
        for (size_t c = 0; c < fmt.size(); ++c) {
          if (fmt[c] == '%' && c + 1 < fmt.size() && fmt[c + 1] == 's') {
            if (group >= m.size()) {
              throw InvalidArgumentError(StrCat("init_from_checkpoint_rules: format '", fmt,
                                                "' has more %s than regex '", rules.rules[i].first,
                                                "' has groups"));
            }
            source += m[group++].str();
            ++c;
          } else {
            source += fmt[c];
          }
        }
        auto t = ckpt.tensors.find(source);
        if (t == ckpt.tensors.end()) {
          problems.push_back(StrCat("'", source, "' (for '", name, "') is not in ", ckpt_path));
        } else if (t->second.sizes() != var.sizes()) {
          problems.push_back(StrCat("'", source, "' has shape ", t->second.sizes(), ", '", name,
                                    "' has ", var.sizes()));
        } else {
          values[name] = t->second;
        }
        break;  // the first matching rule wins
      }
    }
    if (!problems.empty()) {
      throw InvalidArgumentError(StrCat("init_from_checkpoint_rules: ", Join(problems, "; ")));
    }
    if (values.empty()) {
      throw InvalidArgumentError(StrCat("init_from_checkpoint_rules for '", ckpt_path,
                                        "' match no variable of the model"));
    }
    at::NoGradGuard no_grad;
    for (const auto& [name, value] : values) {
      variables.at(name).copy_(value.to(variables.at(name).scalar_type()));
      initialized.push_back(name);
    }
  }
  return initialized;
}

}  // namespace glossa
