// Reference quantization of the non-linear 4-bit formats IQ4_NL (blocks of 32) and IQ4_XS
// (super-blocks of 256 with 6-bit sub-scales), both on the kvalues_iq4nl codebook.
// As for the K-quants: normalize by the group's largest magnitude, fit each 32-group's scale
// (weights x^2, as ggml's reference), quantize the sub-scales, then pick every index against
// the scale as stored.
#include <algorithm>
#include <cmath>

#include "kiln/quant/blocks.h"
#include "kiln/quant/fit.h"
#include "kiln/quant/fp16.h"
#include "kiln/quant/quantize_impl.h"

namespace kiln::quant::detail {
namespace {

// Fit one group of 32 normalized values; returns its (normalized) scale.
float fit_group(const float* xs, uint8_t* idx) {
  float w[32];
  for (int i = 0; i < 32; ++i) w[i] = xs[i] * xs[i];
  return fit_codebook(xs, w, 32, kIq4nlValues, 16, idx);
}

// Indices of 32 values against the stored scale dl; nibbles as Q4_0 (low: 0..15, high: 16..31).
void pack_group(const float* x, float dl, uint8_t* qs) {
  const float idl = dl != 0 ? 1.0f / dl : 0.0f;
  uint8_t idx[32];
  for (int i = 0; i < 32; ++i) {
    float v = x[i] * idl;
    if (std::isnan(v)) v = 0;
    idx[i] = static_cast<uint8_t>(nearest_index(kIq4nlValues, 16, v));
  }
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(idx[j] | (idx[j + 16] << 4));
}

}  // namespace

void quantize_iq4_nl(const float* x, void* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, x += 32) {
    BlockIQ4_NL b{};
    float xs[32];
    uint8_t idx[32];
    const float amax = normalize_by_absmax(x, 32, xs);
    if (amax > 0) b.d = scale_to_fp16(fit_group(xs, idx) * amax);
    pack_group(x, fp16_to_fp32(b.d), b.qs);
    store_block(dst, ib, b);
  }
}

void quantize_iq4_xs(const float* x, void* dst, int64_t num_blocks) {
  for (int64_t ib = 0; ib < num_blocks; ++ib, x += kQK_K) {
    BlockIQ4_XS b{};
    float xs[kQK_K], scales[8];
    uint8_t idx[32];
    const float amax = normalize_by_absmax(x, kQK_K, xs);
    float vmax = 0;  // the sub-scale of largest magnitude, signed
    for (int j = 0; j < 8; ++j) {
      scales[j] = amax > 0 ? fit_group(xs + 32 * j, idx) : 0.0f;
      if (std::fabs(scales[j]) > std::fabs(vmax)) vmax = scales[j];
    }
    // That sub-scale lands on ls - 32 = -32 (as ggml); ls is stored 6-bit unsigned.
    const float d_norm = vmax / -32.0f;
    b.d = scale_to_fp16(d_norm * amax);
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < 8; ++j) {
      const int ls = d_norm != 0 ? round_clamp(scales[j] / d_norm, -32, 31) + 32 : 32;
      b.scales_l[j / 2] = static_cast<uint8_t>(b.scales_l[j / 2] | ((ls & 0xf) << (4 * (j % 2))));
      b.scales_h = static_cast<uint16_t>(b.scales_h | ((ls >> 4) << (2 * j)));
      pack_group(x + 32 * j, d * static_cast<float>(ls - 32), b.qs + 16 * j);
    }
    store_block(dst, ib, b);
  }
}

}  // namespace kiln::quant::detail
