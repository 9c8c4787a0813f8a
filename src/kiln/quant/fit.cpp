#include "kiln/quant/fit.h"

#include <algorithm>
#include <cmath>

#include "kiln/util/status.h"

namespace kiln::quant {

int round_clamp(float v, int lo, int hi) {
  if (!(v > static_cast<float>(lo))) return lo;  // also NaN
  if (!(v < static_cast<float>(hi))) return hi;
  return static_cast<int>(std::nearbyint(v));  // default rounding mode: ties to even
}

float affine_error(const float* x, const float* w, int n, const uint8_t* L, AffineFit fit) {
  float err = 0;
  for (int i = 0; i < n; ++i) {
    const float diff = fit.scale * static_cast<float>(L[i]) - fit.min - x[i];
    err += w[i] * diff * diff;
  }
  return err;
}

namespace {

// Weighted least squares for y = s * L + b over fixed levels L; b is clamped to <= 0 (and s
// refit through the origin) because the format stores -b as a non-negative min.
// Returns false when the levels are degenerate (all equal).
bool solve_affine(const float* x, const float* w, int n, const uint8_t* L, AffineFit* out) {
  float sum_w = 0, sum_x = 0, sum_l = 0, sum_l2 = 0, sum_xl = 0;
  for (int i = 0; i < n; ++i) {
    const float l = static_cast<float>(L[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
    sum_l += w[i] * l;
    sum_l2 += w[i] * l * l;
    sum_xl += w[i] * l * x[i];
  }
  const float det = sum_w * sum_l2 - sum_l * sum_l;
  if (!(det > 0)) return false;
  float s = (sum_w * sum_xl - sum_x * sum_l) / det;
  float b = (sum_l2 * sum_x - sum_l * sum_xl) / det;
  if (b > 0) {
    b = 0;
    s = sum_xl / sum_l2;
  }
  if (!(s >= 0)) return false;  // a negative scale cannot be stored
  *out = {s, -b};
  return true;
}

void round_affine(const float* x, int n, int nmax, float iscale, float offset, uint8_t* L) {
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(round_clamp(iscale * (x[i] + offset), 0, nmax));
  }
}

}  // namespace

AffineFit fit_affine(const float* x, const float* w, int n, int nmax, const ScaleGrid& grid,
                     uint8_t* L) {
  KILN_ASSERT(n > 0 && n <= 256);
  float lo = 0, hi = x[0];
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (!(hi > lo)) {  // every value equals lo <= 0
    std::fill(L, L + n, uint8_t{0});
    return {0, -lo};
  }
  const float range = hi - lo;

  // Start: the levels spread evenly over [lo, hi].
  AffineFit best{range / static_cast<float>(nmax), -lo};
  round_affine(x, n, nmax, static_cast<float>(nmax) / range, -lo, L);
  float best_err = affine_error(x, w, n, L, best);

  uint8_t trial[256];
  auto consider = [&](float iscale, float offset) {
    round_affine(x, n, nmax, iscale, offset, trial);
    AffineFit f;
    if (!solve_affine(x, w, n, trial, &f)) return false;
    const float e = affine_error(x, w, n, trial, f);
    if (!(e < best_err)) return false;
    best_err = e;
    best = f;
    std::copy(trial, trial + n, L);
    return true;
  };

  for (int k = 0; k <= grid.num_steps; ++k) {
    const float iscale = (static_cast<float>(nmax) + grid.first + grid.step * k) / range;
    consider(iscale, -lo);
  }
  // Alternate: re-round against the fitted scale and min, refit; stop when nothing improves.
  for (int pass = 0; pass < 4 && best.scale > 0; ++pass) {
    if (!consider(1.0f / best.scale, best.min)) break;
  }
  return best;
}

float fit_symmetric(const float* x, const float* w, int n, int nmax, int8_t* L) {
  KILN_ASSERT(n > 0 && n <= 256);
  float vmax = 0, amax = 0;  // the value of largest magnitude, and its magnitude
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      vmax = x[i];
    }
  }
  if (!(amax > 0)) {
    std::fill(L, L + n, int8_t{0});
    return 0;
  }
  // For fixed levels the best scale is sum(w x l) / sum(w l^2) and it removes
  // sum(w x l)^2 / sum(w l^2) from the error: maximize that.
  auto levels = [&](float iscale, int8_t* out, float* sum_xl, float* sum_l2) {
    *sum_xl = 0;
    *sum_l2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = round_clamp(iscale * x[i], -nmax, nmax - 1);
      out[i] = static_cast<int8_t>(l);
      *sum_xl += w[i] * x[i] * static_cast<float>(l);
      *sum_l2 += w[i] * static_cast<float>(l * l);
    }
  };
  float best_xl = 0, best_l2 = 0;
  levels(-static_cast<float>(nmax) / vmax, L, &best_xl, &best_l2);
  int8_t trial[256];
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    float sxl, sl2;
    levels(-(static_cast<float>(nmax) + 0.1f * static_cast<float>(k)) / vmax, trial, &sxl, &sl2);
    if (sl2 > 0 && sxl * sxl * best_l2 > best_xl * best_xl * sl2) {
      best_xl = sxl;
      best_l2 = sl2;
      std::copy(trial, trial + n, L);
    }
  }
  // Coordinate passes: move one level at a time to its best value given the others' scale.
  for (int pass = 0; pass < 4; ++pass) {
    int num_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float li = static_cast<float>(L[i]);
      const float rest_xl = best_xl - w[i] * x[i] * li;
      const float rest_l2 = best_l2 - w[i] * li * li;
      if (!(rest_xl != 0) || !(rest_l2 > 0)) continue;
      const int nl = round_clamp(x[i] * rest_l2 / rest_xl, -nmax, nmax - 1);
      if (nl == L[i]) continue;
      const float sxl = rest_xl + w[i] * x[i] * static_cast<float>(nl);
      const float sl2 = rest_l2 + w[i] * static_cast<float>(nl * nl);
      if (sl2 > 0 && sxl * sxl * best_l2 > best_xl * best_xl * sl2) {
        L[i] = static_cast<int8_t>(nl);
        best_xl = sxl;
        best_l2 = sl2;
        ++num_changed;
      }
    }
    if (num_changed == 0) break;
  }
  return best_l2 > 0 ? best_xl / best_l2 : 0.0f;
}

int nearest_index(const int8_t* values, int num_values, float v) {
  // Binary search for the first entry >= v, then the nearer of it and its predecessor.
  int lo = 0, hi = num_values;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (static_cast<float>(values[mid]) < v) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  if (lo == 0) return 0;
  if (lo == num_values) return num_values - 1;
  const float below = v - static_cast<float>(values[lo - 1]);
  const float above = static_cast<float>(values[lo]) - v;
  return below <= above ? lo - 1 : lo;
}

float fit_codebook(const float* x, const float* w, int n, const int8_t* values, int num_values,
                   uint8_t* idx) {
  KILN_ASSERT(n > 0 && n <= 256 && num_values > 1);
  const int zero_idx = nearest_index(values, num_values, 0.0f);
  float vmax = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      vmax = x[i];
    }
  }
  std::fill(idx, idx + n, static_cast<uint8_t>(zero_idx));
  if (!(amax > 0)) return 0;

  // For fixed indices the best scale is sum(w x v) / sum(w v^2), removing
  // sum(w x v)^2 / sum(w v^2) from the error: maximize that over the candidates.
  float best_xv = 0, best_v2 = 0;
  uint8_t trial[256];
  auto consider = [&](float iscale) {
    float sxv = 0, sv2 = 0;
    for (int i = 0; i < n; ++i) {
      trial[i] = static_cast<uint8_t>(nearest_index(values, num_values, iscale * x[i]));
      const float v = static_cast<float>(values[trial[i]]);
      sxv += w[i] * x[i] * v;
      sv2 += w[i] * v * v;
    }
    if (sv2 > 0 && (best_v2 == 0 || sxv * sxv * best_v2 > best_xv * best_xv * sv2)) {
      best_xv = sxv;
      best_v2 = sv2;
      std::copy(trial, trial + n, idx);
    }
  };
  const float ends[2] = {static_cast<float>(values[0]), static_cast<float>(values[num_values - 1])};
  for (const float end : ends) {
    for (int k = -8; k <= 8; ++k) consider((end + static_cast<float>(k)) / vmax);
  }
  return best_v2 > 0 ? best_xv / best_v2 : 0.0f;
}

}  // namespace kiln::quant
