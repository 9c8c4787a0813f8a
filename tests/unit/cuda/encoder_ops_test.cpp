// The CUDA encoder ops of ops_elementwise.cu (layernorm, add_layernorm, gelu) against the CPU
// ops on fresh random inputs, over ragged shapes (one row, one column, widths off 4, 32 and
// 128), unaligned views (the scalar paths) and in-place outputs. Bounds:
//  - layernorm: 2.4e-7 relative + 1e-9 absolute (one float ulp: both sides compute the
//    statistics and each output in double and round once; only the order of the sums differs),
//    on rows with a large mean (1e4) and eps 1e-12, tiny spreads and constant rows too;
//  - add_layernorm: bitwise add then layernorm, in x and in the output (also aliasing x or r);
//  - gelu: (1e-6 + 1e-7 (x^2 + |x|)) relative + 1e-36 absolute: erfcf is within 4 ulp, and the
//    fp32 argument x / sqrt 2 (rounded, 2^-23 relative at most) moves erfc by about
//    2 (x / sqrt 2)^2 of that where it is steep (x << 0); the CPU evaluates in double.
// Outputs are poisoned (NaN) first, so an unwritten element fails.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kiln/backend/cpu/ops.h"
#include "kiln/backend/cuda/kernels.h"
#include "ops_test_util.h"
#include "test_util.h"
#include "unit/backend/layernorm_rows.h"

namespace kiln {
namespace {

namespace cuda = backend::cuda;
namespace cpu = backend::cpu;
using test::DeviceVec;
using test::expect_bitwise;
using test::expect_close;
using test::poison;
using test::random_floats;

std::string shape(const char* op, int64_t rows, int64_t n, const std::string& extra = "") {
  return std::string(op) + " [" + std::to_string(rows) + ", " + std::to_string(n) + "]" + extra;
}

// Rows of the kinds that separate a right layernorm from wrong ones (layernorm_rows.h).
std::vector<float> layernorm_input(std::mt19937& rng, int64_t rows, int64_t n) {
  std::vector<float> x = random_floats(rng, rows * n, -4, 4);
  test::shape_layernorm_rows(x, rows, n);
  return x;
}

const std::vector<std::pair<int64_t, int64_t>> kShapes = {
    {1, 1}, {3, 5}, {4, 64}, {8, 129}, {300, 384}, {5, 768}, {2, 1027}, {4, 4096}, {1, 8192}};

TEST(CudaEncoderOps, LayernormMatchesCpu) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(41);
  for (const auto& [rows, n] : kShapes) {
    const std::vector<float> x = layernorm_input(rng, rows, n);
    const std::vector<float> w = random_floats(rng, n, -2, 2), b = random_floats(rng, n, -1, 1);
    DeviceVec<float> dx(x), dw(w), db(b), dy(rows * n);
    for (float eps : {1e-12f, 1e-5f}) {
      for (int wb = 0; wb < 4; ++wb) {
        const float* wp = wb & 1 ? w.data() : nullptr;
        const float* bp = wb & 2 ? b.data() : nullptr;
        const float* dwp = wb & 1 ? dw.get() : nullptr;
        const float* dbp = wb & 2 ? db.get() : nullptr;
        std::vector<float> want(rows * n);
        cpu::layernorm(x.data(), wp, bp, want.data(), rows, n, eps);
        const auto bound = [&](size_t i) { return 2.4e-7 * std::fabs(want[i]) + 1e-9; };
        const std::string what =
            shape("layernorm", rows, n,
                  " eps " + std::to_string(eps) + (wp ? " w" : "") + (bp ? " b" : ""));
        poison(dy, rows * n);
        cuda::layernorm(dx.get(), dwp, dbp, dy.get(), rows, n, eps, nullptr);
        KILN_CUDA_SYNC_OK();
        expect_close(dy.to_host(), want, bound, what);
        // In place (BERT's norms write over their input).
        DeviceVec<float> dxy(x);
        cuda::layernorm(dxy.get(), dwp, dbp, dxy.get(), rows, n, eps, nullptr);
        KILN_CUDA_SYNC_OK();
        expect_close(dxy.to_host(), want, bound, what + " in place");
      }
    }
  }
  // A view one float past an aligned start (the scalar path even when n % 4 == 0).
  const int64_t rows = 4, n = 384;
  const std::vector<float> x = layernorm_input(rng, rows, n + 1);
  const std::vector<float> w = random_floats(rng, n, -2, 2), b = random_floats(rng, n, -1, 1);
  std::vector<float> want(rows * n);
  cpu::layernorm(x.data() + 1, w.data(), b.data(), want.data(), rows, n, 1e-12f);
  DeviceVec<float> dx(x), dw(w), db(b), dy(rows * n + 1);
  poison(dy, rows * n + 1);
  cuda::layernorm(dx.get() + 1, dw.get(), db.get(), dy.get() + 1, rows, n, 1e-12f, nullptr);
  KILN_CUDA_SYNC_OK();
  std::vector<float> got = dy.to_host();
  got.erase(got.begin());
  expect_close(
      got, want, [&](size_t i) { return 2.4e-7 * std::fabs(want[i]) + 1e-9; },
      shape("layernorm unaligned", rows, n));
}

// add_layernorm is bitwise add then layernorm, in x and in the output, with the output apart,
// over x, or over r; and the CPU's add_layernorm within layernorm's bound.
TEST(CudaEncoderOps, AddLayernormEqualsAddThenLayernorm) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(42);
  for (const auto& [rows, n] : kShapes) {
    for (int off : {0, 1}) {
      std::vector<float> x = layernorm_input(rng, rows, n);
      if (off) x.insert(x.begin(), 0.5f);  // rows * n values after one that shifts the view
      const std::vector<float> r = random_floats(rng, rows * n + off, -1, 1);
      const std::vector<float> w = random_floats(rng, n, -2, 2), b = random_floats(rng, n, -1, 1);
      std::vector<float> cx(x.begin() + off, x.end()), cy(rows * n);
      cpu::add_layernorm(cx.data(), r.data() + off, w.data(), b.data(), cy.data(), rows, n, 1e-12f);
      DeviceVec<float> x1(x), dr(r), dw(w), db(b), y1(rows * n + off);
      cuda::add(x1.get() + off, dr.get() + off, rows * n, nullptr);
      cuda::layernorm(x1.get() + off, dw.get(), db.get(), y1.get() + off, rows, n, 1e-12f, nullptr);
      KILN_CUDA_SYNC_OK();
      std::vector<float> want_x = x1.to_host(), want_y = y1.to_host();
      want_x.erase(want_x.begin(), want_x.begin() + off);
      want_y.erase(want_y.begin(), want_y.begin() + off);
      const std::string what = shape("add_layernorm", rows, n, off ? " unaligned" : "");
      expect_close(
          want_y, cy, [&](size_t i) { return 2.4e-7 * std::fabs(cy[i]) + 1e-9; }, what + " vs cpu");
      for (int alias = 0; alias < 3; ++alias) {  // out apart, out = x, out = r
        DeviceVec<float> x2(x), r2(r), y2(rows * n + off);
        poison(y2, rows * n + off);
        float* out = alias == 0 ? y2.get() : alias == 1 ? x2.get() : r2.get();
        cuda::add_layernorm(x2.get() + off, r2.get() + off, dw.get(), db.get(), out + off, rows, n,
                            1e-12f, nullptr);
        KILN_CUDA_SYNC_OK();
        std::vector<float> got_y = (alias == 0 ? y2 : alias == 1 ? x2 : r2).to_host();
        got_y.erase(got_y.begin(), got_y.begin() + off);
        const std::string a = alias == 0 ? "" : alias == 1 ? " out=x" : " out=r";
        expect_bitwise(got_y, want_y, what + a + " y");
        if (alias != 1) {
          std::vector<float> got_x = x2.to_host();
          got_x.erase(got_x.begin(), got_x.begin() + off);
          expect_bitwise(got_x, want_x, what + a + " x");
        }
      }
    }
  }
}

TEST(CudaEncoderOps, GeluMatchesCpu) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(43);
  for (int64_t n : {1, 3, 4, 33, 1000, 3072 * 7 + 1, 1 << 20}) {
    std::vector<float> x = random_floats(rng, n, -10, 10);
    const float special[] = {0.0f,   -0.0f, 1e-30f, -1e-30f, 3.0f, -3.0f, -5.5f,
                             -14.0f, 14.0f, 30.0f,  -30.0f,  1e4f, -1e4f};
    for (size_t i = 0; i < std::size(special) && static_cast<int64_t>(i) < n; ++i)
      x[static_cast<size_t>(n) - 1 - i] = special[i];
    std::vector<float> want(n);
    cpu::gelu(x.data(), want.data(), n);
    const auto bound = [&](size_t i) {
      const double a = std::fabs(x[i]);
      return (1e-6 + 1e-7 * (a * a + a)) * std::fabs(want[i]) + 1e-36;
    };
    DeviceVec<float> dx(x), dy(n);
    poison(dy, n);
    cuda::gelu(dx.get(), dy.get(), n, nullptr);
    KILN_CUDA_SYNC_OK();
    expect_close(dy.to_host(), want, bound, shape("gelu", 1, n));
    // In place, and unaligned (the scalar tail path for all of it).
    cuda::gelu(dx.get(), dx.get(), n, nullptr);
    KILN_CUDA_SYNC_OK();
    expect_close(dx.to_host(), want, bound, shape("gelu in place", 1, n));
    if (n > 1) {
      DeviceVec<float> ux(x), uy(n);
      poison(uy, n);
      cuda::gelu(ux.get() + 1, uy.get() + 1, n - 1, nullptr);
      KILN_CUDA_SYNC_OK();
      std::vector<float> got = uy.to_host(), w1(want.begin() + 1, want.end());
      got.erase(got.begin());
      expect_close(
          got, w1, [&](size_t i) { return bound(i + 1); }, shape("gelu unaligned", 1, n - 1));
    }
  }
}

}  // namespace
}  // namespace kiln
