// The small ops with AVX2 + FMA: rmsnorm, swiglu, geglu, add, scale, and exp for its test.
// Each has a scalar reference in ops.cpp; the accuracy of each is in attention.h. Same
// target-region rules as kernels_avx2.cpp: internal linkage, no std:: templates inside.
#include <cmath>
#include <cstdint>

#include "kiln/backend/cpu/attention.h"
#include "kiln/util/status.h"

#if defined(__x86_64__)
#include <immintrin.h>

#if defined(__clang__)  // clang has no GCC target pragma: the same as a function attribute
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace kiln::backend::cpu {
namespace {

#include "kiln/backend/cpu/vec_math_avx2.h"

// Sum of squares in double, as the reference (fp32 squares are exact in double), in a fixed
// lane order per row.
double sum_squares(const float* x, int64_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    a0 = _mm256_fmadd_pd(lo, lo, a0);
    a1 = _mm256_fmadd_pd(hi, hi, a1);
  }
  const __m256d a = _mm256_add_pd(a0, a1);
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
  s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
  double sum = _mm_cvtsd_f64(s);
  for (; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

void rmsnorm_rows(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    const float inv =
        static_cast<float>(1.0 / std::sqrt(sum_squares(xr, n) / static_cast<double>(n) + eps));
    const __m256 vinv = _mm256_set1_ps(inv);
    int64_t i = 0;
    if (w != nullptr) {
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), vinv),
                                               _mm256_loadu_ps(w + i)));
      for (; i < n; ++i) yr[i] = xr[i] * inv * w[i];
    } else {
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_loadu_ps(xr + i), vinv));
      for (; i < n; ++i) yr[i] = xr[i] * inv;
    }
  }
}

// The tails go through the vector code too (one padded vector), so every element of a row
// gets the same arithmetic wherever it sits.
template <typename F>
void map2(const float* a, const float* b, float* out, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, f(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  if (i < n) {
    alignas(32) float ta[8] = {}, tb[8] = {}, to[8];
    for (int64_t k = 0; k < n - i; ++k) ta[k] = a[i + k], tb[k] = b[i + k];
    _mm256_store_ps(to, f(_mm256_load_ps(ta), _mm256_load_ps(tb)));
    for (int64_t k = 0; k < n - i; ++k) out[i + k] = to[k];
  }
}

struct Swiglu {
  __m256 operator()(__m256 g, __m256 u) const {
    // g / (1 + e^-g) * up, as the reference.
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
  }
};

struct Geglu {
  __m256 operator()(__m256 g, __m256 u) const {
    // 0.5 g (1 + tanh(z)) = g * sigmoid(2z), z = sqrt(2/pi) (g + 0.044715 g^3): the sigmoid
    // form has no cancellation for negative g.
    const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    const __m256 z = _mm256_mul_ps(_mm256_set1_ps(2.0f * 0.7978845608028654f),
                                   _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g));
    return _mm256_mul_ps(_mm256_mul_ps(g, sigmoid8(z)), u);
  }
};

struct Add {
  __m256 operator()(__m256 a, __m256 b) const { return _mm256_add_ps(a, b); }
};

}  // namespace

void rmsnorm_avx2(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps) {
  rmsnorm_rows(x, w, y, n_rows, n, eps);
}

void swiglu_avx2(const float* gate, const float* up, float* out, int64_t n) {
  map2(gate, up, out, n, Swiglu{});
}

void geglu_avx2(const float* gate, const float* up, float* out, int64_t n) {
  map2(gate, up, out, n, Geglu{});
}

void add_avx2(float* x, const float* y, int64_t n) {
  map2(x, y, x, n, Add{});
}

void scale_avx2(float* x, float s, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
  for (; i < n; ++i) x[i] *= s;
}

void fp32_to_fp16_avx2(const float* x, uint16_t* y, int64_t n, int64_t stride) {
  for (int64_t i = 0; i < n; i += 8) {
    alignas(32) float in[8] = {};
    alignas(16) uint16_t h[8];
    const int64_t m = n - i < 8 ? n - i : 8;
    for (int64_t k = 0; k < m; ++k) in[k] = x[i + k];
    _mm_store_si128(reinterpret_cast<__m128i*>(h),
                    _mm256_cvtps_ph(_mm256_load_ps(in), _MM_FROUND_TO_NEAREST_INT));
    for (int64_t k = 0; k < m; ++k) y[(i + k) * stride] = h[k];
  }
}

void exp_avx2(const float* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, exp8(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) {
    alignas(32) float t[8] = {x[i]};
    _mm256_store_ps(t, exp8(_mm256_load_ps(t)));
    out[i] = t[0];
  }
}

}  // namespace kiln::backend::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else  // not x86-64: never called (avx2_ops_available() is false)

namespace kiln::backend::cpu {
void rmsnorm_avx2(const float*, const float*, float*, int64_t, int64_t, float) {
  KILN_ASSERT(false);
}
void swiglu_avx2(const float*, const float*, float*, int64_t) {
  KILN_ASSERT(false);
}
void geglu_avx2(const float*, const float*, float*, int64_t) {
  KILN_ASSERT(false);
}
void add_avx2(float*, const float*, int64_t) {
  KILN_ASSERT(false);
}
void scale_avx2(float*, float, int64_t) {
  KILN_ASSERT(false);
}
void exp_avx2(const float*, float*, int64_t) {
  KILN_ASSERT(false);
}
void fp32_to_fp16_avx2(const float*, uint16_t*, int64_t, int64_t) {
  KILN_ASSERT(false);
}
}  // namespace kiln::backend::cpu

#endif
