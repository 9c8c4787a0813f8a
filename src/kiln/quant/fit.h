// Scale (and offset) search for the reference quantizers: given a small group of values and
// per-value weights, choose integer levels L and a float scale that minimize the weighted
// squared error. The K-quants use these per sub-block before quantizing the sub-block
// scales themselves.
//
// The method follows the idea of ggml's make_qkx2_quants / make_qx_quants (try a short grid
// of inverse scales around the range-filling one, round, then solve the weighted least
// squares for the scale, and the offset, given those levels; keep the best), plus a few
// alternating passes (re-round with the fitted scale, re-solve) that never increase the
// error.
#pragma once

#include <cstdint>

namespace kiln::quant {

// The grid of inverse scales tried: (nmax + first + step * k) / range for k = 0..num_steps.
struct ScaleGrid {
  float first;
  float step;
  int num_steps;
};

// Round to nearest (ties to even, as ggml's nearest_int) and clamp to [lo, hi]; NaN gives lo.
int round_clamp(float v, int lo, int hi);

// x[i] ~= scale * L[i] - min, L[i] in [0, nmax], scale >= 0, min >= 0 (the group's offset is
// never positive, as the K-quants store it as a subtracted min). All-equal input gives
// scale 0 and L = 0.
struct AffineFit {
  float scale;
  float min;
};
AffineFit fit_affine(const float* x, const float* w, int n, int nmax, const ScaleGrid& grid,
                     uint8_t* L);

// x[i] ~= scale * L[i], L[i] in [-nmax, nmax - 1] (the value of largest magnitude lands on
// -nmax, so the scale's sign follows that value's). Returns the scale; all-zero input gives
// 0 and L = 0.
float fit_symmetric(const float* x, const float* w, int n, int nmax, int8_t* L);

// x[i] ~= scale * values[idx[i]] for an ascending codebook (IQ4_NL's kIq4nlValues). Tries
// inverse scales that put the value of largest magnitude near either end of the codebook,
// keeps the best least-squares scale. All-zero input gives 0 and idx = the entry nearest 0.
float fit_codebook(const float* x, const float* w, int n, const int8_t* values, int num_values,
                   uint8_t* idx);
// Index of the codebook entry nearest v (the lower one on a tie).
int nearest_index(const int8_t* values, int num_values, float v);

// Weighted squared error sum w * (scale * L - min - x)^2.
float affine_error(const float* x, const float* w, int n, const uint8_t* L, AffineFit fit);

}  // namespace kiln::quant
