#include "glossa/input/tokenizers.h"

#include <ATen/ATen.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "glossa/base/errors.h"
#include "glossa/base/file.h"
#include "glossa/base/strings.h"
#include "glossa/input/spm_train.h"

extern char** environ;

namespace glossa {

glossa::Params BaseTokenizer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("name", "tokenizer");
  p.Define("vocab_size", 64, "The size of the vocabulary.");
  p.Define("append_eos", true,
           "Whether to append </s> at the end and treat it as a non-padded label.");
  p.Define("pad_to_max_length", true, "If True, output ids are padded to max_length.");
  p.Define("target_unk_id", 0, "Target unknown token id.");
  p.Define("target_sos_id", 1, "Target start of sequence id.");
  p.Define("target_eos_id", 2, "Target end of sequence id.");
  return p;
}

BaseTokenizer::BaseTokenizer(const glossa::Params& p) : BaseLayer(p) {
  unk_id_ = params().GetInt("target_unk_id");
  sos_id_ = params().GetInt("target_sos_id");
  eos_id_ = params().GetInt("target_eos_id");
}

NestedMap BaseTokenizer::StringsToIds(const std::vector<std::string>& strs, int64_t max_length,
                                      bool pad_to_longest) const {
  if (max_length <= 0) throw InvalidArgumentError("StringsToIds: max_length must be > 0");
  const bool append_eos = params().GetBool("append_eos");
  std::vector<std::vector<int64_t>> ids(strs.size()), labels(strs.size());
  int64_t longest = 0;
  for (size_t i = 0; i < strs.size(); ++i) {
    std::vector<int64_t> toks = StringToIds(strs[i]);
    labels[i] = toks;
    if (append_eos) labels[i].push_back(eos_id_);
    ids[i] = {sos_id_};
    ids[i].insert(ids[i].end(), labels[i].begin(), labels[i].end() - 1);
    if (static_cast<int64_t>(ids[i].size()) > max_length) {
      ids[i].resize(max_length);
      labels[i].resize(max_length);
    }
    longest = std::max<int64_t>(longest, ids[i].size());
  }
  const int64_t width =
      params().GetBool("pad_to_max_length") && !pad_to_longest ? max_length
                                                               : std::max<int64_t>(longest, 1);
  const int64_t b = static_cast<int64_t>(strs.size());
  at::Tensor t_ids = at::full({b, width}, eos_id_, at::kLong);
  at::Tensor t_labels = at::full({b, width}, eos_id_, at::kLong);
  at::Tensor t_pad = at::ones({b, width}, at::kFloat);
  // Filled through raw pointers (the tensors are fresh and contiguous): indexing element by
  // element would cost several ATen ops per token.
  int64_t* id_data = t_ids.data_ptr<int64_t>();
  int64_t* label_data = t_labels.data_ptr<int64_t>();
  float* pad_data = t_pad.data_ptr<float>();
  for (int64_t i = 0; i < b; ++i) {
    for (size_t j = 0; j < ids[i].size(); ++j) {
      id_data[i * width + static_cast<int64_t>(j)] = ids[i][j];
      label_data[i * width + static_cast<int64_t>(j)] = labels[i][j];
      pad_data[i * width + static_cast<int64_t>(j)] = 0.0f;
    }
  }
  return NestedMap{{"ids", t_ids}, {"labels", t_labels}, {"paddings", t_pad}};
}

std::vector<std::string> BaseTokenizer::IdsToStrings(const at::Tensor& ids,
                                                     const at::Tensor& lens) const {
  if (ids.dim() != 2 || lens.dim() != 1 || lens.size(0) != ids.size(0)) {
    throw InvalidArgumentError(StrCat("IdsToStrings: need ids [batch, time] and lens [batch], got ",
                                      ids.sizes(), " and ", lens.sizes()));
  }
  at::Tensor cpu = ids.to(at::kLong).cpu().contiguous();
  std::vector<std::string> out;
  for (int64_t i = 0; i < ids.size(0); ++i) {
    const int64_t n = std::clamp<int64_t>(lens[i].item<int64_t>(), 0, ids.size(1));
    std::vector<int64_t> row(cpu[i].data_ptr<int64_t>(), cpu[i].data_ptr<int64_t>() + n);
    out.push_back(IdsToString(row));
  }
  return out;
}

// ---- AsciiTokenizer ----

namespace {
const std::vector<std::string>& AsciiTokens() {
  static const std::vector<std::string> kTokens = {
      "<unk>", "<s>", "</s>", " ", "<noise>", "a",  "b", "c",         "d",           "e",     "f",
      "g",     "h",   "i",    "j", "k",       "l",  "m", "n",         "o",           "p",     "q",
      "r",     "s",   "t",    "u", "v",       "w",  "x", "y",         "z",           ".",     "'",
      "-",     ":",   "!",    "~", "`",       ";",  "0", "1",         "2",           "3",     "4",
      "5",     "6",   "7",    "8", "9",       "\"", "#", "$",         "%",           "&",     "(",
      ")",     "*",   "+",    ",", "/",       "<",  "=", ">",         "?",           "@",     "[",
      "\\",    "]",   "^",    "_", "{",       "|",  "}", "<epsilon>", "<text_only>", "<sorw>"};
  return kTokens;
}
}  // namespace

glossa::Params AsciiTokenizer::Params() {
  glossa::Params p = BaseTokenizer::Params();
  p.Set("cls", ClsOf<AsciiTokenizer>());
  p.Set("vocab_size", 76);
  return p;
}

std::vector<int64_t> AsciiTokenizer::StringToIds(const std::string& s) const {
  static const std::vector<std::pair<std::string, int64_t>> kSpecial = {
      {"<unk>", 0},      {"<noise>", 4},      {"<s>", 1},    {"</s>", 2},
      {"<epsilon>", 73}, {"<text_only>", 74}, {"<sorw>", 75}};
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const auto& tokens = AsciiTokens();
  std::vector<int64_t> ids;
  for (size_t i = 0; i < lower.size(); ++i) {
    bool special = false;
    for (const auto& [tok, id] : kSpecial) {
      if (lower.compare(i, tok.size(), tok) == 0) {
        ids.push_back(id);
        i += tok.size() - 1;
        special = true;
        break;
      }
    }
    if (special) continue;
    const std::string c(1, lower[i]);
    auto it = std::find(tokens.begin() + 3, tokens.begin() + 73, c);
    ids.push_back(it == tokens.begin() + 73 ? 0 : it - tokens.begin());
  }
  return ids;
}

std::string AsciiTokenizer::IdsToString(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    out +=
        (id >= 0 && id < static_cast<int64_t>(AsciiTokens().size())) ? AsciiTokens()[id] : "<unk>";
  }
  return out;
}

// ---- VocabFileTokenizer ----

glossa::Params VocabFileTokenizer::Params() {
  glossa::Params p = BaseTokenizer::Params();
  p.Set("cls", ClsOf<VocabFileTokenizer>());
  p.Define("token_vocab_filepath", nullptr,
           "The vocabulary file: one token per line (token<TAB>score).");
  p.Define("tokens_delimiter", " ", "The delimiter between tokens in a string.");
  return p;
}

VocabFileTokenizer::VocabFileTokenizer(const glossa::Params& p) : BaseTokenizer(p) {
  if (!params().IsSet("token_vocab_filepath")) {
    throw InvalidArgumentError(
        StrCat("tokenizer '", path(), "': token_vocab_filepath is required"));
  }
  const std::string file = params().GetString("token_vocab_filepath");
  std::ifstream in(file);
  if (!in) throw NotFoundError(StrCat("cannot open vocabulary file '", file, "'"));
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::string token = line.substr(0, line.find('\t'));
    if (token.empty()) {
      throw InvalidArgumentError(StrCat("vocabulary file '", file, "' line ", n, ": empty token"));
    }
    ids_.emplace(token, static_cast<int64_t>(tokens_.size()));
    tokens_.push_back(token);
  }
  if (tokens_.empty()) throw InvalidArgumentError(StrCat("vocabulary file '", file, "' is empty"));
  auto find = [&](const char* t, int64_t fallback) {
    auto it = ids_.find(t);
    return it == ids_.end() ? fallback : it->second;
  };
  unk_id_ = find("<unk>", unk_id_);
  sos_id_ = find("<s>", sos_id_);
  eos_id_ = find("</s>", eos_id_);
}

std::vector<int64_t> VocabFileTokenizer::StringToIds(const std::string& s) const {
  const std::string delim = params().GetString("tokens_delimiter");
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = delim.empty() ? std::string::npos : s.find(delim, start);
    if (end == std::string::npos) end = s.size();
    std::string tok = s.substr(start, end - start);
    if (!tok.empty()) {
      auto it = ids_.find(tok);
      out.push_back(it == ids_.end() ? unk_id_ : it->second);
    }
    if (end == s.size()) break;
    start = end + delim.size();
  }
  return out;
}

std::string VocabFileTokenizer::IdsToString(const std::vector<int64_t>& ids) const {
  std::vector<std::string> toks;
  for (int64_t id : ids) {
    toks.push_back(id >= 0 && id < static_cast<int64_t>(tokens_.size()) ? tokens_[id] : "<unk>");
  }
  return Join(toks, params().GetString("tokens_delimiter"));
}

// ---- SentencePieceTokenizer ----

namespace {

// The functions of libglossa_spm (input/spm_shim.cc), loaded once with RTLD_DEEPBIND from the
// directory libglossa itself was loaded from.
struct SpmModule {
  void* (*create)();
  void (*destroy)(void*);
  int (*load)(void*, const char*, char*, int);
  int (*encode)(void*, const char*, int, int*, int, char*, int);
  int (*decode)(void*, const int*, int, char*, int, char*, int);
  int (*id_to_piece)(void*, int, char*, int);
  int (*piece_size)(void*);
  int (*bos_id)(void*);
  int (*eos_id)(void*);
  int (*unk_id)(void*);
};

const SpmModule& Spm() {
  static const SpmModule module = [] {
    Dl_info info;
    void (*const self)(const SentencePieceTraining&) = &TrainSentencePiece;
    if (dladdr(reinterpret_cast<void*>(self), &info) == 0 || !info.dli_fname) {
      throw FailedPreconditionError("cannot locate libglossa to find libglossa_spm.so");
    }
    std::string dir = info.dli_fname;
    dir = dir.substr(0, dir.rfind('/') + 1);
    const std::string path = dir + "libglossa_spm.so";
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (lib == nullptr) {
      throw FailedPreconditionError(
          StrCat("cannot load the SentencePiece module '", path, "': ", dlerror()));
    }
    SpmModule m;
    auto sym = [&](const char* name) {
      void* f = dlsym(lib, name);
      if (f == nullptr) throw FailedPreconditionError(StrCat("'", path, "' lacks ", name));
      return f;
    };
    m.create = reinterpret_cast<void* (*)()>(sym("glossa_spm_new"));
    m.destroy = reinterpret_cast<void (*)(void*)>(sym("glossa_spm_delete"));
    m.load = reinterpret_cast<int (*)(void*, const char*, char*, int)>(sym("glossa_spm_load"));
    m.encode = reinterpret_cast<int (*)(void*, const char*, int, int*, int, char*, int)>(
        sym("glossa_spm_encode"));
    m.decode = reinterpret_cast<int (*)(void*, const int*, int, char*, int, char*, int)>(
        sym("glossa_spm_decode"));
    m.id_to_piece =
        reinterpret_cast<int (*)(void*, int, char*, int)>(sym("glossa_spm_id_to_piece"));
    m.piece_size = reinterpret_cast<int (*)(void*)>(sym("glossa_spm_piece_size"));
    m.bos_id = reinterpret_cast<int (*)(void*)>(sym("glossa_spm_bos_id"));
    m.eos_id = reinterpret_cast<int (*)(void*)>(sym("glossa_spm_eos_id"));
    m.unk_id = reinterpret_cast<int (*)(void*)>(sym("glossa_spm_unk_id"));
    return m;
  }();
  return module;
}

}  // namespace

glossa::Params SentencePieceTokenizer::Params() {
  glossa::Params p = BaseTokenizer::Params();
  p.Set("cls", ClsOf<SentencePieceTokenizer>());
  p.Define("spm_model_file", nullptr, "The SentencePiece model file.");
  return p;
}

SentencePieceTokenizer::SentencePieceTokenizer(const glossa::Params& p) : BaseTokenizer(p) {
  if (!params().IsSet("spm_model_file")) {
    throw InvalidArgumentError(StrCat(
        "tokenizer '", path(),
        "': spm_model_file is required (a model's is "
        "task.input.tokenizer.spm_model_file; `glossa tokenizer train` makes one from your text)"));
  }
  const std::string file = params().GetString("spm_model_file");
  CheckRegularFile(file, StrCat("tokenizer '", path(), "': spm_model_file"));
  if (FileSize(file) > (uint64_t{1} << 30)) {
    throw InvalidArgumentError(StrCat("tokenizer '", path(), "': spm_model_file '", file,
                                      "' is over 1 GiB: not a SentencePiece model"));
  }
  const SpmModule& spm = Spm();
  sp_ = spm.create();
  char err[512] = {0};
  if (!spm.load(sp_, file.c_str(), err, sizeof(err))) {
    spm.destroy(sp_);
    sp_ = nullptr;
    throw NotFoundError(StrCat("cannot load SentencePiece model '", file, "': ", err));
  }
  unk_id_ = spm.unk_id(sp_);
  if (spm.bos_id(sp_) >= 0) sos_id_ = spm.bos_id(sp_);
  if (spm.eos_id(sp_) >= 0) eos_id_ = spm.eos_id(sp_);
}

SentencePieceTokenizer::~SentencePieceTokenizer() {
  if (sp_) Spm().destroy(sp_);
}

std::vector<int64_t> SentencePieceTokenizer::StringToIds(const std::string& s) const {
  char err[512] = {0};
  std::vector<int> ids(s.size() + 16);
  int n = Spm().encode(sp_, s.data(), static_cast<int>(s.size()), ids.data(),
                       static_cast<int>(ids.size()), err, sizeof(err));
  if (n > static_cast<int>(ids.size())) {
    ids.resize(n);
    n = Spm().encode(sp_, s.data(), static_cast<int>(s.size()), ids.data(), n, err, sizeof(err));
  }
  if (n < 0) throw InvalidArgumentError(StrCat("SentencePiece encode failed: ", err));
  return std::vector<int64_t>(ids.begin(), ids.begin() + n);
}

std::string SentencePieceTokenizer::IdsToString(const std::vector<int64_t>& ids) const {
  const int size = Spm().piece_size(sp_);
  std::vector<int> v;
  for (int64_t id : ids)
    v.push_back(id >= 0 && id < size ? static_cast<int>(id) : Spm().unk_id(sp_));
  char err[512] = {0};
  std::string out(ids.size() * 16 + 16, '\0');
  int n = Spm().decode(sp_, v.data(), static_cast<int>(v.size()), out.data(),
                       static_cast<int>(out.size()), err, sizeof(err));
  if (n > static_cast<int>(out.size())) {
    out.resize(n);
    n = Spm().decode(sp_, v.data(), static_cast<int>(v.size()), out.data(), n, err, sizeof(err));
  }
  if (n < 0) throw InvalidArgumentError(StrCat("SentencePiece decode failed: ", err));
  out.resize(n);
  return out;
}

int64_t SentencePieceTokenizer::vocab_size() const { return Spm().piece_size(sp_); }

namespace {

void RunSpmTrain(const std::string& input_text_file, const std::string& model_prefix,
                 int64_t vocab_size, const std::vector<std::string>& args);

}  // namespace

void TrainSentencePiece(const std::string& input_text_file, const std::string& model_prefix,
                        int64_t vocab_size, const std::string& model_type) {
  RunSpmTrain(input_text_file, model_prefix, vocab_size,
              {"spm_train", "--input=" + input_text_file, "--model_prefix=" + model_prefix,
               StrCat("--vocab_size=", vocab_size), "--model_type=" + model_type,
               "--hard_vocab_limit=false", "--minloglevel=1"});
}

void TrainSentencePiece(const SentencePieceTraining& t) {
  if (t.input.empty()) throw InvalidArgumentError("SentencePiece training: --input is required");
  for (const auto& f : Split(t.input, ',')) {
    CheckRegularFile(f, "SentencePiece training: --input");
  }
  if (t.model_prefix.empty()) {
    throw InvalidArgumentError("SentencePiece training: --model_prefix is required");
  }
  if (t.vocab_size < 4) {
    throw InvalidArgumentError(
        StrCat("SentencePiece training: --vocab_size must be >= 4 (3 "
               "control pieces and one more), got ",
               t.vocab_size));
  }
  if (!(t.character_coverage > 0 && t.character_coverage <= 1)) {
    throw InvalidArgumentError(
        StrCat("SentencePiece training: --character_coverage must be in (0, 1], got ",
               t.character_coverage));
  }
  static const char* const kTypes[] = {"unigram", "bpe", "char", "word"};
  if (std::find(std::begin(kTypes), std::end(kTypes), t.model_type) == std::end(kTypes)) {
    throw InvalidArgumentError(
        StrCat("SentencePiece training: --model_type must be unigram, bpe, "
               "char or word, got '",
               t.model_type, "'"));
  }
  const std::string dir = t.model_prefix.find('/') == std::string::npos
                              ? std::string(".")
                              : t.model_prefix.substr(0, t.model_prefix.rfind('/'));
  if (!dir.empty() && !std::filesystem::is_directory(dir)) {
    throw NotFoundError(StrCat("SentencePiece training: --model_prefix '", t.model_prefix,
                               "': no directory '", dir, "'"));
  }
  std::vector<std::string> args = {
      "spm_train",
      "--input=" + t.input,
      "--model_prefix=" + t.model_prefix,
      StrCat("--vocab_size=", t.vocab_size),
      "--model_type=" + t.model_type,
      StrCat("--character_coverage=", PyFloatRepr(t.character_coverage)),
      StrCat("--num_threads=", std::max<int64_t>(1, t.num_threads)),
      "--unk_id=0",
      "--bos_id=1",
      "--eos_id=2",
      "--pad_id=-1",
      "--hard_vocab_limit=true",
      "--minloglevel=1"};
  if (t.max_sentences > 0) {
    args.push_back(StrCat("--input_sentence_size=", t.max_sentences));
    args.push_back("--shuffle_input_sentence=true");
  }
  RunSpmTrain(t.input, t.model_prefix, t.vocab_size, args);
}

namespace {

void RunSpmTrain(const std::string& input_text_file, const std::string& model_prefix,
                 int64_t vocab_size, const std::vector<std::string>& spm_args) {
  // Training runs Debian's spm_train in a child process: the trainer logs through iostreams, which
  // are not usable from the deep-bound module (see spm_shim.cc).
  const std::string log = model_prefix + ".train.log";
  std::vector<std::string> args = spm_args;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid;
  const int rc = posix_spawnp(&pid, "spm_train", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    throw FailedPreconditionError(
        StrCat("cannot run spm_train (Debian package sentencepiece): ", std::strerror(rc)));
  }
  // spm_train says nothing for minutes on a large corpus: say how long it has run.
  int status = 0;
  const auto start = std::chrono::steady_clock::now();
  const bool tty = isatty(fileno(stderr));
  double last = 0;
  std::fprintf(stderr, "training SentencePiece (%lld pieces) on %s\n",
               static_cast<long long>(vocab_size), input_text_file.c_str());
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) break;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (secs - last >= (tty ? 1.0 : 5.0)) {
      last = secs;
      std::fprintf(stderr, tty ? "\rtraining SentencePiece: %.0f s\x1b[K" : "training SentencePiece: %.0f s\n",
                   secs);
      std::fflush(stderr);
    }
    usleep(100 * 1000);
  }
  if (tty) std::fprintf(stderr, "\r\x1b[K");
  std::fprintf(stderr, "trained SentencePiece in %.1f s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), {}), last;
    // The last line that says something (spm_train ends with "Program terminated with an
    // unrecoverable error." after the reason).
    for (const std::string& line : Split(text, '\n')) {
      if (!Strip(line).empty() && line.find("Program terminated") == std::string::npos) {
        last = std::string(Strip(line));
      }
    }
    throw InvalidArgumentError(
        StrCat("SentencePiece training on '", input_text_file, "' failed: ", last));
  }
  std::remove(log.c_str());
}

}  // namespace

GLOSSA_REGISTER_CLASS(AsciiTokenizer, "glossa.input.AsciiTokenizer");
GLOSSA_REGISTER_CLASS(VocabFileTokenizer, "glossa.input.VocabFileTokenizer");
GLOSSA_REGISTER_CLASS(SentencePieceTokenizer, "glossa.input.SentencePieceTokenizer");


std::string AsciiTokenizer::IdToPiece(int64_t id) const {
  const auto& tokens = AsciiTokens();
  return id >= 0 && id < static_cast<int64_t>(tokens.size()) ? tokens[id] : tokens[0];
}

std::string VocabFileTokenizer::IdToPiece(int64_t id) const {
  if (id >= 0 && id < vocab_size()) return tokens_[id];
  return unk_id_ >= 0 && unk_id_ < vocab_size() ? tokens_[unk_id_] : std::string("<unk>");
}

std::string SentencePieceTokenizer::IdToPiece(int64_t id) const {
  const int size = Spm().piece_size(sp_);
  const int i = id >= 0 && id < size ? static_cast<int>(id) : Spm().unk_id(sp_);
  std::string out(64, '\0');
  int n = Spm().id_to_piece(sp_, i, out.data(), static_cast<int>(out.size()));
  if (n > static_cast<int>(out.size())) {
    out.resize(n);
    n = Spm().id_to_piece(sp_, i, out.data(), n);
  }
  out.resize(n);
  return out;
}

}  // namespace glossa
