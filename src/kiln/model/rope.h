// Rotary embedding frequencies of a model, computed once: the per-pair inverse frequencies
// with every scaling folded in (llama3 factors, linear, YaRN) and the cos/sin multiplier.
// The forward turns them into one cos/sin table per step (backend::cpu::rope_angles), shared by
// Q and K and by every layer. Formulas follow transformers' modeling_rope_utils (the
// oracle: tests/fixtures/hf/rope_probes.json holds its numbers) and ggml's rope_yarn.
#pragma once

#include <vector>

#include "kiln/model/arch/arch.h"

namespace kiln::model {

struct RopeFreqs {
  std::vector<double> inv_freq;  // [n_rot / 2]: angle of pair i at position p = p * inv_freq[i]
  float attn_factor = 1.0f;      // cos and sin are multiplied by it (YaRN's mscale)
};

// The plain rope: inv_freq[i] = base^(-2i / n_rot) / freq_factors[i] (factors may be null).
RopeFreqs rope_freqs_default(float base, int32_t n_rot, const float* freq_factors);

// The model's rope for full-attention (swa = false) or sliding layers: base from
// rope_freq_base(_swa), then hp.rope_scaling (when it applies to those layers).
// freq_factors: rope_freqs.weight ([n_rot / 2], llama3), or null.
RopeFreqs rope_freqs(const HParams& hp, bool swa, const float* freq_factors);

// YaRN's parameters, separate from HParams so tests can drive them from a transformers config.
struct YarnParams {
  float base = 10000.0f;
  int32_t n_rot = 0;
  double factor = 1.0;
  double orig_ctx = 0;
  double beta_fast = 32.0, beta_slow = 1.0;
  double ext_factor = 1.0;
  bool truncate = true;  // floor/ceil the correction range (transformers' default)
};
// inv_freq[i] = interp[i] * (1 - ramp[i] * ext) + extrap[i] * ramp[i] * ext, where extrap is
// the plain frequency, interp = extrap / factor and ramp goes from 1 (pairs that turn more than
// beta_fast times over orig_ctx: kept) to 0 (fewer than beta_slow turns: interpolated).
std::vector<double> yarn_inv_freq(const YarnParams& p);
// 0.1 * mscale * ln(factor) + 1 (1 for factor <= 1): YaRN's attention factor.
double yarn_mscale(double factor, double mscale = 1.0);

}  // namespace kiln::model
