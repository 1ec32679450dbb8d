// A C interface to Debian's libsentencepiece, built as its own module (libglossa_spm.so) and loaded
// with RTLD_DEEPBIND by tokenizers.cc. libsentencepiece bundles its own protobuf 3.14, whose
// symbols would otherwise bind to the system protobuf that libglossa links and abort at load; in a
// deep-bound module its references resolve to its own copy.
#include <sentencepiece_processor.h>

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {
void SetError(const std::string& message, char* err, int err_len) {
  if (err == nullptr || err_len <= 0) return;
  std::strncpy(err, message.c_str(), err_len - 1);
  err[err_len - 1] = '\0';
}
sentencepiece::SentencePieceProcessor* Sp(void* p) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(p);
}

// SentencePiece's encoders take super-linear time in a run of text without spaces (600k NULs took
// 33 s, 3.9 MB of '日' minutes). A text over kChunk bytes is therefore encoded in segments cut at
// spaces: SentencePiece splits there itself (its pieces never span whitespace), so the ids are
// the same. A run of more than kChunk bytes without a space is cut at a character boundary; a
// continuation's dummy-prefix "▁" is taken off its first piece, and one unknown run stays one
// <unk>, as SentencePiece makes it. Only such runs may be tokenized otherwise than in one call.
constexpr size_t kChunk = 2048;
const std::string kSpace = "\xE2\x96\x81";  // ▁

sentencepiece::util::Status EncodeSegmented(sentencepiece::SentencePieceProcessor* sp,
                                            const std::string& text, std::vector<int>* ids) {
  const size_t n = text.size();
  size_t pos = 0;
  bool continues = false;  // the segment goes on a run the last one cut
  std::vector<int> part;
  while (pos < n) {
    size_t end = n;
    bool cut_in_run = false;
    if (n - pos > kChunk) {
      // The last whitespace of the window (the normalizer makes tabs and newlines spaces too).
      const size_t space = std::string_view(text).substr(pos, kChunk + 1).find_last_of(" \t\r\n");
      if (space != std::string_view::npos) {
        end = pos + space;
      } else {
        end = pos + kChunk;  // no space: back up to the start of a UTF-8 character
        while (end > pos + 1 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
        cut_in_run = true;
      }
    }
    if (end > pos) {
      part.clear();
      const auto status = sp->Encode(text.substr(pos, end - pos), &part);
      if (!status.ok()) return status;
      if (continues && !part.empty()) {
        const std::string& first = sp->IdToPiece(part[0]);
        if (first == kSpace) {
          part.erase(part.begin());
        } else if (first.size() > kSpace.size() && first.compare(0, kSpace.size(), kSpace) == 0) {
          // "▁xy" -> "xy" when that is a piece, else its characters one by one.
          const std::string bare = first.substr(kSpace.size());
          std::vector<int> repl;
          if (sp->PieceToId(bare) != sp->unk_id()) {
            repl.push_back(sp->PieceToId(bare));
          } else {
            for (size_t i = 0; i < bare.size();) {
              size_t len = 1;
              while (i + len < bare.size() &&
                     (static_cast<unsigned char>(bare[i + len]) & 0xC0) == 0x80) {
                ++len;
              }
              repl.push_back(sp->PieceToId(bare.substr(i, len)));
              i += len;
            }
          }
          part.erase(part.begin());
          part.insert(part.begin(), repl.begin(), repl.end());
        }
        if (!part.empty() && !ids->empty() && part[0] == sp->unk_id() &&
            ids->back() == sp->unk_id()) {
          part.erase(part.begin());
        }
      }
      ids->insert(ids->end(), part.begin(), part.end());
    }
    pos = cut_in_run ? end : end + 1;  // a space cut is not part of either segment
    continues = cut_in_run;
  }
  return sentencepiece::util::Status();  // OK
}
}  // namespace

extern "C" {

void* glossa_spm_new() { return new sentencepiece::SentencePieceProcessor(); }
void glossa_spm_delete(void* p) { delete Sp(p); }

int glossa_spm_load(void* p, const char* path, char* err, int err_len) {
  const auto status = Sp(p)->Load(path);
  if (!status.ok()) SetError(status.ToString(), err, err_len);
  return status.ok() ? 1 : 0;
}

// Encodes `text`; returns the number of ids (writing at most `cap` of them), -1 on error.
int glossa_spm_encode(void* p, const char* text, int text_len, int* out, int cap, char* err,
                      int err_len) {
  std::vector<int> ids;
  const std::string input(text, text_len);
  const auto status = input.size() <= kChunk ? Sp(p)->Encode(input, &ids)
                                             : EncodeSegmented(Sp(p), input, &ids);
  if (!status.ok()) {
    SetError(status.ToString(), err, err_len);
    return -1;
  }
  for (size_t i = 0; i < ids.size() && static_cast<int>(i) < cap; ++i) out[i] = ids[i];
  return static_cast<int>(ids.size());
}

// Decodes ids; returns the length of the text (writing at most `cap` bytes), -1 on error.
int glossa_spm_decode(void* p, const int* ids, int n, char* out, int cap, char* err, int err_len) {
  std::string text;
  const auto status = Sp(p)->Decode(std::vector<int>(ids, ids + n), &text);
  if (!status.ok()) {
    SetError(status.ToString(), err, err_len);
    return -1;
  }
  std::memcpy(out, text.data(), std::min<size_t>(text.size(), static_cast<size_t>(cap)));
  return static_cast<int>(text.size());
}

// The piece of `id` (its length; writes at most `cap` bytes).
int glossa_spm_id_to_piece(void* p, int id, char* out, int cap) {
  const std::string& piece = Sp(p)->IdToPiece(id);
  std::memcpy(out, piece.data(), std::min<size_t>(piece.size(), static_cast<size_t>(cap)));
  return static_cast<int>(piece.size());
}

int glossa_spm_piece_size(void* p) { return Sp(p)->GetPieceSize(); }
int glossa_spm_bos_id(void* p) { return Sp(p)->bos_id(); }
int glossa_spm_eos_id(void* p) { return Sp(p)->eos_id(); }
int glossa_spm_unk_id(void* p) { return Sp(p)->unk_id(); }

}  // extern "C"
