// OpenBLAS's kernel set, chosen by measurement. OpenBLAS picks its GEMM kernels from CPUID when it
// loads, and its pick is not always the fastest: in some VMs it settles on a pre-AVX2 set
// (Prescott, SSE3) on a CPU with AVX2 or AVX-512 and fp32 GEMMs run 2-3x slower; on a Zen 5 EPYC
// its AVX-512 kernels trained a 512-wide model 1.69x as fast as the AVX2 ones its environment
// pinned. So the glossa program and the benchmarks time the sets the CPU supports (what OpenBLAS
// picked, Haswell with AVX2 and FMA, SkylakeX with AVX-512) on fp32 GEMMs of training shapes,
// each in a child process started with OPENBLAS_CORETYPE naming it, keep the fastest (what OpenBLAS
// picked unless another takes under 0.9 of its time), cache the decision per machine
// (glossa/kernels/kernel_choice.h's cache file), say it on stderr, and re-execute the program
// with OPENBLAS_CORETYPE set when it differs.
//
//   int main(int argc, char** argv) {
//     glossa::UseBestBlasKernels(argv);  // first thing: may re-execute this program
//
// A set OPENBLAS_CORETYPE is the user's choice and is kept; GLOSSA_KEEP_BLAS_KERNELS=1 keeps what
// OpenBLAS picked.
#pragma once

#include <string>
#include <vector>

namespace glossa {

// See above. Re-executes /proc/self/exe with the same argv (and PID) when another kernel set
// wins. In a probe process (GLOSSA_BLAS_PROBE=1 in the environment) it runs the probe instead,
// prints "blas_probe_seconds <s>" on stdout and exits.
void UseBestBlasKernels(char** argv);

// The kernel set to run: candidates as above, each timed by running `probe_argv` (a program that
// calls UseBestBlasKernels or RunBlasProbe first) with OPENBLAS_CORETYPE and GLOSSA_BLAS_PROBE=1
// set; cached under BlasChoiceKey(). `description` gets what kernel_choice.h's
// ChooseAmongCached says. "" when OpenBLAS is not loaded.
std::string ChooseBlasKernels(const std::vector<std::string>& probe_argv, std::string* description);

// The cache key of the decision: this CPU (CpuIdentity), its cores, the probe's version, and the
// kernel set OpenBLAS picked.
std::string BlasChoiceKey();

// The probe: the median time of five rounds of fp32 GEMMs of training shapes (2048 x 512 x 512
// and 2048 x 128 x 512) on OpenBLAS's threads, printed as "blas_probe_seconds <s>".
void RunBlasProbe();

}  // namespace glossa
