// AVX-512 VL + VNNI kernels (Ice Lake, Sapphire Rapids, Zen 4 and later): the AVX2 kernel
// bodies (kernels_x86.inc) with vpdpbusd / vpdpwssd, on 256-bit vectors (512-bit, 16-row
// groups for the packed kernels). Compiled with a target pragma so the build needs no -march
// flag; matmul.cpp calls them only when util::cpu_features() reports AVX-512 F/BW/VL/VNNI.
#include <cstdint>
#include <cstring>
#include <vector>

#include "kiln/backend/cpu/kernels.h"
#include "kiln/backend/cpu/pack.h"
#include "kiln/quant/blocks.h"

#if defined(__x86_64__)
#include <immintrin.h>

#if defined(__clang__)  // clang has no GCC target pragma: the same as a function attribute
#pragma clang attribute push(                                                      \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif
// GCC 12's avx512fintrin.h starts several 512-bit conversions (cvtepi8_epi32, cvtph_ps, ...)
// from _mm512_undefined_*(), which -Wmaybe-uninitialized reports as an uninitialized read.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace kiln::backend::cpu {
namespace {

#include "kiln/backend/cpu/kernels_tile.h"

#define KILN_X86_VNNI 1
#include "kiln/backend/cpu/kernels_x86.inc"
#undef KILN_X86_VNNI
static_assert(PV::kRows == pack_rows(KernelPath::Avx512));

}  // namespace
}  // namespace kiln::backend::cpu

#pragma GCC diagnostic pop
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace kiln::backend::cpu {

GemmFn gemm_avx512(quant::Type t) {
  switch (t) {
    case quant::Type::F32:
      return gemm<FKernel<FType::F32>>;
    case quant::Type::F16:
      return gemm<FKernel<FType::F16>>;
    case quant::Type::BF16:
      return gemm<FKernel<FType::BF16>>;
    case quant::Type::Q8_0:
      return gemm<Q32Kernel<false>>;
    case quant::Type::Q4_0:
      return gemm<Q32Kernel<true>>;
    case quant::Type::Q4_K:
      return gemm<KKernel<UnpackQ4K>>;
    case quant::Type::Q5_K:
      return gemm<KKernel<UnpackQ5K>>;
    case quant::Type::Q6_K:
      return gemm<KKernel<UnpackQ6K>>;
    default:
      return nullptr;
  }
}

GemmFn gemm_packed_avx512(quant::Type t) {
  switch (t) {
    case quant::Type::Q8_0:
      return gemm_packed<PackedQ8Kernel>;
    case quant::Type::Q4_K:
      return gemm_packed<PackedQ4KKernel>;
    case quant::Type::Q6_K:
      return gemm_packed<PackedQ6KKernel>;
    default:
      return nullptr;
  }
}

}  // namespace kiln::backend::cpu

#else  // not x86-64

namespace kiln::backend::cpu {
GemmFn gemm_avx512(quant::Type) {
  return nullptr;
}
GemmFn gemm_packed_avx512(quant::Type) {
  return nullptr;
}
}  // namespace kiln::backend::cpu

#endif
