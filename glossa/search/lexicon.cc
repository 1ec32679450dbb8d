#include "glossa/search/lexicon.h"

#include <ATen/ATen.h>

#include <sstream>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/input/tokenizers.h"

namespace glossa {
namespace {

// Fixed nodes; the trie's nodes follow.
constexpr int64_t kInitial = 0;  // before <s>
constexpr int64_t kStart = 1;    // after <s>: a word's first token, or </s> (empty transcript)
constexpr int64_t kWordStart = 2;  // after a separator: a word's first token only
constexpr int64_t kFree = 3;     // after </s>, or after a forbidden token: anything goes
constexpr int64_t kFirstTrieNode = 4;

}  // namespace

LexiconConstraint::LexiconConstraint(const std::vector<std::vector<int64_t>>& words,
                                     int64_t vocab_size, int64_t separator_id, int64_t sos_id,
                                     int64_t eos_id) {
  if (words.empty()) throw InvalidArgumentError("lexicon: the word list is empty");
  for (int64_t id : {separator_id, sos_id, eos_id}) {
    if (id < 0 || id >= vocab_size) {
      throw InvalidArgumentError(StrCat("lexicon: token id ", id, " is outside the vocabulary [0, ",
                                        vocab_size, ")"));
    }
  }
  // The trie: children[node][token] (-1: none), and which nodes end a word. Node kStart stands
  // for the trie's root; kWordStart shares its children.
  std::vector<std::vector<int64_t>> children(kFirstTrieNode, std::vector<int64_t>(vocab_size, -1));
  std::vector<bool> final(kFirstTrieNode, false);
  for (size_t w = 0; w < words.size(); ++w) {
    if (words[w].empty()) throw InvalidArgumentError(StrCat("lexicon: word ", w, " has no tokens"));
    int64_t node = kStart;
    for (int64_t id : words[w]) {
      if (id < 0 || id >= vocab_size || id == separator_id || id == sos_id || id == eos_id) {
        throw InvalidArgumentError(StrCat("lexicon: word ", w, " has token id ", id,
                                          " (the separator, <s>, </s> or outside [0, ",
                                          vocab_size, "))"));
      }
      if (children[node][id] < 0) {
        children[node][id] = static_cast<int64_t>(children.size());
        children.emplace_back(vocab_size, -1);
        final.push_back(false);
      }
      node = children[node][id];
    }
    if (!final[node]) ++num_words_;
    final[node] = true;
  }
  const int64_t n = static_cast<int64_t>(children.size());
  next_ = at::full({n, vocab_size}, kFree, at::kLong);
  allowed_ = at::zeros({n, vocab_size}, at::kBool);
  auto next = next_.accessor<int64_t, 2>();
  auto allowed = allowed_.accessor<bool, 2>();
  auto allow = [&](int64_t from, int64_t token, int64_t to) {
    next[from][token] = to;
    allowed[from][token] = true;
  };
  allow(kInitial, sos_id, kStart);
  allow(kStart, eos_id, kFree);
  for (int64_t t = 0; t < vocab_size; ++t) allow(kFree, t, kFree);
  for (int64_t node = kStart; node < n; ++node) {
    if (node == kFree) continue;
    const int64_t from_children = node == kWordStart ? kStart : node;
    for (int64_t t = 0; t < vocab_size; ++t) {
      if (children[from_children][t] >= 0) allow(node, t, children[from_children][t]);
    }
    if (final[node]) {
      allow(node, separator_id, kWordStart);
      allow(node, eos_id, kFree);
    }
  }
}

LexiconConstraint LexiconConstraint::FromFile(const std::string& path, const BaseTokenizer& tok,
                                              int64_t vocab_size) {
  if (!FileExists(path)) throw NotFoundError(StrCat("lexicon file '", path, "' does not exist"));
  const std::vector<int64_t> sep = tok.StringToIds(" ");
  if (sep.size() != 1) {
    throw InvalidArgumentError(StrCat("lexicon '", path, "': the tokenizer has no single id for "
                                      "the word separator ' '"));
  }
  std::vector<std::vector<int64_t>> words;
  std::istringstream in(ReadFileToString(path));
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    std::istringstream fields(line);
    std::string word;
    if (!(fields >> word)) continue;
    std::vector<int64_t> ids = tok.StringToIds(word);
    for (int64_t id : ids) {
      if (id == tok.unk_id() || id < 0 || id >= vocab_size || id == sep[0] ||
          id == tok.sos_id() || id == tok.eos_id()) {
        throw InvalidArgumentError(StrCat("lexicon '", path, "' line ", line_no, ": the tokenizer "
                                          "cannot spell '", word, "' (id ", id, ")"));
      }
    }
    words.push_back(std::move(ids));
  }
  if (words.empty()) throw InvalidArgumentError(StrCat("lexicon '", path, "' has no words"));
  return LexiconConstraint(words, vocab_size, sep[0], tok.sos_id(), tok.eos_id());
}

NestedMap LexiconConstraint::InitStates(int64_t n) const {
  return NestedMap{{"node", at::full({n}, kInitial, at::kLong)}};
}

std::pair<at::Tensor, NestedMap> LexiconConstraint::Step(const at::Tensor& ids,
                                                         const at::Tensor& log_probs,
                                                         const NestedMap& states) const {
  const at::Tensor& node = states.GetTensor("node");
  if (log_probs.dim() != 2 || log_probs.size(1) != next_.size(1) ||
      log_probs.size(0) != node.size(0) || ids.numel() != node.size(0)) {
    throw InvalidArgumentError(StrCat("lexicon: log_probs ", log_probs.sizes(), ", ids ",
                                      ids.sizes(), " and ", node.size(0), " states disagree (vocab ",
                                      next_.size(1), ")"));
  }
  // The node after each hypothesis's last token, then the tokens allowed after it.
  const int64_t v = next_.size(1);
  const at::Tensor now = next_.view({-1}).index_select(0, node * v + ids.reshape({-1}).to(at::kLong));
  const at::Tensor ok = allowed_.index_select(0, now);
  return {log_probs.masked_fill(ok.logical_not(), kMaskedLogProb), NestedMap{{"node", now}}};
}

at::Tensor LexiconConstraint::AllowedAfter(const std::vector<int64_t>& ids) const {
  int64_t node = kStart;  // after <s>
  for (int64_t id : ids) node = next_[node][id].item<int64_t>();
  return allowed_[node].clone();
}

}  // namespace glossa
