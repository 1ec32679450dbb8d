// A C interface to Debian's libsentencepiece, built as its own module (libglossa_spm.so) and loaded
// with RTLD_DEEPBIND by tokenizers.cc. libsentencepiece bundles its own protobuf 3.14, whose
// symbols would otherwise bind to the system protobuf that libglossa links and abort at load; in a
// deep-bound module its references resolve to its own copy.
#include <sentencepiece_processor.h>

#include <cstring>
#include <string>
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
  const auto status = Sp(p)->Encode(std::string(text, text_len), &ids);
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
