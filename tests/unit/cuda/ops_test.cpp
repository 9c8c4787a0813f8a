// The CUDA elementwise and row ops (ops_elementwise.cu) against the CPU ops on fresh random
// inputs, over shapes with ragged tails and unaligned views (the scalar paths). Bounds:
//  - add, add_bias, scale, scale_rows, copy_cols, gather_rows: bit-identical (one IEEE op or a
//    copy per element);
//  - rmsnorm: 1e-6 relative (the sum of squares is in double on both sides, only its order
//    differs);
//  - softcap, swiglu: 1e-6 relative (CUDA's tanhf and expf are within 2 ulp);
//  - geglu: 1e-6 relative plus 2e-7 * |gate * up| (where 1 + tanh cancels, the tanhf ulp near
//    -1 is an absolute error);
//  - argmax_rows: equal indices, ties to the first, on rows with many exact ties.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/backend/cpu/attention.h"
#include "kiln/backend/cpu/ops.h"
#include "kiln/backend/cuda/kernels.h"
#include "ops_test_util.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace cuda = backend::cuda;
namespace cpu = backend::cpu;
using test::DeviceVec;
using test::expect_bitwise;
using test::expect_close;
using test::poison;
using test::random_floats;

std::string shape(const char* op, int64_t rows, int64_t n, const char* extra = "") {
  return std::string(op) + " [" + std::to_string(rows) + ", " + std::to_string(n) + "]" + extra;
}

TEST(CudaOps, RmsnormMatchesReference) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(11);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {3, 5}, {2, 64}, {300, 128}, {7, 129}, {2, 1027}, {5, 4096}, {1, 8192}};
  for (const auto& [rows, n] : shapes) {
    const std::vector<float> x = random_floats(rng, rows * n, -4, 4);
    const std::vector<float> w = random_floats(rng, n, -2, 2);
    DeviceVec<float> dx(x), dw(w), dy(rows * n);
    for (bool with_w : {true, false}) {
      const float eps = with_w ? 1e-6f : 1e-5f;
      std::vector<float> want(rows * n);
      cpu::rmsnorm_reference(x.data(), with_w ? w.data() : nullptr, want.data(), rows, n, eps);
      const auto bound = [&](size_t i) { return 1e-6 * std::fabs(want[i]) + 1e-30; };
      poison(dy, rows * n);
      cuda::rmsnorm(dx.get(), with_w ? dw.get() : nullptr, dy.get(), rows, n, eps, nullptr);
      KILN_CUDA_SYNC_OK();
      expect_close(dy.to_host(), want, bound, shape("rmsnorm", rows, n, with_w ? " w" : ""));
      // In place (qk-norm and the sandwich norms write over their input).
      DeviceVec<float> dxy(x);
      cuda::rmsnorm(dxy.get(), with_w ? dw.get() : nullptr, dxy.get(), rows, n, eps, nullptr);
      KILN_CUDA_SYNC_OK();
      expect_close(dxy.to_host(), want, bound, shape("rmsnorm in place", rows, n));
    }
  }
  // A view one float past an aligned start (the scalar path even when n % 4 == 0).
  const int64_t rows = 3, n = 256;
  const std::vector<float> x = random_floats(rng, rows * n + 1, -4, 4);
  const std::vector<float> w = random_floats(rng, n, -2, 2);
  std::vector<float> want(rows * n);
  cpu::rmsnorm_reference(x.data() + 1, w.data(), want.data(), rows, n, 1e-6f);
  DeviceVec<float> dx(x), dw(w), dy(rows * n + 1);
  poison(dy, rows * n + 1);
  cuda::rmsnorm(dx.get() + 1, dw.get(), dy.get() + 1, rows, n, 1e-6f, nullptr);
  KILN_CUDA_SYNC_OK();
  std::vector<float> got = dy.to_host();
  got.erase(got.begin());
  expect_close(
      got, want, [&](size_t i) { return 1e-6 * std::fabs(want[i]) + 1e-30; },
      shape("rmsnorm unaligned", rows, n));
}

// add_rmsnorm is bitwise add then rmsnorm, in x and in y (aligned and unaligned views).
TEST(CudaOps, AddRmsnormEqualsAddThenRmsnorm) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(12);
  for (const auto& [rows, n] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 2048}, {3, 5}, {7, 129}, {4, 4096}, {2, 8192}}) {
    for (int off : {0, 1}) {
      const std::vector<float> x = random_floats(rng, rows * n + off, -4, 4);
      const std::vector<float> r = random_floats(rng, rows * n + off, -4, 4);
      const std::vector<float> w = random_floats(rng, n, -2, 2);
      DeviceVec<float> x1(x), x2(x), dr(r), dw(w), y1(rows * n + off), y2(rows * n + off);
      cuda::add(x1.get() + off, dr.get() + off, rows * n, nullptr);
      cuda::rmsnorm(x1.get() + off, dw.get(), y1.get() + off, rows, n, 1e-6f, nullptr);
      cuda::add_rmsnorm(x2.get() + off, dr.get() + off, dw.get(), y2.get() + off, rows, n, 1e-6f,
                        nullptr);
      KILN_CUDA_SYNC_OK();
      const std::string what = shape("add_rmsnorm", rows, n, off ? " unaligned" : "");
      expect_bitwise(x2.to_host(), x1.to_host(), what + " x");
      std::vector<float> a = y2.to_host(), b = y1.to_host();
      a.erase(a.begin(), a.begin() + off);
      b.erase(b.begin(), b.begin() + off);
      expect_bitwise(a, b, what + " y");
    }
  }
}

// The producers that quantize their output for the matvec (rmsnorm, add_rmsnorm, swiglu) write
// the same fp32 output as without, and the same int8 levels and (d, sum) pairs as
// quantize_q8_32 of that output, bit for bit.
TEST(CudaOps, ProducersQuantizeAsTheQuantizeKernel) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(13);
  for (const auto& [rows, n] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 2048}, {3, 4096}, {8, 8192}, {5, 96}, {2, 14336}}) {
    const std::vector<float> x = random_floats(rng, rows * n, -4, 4);
    const std::vector<float> r = random_floats(rng, rows * n, -4, 4);
    const std::vector<float> w = random_floats(rng, n, -2, 2);
    const int64_t groups = rows * n / 32;
    for (int op = 0; op < 3; ++op) {
      DeviceVec<float> dx(x), dr(r), dw(w), y1(rows * n), y2(rows * n);
      DeviceVec<int8_t> q1(rows * n), q2(rows * n);
      DeviceVec<float2> s1(groups), s2(groups);
      DeviceVec<float> dx2(x);
      bool quantized = false;
      if (op == 0) {
        cuda::rmsnorm(dx.get(), dw.get(), y1.get(), rows, n, 1e-6f, nullptr);
        quantized = cuda::rmsnorm(dx.get(), dw.get(), y2.get(), rows, n, 1e-6f, nullptr, q2.get(),
                                  s2.get());
      } else if (op == 1) {
        cuda::add_rmsnorm(dx.get(), dr.get(), dw.get(), y1.get(), rows, n, 1e-6f, nullptr);
        quantized = cuda::add_rmsnorm(dx2.get(), dr.get(), dw.get(), y2.get(), rows, n, 1e-6f,
                                      nullptr, q2.get(), s2.get());
      } else {
        cuda::swiglu(dx.get(), dr.get(), y1.get(), rows * n, nullptr);
        quantized =
            cuda::swiglu_q8(dx.get(), dr.get(), y2.get(), rows * n, q2.get(), s2.get(), nullptr);
      }
      EXPECT_TRUE(quantized);
      cuda::quantize_q8_32(y1.get(), rows, n, q1.get(), s1.get(), nullptr);
      KILN_CUDA_SYNC_OK();
      const std::string what = shape(op == 0   ? "rmsnorm"
                                     : op == 1 ? "add_rmsnorm"
                                               : "swiglu",
                                     rows, n, " quantized");
      expect_bitwise(y2.to_host(), y1.to_host(), what + " y");
      EXPECT_EQ(q2.to_host(), q1.to_host()) << what;
      const std::vector<float2> a = s2.to_host(), b = s1.to_host();
      for (int64_t g = 0; g < groups; ++g) {
        ASSERT_EQ(a[g].x, b[g].x) << what << " group " << g;
        ASSERT_EQ(a[g].y, b[g].y) << what << " group " << g;
      }
    }
  }
  // A row length that is not a multiple of 32: no quantization, the plain op.
  DeviceVec<float> dx(random_floats(rng, 2 * 40, -1, 1)), dy(2 * 40);
  DeviceVec<int8_t> q(80);
  DeviceVec<float2> ds(3);
  EXPECT_FALSE(
      cuda::rmsnorm(dx.get(), nullptr, dy.get(), 2, 40, 1e-6f, nullptr, q.get(), ds.get()));
}

TEST(CudaOps, AddScaleSoftcapMatchCpu) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(12);
  for (int64_t n : {1, 3, 4, 7, 1027, 4096, 151936 * 3}) {
    for (int64_t offset : {0, 1}) {  // 1: an unaligned view, the scalar path
      const std::vector<float> x = random_floats(rng, n + offset, -30, 30);
      const std::vector<float> y = random_floats(rng, n + offset, -3, 3);
      const char* tag = offset ? " unaligned" : "";
      std::vector<float> want(x.begin() + offset, x.end());
      cpu::add(want.data(), y.data() + offset, n);
      DeviceVec<float> dx(x), dy(y);
      cuda::add(dx.get() + offset, dy.get() + offset, n, nullptr);
      KILN_CUDA_SYNC_OK();
      std::vector<float> got = dx.to_host();
      expect_bitwise(std::vector<float>(got.begin() + offset, got.end()), want,
                     shape("add", 1, n, tag));

      want.assign(x.begin() + offset, x.end());
      cpu::scale(want.data(), 0.37f, n);
      DeviceVec<float> sx(x);
      cuda::scale(sx.get() + offset, 0.37f, n, nullptr);
      KILN_CUDA_SYNC_OK();
      got = sx.to_host();
      expect_bitwise(std::vector<float>(got.begin() + offset, got.end()), want,
                     shape("scale", 1, n, tag));

      for (float cap : {30.0f, 50.0f}) {  // gemma2's final and attention caps
        want.assign(x.begin() + offset, x.end());
        cpu::softcap(want.data(), cap, n);
        DeviceVec<float> cx(x);
        cuda::softcap(cx.get() + offset, cap, n, nullptr);
        KILN_CUDA_SYNC_OK();
        got = cx.to_host();
        expect_close(
            std::vector<float>(got.begin() + offset, got.end()), want,
            [&](size_t i) { return 1e-6 * std::fabs(want[i]) + 1e-30; },
            shape("softcap", 1, n, tag));
      }
    }
  }
}

TEST(CudaOps, AddBiasAndScaleRowsMatchCpu) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(13);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},   {5, 3},     {4, 4},
                                                           {3, 129}, {17, 1024}, {2, 4099}};
  for (const auto& [rows, n] : shapes) {
    const std::vector<float> x = random_floats(rng, rows * n, -5, 5);
    const std::vector<float> b = random_floats(rng, n, -1, 1);
    const std::vector<float> s = random_floats(rng, rows, 0.5f, 2.0f);
    std::vector<float> want = x;
    cpu::add_bias(want.data(), b.data(), rows, n);
    DeviceVec<float> dx(x), db(b), ds(s);
    cuda::add_bias(dx.get(), db.get(), rows, n, nullptr);
    KILN_CUDA_SYNC_OK();
    expect_bitwise(dx.to_host(), want, shape("add_bias", rows, n));

    want = x;
    for (int64_t r = 0; r < rows; ++r) cpu::scale(want.data() + r * n, s[r], n);
    DeviceVec<float> sx(x);
    cuda::scale_rows(sx.get(), ds.get(), rows, n, nullptr);
    KILN_CUDA_SYNC_OK();
    expect_bitwise(sx.to_host(), want, shape("scale_rows", rows, n));
  }
}

TEST(CudaOps, SwigluGegluMatchReference) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(14);
  for (int64_t n : {1, 7, 8, 9, 31, 64, 4099, 3 * 12288}) {
    const std::vector<float> g = random_floats(rng, n, -20, 20), u = random_floats(rng, n, -3, 3);
    DeviceVec<float> dg(g), du(u), dout(n);
    for (int which = 0; which < 2; ++which) {
      std::vector<float> want(n);
      (which ? cpu::geglu_reference : cpu::swiglu_reference)(g.data(), u.data(), want.data(), n);
      const double gu = which ? 2e-7 : 0.0;
      const auto bound = [&](size_t i) {
        return 1e-6 * std::fabs(want[i]) + gu * std::fabs(g[i] * u[i]) + 1e-30;
      };
      poison(dout, n);
      (which ? cuda::geglu : cuda::swiglu)(dg.get(), du.get(), dout.get(), n, nullptr);
      KILN_CUDA_SYNC_OK();
      expect_close(dout.to_host(), want, bound, shape(which ? "geglu" : "swiglu", 1, n));
      // In place over gate, as the forward calls them.
      DeviceVec<float> gg(g);
      (which ? cuda::geglu : cuda::swiglu)(gg.get(), du.get(), gg.get(), n, nullptr);
      KILN_CUDA_SYNC_OK();
      expect_close(gg.to_host(), want, bound,
                   shape(which ? "geglu in place" : "swiglu in place", 1, n));
    }
  }
}

TEST(CudaOps, CopyColsAndGatherRowsCopy) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(15);
  struct Cols {
    int64_t rows, src_cols, col0, n_cols;
  };
  // Ragged widths and offsets, and a fused QKV split (q | k | v of 4096 | 1024 | 1024).
  for (const Cols& c :
       {Cols{1, 1, 0, 1}, Cols{3, 7, 2, 3}, Cols{5, 12, 4, 8}, Cols{2, 13, 5, 8},
        Cols{33, 6144, 0, 4096}, Cols{33, 6144, 4096, 1024}, Cols{33, 6144, 5120, 1024}}) {
    const std::vector<float> src = random_floats(rng, c.rows * c.src_cols, -1, 1);
    std::vector<float> want(c.rows * c.n_cols);
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t i = 0; i < c.n_cols; ++i)
        want[r * c.n_cols + i] = src[r * c.src_cols + c.col0 + i];
    DeviceVec<float> dsrc(src), ddst(c.rows * c.n_cols);
    poison(ddst, c.rows * c.n_cols);
    cuda::copy_cols(dsrc.get(), c.src_cols, c.col0, ddst.get(), c.n_cols, c.rows, nullptr);
    KILN_CUDA_SYNC_OK();
    expect_bitwise(
        ddst.to_host(), want,
        shape("copy_cols", c.rows, c.n_cols,
              (" of " + std::to_string(c.src_cols) + " from " + std::to_string(c.col0)).c_str()));
  }
  for (const auto& [n_src, n_out, n] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 1}, {5, 3, 3}, {9, 20, 8}, {40, 7, 4096}, {64, 512, 2051}}) {
    const std::vector<float> src = random_floats(rng, n_src * n, -1, 1);
    std::vector<int32_t> rows(n_out);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(n_src - 1));
    for (int32_t& r : rows) r = pick(rng);  // repeats allowed (MoE pairs of one token)
    std::vector<float> want(n_out * n);
    for (int64_t i = 0; i < n_out; ++i)
      for (int64_t j = 0; j < n; ++j) want[i * n + j] = src[rows[i] * n + j];
    DeviceVec<float> dsrc(src), ddst(n_out * n);
    DeviceVec<int32_t> drows(rows);
    poison(ddst, n_out * n);
    cuda::gather_rows(dsrc.get(), drows.get(), ddst.get(), n_out, n, nullptr);
    KILN_CUDA_SYNC_OK();
    expect_bitwise(ddst.to_host(), want, shape("gather_rows", n_out, n));
  }
}

TEST(CudaOps, ArgmaxRowsMatchesCpuWithTies) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(16);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {3, 2}, {2, 5}, {4, 33}, {3, 1027}, {2, 4096}, {8, 32000}, {3, 151936}, {1, 151937}};
  for (const auto& [rows, n] : shapes) {
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<float> x;
      if (mode == 0) {  // continuous values
        x = random_floats(rng, rows * n, -10, 10);
      } else {  // a few distinct values: the maximum repeats within a row (ties to the first)
        std::uniform_int_distribution<int> level(mode == 1 ? -3 : 0, 3);
        x.resize(rows * n);
        for (float& v : x) v = static_cast<float>(level(rng));
      }
      std::vector<int32_t> want(rows);
      for (int64_t r = 0; r < rows; ++r) want[r] = cpu::argmax(x.data() + r * n, n);
      for (int64_t offset : {0, 1}) {  // 1: an unaligned view, the scalar path
        std::vector<float> xo(offset, 0.0f);
        xo.insert(xo.end(), x.begin(), x.end());
        DeviceVec<float> dx(xo);
        DeviceVec<int32_t> dout(rows);
        poison(dout, rows);
        cuda::argmax_rows(dx.get() + offset, rows, n, dout.get(), nullptr);
        KILN_CUDA_SYNC_OK();
        EXPECT_EQ(dout.to_host(), want)
            << shape("argmax_rows", rows, n) << " mode " << mode << " offset " << offset;
      }
    }
  }
  // cpu::argmax's edge cases: -inf everywhere gives 0, a NaN is never greater, a NaN first
  // keeps index 0.
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> edge = {
      {-inf, -inf, -inf, -inf, -inf}, {1, nan, 3, 3, nan}, {nan, 5, 7, 1, 2}, {-inf, 2, nan, 2, 1}};
  for (const std::vector<float>& row : edge) {
    DeviceVec<float> dx(row);
    DeviceVec<int32_t> dout(1);
    poison(dout, 1);
    cuda::argmax_rows(dx.get(), 1, static_cast<int64_t>(row.size()), dout.get(), nullptr);
    KILN_CUDA_SYNC_OK();
    EXPECT_EQ(dout.to_host()[0], cpu::argmax(row.data(), static_cast<int64_t>(row.size())));
  }
}

// The ops are capturable: recorded in a CUDA graph (global capture mode rejects synchronising
// or allocating calls) and replayed, they give the eager results.
TEST(CudaOps, GraphCaptureReplaysEager) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(17);
  const int64_t rows = 4, n = 1024;
  const std::vector<float> x = random_floats(rng, rows * n, -3, 3);
  const std::vector<float> w = random_floats(rng, n, -1, 1);
  DeviceVec<float> dx(x), dw(w), dy(rows * n), dz(rows * n);
  DeviceVec<int32_t> dmax(rows);
  cudaStream_t s = nullptr;
  KILN_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto step = [&] {
    cuda::rmsnorm(dx.get(), dw.get(), dy.get(), rows, n, 1e-6f, s);
    cuda::swiglu(dy.get(), dx.get(), dz.get(), rows * n, s);
    cuda::softcap(dz.get(), 30.0f, rows * n, s);
    cuda::add(dz.get(), dx.get(), rows * n, s);
    cuda::argmax_rows(dz.get(), rows, n, dmax.get(), s);
  };
  step();
  KILN_CUDA_OK(cudaStreamSynchronize(s));
  const std::vector<float> eager = dz.to_host();
  const std::vector<int32_t> eager_max = dmax.to_host();
  poison(dz, rows * n);
  poison(dmax, rows);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  KILN_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  step();
  KILN_CUDA_OK(cudaStreamEndCapture(s, &graph));
  KILN_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  KILN_CUDA_OK(cudaGraphLaunch(exec, s));
  KILN_CUDA_OK(cudaStreamSynchronize(s));
  expect_bitwise(dz.to_host(), eager, "graph replay of rmsnorm/swiglu/softcap/add");
  EXPECT_EQ(dmax.to_host(), eager_max);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// Not a test: achieved bandwidth of the ops against a device-to-device copy measured in the same
// run (run with --gtest_also_run_disabled_tests --gtest_filter='CudaOpsBench.*'). Median of 20
// timed launches after 3 warm-ups; bytes are the fewest the op must move (inputs read once,
// outputs written once).
TEST(CudaOpsBench, DISABLED_PrintsBandwidth) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(18);
  const int64_t big = int64_t{64} << 20;  // floats per operand: 256 MiB
  DeviceVec<float> a(random_floats(rng, big, -2, 2)), b(random_floats(rng, big, -2, 2)), c(big);
  DeviceVec<int32_t> idx(std::vector<int32_t>(1 << 20, 0));
  std::vector<int32_t> spread(8192);  // distinct source rows, so gather_rows is not an L2 re-read
  for (int32_t i = 0; i < 8192; ++i) spread[i] = (i * 4099) % 8192;
  DeviceVec<int32_t> gather_idx(spread);
  DeviceVec<double> freq(std::vector<double>(128, 1e-3));
  cudaEvent_t e0, e1;
  KILN_CUDA_OK(cudaEventCreate(&e0));
  KILN_CUDA_OK(cudaEventCreate(&e1));
  auto time_us = [&](auto&& launch) {
    for (int i = 0; i < 3; ++i) launch();
    std::vector<float> ms(20);
    for (float& m : ms) {
      cudaEventRecord(e0);
      launch();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      cudaEventElapsedTime(&m, e0, e1);
    }
    std::sort(ms.begin(), ms.end());
    return 1e3 * ms[ms.size() / 2];
  };
  const double copy_us = time_us(
      [&] { cudaMemcpyAsync(c.get(), a.get(), big * 4, cudaMemcpyDeviceToDevice, nullptr); });
  const double ceiling = 2.0 * big * 4 / copy_us / 1e3;  // GB/s
  std::printf("  %-44s %10.1f us %8.0f GB/s (the ceiling)\n", "cudaMemcpy D2D 256 MiB", copy_us,
              ceiling);
  auto report = [&](const char* what, double bytes, auto&& launch) {
    const double us = time_us(launch);
    const double gbs = bytes / us / 1e3;
    std::printf("  %-44s %10.1f us %8.0f GB/s %5.1f%% of copy\n", what, us, gbs,
                100.0 * gbs / ceiling);
  };
  report("add [64M]", 12.0 * big, [&] { cuda::add(c.get(), b.get(), big, nullptr); });
  report("swiglu [64M]", 12.0 * big,
         [&] { cuda::swiglu(a.get(), b.get(), c.get(), big, nullptr); });
  report("geglu [64M]", 12.0 * big, [&] { cuda::geglu(a.get(), b.get(), c.get(), big, nullptr); });
  report("softcap [64, 151936]", 8.0 * 64 * 151936,
         [&] { cuda::softcap(c.get(), 30.0f, 64 * 151936, nullptr); });
  report("rmsnorm [8192, 4096]", 8.0 * 8192 * 4096,
         [&] { cuda::rmsnorm(a.get(), b.get(), c.get(), 8192, 4096, 1e-6f, nullptr); });
  report("rmsnorm [1, 4096] (latency)", 8.0 * 4096,
         [&] { cuda::rmsnorm(a.get(), b.get(), c.get(), 1, 4096, 1e-6f, nullptr); });
  report("rmsnorm [262144, 128] (qk-norm)", 8.0 * 262144 * 128,
         [&] { cuda::rmsnorm(a.get(), b.get(), c.get(), 262144, 128, 1e-6f, nullptr); });
  report("add_bias [8192, 4096]", 8.0 * 8192 * 4096,
         [&] { cuda::add_bias(c.get(), b.get(), 8192, 4096, nullptr); });
  report("copy_cols [8192, 1024 of 6144]", 8.0 * 8192 * 1024,
         [&] { cuda::copy_cols(a.get(), 6144, 4096, c.get(), 1024, 8192, nullptr); });
  report("gather_rows [8192, 4096]", 8.0 * 8192 * 4096,
         [&] { cuda::gather_rows(a.get(), gather_idx.get(), c.get(), 8192, 4096, nullptr); });
  report("argmax_rows [1, 151936] (latency)", 4.0 * 151936,
         [&] { cuda::argmax_rows(a.get(), 1, 151936, idx.get(), nullptr); });
  report("argmax_rows [256, 151936]", 4.0 * 256 * 151936,
         [&] { cuda::argmax_rows(a.get(), 256, 151936, idx.get(), nullptr); });
  report("rope_angles [8192, 64]", 8.0 * 8192 * 64, [&] {
    cuda::rope_angles(freq.get(), 64, idx.get(), 8192, 1.0f, b.get(), b.get() + (1 << 20), nullptr);
  });
  report("rope_apply [8192, 32, 128]", 8.0 * 8192 * 32 * 128, [&] {
    cuda::rope_apply(c.get(), 8192, 32, 128, 64, true, b.get(), b.get() + (1 << 20), nullptr);
  });
  report("moe_topk [8192, 128] k8", 4.0 * 8192 * 128, [&] {
    cuda::moe_topk(a.get(), 8192, 128, 8, idx.get(), c.get(), idx.get() + 65536, nullptr);
  });
  report("moe_topk [1, 128] k8 (latency)", 4.0 * 128, [&] {
    cuda::moe_topk(a.get(), 1, 128, 8, idx.get(), c.get(), idx.get() + 65536, nullptr);
  });
  report("moe_combine [2048, 8, 4096]", 4.0 * 2048 * 9 * 4096,
         [&] { cuda::moe_combine(a.get(), b.get(), 2048, 8, 4096, c.get(), nullptr); });
  KILN_CUDA_SYNC_OK();
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
}  // namespace kiln
