// Rows for layernorm tests (CPU and CUDA): of every four rows, one kept as drawn, one a large
// mean over a unit spread (catastrophic cancellation for a one-pass fp32 variance), one a tiny
// spread where eps matters, one constant (variance 0).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace kiln::test {

// x: [rows, n] drawn in -4..4, reshaped in place.
inline void shape_layernorm_rows(std::vector<float>& x, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x.data() + r * n;
    if (r % 4 == 1) {
      for (int64_t i = 0; i < n; ++i) xr[i] = 1e4f + xr[i] / 4;
    } else if (r % 4 == 2) {
      for (int64_t i = 0; i < n; ++i) xr[i] = -3.0f + xr[i] * 1e-3f;
    } else if (r % 4 == 3) {
      std::fill(xr, xr + n, 7.25f);
    }
  }
}

}  // namespace kiln::test
