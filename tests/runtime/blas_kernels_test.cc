// OpenBLAS's kernel set by measurement (glossa/runtime/blas_kernels.h): each candidate is timed by
// a probe process started with OPENBLAS_CORETYPE naming it, the fastest is kept and cached; a
// probe that fails loses. The real probe (the glossa program with GLOSSA_BLAS_PROBE=1) is run by
// tests/tools/glossa_cli_test.sh.
#include "glossa/runtime/blas_kernels.h"

#include <gtest/gtest.h>

#include <string>

#include "glossa/base/file.h"
#include "glossa/kernels/cpu_features.h"
#include "glossa/kernels/kernel_choice.h"
#include "glossa/runtime/cpu_runtime.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

TEST(BlasKernels, TheFastestSetOfTheProbesIsChosenAndCached) {
  if (*BlasCoreName() == '\0') GTEST_SKIP() << "OpenBLAS is not loaded";
  const std::string dir = testing::TempDir("blas_kernels");
  const std::string log = dir + "/probes.txt";
  const std::string previous = KernelChoiceCachePath();
  SetKernelChoiceCache(dir + "/k.tsv");
  // A probe program: SkylakeX's kernels take a tenth of the others' time; each run is logged.
  const std::vector<std::string> probe = {
      "/bin/sh", "-c",
      "echo \"$OPENBLAS_CORETYPE $GLOSSA_BLAS_PROBE\" >> '" + log + "'; "
      "case \"$OPENBLAS_CORETYPE\" in SkylakeX) echo 'blas_probe_seconds 0.001';; "
      "*) echo 'blas_probe_seconds 0.01';; esac"};
  std::string description;
  const std::string chosen = ChooseBlasKernels(probe, &description);
  const X86Features cpu = ProbeX86Features();
  const bool avx512 = cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq;
  EXPECT_EQ(chosen, avx512 ? "SkylakeX" : BlasCoreName()) << description;
  const std::string probes = ReadFileToString(log);
  if (avx512 || (cpu.avx2 && cpu.fma && std::string(BlasCoreName()) != "Haswell")) {
    EXPECT_NE(probes.find(std::string(BlasCoreName()) + " 1\n"), std::string::npos) << probes;
    EXPECT_NE(description.find("(measured: "), std::string::npos) << description;
    // The second call reads the cache: no probe runs.
    EXPECT_EQ(ChooseBlasKernels(probe, &description), chosen);
    EXPECT_EQ(ReadFileToString(log), probes);
    EXPECT_NE(description.find("; as cached in " + dir + "/k.tsv"), std::string::npos)
        << description;
    EXPECT_NE(ReadFileToString(dir + "/k.tsv").find(BlasChoiceKey() + "\t" + chosen + "\t"),
              std::string::npos);
  }
  // Probes that fail (exit 3, or say nothing) lose: what runs now is kept.
  SetKernelChoiceCache(dir + "/k2.tsv");
  EXPECT_EQ(ChooseBlasKernels({"/bin/sh", "-c", "exit 3"}, &description), BlasCoreName())
      << description;
  SetKernelChoiceCache(dir + "/k3.tsv");
  EXPECT_EQ(ChooseBlasKernels({"/bin/sh", "-c", "echo hello"}, &description), BlasCoreName())
      << description;
  EXPECT_EQ(ChooseBlasKernels({"/no/such/program"}, &description), BlasCoreName());
  SetKernelChoiceCache(previous);
}

}  // namespace
}  // namespace glossa
