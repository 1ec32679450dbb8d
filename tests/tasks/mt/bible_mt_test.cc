// The registered mt.bible.* models (glossa/tasks/mt/bible_mt.cc) and where they find their data
// (glossa/tasks/data_dir.cc). The models train end to end in the CTest bible_mt; here, the Params
// they build and the data-directory rules, without the corpus.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "glossa/base/errors.h"
#include "glossa/model/model_registry.h"
#include "glossa/tasks/data_dir.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

class DataDirEnv {
 public:
  explicit DataDirEnv(const char* value) {
    if (const char* old = std::getenv("GLOSSA_DATA_DIR")) old_ = old;
    if (value) {
      ::setenv("GLOSSA_DATA_DIR", value, 1);
    } else {
      ::unsetenv("GLOSSA_DATA_DIR");
    }
  }
  ~DataDirEnv() {
    if (old_.empty()) {
      ::unsetenv("GLOSSA_DATA_DIR");
    } else {
      ::setenv("GLOSSA_DATA_DIR", old_.c_str(), 1);
    }
  }

 private:
  std::string old_;
};

TEST(FindDataDir, UsesGlossaDataDirAsGivenAndNamesEveryPlaceWhenMissing) {
  {
    DataDirEnv env("/srv/glossa-data");
    EXPECT_EQ(FindDataDir("bible_mt", "scripts/prepare_bible_mt.sh"), "/srv/glossa-data/bible_mt");
  }
  DataDirEnv env(nullptr);
  EXPECT_ERROR_CONTAINS(FindDataDir("no_such_corpus", "scripts/make_it.sh"), NotFoundError,
                        "make it with scripts/make_it.sh or set GLOSSA_DATA_DIR");
  EXPECT_ERROR_CONTAINS(FindDataDir("no_such_corpus", "x"), NotFoundError, "no_such_corpus/");
}

TEST(BibleMtModels, BuildTheirInputsAndTaskFromTheDataDirectory) {
  DataDirEnv env("/tmp/glossa_bible_params");
  for (const char* key : {"mt.bible.TransformerEnEsTiny", "mt.bible.TransformerEnEsBase"}) {
    const Params train = GetModelParams(key, "Train");
    EXPECT_EQ(train.GetString("task.input.file_pattern"),
              "text:/tmp/glossa_bible_params/bible_mt/train.tsv")
        << key;
    EXPECT_EQ(train.GetString("task.input.tokenizer.spm_model_file"),
              "/tmp/glossa_bible_params/bible_mt/spm_8000.model");
    EXPECT_EQ(train.GetInt("task.decoder.token_emb.vocab_size"), 8000);
    EXPECT_TRUE(train.GetBool("task.decoder.beam_search.force_eos_in_last_step"));
    EXPECT_EQ(train.GetInt("task.input.repeat_count"), -1) << "training repeats";
    const Params test = GetModelParams(key, "Test");
    EXPECT_EQ(test.GetString("task.input.file_pattern"),
              "text:/tmp/glossa_bible_params/bible_mt/test.tsv");
    EXPECT_EQ(test.GetInt("task.input.repeat_count"), 1) << "evaluation reads Test once";
    EXPECT_TRUE(test.GetBool("task.input.require_sequential_order"));
  }
  EXPECT_EQ(GetModelParams("mt.bible.TransformerEnEsTiny", "Train").GetInt("task.train.max_steps"),
            1500);
}

}  // namespace
}  // namespace glossa
