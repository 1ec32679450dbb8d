#include "glossa/model/params_passes.h"

#include <algorithm>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/input/input_generator.h"
#include "glossa/layers/base_layer.h"
#include "glossa/model/base_task.h"

namespace glossa {
namespace {

std::string Join2(const std::string& path, const std::string& name) {
  return path.empty() ? name : StrCat(path, ".", name);
}

// The hooks whose class `node`'s class derives from (none for a node without a registered cls).
std::vector<const ParamsHook*> HooksOf(const Params& node, const std::vector<ParamsHook>& hooks) {
  std::vector<const ParamsHook*> out;
  if (!node.Contains("cls") || node.Get("cls").kind() != ParamValue::Kind::kClass) return out;
  const std::string key = node.ClsKey();
  if (!ClassRegistry::Contains(key)) return out;
  const ClassRegistry::Entry& entry = ClassRegistry::Get(key);
  for (const ParamsHook& h : hooks) {
    if (h.applies(entry)) out.push_back(&h);
  }
  return out;
}

void Walk(Params& node, const std::string& path, const std::vector<ParamsHook>& hooks) {
  for (const ParamsHook* h : HooksOf(node, hooks)) h->apply(node, path);
  for (const std::string& name : node.Keys()) {
    const ParamValue& v = node.Get(name);
    if (v.is_params()) {
      Walk(node.GetParams(name), Join2(path, name), hooks);
    } else if (v.is_list()) {
      ParamValue::List list = v.AsList();
      bool any = false;
      for (size_t i = 0; i < list.size(); ++i) {
        if (!list[i].is_params()) continue;
        Params element = list[i].AsParams().Copy();
        Walk(element, StrCat(Join2(path, name), "[", i, "]"), hooks);
        list[i] = ParamValue(std::move(element));
        any = true;
      }
      if (any) node.Set(name, list);
    }
  }
}

// Each rank's share of a batch: value / world, rounded up (the global batch then grows to
// world × share, noted in `notes`).
int64_t DivideAmong(int64_t value, int world, const std::string& key,
                    std::vector<std::string>* notes) {
  const int64_t share = (value + world - 1) / world;
  if (share * world != value) {
    notes->push_back(StrCat(key, " = ", value, " does not divide among ", world,
                            " workers: each reads ", share, ", ", share * world, " in all"));
  }
  return share;
}

}  // namespace

std::vector<std::string> TaskPaths(const Params& model) {
  if (model.Contains("task") && model.Get("task").is_params()) return {"task"};
  if (!model.Contains("task_params") || !model.Get("task_params").is_params()) {
    throw InvalidArgumentError(
        "model Params must be a model's (SingleTaskModel: task, MultiTaskModel: task_params), "
        "not a task's or a layer's");
  }
  std::vector<std::string> out;
  for (const std::string& name : model.GetParams("task_params").Keys()) {
    out.push_back(StrCat("task_params.", name));
  }
  if (out.empty()) throw InvalidArgumentError("model Params: task_params is empty");
  return out;
}

std::string MainTaskPath(const Params& model) {
  const std::vector<std::string> paths = TaskPaths(model);
  if (paths.front() == "task") return "task";
  const std::string main = model.Contains("main_task") ? model.GetString("main_task") : "";
  if (main.empty()) return paths.front();
  const std::string path = StrCat("task_params.", main);
  if (std::find(paths.begin(), paths.end(), path) == paths.end()) {
    throw NotFoundError(StrCat("main_task ", KeyErrorString(main,
                                                            model.GetParams("task_params").Keys())));
  }
  return path;
}

void RunParamsPass(Params& root, const std::vector<ParamsHook>& hooks) { Walk(root, "", hooks); }

std::vector<std::string> ShardParamsForReplicas(Params& model, int world, int rank) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw InvalidArgumentError(StrCat("rank ", rank, " of world size ", world, " is out of range"));
  }
  std::vector<std::string> notes;
  if (world == 1) return notes;
  RunParamsPass(model, {
      HookFor<BaseInputGenerator>([&](Params& p, const std::string& path) {
        p.Set("num_input_replicas", world);
        p.Set("input_replica_id", rank);
        if (p.GetInt("batch_size") > 0) {
          p.Set("batch_size",
                DivideAmong(p.GetInt("batch_size"), world, Join2(path, "batch_size"), &notes));
        }
      }),
      HookFor<BaseSequenceInputGenerator>([&](Params& p, const std::string& path) {
        ParamValue::List limits;
        for (const ParamValue& v : p.Get("bucket_batch_limit").AsList()) {
          limits.emplace_back(
              DivideAmong(v.AsInt(), world, Join2(path, "bucket_batch_limit"), &notes));
        }
        p.Set("bucket_batch_limit", limits);
      }),
      HookFor<BaseTask>([&](Params& p, const std::string& path) {
        const int64_t splits = p.GetInt("num_splits");
        if (splits % world == 0) {
          p.Set("num_splits", splits / world);
        } else if (splits != 1) {
          throw InvalidArgumentError(StrCat(Join2(path, "num_splits"), " = ", splits,
                                            " towers cannot be spread over ", world,
                                            " workers: use a multiple of the world size, or 1"));
        }
      }),
  });
  return notes;
}

void FloatActivations(Params& model) {
  RunParamsPass(model, {HookFor<BaseLayer>([](Params& p, const std::string&) {
                  if (!p.Get("fprop_dtype").is_none()) p.Set("fprop_dtype", nullptr);
                })});
}

}  // namespace glossa
