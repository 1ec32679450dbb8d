// One CPU-feature probe for Glossa's native kernels, and the switch that forces their ATen
// reference paths (the first piece of the kernels room, DESIGN.md §2).
//
//   GLOSSA_KERNELS=reference build/bin/glossa_tests   # every kernel on its reference path
//
// GLOSSA_KERNELS is "native" (the default: the CPU's features decide) or "reference" (every
// native kernel reports its features absent, so callers take the ATen paths, on any machine).
// CI runs the unit tests both ways, so the fallbacks run on AVX-512 machines too.
#pragma once

namespace glossa {

// True with GLOSSA_KERNELS=reference. Another value than native or reference is InvalidArgument.
bool KernelsForcedToReference();

// What the native kernels need; false when forced to reference, and on a non-x86 build.
bool CpuHasAvx512F();      // AVX-512 Foundation
bool CpuHasAvx512BwVl();   // AVX-512 F + BW + VL

}  // namespace glossa
