// `glossa adopt_checkpoint`: vouch for a checkpoint that carries no checksums (written by Glossa
// before format_version 2, or by another tool) by rewriting it with Glossa's checksums, so that
// every loader, which refuses unchecked files, takes it from then on (docs/training.md,
// "Checksums").
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/checkpoint/saver.h"
#include "glossa/io/safetensors.h"
#include "glossa/tools/command.h"

namespace glossa {
namespace cli {
namespace {

class AdoptCheckpointCommand : public Command {
 public:
  CLI::App* Define(CLI::App& app) override {
    auto* c = app.add_subcommand(
        "adopt_checkpoint",
        "Vouch for a checkpoint without checksums (an early Glossa checkpoint, or safetensors "
        "from another tool): rewrite it with Glossa's checksums so that train, eval, export and "
        "init_from_checkpoint_rules load it. Every loader refuses an unchecked file otherwise.");
    c->add_option("--checkpoint", checkpoint_,
                  "The checkpoint: a prefix (runs/x/train/ckpt-00000003) or its .safetensors "
                  "file.")
        ->required();
    c->add_option("--out", out_,
                  "Write the adopted checkpoint to this prefix instead of replacing --checkpoint.");
    return c;
  }

  int Run(const CommandContext&) override {
    const std::string prefix = ResolveCheckpoint(checkpoint_, "");
    try {
      LoadSafetensorsSharded(prefix);  // the strict load: already checked, or a real error
      if (out_.empty()) {
        std::printf("%s already carries Glossa's checksums and verifies: nothing to do\n",
                    prefix.c_str());
        return 0;
      }
    } catch (const DataLossError& e) {
      if (e.message().find("carries no checksums") == std::string::npos) throw;
    }
    SafetensorsContents c = LoadSafetensorsSharded(prefix, UncheckedFiles::kAllow);
    if (c.metadata.count("format_version")) c.metadata["format_version"] = kCheckpointFormatVersion;
    const std::string out = out_.empty() ? prefix : out_;
    if (out.find('/') != std::string::npos) CreateDirectories(out.substr(0, out.rfind('/')));
    const std::vector<std::string> before = SafetensorsFiles(out);
    const std::vector<std::string> written =
        SaveSafetensorsSharded(out, c.tensors, c.metadata, SaverOptions().max_shard_bytes);
    for (const auto& f : before) {  // a sharded original rewritten as one file (or vice versa)
      if (std::find(written.begin(), written.end(), f) == written.end()) RemoveFileIfExists(f);
    }
    LoadSafetensorsSharded(out);  // what the loaders will read now verifies
    std::printf("adopted %s: %zu tensors rewritten with checksums to %s (their bytes were not "
                "verified before: you vouch for them)\n",
                prefix.c_str(), c.tensors.size(), out.c_str());
    return 0;
  }

 private:
  std::string checkpoint_, out_;
};
GLOSSA_REGISTER_COMMAND(AdoptCheckpointCommand, 85);

}  // namespace
}  // namespace cli
}  // namespace glossa
