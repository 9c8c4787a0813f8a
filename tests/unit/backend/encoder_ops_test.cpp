// The elementwise ops an encoder (BERT) needs on the CPU, against plain long-double references
// written here: layernorm / add_layernorm and the exact GELU (non-causal attention:
// attention_noncausal_test.cpp).
//
// Bounds:
//  - layernorm, gelu: the op evaluates in double and rounds once, so within one float ulp of
//    the exact value: 2.4e-7 relative (plus 1e-9 absolute for layernorm, where x_hat * w + b
//    cancels; plus 1e-44 for gelu's subnormal results).
//  - add_layernorm: x becomes x + r bit for bit (one fp32 add), y as layernorm of that x.
// The tests also check that their data tell the op from plausible wrong ones (tanh GELU, no
// eps, eps outside the root, unbiased or fp32 one-pass variance), so such a bug fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kiln/backend/cpu/attention.h"
#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cpu/ops.h"
#include "unit/backend/layernorm_rows.h"

namespace kiln::backend::cpu {
namespace {

std::vector<float> random_vec(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// ---- layernorm ------------------------------------------------------------------------------

// torch.nn.LayerNorm in long double: mean, biased variance, (x - mean) / sqrt(var + eps) * w + b.
std::vector<long double> layernorm_ld(const std::vector<float>& x, const float* w, const float* b,
                                      int64_t rows, int64_t n, float eps) {
  std::vector<long double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * n;
    long double mean = 0;
    for (int64_t i = 0; i < n; ++i) mean += xr[i];
    mean /= n;
    long double var = 0;
    for (int64_t i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= n;
    for (int64_t i = 0; i < n; ++i) {
      long double v = (xr[i] - mean) / std::sqrt(var + static_cast<long double>(eps));
      y[r * n + i] = v * (w ? w[i] : 1.0L) + (b ? b[i] : 0.0L);
    }
  }
  return y;
}

// Rows of the kinds that separate a right layernorm from wrong ones (layernorm_rows.h).
std::vector<float> layernorm_input(std::mt19937& rng, int64_t rows, int64_t n) {
  std::vector<float> x = random_vec(rng, rows * n, -4, 4);
  test::shape_layernorm_rows(x, rows, n);
  return x;
}

void expect_layernorm_close(const std::vector<float>& got, const std::vector<long double>& want,
                            const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const long double bound = 2.4e-7L * std::fabs(want[i]) + 1e-9L;
    ASSERT_LE(std::fabs(got[i] - want[i]), bound) << what << " element " << i << " got " << got[i]
                                                  << " want " << static_cast<double>(want[i]);
  }
}

TEST(EncoderOps, LayernormMatchesLongDoubleReference) {
  std::mt19937 rng(31);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},   {1, 7},   {4, 33},
                                                           {5, 384}, {8, 769}, {4, 1024}};
  for (const auto& [rows, n] : shapes) {
    const std::vector<float> x = layernorm_input(rng, rows, n);
    const std::vector<float> w = random_vec(rng, n, -2, 2), b = random_vec(rng, n, -1, 1);
    for (float eps : {1e-12f, 1e-5f}) {
      for (int wb = 0; wb < 4; ++wb) {
        const float* wp = wb & 1 ? w.data() : nullptr;
        const float* bp = wb & 2 ? b.data() : nullptr;
        const std::string what = "layernorm [" + std::to_string(rows) + ", " + std::to_string(n) +
                                 "] eps " + std::to_string(eps) + " w " + std::to_string(wb & 1) +
                                 " b " + std::to_string(wb >> 1);
        const std::vector<long double> want = layernorm_ld(x, wp, bp, rows, n, eps);
        std::vector<float> y(x.size(), NAN);
        layernorm(x.data(), wp, bp, y.data(), rows, n, eps);
        expect_layernorm_close(y, want, what);
        // In place.
        std::vector<float> xy = x;
        layernorm(xy.data(), wp, bp, xy.data(), rows, n, eps);
        EXPECT_EQ(0, std::memcmp(xy.data(), y.data(), y.size() * 4)) << what << " in place";
        // Through the backend interface: the same op.
        CpuBackend be(nullptr);
        std::vector<float> yb(x.size(), NAN);
        std::vector<float> xc = x;
        be.layernorm({xc.data(), rows, n}, wp, bp, {yb.data(), rows, n}, eps);
        EXPECT_EQ(0, std::memcmp(yb.data(), y.data(), y.size() * 4)) << what << " backend";
      }
    }
  }
}

// The data of the test above tells layernorm from the plausible wrong ones: a one-pass fp32
// variance (E[x^2] - E[x]^2) on the large-mean row, eps left out or outside the square root
// on the tiny-spread row, and the unbiased variance.
TEST(EncoderOps, LayernormInputsExposeWrongFormulas) {
  std::mt19937 rng(32);
  const int64_t n = 384;
  const std::vector<float> x = layernorm_input(rng, 4, n);
  const std::vector<long double> want = layernorm_ld(x, nullptr, nullptr, 4, n, 1e-5f);
  auto worst = [&](auto&& formula) {
    long double w = 0;
    for (int64_t r = 0; r < 3; ++r) {
      const float* xr = x.data() + r * n;
      float s = 0, s2 = 0;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < n; ++i) s += xr[i], s2 += xr[i] * xr[i], mean += xr[i];
      mean /= n;
      for (int64_t i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
      for (int64_t i = 0; i < n; ++i) {
        const double got = formula(xr[i], s / n, s2 / n - (s / n) * (s / n), mean, var);
        w = std::max(w, std::fabs(got - want[r * n + i]));
      }
    }
    return w;
  };
  const float eps = 1e-5f;
  EXPECT_GT(worst([&](float v, float m1, float var1, double, double) {
              return (v - m1) / std::sqrt(std::max(var1, 0.0f) + eps);
            }),
            1e-3L);
  EXPECT_GT(worst([&](float v, float, float, double m, double var) {
              return (v - m) / std::sqrt(var / n);  // no eps
            }),
            1e-3L);
  EXPECT_GT(worst([&](float v, float, float, double m, double var) {
              return (v - m) / (std::sqrt(var / n) + eps);
            }),
            1e-3L);
  EXPECT_GT(worst([&](float v, float, float, double m, double var) {
              return (v - m) / std::sqrt(var / (n - 1) + eps);  // unbiased
            }),
            1e-5L);
}

TEST(EncoderOps, AddLayernormAddsThenNormalizes) {
  std::mt19937 rng(33);
  for (const auto& [rows, n] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 384}, {3, 129}, {6, 1024}}) {
    const std::vector<float> x = layernorm_input(rng, rows, n);
    const std::vector<float> r = random_vec(rng, rows * n, -1, 1);
    const std::vector<float> w = random_vec(rng, n, -2, 2), b = random_vec(rng, n, -1, 1);
    std::vector<float> sum = x;
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += r[i];
    const std::vector<long double> want = layernorm_ld(sum, w.data(), b.data(), rows, n, 1e-12f);
    const std::string what =
        "add_layernorm [" + std::to_string(rows) + ", " + std::to_string(n) + "]";
    // out separate, out aliasing x, out aliasing r; and through the backend interface.
    for (int alias = 0; alias < 4; ++alias) {
      std::vector<float> xs = x, rs = r, out(x.size(), NAN);
      float* o = alias == 1 ? xs.data() : alias == 2 ? rs.data() : out.data();
      if (alias == 3) {
        CpuBackend be(nullptr);
        be.add_layernorm({xs.data(), rows, n}, {rs.data(), rows, n}, w.data(), b.data(),
                         {o, rows, n}, 1e-12f);
      } else {
        add_layernorm(xs.data(), rs.data(), w.data(), b.data(), o, rows, n, 1e-12f);
      }
      if (alias != 1) {
        EXPECT_EQ(0, std::memcmp(xs.data(), sum.data(), sum.size() * 4)) << what;
      }
      const float* op = alias == 1 ? xs.data() : alias == 2 ? rs.data() : out.data();
      expect_layernorm_close(std::vector<float>(op, op + x.size()), want,
                             what + " alias " + std::to_string(alias));
    }
  }
}

// ---- gelu -----------------------------------------------------------------------------------

// 0.5 x (1 + erf(x / sqrt 2)) in long double; for x < -3, where 1 + erf cancels, the same as
// 0.5 x erfc(-x / sqrt 2).
long double gelu_ld(float x) {
  const long double z = static_cast<long double>(x) / std::sqrt(2.0L);
  return x >= -3.0f ? 0.5L * x * (1.0L + std::erf(z)) : 0.5L * x * std::erfc(-z);
}

TEST(EncoderOps, GeluMatchesLongDoubleReference) {
  std::mt19937 rng(34);
  std::vector<float> x = random_vec(rng, 20000, -10, 10);
  const std::vector<float> small = random_vec(rng, 1000, -1e-3f, 1e-3f);
  x.insert(x.end(), small.begin(), small.end());
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 3.0f, -3.0f, -5.5f, 14.0f, -14.0f, 30.0f, -30.0f,
                  1e4f, -1e4f})
    x.push_back(v);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(x.size(), NAN);
  gelu(x.data(), y.data(), n);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const long double want = gelu_ld(x[i]);
    const long double bound = 2.4e-7L * std::fabs(want) + 1e-44L;
    ASSERT_LE(std::fabs(y[i] - want), bound) << "x " << x[i];
    worst = std::max(worst, static_cast<double>(std::fabs(y[i] - want) / bound));
  }
  std::printf("gelu: worst error %.3f of bound over %lld values\n", worst,
              static_cast<long long>(n));
  EXPECT_EQ(y[n - 2], 1e4f);            // gelu(x) = x for large x
  EXPECT_EQ(y[n - 1], 0.0f);            // and 0 (-0) for very negative x
  EXPECT_TRUE(std::signbit(y[n - 1]));  // 0.5 * x * 0 with x < 0
  // In place, and through the backend interface.
  std::vector<float> xy = x;
  gelu(xy.data(), xy.data(), n);
  EXPECT_EQ(0, std::memcmp(xy.data(), y.data(), y.size() * 4));
  CpuBackend be(nullptr);
  std::vector<float> xb = x, yb(x.size(), NAN);
  be.gelu({xb.data(), 1, n}, {yb.data(), 1, n});
  EXPECT_EQ(0, std::memcmp(yb.data(), y.data(), y.size() * 4));
  // The tanh approximation (geglu's) is not within the bound: the test tells them apart.
  std::vector<float> ones(x.size(), 1.0f), tanh_gelu(x.size());
  geglu_reference(x.data(), ones.data(), tanh_gelu.data(), n);
  long double tanh_worst = 0;
  for (int64_t i = 0; i < n; ++i)
    tanh_worst = std::max(tanh_worst, std::fabs(tanh_gelu[i] - gelu_ld(x[i])) /
                                          (2.4e-7L * std::fabs(gelu_ld(x[i])) + 1e-44L));
  EXPECT_GT(tanh_worst, 100.0L);
}

}  // namespace
}  // namespace kiln::backend::cpu
