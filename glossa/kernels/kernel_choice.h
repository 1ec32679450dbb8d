// Kernel choices by measurement. Where two kernels compute the same thing, which one runs is
// decided by timing both on this machine, on the shape in use, the first time the process meets
// that shape: never by a list of CPU flags or a core count, which is right on one VM and a bug on
// the next (issue 48: on a Xeon without AMX oneDNN's bf16 GEMM ran at 0.7× OpenBLAS's fp32, on a
// Zen 4 at 1.9×). Three choices are made so, each ATen's path against Glossa's native one:
//   kBf16       bf16 projections and attention: ATen's bf16 GEMMs (oneDNN's AVX-512 BF16 / AMX
//               kernels) or Glossa's float32 sgemms of the exactly widened values;
//   kGemmSplit  a training fp32 projection's GEMMs: one at a time on OpenBLAS's threads, or as row
//               parts, one single-threaded GEMM per kernel thread (and the backward's two GEMMs
//               side by side on two);
//   kRowKernel  Glossa's own kernels for small products, against BLAS sgemm, which packs its
//               operands on every call: a short fp32 input without autograd (decoding, scoring)
//               on the row kernel that reads the weights in place (glossa/kernels/batch_invariant.h),
//               measured per power-of-two row count; and the float32 attention core's per-head
//               products on SmallSgemm (glossa/kernels/small_gemm.h), measured per head shape.
//
// A probe runs the forward (and, in training, the backward) of both paths on operands of the
// layer's weight shape at a fixed row count (2,048 rows in training, 256 in inference: one path
// per layer whatever the batch, so that a sentence's bits do not depend on what shares its
// batch), a warm-up then five alternating timed calls each, and keeps the native path unless
// ATen's median is under 0.9 of it (near ties stay put) in two of at most three such measurements
// (SettleMeasurements); it costs a few milliseconds per shape for
// small models and about 0.3 s per shape for a 512-wide one, once per machine (the decisions are
// cached in a file, see SetKernelChoiceCache). Each decision is
// said once on stderr ("kernel choice: ..."), kept for the process, and listed by
// KernelDecisions() (the benchmarks print them). The two paths differ only in the order of float32
// sums, so a measured choice can change the last bits of a bf16 run between machines or runs:
// `--bf16_kernels=aten|native` pins it (`--gemm_split`, `--row_kernels` the others).
//
//   SetKernelMode(KernelChoice::kBf16, ParseKernelMode("measure", "--bf16_kernels"));  // default
//   const bool native = ChooseNative(KernelChoice::kBf16, "bf16_affine", "2048x512x2048 train",
//                                    [&](bool native) { /* run that path once */ });
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace glossa {

enum class KernelMode { kMeasure, kAten, kNative };
enum class KernelChoice { kBf16, kGemmSplit, kRowKernel };

// The flag that pins `choice` ("--bf16_kernels", "--gemm_split", "--row_kernels").
const char* KernelChoiceFlag(KernelChoice choice);
// "measure" (time both), "aten" (ATen's path) or "native" (Glossa's); InvalidArgument naming
// `flag` otherwise.
KernelMode ParseKernelMode(const std::string& text, const std::string& flag);
// How this process makes `choice` (kMeasure unless set). A forced mode applies from the next call
// on; measured decisions are kept for when the mode is kMeasure again.
void SetKernelMode(KernelChoice choice, KernelMode mode);
KernelMode GetKernelMode(KernelChoice choice);

struct KernelDecision {
  KernelChoice choice = KernelChoice::kBf16;
  std::string op, shape;
  bool native = false;
  bool measured = false;                     // false: given by the mode
  bool cached = false;                       // measured earlier, by a run of this machine
  double aten_seconds = 0, native_seconds = 0;  // medians per call, of the latest measurement
  // The measurements of this shape (cached and this process's) and how many ATen's path won: it
  // is taken only after winning two (SettleMeasurements).
  int measurements = 0, aten_wins = 0;
  std::string cache;                          // the cache file it was read from or written to
  std::string Describe() const;
};

// Whether `op` at `shape` (a key naming the shape and mode) runs the native path: the mode's
// path when it forces one; else measured once per process by `run(native)` for both paths and the
// faster kept. Thread-safe (a second caller waits for the first's probe).
bool ChooseNative(KernelChoice choice, const std::string& op, const std::string& shape,
                  const std::function<void(bool native)>& run);

// How a shape's measurements settle. The native path is the default; ATen's (BLAS) is taken only
// once it has won two of at most three: a first measurement that BLAS wins is followed by another,
// and by a third when the two disagree (in the same process, under the cache's lock, so that later
// runs, a resumed one among them, read a settled decision). On a 2-core Xeon three cached single BLAS
// wins of the scoring network's projections (512 × 128 × 2000, 512 × 512 × 128, 256 × 512 × 128)
// were native wins by 1.3-1.6× when measured again. `measure_again`: one more is needed.
struct SettledChoice {
  bool native = true;
  bool measure_again = false;
};
SettledChoice SettleMeasurements(int measurements, int aten_wins);

// The CPU that /proc/cpuinfo's text `cpuinfo` describes (its first processor): "<model name>
// (<vendor> family F model M stepping S, flags <digest of the flags>)". The model name alone does
// not tell CPUs apart (VMs of Zen 4 and Zen 5 both say "AMD EPYC").
std::string CpuIdentity(const std::string& cpuinfo);
// CpuIdentity of this machine's /proc/cpuinfo, read once per process.
const std::string& ThisCpuIdentity();

// Measured decisions are shared by the runs of one machine through a cache file (a line per
// CPU (CpuIdentity), core count, ATen thread count, libtorch and OpenBLAS kernel set, op and shape),
// locked while it is read and a missing decision measured, so that runs started together agree,
// and a resumed run keeps its kernels. The default: $GLOSSA_KERNEL_CHOICE_CACHE ("none": no
// cache), else $XDG_CACHE_HOME/glossa/kernel_choices.tsv, else ~/.cache/glossa/; "" here: none.
// Delete the file to measure again.
void SetKernelChoiceCache(const std::string& path);

// Every decision this process made, in the order made.
std::vector<KernelDecision> KernelDecisions();

// A choice among named candidates that a process cannot time in itself (OpenBLAS's kernel set,
// fixed when the library loads: glossa/runtime/blas_kernels.h). `seconds(candidate)` times one
// (say, in a child process; +inf when it could not), candidates[0] is what runs now and is kept
// unless another takes under 0.9 of its time. The decision is kept in the cache file
// (SetKernelChoiceCache) under `key` as "<key>\t<choice>\t<candidate>=<seconds>,...", the file
// locked while it is read and a missing decision measured; `description` (if not null) gets
// "<choice> (measured: <candidate> <ms> ms, ...)".
std::string ChooseAmongCached(const std::string& key, const std::vector<std::string>& candidates,
                              const std::function<double(const std::string&)>& seconds,
                              std::string* description);
// The cache file decisions are kept in now ("" none).
std::string KernelChoiceCachePath();

}  // namespace glossa
