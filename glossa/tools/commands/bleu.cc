// `glossa bleu`: corpus BLEU of a hypothesis file against a reference file (Lingvo's BleuScorer).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/metrics/bleu.h"
#include "glossa/tools/command.h"
#include "glossa/tools/flags.h"

namespace glossa {
namespace cli {
namespace {

// `bleu`: corpus BLEU of two line-aligned files, printed as BLEU = 100 x score with the n-gram
// statistics (as Lingvo's decoder reports it).
int Bleu(const std::string& ref, const std::string& hyp, int max_ngram,
         const std::string& separator_type) {
  CheckRegularFile(ref, "--ref");
  CheckRegularFile(hyp, "--hyp");
  std::ifstream r(ref), h(hyp);
  BleuScorer scorer(max_ngram, separator_type);
  std::string rl, hl;
  int64_t line = 0;
  for (;;) {
    const bool more_r = static_cast<bool>(std::getline(r, rl));
    const bool more_h = static_cast<bool>(std::getline(h, hl));
    if (!more_r && !more_h) break;
    ++line;
    if (more_r != more_h) {
      throw InvalidArgumentError(StrCat(more_r ? hyp : ref, " ends at line ", line - 1, " but ",
                                        more_r ? ref : hyp, " goes on: the files must align"));
    }
    scorer.AddSentence(rl, hl);
  }
  if (line == 0) throw InvalidArgumentError(StrCat("--ref '", ref, "' is empty"));
  std::vector<std::string> precisions;
  for (int i = 0; i < max_ngram; ++i) {
    precisions.push_back(StrCat(scorer.matches()[i], "/", scorer.counts()[i]));
  }
  std::printf("BLEU = %.2f (%lld sentences; n-gram matches %s; hyp/ref tokens %lld/%lld)\n",
              100 * scorer.ComputeOverallScore(), static_cast<long long>(line),
              Join(precisions, " ").c_str(), static_cast<long long>(scorer.num_hyp_tokens()),
              static_cast<long long>(scorer.num_ref_tokens()));
  return 0;
}

class BleuCommand : public Command {
 public:
  CLI::App* Define(CLI::App& app) override {
    auto* c = app.add_subcommand(
        "bleu", "Corpus BLEU of a hypothesis file against a reference file, one sentence per line "
                "(Lingvo's BleuScorer, docs/mt.md).");
    c->add_option("--ref", ref_, "The reference file.")->required();
    c->add_option("--hyp", hyp_, "The hypothesis file (as many lines as --ref).")->required();
    c->add_option("--separator_type", separator_,
                  "Undo subword segmentation first: '', bpe, wpm or spm.");
    AddIntFlag(c, "--max_ngram", max_ngram_, 1, 100, "Highest n-gram order (default 4).");
    return c;
  }
  int Run(const CommandContext&) override {
    return Bleu(ref_, hyp_, static_cast<int>(max_ngram_), separator_);
  }

 private:
  std::string ref_, hyp_, separator_;
  int64_t max_ngram_ = 4;
};
GLOSSA_REGISTER_COMMAND(BleuCommand, 110);

}  // namespace
}  // namespace cli
}  // namespace glossa
