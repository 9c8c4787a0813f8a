// Reference quantization of the K-quants (super-blocks of QK_K = 256).
//
// Each super-block is handled in three steps:
//   1. Divide it by its largest magnitude (so the fits' sums of squares cannot overflow or
//      underflow whatever the input's scale), and fit each sub-block's scale (and min) with
//      the weighted search of fit.h.
//   2. Quantize the sub-block scales (and mins) to the format's small integers against one
//      f16 super-block scale (and one for the mins).
//   3. Re-round every weight against the scales as actually stored (f16 super-scale times
//      the integer sub-scale), which is what the decoder will use.
// Weights in the fits follow ggml's reference quantizers: |x| plus the sub-block RMS for the
// 4/5-bit formats, |x| for Q2_K, x^2 for the symmetric Q3_K and Q6_K.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kiln/quant/blocks.h"
#include "kiln/quant/fit.h"
#include "kiln/quant/fp16.h"
#include "kiln/quant/quantize_impl.h"

namespace kiln::quant::detail {
namespace {

// The affine K-quants (Q2_K: 16 x 16, nmax 3, 4-bit sub-scales; Q4_K/Q5_K: 8 x 32, nmax 15/31,
// 6-bit sub-scales). Output: the two f16 super-scales, per-sub-block integer scale and min,
// and the final levels L[256] in 0..nmax.
struct AffineSuperBlock {
  uint16_t d = 0, dmin = 0;
  uint8_t sub_scale[16] = {}, sub_min[16] = {};
  uint8_t L[kQK_K] = {};
};

struct AffineFormat {
  int sub_elems;      // 16 or 32
  int nmax;           // largest level
  int sub_scale_max;  // 15 (4-bit) or 63 (6-bit)
  ScaleGrid grid;
  bool rms_weights;  // weights |x| + rms(sub-block) (else |x|)
};

AffineSuperBlock quantize_affine(const float* x, const AffineFormat& f) {
  AffineSuperBlock out;
  float xs[kQK_K];
  const float amax = normalize_by_absmax(x, kQK_K, xs);
  if (amax == 0) return out;

  const int num_sub = kQK_K / f.sub_elems;
  float scales[16], mins[16], w[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < num_sub; ++j) {
    const float* v = xs + j * f.sub_elems;
    float sum_x2 = 0;
    for (int l = 0; l < f.sub_elems; ++l) sum_x2 += v[l] * v[l];
    const float rms = f.rms_weights ? std::sqrt(sum_x2 / static_cast<float>(f.sub_elems)) : 0.0f;
    for (int l = 0; l < f.sub_elems; ++l) w[l] = rms + std::fabs(v[l]);
    const AffineFit fit = fit_affine(v, w, f.sub_elems, f.nmax, f.grid, out.L + j * f.sub_elems);
    scales[j] = fit.scale;
    mins[j] = fit.min;
    max_scale = std::max(max_scale, fit.scale);
    max_min = std::max(max_min, fit.min);
  }

  const float smax = static_cast<float>(f.sub_scale_max);
  const float inv_scale = max_scale > 0 ? smax / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? smax / max_min : 0.0f;
  for (int j = 0; j < num_sub; ++j) {
    out.sub_scale[j] = static_cast<uint8_t>(round_clamp(scales[j] * inv_scale, 0, f.sub_scale_max));
    out.sub_min[j] = static_cast<uint8_t>(round_clamp(mins[j] * inv_min, 0, f.sub_scale_max));
  }
  out.d = scale_to_fp16(max_scale / smax * amax);
  out.dmin = scale_to_fp16(max_min / smax * amax);

  const float d = fp16_to_fp32(out.d), dmin = fp16_to_fp32(out.dmin);
  for (int j = 0; j < num_sub; ++j) {
    const float dl = d * static_cast<float>(out.sub_scale[j]);
    const float ml = dmin * static_cast<float>(out.sub_min[j]);
    for (int l = 0; l < f.sub_elems; ++l) {
      const int i = j * f.sub_elems + l;
      out.L[i] = dl == 0 ? 0 : static_cast<uint8_t>(round_clamp((x[i] + ml) / dl, 0, f.nmax));
    }
  }
  return out;
}

// The symmetric K-quants (Q3_K: nmax 4, 6-bit signed sub-scales; Q6_K: nmax 32, int8
// sub-scales), 16 sub-blocks of 16. Output: f16 d, signed sub-scales, levels L in
// [-nmax, nmax - 1].
struct SymmetricSuperBlock {
  uint16_t d = 0;
  int8_t sub_scale[16] = {};
  int8_t L[kQK_K] = {};
};

SymmetricSuperBlock quantize_symmetric(const float* x, int nmax, int sub_scale_min,
                                       int sub_scale_max) {
  SymmetricSuperBlock out;
  float xs[kQK_K];
  const float amax = normalize_by_absmax(x, kQK_K, xs);
  if (amax == 0) return out;

  float scales[16], w[16];
  for (int j = 0; j < 16; ++j) {
    const float* v = xs + 16 * j;
    for (int l = 0; l < 16; ++l) w[l] = v[l] * v[l];
    scales[j] = fit_symmetric(v, w, 16, nmax, out.L + 16 * j);
  }
  // The sub-scale of largest magnitude lands on the most negative integer, as in ggml.
  const float vmax = signed_absmax(scales, 16);
  if (vmax == 0) return out;
  const float d_norm = vmax / static_cast<float>(sub_scale_min);
  for (int j = 0; j < 16; ++j) {
    out.sub_scale[j] =
        static_cast<int8_t>(round_clamp(scales[j] / d_norm, sub_scale_min, sub_scale_max));
  }
  out.d = scale_to_fp16(d_norm * amax);

  const float d = fp16_to_fp32(out.d);
  for (int i = 0; i < kQK_K; ++i) {
    const float dl = d * static_cast<float>(out.sub_scale[i / 16]);
    out.L[i] = dl == 0 ? 0 : static_cast<int8_t>(round_clamp(x[i] / dl, -nmax, nmax - 1));
  }
  return out;
}

// Two-bit fields as Q2_K/Q3_K/Q6_K lay them out: for each half h, element 128h + 32s + l
// goes to byte 32h + l, bits 2s..2s+1.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t* v = L + 128 * h + l;
      qs[32 * h + l] = static_cast<uint8_t>((v[0] & 3) | ((v[32] & 3) << 2) | ((v[64] & 3) << 4) |
                                            ((v[96] & 3) << 6));
    }
  }
}

// Q4_K/Q5_K nibbles: chunk c of 64 -> bytes 32c..32c+32, element 64c + l low, 64c + 32 + l high.
void pack_nibbles_k(const uint8_t* L, uint8_t* qs) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * c + l] =
          static_cast<uint8_t>((L[64 * c + l] & 0xf) | ((L[64 * c + 32 + l] & 0xf) << 4));
    }
  }
}

}  // namespace

void quantize_q2_k(const float* x, void* dst, int64_t num_blocks) {
  const AffineFormat f{16, 3, 15, {-0.5f, 0.1f, 15}, false};
  for (int64_t ib = 0; ib < num_blocks; ++ib, x += kQK_K) {
    const AffineSuperBlock s = quantize_affine(x, f);
    BlockQ2_K b{};
    b.d = s.d;
    b.dmin = s.dmin;
    for (int j = 0; j < 16; ++j)
      b.scales[j] = static_cast<uint8_t>(s.sub_scale[j] | (s.sub_min[j] << 4));
    pack_2bit(s.L, b.qs);
    store_block(dst, ib, b);
  }
}

void quantize_q4_k(const float* x, void* dst, int64_t num_blocks) {
  const AffineFormat f{32, 15, 63, {-1.0f, 0.1f, 20}, true};
  for (int64_t ib = 0; ib < num_blocks; ++ib, x += kQK_K) {
    const AffineSuperBlock s = quantize_affine(x, f);
    BlockQ4_K b{};
    b.d = s.d;
    b.dmin = s.dmin;
    pack_scale_min_k4(s.sub_scale, s.sub_min, b.scales);
    pack_nibbles_k(s.L, b.qs);
    store_block(dst, ib, b);
  }
}

void quantize_q5_k(const float* x, void* dst, int64_t num_blocks) {
  const AffineFormat f{32, 31, 63, {-0.5f, 0.1f, 15}, true};
  for (int64_t ib = 0; ib < num_blocks; ++ib, x += kQK_K) {
    const AffineSuperBlock s = quantize_affine(x, f);
    BlockQ5_K b{};
    b.d = s.d;
    b.dmin = s.dmin;
    pack_scale_min_k4(s.sub_scale, s.sub_min, b.scales);
    pack_nibbles_k(s.L, b.qs);
    // Bit 4: element 64c + l -> qh[l] bit 2c, element 64c + 32 + l -> bit 2c + 1.
    for (int i = 0; i < kQK_K; ++i) {
      b.qh[i % 32] = static_cast<uint8_t>(b.qh[i % 32] | (((s.L[i] >> 4) & 1) << (i / 32)));
    }
    store_block(dst, ib, b);
  }
}

void quantize_q3_k(const float* x, void* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, x += kQK_K) {
    const SymmetricSuperBlock s = quantize_symmetric(x, 4, -32, 31);
    BlockQ3_K b{};
    b.d = s.d;
    pack_q3_k_scales(s.sub_scale, b.scales);
    uint8_t low[kQK_K];
    for (int i = 0; i < kQK_K; ++i) {
      const int q = s.L[i] + 4;  // 0..7; bit 2 goes to hmask (set = no -4)
      low[i] = static_cast<uint8_t>(q & 3);
      b.hmask[i % 32] = static_cast<uint8_t>(b.hmask[i % 32] | ((q >> 2) << (i / 32)));
    }
    pack_2bit(low, b.qs);
    store_block(dst, ib, b);
  }
}

void quantize_q6_k(const float* x, void* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, x += kQK_K) {
    const SymmetricSuperBlock s = quantize_symmetric(x, 32, -128, 127);
    BlockQ6_K b{};
    b.d = s.d;
    std::memcpy(b.scales, s.sub_scale, 16);
    uint8_t q[kQK_K], high[kQK_K];
    for (int i = 0; i < kQK_K; ++i) {
      q[i] = static_cast<uint8_t>(s.L[i] + 32);  // 0..63
      high[i] = q[i] >> 4;
    }
    // ql: for half h, element 128h + l (+32) low nibble of byte 64h + l (+32); elements
    // 128h + 64 + l (+32) the high nibble of the same bytes.
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 64; ++l) {
        const int i = 128 * h + l;
        b.ql[64 * h + l] = static_cast<uint8_t>((q[i] & 0xf) | ((q[i + 64] & 0xf) << 4));
      }
    }
    pack_2bit(high, b.qh);
    store_block(dst, ib, b);
  }
}

}  // namespace kiln::quant::detail
