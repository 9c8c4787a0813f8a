// AVX2 + FMA + F16C kernels (Haswell and later, Zen). Compiled with a target pragma so the
// build needs no -march flag; matmul.cpp calls them only when util::cpu_features() says so.
//
// Quantized weights: llama.cpp's integer recipe. _mm256_maddubs_epi16 multiplies unsigned
// weight bytes by signed activation bytes and adds adjacent pairs into int16 (no saturation:
// |q| <= 63 or |w| <= 128 times |x| <= 127, twice, stays below 32767), _mm256_madd_epi16
// widens to int32 (times the sub-block scales for K-quants). Signed Q8_0 weights use the
// sign trick (|w| times x * sign(w)); Q4_0's -8 and Q6_K's -32 offsets are subtracted through
// the activation sums. Per block the 8 int32 lanes become fp32 and are multiplied-added by
// d_w * d_x into 8 fp32 lanes per output, summed at the end.
#include <cstdint>
#include <cstring>

#include "kiln/backend/cpu/kernels.h"
#include "kiln/quant/blocks.h"

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace kiln::backend::cpu {
namespace {

#include "kiln/backend/cpu/kernels_tile.h"

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline __m256i loadu(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// Pointers of the tile's activation rows.
template <int T>
struct ActRows {
  const int8_t* qs[T];
  const float* d[T];
  const int16_t* bsums[T];
  ActRows(const QuantizedActs& a, int64_t t0) {
    for (int t = 0; t < T; ++t) {
      qs[t] = a.qs.data() + (t0 + t) * a.qs_stride;
      d[t] = a.d.data() + (t0 + t) * a.d_stride;
      bsums[t] = a.bsums_stride ? a.bsums.data() + (t0 + t) * a.bsums_stride : nullptr;
    }
  }
};

template <int R, int T>
inline void store_tile(const GemmArgs& g, int64_t r0, int64_t t0, const __m256 (&acc)[R][T]) {
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) g.y[(t0 + t) * g.w->n_out + r0 + r] = hsum8(acc[r][t]);
}

// ---- Q8_0 x Q8_0 and Q4_0 x Q8_0: blocks of 32 -------------------------------------------

template <bool kQ4>
struct Q32Kernel {
  static constexpr int kRows = 2;
  static constexpr int kTokens = 4;
  static constexpr int64_t kBlockBytes = kQ4 ? 18 : 34;

  template <int R, int T>
  static void tile(const GemmArgs& g, int64_t r0, int64_t t0) {
    const Weight& w = *g.w;
    const ActRows<T> x(*g.a, t0);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i eights = _mm256_set1_epi8(8);
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    const int64_t nb = w.n_in / 32;
    for (int64_t b = 0; b < nb; ++b) {
      __m256i wu[R], ws[R];  // unsigned weight bytes; Q8_0: the signed weights for sign()
      float dw[R];
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = w.row(r0 + r) + b * kBlockBytes;
        dw[r] = load_f16(blk);
        if constexpr (kQ4) {
          const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
          const __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
          wu[r] = _mm256_and_si256(both, m4);
        } else {
          ws[r] = loadu(blk + 2);
          wu[r] = _mm256_abs_epi8(ws[r]);
        }
      }
      for (int t = 0; t < T; ++t) {
        const __m256i xv = loadu(x.qs[t] + b * 32);
        const float dx = x.d[t][b];
        __m256i m8 = _mm256_setzero_si256();
        if constexpr (kQ4) m8 = _mm256_maddubs_epi16(eights, xv);
        for (int r = 0; r < R; ++r) {
          __m256i p;
          if constexpr (kQ4) {
            p = _mm256_sub_epi16(_mm256_maddubs_epi16(wu[r], xv), m8);
          } else {
            p = _mm256_maddubs_epi16(wu[r], _mm256_sign_epi8(xv, ws[r]));
          }
          const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
          acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dw[r] * dx), s, acc[r][t]);
        }
      }
    }
    store_tile<R, T>(g, r0, t0, acc);
  }
};

// ---- K-quants x Q8_K: super-blocks of 256 ------------------------------------------------

// One super-block of one weight row, unpacked so that every type shares the dot below:
// isum = sum_k madd(maddubs(q[32k..], x[32k..]), scv[k]) (scv: the int16 multiplier of each
// element pair), icor = madd(cor, x bsums) (cor: the multiplier of each 16-sum of x).
struct KBlock {
  alignas(32) uint8_t q[256];
  alignas(32) int16_t scv[8][16];
  alignas(32) int16_t cor[16];
  float d;     // multiplies isum
  float dcor;  // multiplies icor (subtracted)
};

inline void unpack_q4_k_scales(const uint8_t* blk, KBlock* kb) {
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) quant::unpack_scale_min_k4(j, blk + 4, &sc[j], &m[j]);
  for (int k = 0; k < 8; ++k)
    _mm256_store_si256(reinterpret_cast<__m256i*>(kb->scv[k]), _mm256_set1_epi16(sc[k]));
  for (int g = 0; g < 16; ++g) kb->cor[g] = m[g / 2];
  kb->d = load_f16(blk);
  kb->dcor = load_f16(blk + 2);
}

struct UnpackQ4K {
  static constexpr int64_t kBlockBytes = 144;
  static constexpr bool kFold = false;
  static void unpack(const uint8_t* blk, KBlock* kb) {
    unpack_q4_k_scales(blk, kb);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int c = 0; c < 4; ++c) {
      const __m256i v = loadu(blk + 16 + 32 * c);
      _mm256_store_si256(reinterpret_cast<__m256i*>(kb->q + 64 * c), _mm256_and_si256(v, m4));
      _mm256_store_si256(reinterpret_cast<__m256i*>(kb->q + 64 * c + 32),
                         _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    }
  }
};

struct UnpackQ5K {
  static constexpr int64_t kBlockBytes = 176;
  static constexpr bool kFold = false;
  static void unpack(const uint8_t* blk, KBlock* kb) {
    unpack_q4_k_scales(blk, kb);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i sixteen = _mm256_set1_epi8(16);
    const __m256i hv = loadu(blk + 16);
    for (int c = 0; c < 4; ++c) {
      const __m256i v = loadu(blk + 48 + 32 * c);
      const __m256i bl = _mm256_set1_epi8(static_cast<char>(1 << (2 * c)));
      const __m256i bh = _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1)));
      const __m256i hl = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, bl), bl), sixteen);
      const __m256i hh = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, bh), bh), sixteen);
      _mm256_store_si256(reinterpret_cast<__m256i*>(kb->q + 64 * c),
                         _mm256_or_si256(_mm256_and_si256(v, m4), hl));
      _mm256_store_si256(reinterpret_cast<__m256i*>(kb->q + 64 * c + 32),
                         _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), hh));
    }
  }
};

struct UnpackQ6K {
  static constexpr int64_t kBlockBytes = 210;
  static constexpr bool kFold = true;  // isum - icor is exact: one fp32 multiply-add
  static void unpack(const uint8_t* blk, KBlock* kb) {
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = loadu(ql + 64 * h);
      const __m256i l1 = loadu(ql + 64 * h + 32);
      const __m256i hb = loadu(qh + 32 * h);
      __m256i* q = reinterpret_cast<__m256i*>(kb->q + 128 * h);
      _mm256_store_si256(q + 0, _mm256_or_si256(_mm256_and_si256(l0, m4),
                                                _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30)));
      _mm256_store_si256(q + 1, _mm256_or_si256(_mm256_and_si256(l1, m4),
                                                _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30)));
      _mm256_store_si256(q + 2, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                                _mm256_and_si256(hb, m30)));
      _mm256_store_si256(q + 3, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                                _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30)));
    }
    for (int k = 0; k < 8; ++k) {
      _mm256_store_si256(
          reinterpret_cast<__m256i*>(kb->scv[k]),
          _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k])));
    }
    for (int g = 0; g < 16; ++g) kb->cor[g] = static_cast<int16_t>(32 * sc[g]);
    kb->d = load_f16(blk + 208);
    kb->dcor = kb->d;
  }
};

template <class U>
struct KKernel {
  static constexpr int kRows = 2;
  static constexpr int kTokens = 4;

  template <int R, int T>
  static void tile(const GemmArgs& g, int64_t r0, int64_t t0) {
    const Weight& w = *g.w;
    const ActRows<T> x(*g.a, t0);
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    KBlock kb[R];
    const int64_t nb = w.n_in / 256;
    for (int64_t b = 0; b < nb; ++b) {
      for (int r = 0; r < R; ++r) U::unpack(w.row(r0 + r) + b * U::kBlockBytes, &kb[r]);
      __m256i sum[R][T];
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) sum[r][t] = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        __m256i q[R], s[R];
        for (int r = 0; r < R; ++r) {
          q[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(kb[r].q + 32 * k));
          s[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(kb[r].scv[k]));
        }
        for (int t = 0; t < T; ++t) {
          const __m256i xv = loadu(x.qs[t] + b * 256 + 32 * k);
          for (int r = 0; r < R; ++r) {
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], xv), s[r]);
            sum[r][t] = _mm256_add_epi32(sum[r][t], p);
          }
        }
      }
      for (int t = 0; t < T; ++t) {
        const __m256i bs = loadu(x.bsums[t] + b * 16);
        const float dx = x.d[t][b];
        for (int r = 0; r < R; ++r) {
          const __m256i c = _mm256_madd_epi16(loadu(kb[r].cor), bs);
          if constexpr (U::kFold) {
            const __m256 s = _mm256_cvtepi32_ps(_mm256_sub_epi32(sum[r][t], c));
            acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(kb[r].d * dx), s, acc[r][t]);
          } else {
            acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(kb[r].d * dx), _mm256_cvtepi32_ps(sum[r][t]),
                                        acc[r][t]);
            acc[r][t] =
                _mm256_fnmadd_ps(_mm256_set1_ps(kb[r].dcor * dx), _mm256_cvtepi32_ps(c), acc[r][t]);
          }
        }
      }
    }
    store_tile<R, T>(g, r0, t0, acc);
  }
};

// ---- F32 / F16 / BF16 weights x fp32 activations ----------------------------------------

enum class FType { F32, F16, BF16 };

template <FType F>
inline void load_w16(const uint8_t* p, __m256* w0, __m256* w1) {
  if constexpr (F == FType::F32) {
    *w0 = _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    *w1 = _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8);
  } else if constexpr (F == FType::F16) {
    *w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    *w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
  } else {
    const __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i b =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    *w0 = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16));
    *w1 = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
  }
}

template <FType F>
struct FKernel {
  static constexpr int kRows = 2;
  static constexpr int kTokens = 2;
  static constexpr int64_t kElemBytes = F == FType::F32 ? 4 : 2;

  template <int R, int T>
  static void tile(const GemmArgs& g, int64_t r0, int64_t t0) {
    const Weight& w = *g.w;
    const int64_t n = w.n_in;
    const float* xr[T];
    for (int t = 0; t < T; ++t) xr[t] = g.x + (t0 + t) * n;
    __m256 acc0[R][T], acc1[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc0[r][t] = acc1[r][t] = _mm256_setzero_ps();
    const auto step = [&](const uint8_t* const* wp, const float* const* xp) {
      __m256 w0[R], w1[R];
      for (int r = 0; r < R; ++r) load_w16<F>(wp[r], &w0[r], &w1[r]);
      for (int t = 0; t < T; ++t) {
        const __m256 x0 = _mm256_loadu_ps(xp[t]);
        const __m256 x1 = _mm256_loadu_ps(xp[t] + 8);
        for (int r = 0; r < R; ++r) {
          acc0[r][t] = _mm256_fmadd_ps(w0[r], x0, acc0[r][t]);
          acc1[r][t] = _mm256_fmadd_ps(w1[r], x1, acc1[r][t]);
        }
      }
    };
    const int64_t n16 = n / 16 * 16;
    for (int64_t i = 0; i < n16; i += 16) {
      const uint8_t* wp[R];
      const float* xp[T];
      for (int r = 0; r < R; ++r) wp[r] = w.row(r0 + r) + i * kElemBytes;
      for (int t = 0; t < T; ++t) xp[t] = xr[t] + i;
      step(wp, xp);
    }
    if (n16 < n) {  // zero-padded copies of the tail, same weight encoding
      alignas(32) uint8_t wt[R][64] = {};
      alignas(32) float xt[T][16] = {};
      const uint8_t* wp[R];
      const float* xp[T];
      for (int r = 0; r < R; ++r) {
        std::memcpy(wt[r], w.row(r0 + r) + n16 * kElemBytes, (n - n16) * kElemBytes);
        wp[r] = wt[r];
      }
      for (int t = 0; t < T; ++t) {
        std::memcpy(xt[t], xr[t] + n16, (n - n16) * sizeof(float));
        xp[t] = xt[t];
      }
      step(wp, xp);
    }
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_add_ps(acc0[r][t], acc1[r][t]);
    store_tile<R, T>(g, r0, t0, acc);
  }
};

}  // namespace
}  // namespace kiln::backend::cpu

#pragma GCC pop_options

namespace kiln::backend::cpu {

GemmFn gemm_avx2(quant::Type t) {
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

}  // namespace kiln::backend::cpu

#else  // not x86-64

namespace kiln::backend::cpu {
GemmFn gemm_avx2(quant::Type) {
  return nullptr;
}
}  // namespace kiln::backend::cpu

#endif
