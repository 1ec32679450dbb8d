// Lexicon-constrained decoding of a character model (the closed-vocabulary search of Kaldi's and
// wav2letter's lexicon decoders): every word a hypothesis spells must be in a word list. A prefix
// trie over the words' token ids masks, at every step, the tokens that cannot come next: within a
// word, the characters that continue no listed word; the word separator (a space) and </s> except
// right after a whole word. So a hypothesis can end, or start another word, only after a listed
// word, and never with a separator or two in a row. The empty transcript is allowed.
//
//   LexiconConstraint lex = LexiconConstraint::FromFile("lexicon.txt", tokenizer);
//   ... step: auto [masked, s] = lex.Step(ids, log_probs, states.lexicon);  // after LM fusion
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "glossa/core/nested_map.h"

namespace glossa {

class BaseTokenizer;

class LexiconConstraint {
 public:
  // What a disallowed token's log-prob becomes: -inf, which the beam search and greedy search
  // never extend (a beam with fewer allowed extensions than slots keeps dead slots).
  static constexpr double kMaskedLogProb = -std::numeric_limits<double>::infinity();

  // words: each word's token ids (at least one; neither the separator, sos nor eos); vocab_size
  // of the decoder; the separator (space), sos and eos ids. InvalidArgument for an empty list or
  // an id outside the vocabulary.
  LexiconConstraint(const std::vector<std::vector<int64_t>>& words, int64_t vocab_size,
                    int64_t separator_id, int64_t sos_id, int64_t eos_id);
  // Words from a file: the first whitespace-separated field of each non-empty line (what follows,
  // e.g. a count, is ignored), each turned into ids by `tok`; the separator is tok's id of " ".
  // NotFound for a missing file, InvalidArgument naming the file and line for a word the
  // tokenizer cannot spell (an <unk> id, or ids outside vocab_size) and for a file with no words.
  static LexiconConstraint FromFile(const std::string& path, const BaseTokenizer& tok,
                                    int64_t vocab_size);

  // States of n hypotheses: {node [n] int64}, each before its <s>.
  NestedMap InitStates(int64_t n) const;
  // ids [N]: the token each hypothesis last appended (<s> at step 0); log_probs [N, V] of the next
  // token -> (log_probs with every token the lexicon forbids after the hypothesis set to
  // kMaskedLogProb, the states after ids). A hypothesis that took a forbidden token anyway (a dead
  // slot of a beam search) is left unconstrained.
  std::pair<at::Tensor, NestedMap> Step(const at::Tensor& ids, const at::Tensor& log_probs,
                                        const NestedMap& states) const;
  // The allowed tokens [V] (bool) after a whole token sequence (without <s>): for tests and tools.
  at::Tensor AllowedAfter(const std::vector<int64_t>& ids) const;

  int64_t num_words() const { return num_words_; }
  int64_t num_nodes() const { return next_.size(0); }

 private:
  at::Tensor next_;     // [nodes, V] int64: the node after each token (kFree when not allowed)
  at::Tensor allowed_;  // [nodes, V] bool
  int64_t num_words_ = 0;
};

}  // namespace glossa
