// CPU feature detection and core counts, for picking kernels and the default thread count.
//
// Features are detected once (cpuid + XGETBV on x86-64, getauxval(AT_HWCAP{,2}) on aarch64)
// and mean "usable here": a flag is true only when the CPU has the instructions AND the OS
// saves the register state they need (YMM for AVX*, opmask/ZMM for AVX-512, tile state for
// AMX). On other architectures every flag is false.
//
// Implications we guarantee (kernels may rely on them): avx2/fma/f16c/avx_vnni imply avx;
// every avx512* flag implies avx512f, and avx512f implies avx2 and fma; amx_int8/amx_bf16
// imply amx_tile; arm_dotprod/arm_fp16/arm_i8mm imply neon.
//
// AMX note: on Linux a process must also ask for the tile data state
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) before its first tile instruction;
// amx_tile here only says the CPU and the kernel support it.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace kiln::util {

struct CpuFeatures {
  // x86-64
  bool sse3 = false;
  bool ssse3 = false;
  bool sse41 = false;
  bool sse42 = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool bmi2 = false;
  bool avx512f = false;
  bool avx512dq = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vbmi = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool avx512fp16 = false;
  bool avx_vnni = false;
  bool amx_tile = false;
  bool amx_int8 = false;
  bool amx_bf16 = false;
  // aarch64
  bool neon = false;         // Advanced SIMD (HWCAP_ASIMD)
  bool arm_dotprod = false;  // SDOT/UDOT (HWCAP_ASIMDDP)
  bool arm_fp16 = false;     // fp16 arithmetic, scalar and vector (HWCAP_FPHP + HWCAP_ASIMDHP)
  bool arm_i8mm = false;     // SMMLA/UMMLA (HWCAP2_I8MM)
  bool arm_sve = false;      // SVE (HWCAP_SVE)
};

// One named flag, in the order to_string() prints them.
struct CpuFlagName {
  const char* name;  // "AVX2", "AVX512_VNNI", "NEON", ...
  bool CpuFeatures::*member;
};
std::span<const CpuFlagName> cpu_flag_names();

// The features of this machine, detected on first call (thread-safe).
const CpuFeatures& cpu_features();

// Space-separated names of the true flags, in cpu_flag_names() order ("AVX AVX2 FMA F16C").
// Empty when no flag is set.
std::string to_string(const CpuFeatures& f);

// The raw x86 inputs of detection, so the decoding can be tested with fabricated values.
struct X86CpuidRegs {
  uint32_t max_leaf = 0;   // leaf 0 EAX
  uint32_t leaf1_ecx = 0;  // leaf 1
  uint32_t leaf1_edx = 0;
  uint32_t leaf7_max_sub = 0;  // leaf 7 subleaf 0 EAX: highest subleaf
  uint32_t leaf7_ebx = 0;      // leaf 7 subleaf 0
  uint32_t leaf7_ecx = 0;
  uint32_t leaf7_edx = 0;
  uint32_t leaf7_1_eax = 0;  // leaf 7 subleaf 1
  uint64_t xcr0 = 0;         // XGETBV(0); read only when leaf 1 ECX.OSXSAVE is set
};
// Pure decoding of cpuid/XCR0 values into features (applies the OS-state checks and the
// implications above). Leaves above max_leaf / leaf7_max_sub are ignored.
CpuFeatures decode_x86_features(const X86CpuidRegs& regs);

// Pure decoding of Linux aarch64 AT_HWCAP / AT_HWCAP2 bits.
CpuFeatures decode_arm_hwcaps(uint64_t hwcap, uint64_t hwcap2);

// Logical CPUs the system has (std::thread::hardware_concurrency, at least 1).
int num_logical_cores();
// Logical CPUs this process may run on (sched_getaffinity; falls back to num_logical_cores).
int num_available_cores();
// Physical cores among the available CPUs: SMT siblings (sysfs thread_siblings_list) count
// once. Falls back to num_available_cores when the topology cannot be read.
int num_physical_cores();

}  // namespace kiln::util
