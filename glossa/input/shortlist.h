// A vocabulary shortlist for translation (Marian's lexical shortlist, CTranslate2's vocabulary
// map): for each source piece, the target pieces that co-occur with it most in the training
// pairs, plus the most frequent target pieces. A batch's decoder then computes its logits over
// the union of its sources' candidates only, not the whole vocabulary: the vocabulary projection
// and the log-softmax shrink from V columns to a few hundred.
//
//   VocabShortlist s = VocabShortlist::Build(pairs, 8000, 8000, /*per_source=*/50,
//                                            /*frequent=*/200);
//   s.Save("shortlist.tsv");                      // `glossa shortlist` writes it from text files
//   VocabShortlist t = VocabShortlist::Load("shortlist.tsv");
//   at::Tensor ids = t.Candidates(src_ids, src_paddings);   // sorted int64 target ids
//
// Scores: the Dice coefficient 2·c(s, t) / (c(s) + c(t)) over sentence pairs (c counts pairs
// that contain the piece, c(s, t) pairs that contain both), ties by the smaller id. Dice keeps
// the frequent pieces that co-occur with everything from crowding out the rare ones a source
// piece translates to; the frequent pieces are in every batch's list anyway.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace glossa {

class VocabShortlist {
 public:
  // Token id sequences of aligned (source, target) pairs; ids outside [0, vocab) are
  // InvalidArgument naming the pair. per_source >= 1, frequent >= 0.
  static VocabShortlist Build(
      const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>& pairs,
      int64_t source_vocab, int64_t target_vocab, int64_t per_source, int64_t frequent);

  // The text file: a header line "glossa_shortlist 1 <source_vocab> <target_vocab>", a line
  // "frequent <ids...>", then "<source id> <target ids...>" per source piece. Save writes it
  // atomically; Load's errors name the file and line (NotFound for a missing file, DataLoss for
  // a malformed line or an id out of range).
  void Save(const std::string& path) const;
  static VocabShortlist Load(const std::string& path);

  // The sorted, distinct target ids a batch may produce: the frequent ones, `always` (e.g. the
  // decoder's </s>), and the candidates of every source piece of ids [B, S] not padded
  // (paddings [B, S], 1 = pad; undefined: none). Ids outside the source vocabulary are
  // InvalidArgument.
  at::Tensor Candidates(const at::Tensor& ids, const at::Tensor& paddings,
                        const std::vector<int64_t>& always) const;

  int64_t source_vocab() const { return source_vocab_; }
  int64_t target_vocab() const { return target_vocab_; }
  const std::vector<int64_t>& frequent() const { return frequent_; }
  const std::vector<int64_t>& candidates(int64_t source_id) const {
    return per_source_[source_id];
  }

 private:
  int64_t source_vocab_ = 0, target_vocab_ = 0;
  std::vector<int64_t> frequent_;
  std::vector<std::vector<int64_t>> per_source_;  // [source_vocab]
};

}  // namespace glossa
