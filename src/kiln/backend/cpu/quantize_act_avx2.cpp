// quantize_act_row with AVX2 (quantize_act.h): the same values as the scalar reference, bit
// for bit: amax over the block (NaN ignored, as std::max does), the same scalar divisions
// for d and 1/d, x * id clamped to [-127, 127] (NaN -> -127), rounded half to even (the
// rounding instruction equals the reference's 1.5 * 2^23 trick for |v| <= 127). Same
// target-region rules as kernels_avx2.cpp.
#include <cstdint>

#include "kiln/backend/cpu/quantize_act.h"

#if defined(__x86_64__)
#include <immintrin.h>

#if defined(__clang__)  // clang has no GCC target pragma: the same as a function attribute
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace kiln::backend::cpu {

void quantize_act_row_avx2(const float* x, int64_t n, int block_elems, int8_t* qs, float* d,
                           int16_t* bsums) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const int64_t nb = n / block_elems;
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * block_elems;
    int8_t* qb = qs + b * block_elems;
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < block_elems; i += 8) {
      // max(|x|, m): a NaN |x| keeps m (the second operand), as std::max(amax, NaN) does.
      m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + i)), m);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float amax = _mm_cvtss_f32(m4);
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    const __m256 vid = _mm256_set1_ps(id);
    for (int i = 0; i < block_elems; i += 32) {
      __m256i q[4];
      for (int k = 0; k < 4; ++k) {
        // max(x * id, -127): NaN -> -127 (second operand), then min(., 127).
        __m256 v = _mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 8 * k), vid), lo);
        v = _mm256_min_ps(v, hi);
        q[k] =
            _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
      const __m256i p =
          _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + i),
                          _mm256_permutevar8x32_epi32(p, order));
    }
  }
  if (bsums != nullptr) {
    for (int64_t g = 0; g < n / 16; ++g) {
      int32_t s = 0;
      for (int i = 0; i < 16; ++i) s += qs[g * 16 + i];
      bsums[g] = static_cast<int16_t>(s);
    }
  }
}

}  // namespace kiln::backend::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
