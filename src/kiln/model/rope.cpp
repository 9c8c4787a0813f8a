#include "kiln/model/rope.h"

#include <algorithm>
#include <cmath>

namespace kiln::model {

RopeFreqs rope_freqs_default(float base, int32_t n_rot, const float* freq_factors) {
  RopeFreqs r;
  r.inv_freq.resize(static_cast<size_t>(n_rot / 2));
  for (int32_t i = 0; i < n_rot / 2; ++i) {
    double f = std::pow(static_cast<double>(base), -2.0 * i / n_rot);
    if (freq_factors != nullptr) f /= freq_factors[i];
    r.inv_freq[static_cast<size_t>(i)] = f;
  }
  return r;
}

double yarn_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

std::vector<double> yarn_inv_freq(const YarnParams& p) {
  const int32_t half = p.n_rot / 2;
  // The pair index whose wavelength turns `rotations` times over orig_ctx.
  auto correction_dim = [&](double rotations) {
    return p.n_rot * std::log(p.orig_ctx / (rotations * 2.0 * M_PI)) /
           (2.0 * std::log(static_cast<double>(p.base)));
  };
  double low = correction_dim(p.beta_fast), high = correction_dim(p.beta_slow);
  if (p.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(p.n_rot - 1));
  if (low == high) high += 0.001;  // as transformers: no division by zero
  std::vector<double> out(static_cast<size_t>(half));
  for (int32_t i = 0; i < half; ++i) {
    const double extrap = std::pow(static_cast<double>(p.base), -2.0 * i / p.n_rot);
    const double interp = extrap / p.factor;
    const double ramp = 1.0 - std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double mix = ramp * p.ext_factor;
    out[static_cast<size_t>(i)] = interp * (1.0 - mix) + extrap * mix;
  }
  return out;
}

RopeFreqs rope_freqs(const HParams& hp, bool swa, const float* freq_factors) {
  const float base = swa ? hp.rope_freq_base_swa : hp.rope_freq_base;
  const int32_t n_rot = static_cast<int32_t>(hp.n_rot);
  const RopeScaling scaling = swa && !hp.rope_scaling_swa ? RopeScaling::kNone : hp.rope_scaling;
  RopeFreqs r = rope_freqs_default(base, n_rot, freq_factors);
  if (hp.rope_attn_factor != 0) r.attn_factor = hp.rope_attn_factor;
  switch (scaling) {
    case RopeScaling::kNone:
      break;
    case RopeScaling::kLinear:
      for (double& f : r.inv_freq) f /= hp.rope_scale_factor;
      break;
    case RopeScaling::kYarn: {
      YarnParams p;
      p.base = base;
      p.n_rot = n_rot;
      p.factor = hp.rope_scale_factor;
      p.orig_ctx = hp.rope_orig_ctx != 0 ? hp.rope_orig_ctx : hp.n_ctx_train;
      p.beta_fast = hp.yarn_beta_fast;
      p.beta_slow = hp.yarn_beta_slow;
      p.ext_factor = hp.yarn_ext_factor;
      std::vector<double> inv = yarn_inv_freq(p);
      // llama3-style divisors (a yarn file rarely has them) still apply per pair.
      for (size_t i = 0; i < inv.size(); ++i)
        r.inv_freq[i] = freq_factors != nullptr ? inv[i] / freq_factors[i] : inv[i];
      if (hp.rope_attn_factor == 0) {
        // mistral3 stores mscale_all_dim as yarn_log_multiplier (mscale = 1): the ratio of the
        // two mscales, as transformers' _compute_yarn_parameters.
        r.attn_factor = static_cast<float>(hp.yarn_log_multiplier != 0
                                               ? yarn_mscale(p.factor) /
                                                     yarn_mscale(p.factor, hp.yarn_log_multiplier)
                                               : yarn_mscale(p.factor));
      }
      break;
    }
  }
  return r;
}

}  // namespace kiln::model
