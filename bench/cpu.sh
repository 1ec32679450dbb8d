#!/usr/bin/env bash
# Prints the CPU a benchmark ran on, the way the kernel-choice cache keys it: the model name and
# its vendor, family, model and stepping (VMs of Zen 4 and Zen 5 both say "AMD EPYC"), the
# vector extensions that decide our kernels, and the core count.
#   bash bench/cpu.sh   ->  AMD EPYC (AuthenticAMD family 26 model 2 stepping 1; avx512f avx512_bf16 avx512_vnni), 2 cores
awk -F': *' -v cores="$(nproc)" '
  /^model name/ && !n { n = $2 } /^vendor_id/ && !v { v = $2 } /^cpu family/ && !f { f = $2 }
  /^model[ \t]*:/ && !m { m = $2 } /^stepping/ && !s { s = $2 }
  /^flags/ && !fl { fl = " " $2 " " }
  END {
    ext = ""
    split("avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_int8", want, " ")
    for (i = 1; i <= 6; i++) if (index(fl, " " want[i] " ")) ext = ext (ext == "" ? "" : " ") want[i]
    printf "%s (%s family %s model %s stepping %s; %s), %d cores\n", n, v, f, m, s, ext, cores
  }' /proc/cpuinfo
