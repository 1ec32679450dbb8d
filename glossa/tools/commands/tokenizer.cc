// `glossa tokenizer train`: a SentencePiece model for your own text, in Glossa's id convention
// (<unk> 0, <s> 1, </s> 2), with the overrides that make a model use it.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <thread>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/input/spm_train.h"
#include "glossa/input/tokenizers.h"
#include "glossa/layers/base_layer.h"
#include "glossa/tools/command.h"
#include "glossa/tools/flags.h"

namespace glossa {
namespace cli {
namespace {

class TokenizerCommand : public Command {
 public:
  CLI::App* Define(CLI::App& app) override {
    auto* c = app.add_subcommand("tokenizer", "Tokenizers for your own text.");
    c->require_subcommand(1);
    train_ = c->add_subcommand(
        "train",
        "Train a SentencePiece model on text files (one sentence per line) with Glossa's ids: "
        "<unk> 0, <s> 1, </s> 2.");
    train_->add_option("--input", t_.input, "The text file(s), comma-separated.")->required();
    train_
        ->add_option("--model_prefix", t_.model_prefix, "Writes <prefix>.model and <prefix>.vocab.")
        ->required();
    AddIntFlag(train_, "--vocab_size", t_.vocab_size, 4, int64_t{1} << 24,
               "Pieces in the vocabulary, exactly (the model's emb.vocab_size).");
    train_->add_option("--model_type", t_.model_type, "unigram, bpe, char or word.")
        ->capture_default_str();
    train_
        ->add_option("--character_coverage", t_.character_coverage,
                     "The share of the text's characters the pieces cover (1.0 for alphabets, "
                     "0.9995 for large character sets such as Chinese or Japanese).")
        ->capture_default_str();
    t_.num_threads = std::max(1u, std::thread::hardware_concurrency());
    AddIntFlag(train_, "--num_threads", t_.num_threads, 1, 1024,
               "Trainer threads (default: the cores).");
    AddIntFlag(train_, "--max_sentences", t_.max_sentences, 0, int64_t{1} << 40,
               "Train on at most this many lines, sampled (0: all).");
    return c;
  }

  int Run(const CommandContext&) override {
    TrainSentencePiece(t_);
    const std::string model = t_.model_prefix + ".model";
    auto tok = InstantiateLayer<SentencePieceTokenizer>(
        SentencePieceTokenizer::Params().Set("name", "tokenizer").Set("spm_model_file", model));
    const int64_t n = tok->vocab_size();
    if (n != t_.vocab_size || tok->unk_id() != 0 || tok->sos_id() != 1 || tok->eos_id() != 2) {
      throw InternalError(StrCat(model, ": ", n, " pieces, <unk> ", tok->unk_id(), ", <s> ",
                                 tok->sos_id(), ", </s> ", tok->eos_id(), "; asked for ",
                                 t_.vocab_size, ", 0, 1, 2"));
    }
    std::printf(
        "wrote %s and %s.vocab: %lld pieces, <unk> 0, <s> 1, </s> 2\n"
        "a model uses it with --model_params_override=\"task.input.tokenizer.spm_model_file : "
        "'%s'; task.input.tokenizer.vocab_size : %lld; task.emb.vocab_size : %lld; "
        "task.softmax.num_classes : %lld\"\n"
        "(a translation model, mt.text.*: task.encoder.token_emb.vocab_size and "
        "task.decoder.token_emb.vocab_size for task.emb.vocab_size and task.softmax.num_classes)\n",
        model.c_str(), t_.model_prefix.c_str(), static_cast<long long>(n), model.c_str(),
        static_cast<long long>(n), static_cast<long long>(n), static_cast<long long>(n));
    return 0;
  }

 private:
  CLI::App* train_ = nullptr;
  SentencePieceTraining t_;
};
GLOSSA_REGISTER_COMMAND(TokenizerCommand, 45);

}  // namespace
}  // namespace cli
}  // namespace glossa
