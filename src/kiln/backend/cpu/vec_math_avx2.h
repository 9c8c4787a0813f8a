// Vector math for the AVX2 kernels: exp, sigmoid, tanh and horizontal reductions on 8 fp32
// lanes. Include it only inside a `#pragma GCC target("avx2,fma,f16c")` region and inside an
// anonymous namespace (attention_avx2.cpp, ops_avx2.cpp), so that every function has internal
// linkage and no AVX2 code can leak to callers on other CPUs.
//
// exp8: the Cephes expf scheme (S. Moshier, Cephes Math Library): x = n ln2 + r with
// |r| <= ln2/2 (ln2 split in two constants so n ln2 is exact enough), e^r by a degree-6
// polynomial, 2^n put into the exponent bits. Measured relative error below 4e-7 on
// [-87, 88] (attention_test.cpp). Inputs below -87.33 (results that would be subnormal, and
// -inf) give 0; inputs above 88.3 are clamped to 88.3 (never inf). NaN in gives a finite
// value: callers do not pass NaN.

inline __m256 exp8(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3365447504019f), _CMP_LT_OQ);
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365447504019f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i n = _mm256_cvtps_epi32(fx);
  const __m256 pow2n =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, pow2n));
}

// 1 / (1 + e^-x)
inline __m256 sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

// tanh(x) = 1 - 2 / (e^2x + 1): absolute error about 2e-7 (relative error grows near 0).
inline __m256 tanh8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = exp8(_mm256_add_ps(x, x));
  return _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
}

// Sum of the 8 lanes in a fixed order: (0+4, 1+5, 2+6, 3+7), then pairs.
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
