// `glossa shortlist`: a vocabulary shortlist (glossa/input/shortlist.h) from line-aligned
// training text, tokenized by a translation bundle's tokenizer.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/inference/bundle.h"
#include "glossa/input/shortlist.h"
#include "glossa/input/tokenizers.h"
#include "glossa/input/vocabulary_check.h"
#include "glossa/input/shortlist.h"
#include "glossa/tools/command.h"
#include "glossa/tools/flags.h"

namespace glossa {
namespace cli {
namespace {

int Shortlist(const std::string& bundle, const std::string& source, const std::string& target,
              const std::string& out, int64_t per_source, int64_t frequent) {
  CheckRegularFile(source, "--source");
  CheckRegularFile(target, "--target");
  if (std::filesystem::is_directory(out)) {
    throw InvalidArgumentError(StrCat("--out '", out, "' is a directory; give the file to write"));
  }
  LoadedBundle b = LoadBundle(bundle);
  if (b.tokenizer == nullptr) {
    throw InvalidArgumentError(StrCat("--bundle '", bundle, "': the bundle has no tokenizer"));
  }
  std::ifstream s(source), t(target);
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> pairs;
  std::string sl, tl;
  for (int64_t line = 1;; ++line) {
    const bool more_s = static_cast<bool>(std::getline(s, sl));
    const bool more_t = static_cast<bool>(std::getline(t, tl));
    if (!more_s && !more_t) break;
    if (more_s != more_t) {
      throw InvalidArgumentError(StrCat(more_s ? target : source, " ends at line ", line - 1,
                                        " but ", more_s ? source : target,
                                        " goes on: the files must align"));
    }
    pairs.emplace_back(b.tokenizer->StringToIds(sl), b.tokenizer->StringToIds(tl));
  }
  if (pairs.empty()) throw InvalidArgumentError(StrCat("--source '", source, "' is empty"));
  const VocabShortlist list = VocabShortlist::Build(
      pairs, TokenizerVocabSize(*b.tokenizer), TokenizerVocabSize(*b.tokenizer), per_source,
      frequent);
  list.Save(out);
  int64_t total = 0;
  for (int64_t a = 0; a < list.source_vocab(); ++a) total += list.candidates(a).size();
  std::printf("shortlist: %zu pairs, %lld frequent target pieces, %.1f candidates per source "
              "piece on average; wrote %s\n",
              pairs.size(), static_cast<long long>(list.frequent().size()),
              static_cast<double>(total) / static_cast<double>(list.source_vocab()), out.c_str());
  return 0;
}

class ShortlistCommand : public Command {
 public:
  CLI::App* Define(CLI::App& app) override {
    auto* c = app.add_subcommand(
        "shortlist",
        "Build a vocabulary shortlist for translation from line-aligned training text (docs/mt.md): "
        "per source piece, the target pieces that co-occur with it most (Dice), and the most "
        "frequent target pieces. Decode with it through task.shortlist_file.");
    c->add_option("--bundle", bundle_, "A translation bundle (its tokenizer).")
        ->required();
    c->add_option("--source", source_, "Source-side text, one sentence per line.")->required();
    c->add_option("--target", target_, "Target-side text, line-aligned with --source.")->required();
    c->add_option("--out", out_, "The shortlist file to write.")->required();
    AddIntFlag(c, "--per_source", per_source_, 1, 1 << 20,
               "Candidate target pieces kept per source piece.");
    AddIntFlag(c, "--frequent", frequent_, 0, 1 << 20,
               "Most frequent target pieces in every batch's list.");
    return c;
  }
  int Run(const CommandContext&) override {
    return Shortlist(bundle_, source_, target_, out_, per_source_, frequent_);
  }

 private:
  std::string bundle_, source_, target_, out_;
  int64_t per_source_ = 50, frequent_ = 200;
};
GLOSSA_REGISTER_COMMAND(ShortlistCommand, 112);

}  // namespace
}  // namespace cli
}  // namespace glossa
