// Benchmark of the CUDA matmul, a test-binary mode: runs only with KILN_CUDA_BENCH=1 (skipped
// otherwise), prints figures and asserts nothing about speed.
//   ceiling: device-to-device copy bandwidth (bytes read + written), measured in the same run;
//   decode (direct kernels): Llama-3-8B shapes, achieved GB/s (weight + x + y bytes) and % of
//   the copy ceiling, at 1, 4 and 8 tokens;
//   prefill (dequant + cuBLAS): TFLOP/s at 512 tokens;
//   matmul_id: a Qwen3-30B-A3B-shaped expert matmul (128 experts of 768 x 2048); and
//   Qwen3.5-35B-A3B-shaped prefill (256 experts, 8 used: gate/up 512 x 2048, down 2048 x 512)
//   at 4096 and 32768 pairs (512 and 4096 tokens), and 128-1024 pairs (the crossover), the
//   grouped int8 MMA (mmq_id) against the direct kernel (MatmulIdPrefill);
//   mmq (int8 MMA, 9..256 tokens) against dequant + cuBLAS on Llama-3-8B shapes, and mmq's
//   tilings side by side (Mmq, MmqTilings).
// Timing: launches captured in a CUDA graph (rotating over enough weight copies to exceed the
// 50 MiB L2), replayed; the median of 7 replays. Weights are random bytes with small finite
// f16 scales (never zeros).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/mmh.h"
#include "kiln/backend/cuda/mmq.h"
#include "kiln/quant/types.h"
#include "test_util.h"

namespace kiln {
namespace {

using backend::Weight;
using quant::Type;

#define KILN_BENCH_REQUIRE()                                     \
  do {                                                           \
    KILN_REQUIRE_GPU();                                          \
    if (std::getenv("KILN_CUDA_BENCH") == nullptr)               \
      GTEST_SKIP() << "benchmark: set KILN_CUDA_BENCH=1 to run"; \
  } while (0)

// 256 MiB of random bytes, made once and uploaded repeatedly.
const std::vector<uint8_t>& random_pool() {
  static const std::vector<uint8_t> pool = [] {
    std::vector<uint64_t> v((size_t{256} << 20) / 8);
    uint64_t s = 0x9E3779B97F4A7C15ULL;
    for (auto& x : v) {
      s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
      x = s * 0x2545F4914F6CDD1DULL;
    }
    std::vector<uint8_t> b(v.size() * 8);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  }();
  return pool;
}

// Offsets of the f16 scale fields of a block type (none for the plain types).
std::vector<int> scale_offsets(Type t) {
  switch (t) {
    case Type::Q4_0:
    case Type::Q8_0:
    case Type::IQ4_NL:
    case Type::IQ4_XS:
    case Type::Q5_0:
      return {0};
    case Type::Q4_1:
    case Type::Q5_1:
    case Type::Q4_K:
    case Type::Q5_K:
      return {0, 2};
    case Type::Q2_K:
      return {80, 82};
    case Type::Q3_K:
      return {108};
    case Type::Q6_K:
      return {208};
    default:
      return {};
  }
}

// KILN_BENCH_TYPES=q4_k,q6_k: only those weight types (default: all the benchmark lists).
bool type_selected(Type t) {
  const char* e = std::getenv("KILN_BENCH_TYPES");
  if (e == nullptr || *e == 0) return true;
  const std::string list = std::string(",") + e + ",";
  return list.find("," + std::string(quant::type_name(t)) + ",") != std::string::npos;
}

// A device buffer of `bytes` random bytes laid out as blocks of `t`, scale fields ~1e-3.
uint8_t* random_weight_bytes(Type t, uint64_t bytes) {
  uint8_t* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
  const auto& pool = random_pool();
  for (uint64_t off = 0; off < bytes; off += pool.size())
    cudaMemcpy(p + off, pool.data(), std::min<uint64_t>(pool.size(), bytes - off),
               cudaMemcpyHostToDevice);
  const uint32_t bb = quant::traits(t).block_bytes;
  for (int o : scale_offsets(t)) {
    // 0x14 0x14 -> f16 0x1414 ~ 1.1e-3
    cudaMemset2D(p + o, bb, 0x14, 2, bytes / bb);
  }
  return p;
}

// Copies of one random weight (enough to pass ~400 MB, at most 8): timed runs rotate through
// them (weight(i) is copy i % copies), so that they read DRAM, not L2.
struct RotatingWeight {
  Type type;
  int64_t n_out, n_in;
  uint64_t row_bytes, bytes;  // one copy's
  int copies;
  uint8_t* w;
  RotatingWeight(Type t, int64_t out, int64_t in)
      : type(t),
        n_out(out),
        n_in(in),
        row_bytes(*quant::row_bytes(t, static_cast<uint64_t>(in))),
        bytes(row_bytes * static_cast<uint64_t>(out)),
        copies(static_cast<int>(std::clamp<uint64_t>((uint64_t{400} << 20) / bytes + 1, 1, 8))),
        w(random_weight_bytes(t, bytes * copies)) {}
  ~RotatingWeight() { cudaFree(w); }
  RotatingWeight(const RotatingWeight&) = delete;
  RotatingWeight& operator=(const RotatingWeight&) = delete;
  bool ok() const { return w != nullptr; }
  Weight operator()(int i) const {
    Weight wt;
    wt.type = type;
    wt.n_in = n_in;
    wt.n_out = n_out;
    wt.row_bytes = row_bytes;
    wt.data = w + static_cast<uint64_t>(i % copies) * bytes;
    return wt;
  }
};

template <typename F>
double time_graph_us(F launch, int per_graph) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  launch(0, s);  // eager first: module loading and library set-up stay outside the capture
  cudaStreamSynchronize(s);
  cudaGraph_t g;
  cudaGraphExec_t ge;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  for (int i = 0; i < per_graph; ++i) launch(i, s);
  cudaStreamEndCapture(s, &g);
  cudaGraphInstantiate(&ge, g, 0);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaGraphLaunch(ge, s);  // warm-up
  std::vector<float> ms;
  for (int r = 0; r < 7; ++r) {
    cudaEventRecord(a, s);
    cudaGraphLaunch(ge, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  return 1000.0 * ms[ms.size() / 2] / per_graph;
}

double copy_ceiling_gbs() {
  const size_t n = size_t{1} << 30;
  void *a, *b;
  if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) return 0;
  cudaMemset(a, 1, n);
  const double us = time_graph_us(
      [&](int, cudaStream_t s) { cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s); }, 4);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * n / us / 1e3;
}

TEST(CudaMatmulBench, DecodeAndPrefill) {
  KILN_BENCH_REQUIRE();
  const double ceiling = copy_ceiling_gbs();
  std::printf("copy ceiling: %.0f GB/s (read + write, 1 GiB D2D)\n", ceiling);
  struct Shape {
    int64_t n_out, n_in;
  };
  const Shape shapes[] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}};
  const Type types[] = {Type::F16,  Type::BF16, Type::Q8_0, Type::Q4_0,  Type::Q4_K,
                        Type::Q5_K, Type::Q6_K, Type::Q3_K, Type::IQ4_XS};
  auto* ctx = backend::cuda::create_matmul_context(512, 14336, 128256);
  ASSERT_NE(ctx, nullptr);
  float *x, *y;
  KILN_CUDA_OK(cudaMalloc(&x, 512 * 14336 * sizeof(float)));
  KILN_CUDA_OK(cudaMalloc(&y, 512 * size_t{128256} * sizeof(float)));
  {
    std::vector<float> hx(512 * 14336);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0, 1);
    for (auto& f : hx) f = nd(rng);
    cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice);
  }
  std::printf("%-7s %7s %6s %4s %9s %9s %6s\n", "type", "n_out", "n_in", "tok", "us", "GB/s",
              "%ceil");
  for (Type t : types) {
    if (!type_selected(t)) continue;
    for (const Shape& sh : shapes) {
      const RotatingWeight weight(t, sh.n_out, sh.n_in);
      ASSERT_TRUE(weight.ok());
      const int copies = weight.copies;
      const uint64_t wbytes = weight.bytes;
      for (int64_t tok : {1, 4, 8}) {
        const double us = time_graph_us(
            [&](int i, cudaStream_t s) { backend::cuda::matmul(ctx, weight(i), x, y, tok, s); },
            4 * copies);
        const double bytes = wbytes + 4.0 * tok * (sh.n_in + sh.n_out);
        std::printf("%-7s %7ld %6ld %4ld %9.1f %9.0f %5.0f%%\n",
                    std::string(quant::type_name(t)).c_str(), sh.n_out, sh.n_in, tok, us,
                    bytes / us / 1e3, 100.0 * bytes / us / 1e3 / ceiling);
      }
      if (sh.n_out != 128256 && (t == Type::F16 || t == Type::Q8_0 || t == Type::Q4_K)) {
        const int64_t tok = 512;
        const double us = time_graph_us(
            [&](int, cudaStream_t s) { backend::cuda::matmul(ctx, weight(0), x, y, tok, s); }, 3);
        std::printf("%-7s %7ld %6ld %4ld %9.1f  prefill %.0f TFLOP/s\n",
                    std::string(quant::type_name(t)).c_str(), sh.n_out, sh.n_in, tok, us,
                    2.0 * sh.n_out * sh.n_in * tok / us / 1e6);
      }
      std::fflush(stdout);
    }
  }
  ASSERT_EQ(cudaSuccess, cudaGetLastError());
  cudaFree(x);
  cudaFree(y);
  backend::cuda::destroy_matmul_context(ctx);
}

TEST(CudaMatmulBench, MatmulId) {
  KILN_BENCH_REQUIRE();
  const int64_t n_expert = 128, n_out = 768, n_in = 2048, top_k = 8;
  auto* ctx = backend::cuda::create_matmul_context(512, n_in, n_out, 512 * top_k, n_expert);
  ASSERT_NE(ctx, nullptr);
  float *x, *y;
  int32_t *ids, *rows;
  KILN_CUDA_OK(cudaMalloc(&x, 512 * n_in * sizeof(float)));
  KILN_CUDA_OK(cudaMalloc(&y, 512 * top_k * n_out * sizeof(float)));
  KILN_CUDA_OK(cudaMalloc(&ids, 512 * top_k * sizeof(int32_t)));
  KILN_CUDA_OK(cudaMalloc(&rows, 512 * top_k * sizeof(int32_t)));
  std::mt19937 rng(2);
  std::vector<int32_t> hid(512 * top_k), hrows(512 * top_k);
  for (size_t p = 0; p < hid.size(); ++p) {
    hid[p] = static_cast<int32_t>(rng() % n_expert);
    hrows[p] = static_cast<int32_t>(p / top_k);
  }
  cudaMemcpy(ids, hid.data(), hid.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(rows, hrows.data(), hrows.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(x, 0x3c, 512 * n_in * sizeof(float));
  for (Type t : {Type::Q4_K, Type::Q8_0}) {
    const uint64_t rb = *quant::row_bytes(t, n_in);
    uint8_t* w = random_weight_bytes(t, rb * n_out * n_expert);
    ASSERT_NE(w, nullptr);
    Weight wt;
    wt.type = t;
    wt.n_in = n_in;
    wt.n_out = n_out;
    wt.row_bytes = rb;
    wt.data = w;
    for (int64_t tokens : {1, 512}) {
      const int64_t pairs = tokens * top_k;
      const double us = time_graph_us(
          [&](int, cudaStream_t s) {
            backend::cuda::matmul_id(ctx, wt, n_expert, x, tokens, rows, ids, y, pairs, s);
          },
          10);
      const double bytes = static_cast<double>(std::min<int64_t>(pairs, n_expert)) * rb * n_out;
      std::printf(
          "matmul_id %-5s %ld pairs: %.1f us, %.0f GB/s of distinct experts, %.1f TFLOP/s\n",
          std::string(quant::type_name(t)).c_str(), pairs, us, bytes / us / 1e3,
          2.0 * pairs * n_out * n_in / us / 1e6);
    }
    cudaFree(w);
  }
  ASSERT_EQ(cudaSuccess, cudaGetLastError());
  cudaFree(x);
  cudaFree(y);
  cudaFree(ids);
  cudaFree(rows);
  backend::cuda::destroy_matmul_context(ctx);
}

// MoE prefill: the grouped int8 MMA (default dispatch above 64 pairs) and the direct kernel
// (matmul_set_mmq_id to never) on the same routing; TFLOP/s counts 2 * pairs * n_out * n_in.
// Gate/up pairs read token rows (8 per token), the down projection one row per pair. A copy of
// the weights is ~70-280 MiB (over L2), so no rotation.
TEST(CudaMatmulBench, MatmulIdPrefill) {
  KILN_BENCH_REQUIRE();
  const int64_t n_expert = 256, top_k = 8, max_tokens = 4096, max_pairs = max_tokens * top_k;
  struct Shape {
    const char* name;
    int64_t n_out, n_in;
  };
  const Shape shapes[] = {{"gate/up", 512, 2048}, {"down", 2048, 512}};
  auto* ctx = backend::cuda::create_matmul_context(max_tokens, 2048, 2048, max_pairs, n_expert);
  ASSERT_NE(ctx, nullptr);
  float *x, *y;
  int32_t *ids, *tok_rows, *pair_rows;
  KILN_CUDA_OK(cudaMalloc(&x, max_pairs * 2048 * sizeof(float)));
  KILN_CUDA_OK(cudaMalloc(&y, max_pairs * 2048 * sizeof(float)));
  KILN_CUDA_OK(cudaMalloc(&ids, max_pairs * sizeof(int32_t)));
  KILN_CUDA_OK(cudaMalloc(&tok_rows, max_pairs * sizeof(int32_t)));
  KILN_CUDA_OK(cudaMalloc(&pair_rows, max_pairs * sizeof(int32_t)));
  // Each token's 8 experts distinct, uniformly at random.
  std::mt19937 rng(3);
  std::vector<int32_t> hid(max_pairs), htok(max_pairs), hpair(max_pairs);
  for (int64_t t = 0; t < max_tokens; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      int32_t e;
      do {
        e = static_cast<int32_t>(rng() % n_expert);
      } while (std::find(hid.begin() + t * top_k, hid.begin() + t * top_k + j, e) !=
               hid.begin() + t * top_k + j);
      hid[t * top_k + j] = e;
      htok[t * top_k + j] = static_cast<int32_t>(t);
      hpair[t * top_k + j] = static_cast<int32_t>(t * top_k + j);
    }
  }
  cudaMemcpy(ids, hid.data(), hid.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(tok_rows, htok.data(), htok.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(pair_rows, hpair.data(), hpair.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(x, 0x3c, max_pairs * 2048 * sizeof(float));
  for (Type t : {Type::Q4_K, Type::Q6_K, Type::Q8_0}) {
    for (const Shape& sh : shapes) {
      const uint64_t rb = *quant::row_bytes(t, sh.n_in);
      uint8_t* w = random_weight_bytes(t, rb * sh.n_out * n_expert);
      ASSERT_NE(w, nullptr);
      Weight wt;
      wt.type = t;
      wt.n_in = sh.n_in;
      wt.n_out = sh.n_out;
      wt.row_bytes = rb;
      wt.data = w;
      const bool down = sh.n_out > sh.n_in;
      // 16-128 tokens (128-1024 pairs): where the 64-pair crossover to mmq_id should be checked.
      for (int64_t tokens :
           {int64_t{16}, int64_t{32}, int64_t{64}, int64_t{128}, int64_t{512}, max_tokens}) {
        const int64_t pairs = tokens * top_k;
        for (bool grouped : {true, false}) {
          backend::cuda::matmul_set_mmq_id(
              ctx, grouped ? backend::cuda::kMmqIdMinPairs : int64_t{1} << 40);
          const double us = time_graph_us(
              [&](int, cudaStream_t s) {
                backend::cuda::matmul_id(ctx, wt, n_expert, x, down ? pairs : tokens,
                                         down ? pair_rows : tok_rows, ids, y, pairs, s);
              },
              grouped ? 10 : 3);
          std::printf("matmul_id %-5s %-7s %5ld pairs %-7s: %9.1f us, %6.1f TFLOP/s\n",
                      std::string(quant::type_name(t)).c_str(), sh.name, pairs,
                      grouped ? "mmq_id" : "direct", us,
                      2.0 * pairs * sh.n_out * sh.n_in / us / 1e6);
          std::fflush(stdout);
        }
      }
      cudaFree(w);
    }
  }
  backend::cuda::matmul_set_mmq_id(ctx, backend::cuda::kMmqIdMinPairs);
  ASSERT_EQ(cudaSuccess, cudaGetLastError());
  cudaFree(x);
  cudaFree(y);
  cudaFree(ids);
  cudaFree(tok_rows);
  cudaFree(pair_rows);
  backend::cuda::destroy_matmul_context(ctx);
}

// A Q8 activation buffer and mmq scratch of the bench's own, for timing the mmq kernel alone.
struct MmqBuffers {
  int8_t* xq = nullptr;
  float2* xds = nullptr;
  backend::cuda::MmqScratch scratch;
  MmqBuffers(const float* x, int64_t n_tokens, int64_t n_in) {
    cudaMalloc(&xq, n_tokens * n_in);
    cudaMalloc(&xds, n_tokens * n_in / 32 * sizeof(float2));
    scratch.partial_floats = int64_t{4} << 20;
    scratch.n_counters = 16384;
    cudaMalloc(&scratch.partials, scratch.partial_floats * sizeof(float));
    cudaMalloc(&scratch.counters, scratch.n_counters * sizeof(int32_t));
    cudaMemset(scratch.counters, 0, scratch.n_counters * sizeof(int32_t));
    backend::cuda::quantize_q8_32(x, n_tokens, n_in, xq, xds, nullptr);
    cudaDeviceSynchronize();
  }
  ~MmqBuffers() {
    cudaFree(xq);
    cudaFree(xds);
    cudaFree(scratch.partials);
    cudaFree(scratch.counters);
  }
};

struct MmqShape {
  int64_t n_out, n_in;
};
constexpr MmqShape kMmqShapes[] = {{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}};

// Per shape, type and token count: the mmq kernel alone (x already int8, as the norms and
// swiglu write it), matmul() through mmq (with the quantize kernel), and matmul() through
// dequantize + cuBLAS; us, int8 TOPS and weight GB/s of the kernel, speedup of matmul().
TEST(CudaMatmulBench, Mmq) {
  KILN_BENCH_REQUIRE();
  const double ceiling = copy_ceiling_gbs();
  std::printf("copy ceiling: %.0f GB/s (read + write, 1 GiB D2D)\n", ceiling);
  const int64_t max_tok = 256;
  auto* ctx = backend::cuda::create_matmul_context(max_tok, 14336, 14336);
  ASSERT_NE(ctx, nullptr);
  float *x, *y;
  KILN_CUDA_OK(cudaMalloc(&x, max_tok * 14336 * sizeof(float)));
  KILN_CUDA_OK(cudaMalloc(&y, max_tok * 14336 * sizeof(float)));
  {
    std::vector<float> hx(max_tok * 14336);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0, 1);
    for (auto& f : hx) f = nd(rng);
    cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice);
  }
  MmqBuffers buf(x, max_tok, 14336);
  std::printf("%-5s %6s %6s %4s | %8s %6s %6s | %8s %8s %6s\n", "type", "n_out", "n_in", "tok",
              "mmq us", "TOPS", "GB/s", "+quant", "cuBLAS", "x");
  for (Type t : {Type::Q4_K, Type::Q6_K, Type::Q8_0, Type::Q5_K, Type::Q4_0}) {
    for (const MmqShape& sh : kMmqShapes) {
      const RotatingWeight weight(t, sh.n_out, sh.n_in);
      ASSERT_TRUE(weight.ok());
      const int copies = weight.copies;
      const uint64_t wbytes = weight.bytes;
      for (int64_t tok : {16, 32, 64, 128, 256}) {
        if (t != Type::Q4_K && t != Type::Q6_K && (tok == 32 || tok == 128)) continue;
        const double us_k = time_graph_us(
            [&](int i, cudaStream_t s) {
              backend::cuda::mmq(weight(i), y, buf.xq, buf.xds, tok, buf.scratch, s);
            },
            4 * copies);
        backend::cuda::matmul_set_mmq(ctx, max_tok);
        const double us_m = time_graph_us(
            [&](int i, cudaStream_t s) { backend::cuda::matmul(ctx, weight(i), x, y, tok, s); },
            4 * copies);
        backend::cuda::matmul_set_mmq(ctx, 0);
        const double us_c = time_graph_us(
            [&](int i, cudaStream_t s) { backend::cuda::matmul(ctx, weight(i), x, y, tok, s); },
            2 * copies);
        std::printf("%-5s %6ld %6ld %4ld | %8.1f %6.0f %6.0f | %8.1f %8.1f %5.1fx\n",
                    std::string(quant::type_name(t)).c_str(), sh.n_out, sh.n_in, tok, us_k,
                    2.0 * sh.n_out * sh.n_in * tok / us_k / 1e6, wbytes / us_k / 1e3, us_m, us_c,
                    us_c / us_m);
        std::fflush(stdout);
      }
    }
  }
  ASSERT_EQ(cudaSuccess, cudaGetLastError());
  cudaFree(x);
  cudaFree(y);
  backend::cuda::destroy_matmul_context(ctx);
}

// mmq's tilings (tokens per CTA x K splits) for Q4_K on two shapes: the kernel alone, us.
// mmh (fp16 MMA, weights dequantized in registers) against mmq (int8 MMA) and dequantize +
// cuBLAS, per shape and token count: the mmh and mmq kernels alone (x already in their formats),
// matmul() with mmh and mmq off (cuBLAS); us, TFLOP/s and weight GB/s of mmh.
TEST(CudaMatmulBench, Mmh) {
  KILN_BENCH_REQUIRE();
  const double ceiling = copy_ceiling_gbs();
  std::printf("copy ceiling: %.0f GB/s (read + write, 1 GiB D2D)\n", ceiling);
  const int64_t max_tok = 256, max_in = 14336, max_out = 128256;
  auto* ctx = backend::cuda::create_matmul_context(max_tok, max_in, max_out);
  ASSERT_NE(ctx, nullptr);
  float *x, *y;
  __half* xh;
  KILN_CUDA_OK(cudaMalloc(&x, max_tok * max_in * sizeof(float)));
  KILN_CUDA_OK(cudaMalloc(&y, max_tok * max_out * sizeof(float)));
  KILN_CUDA_OK(cudaMalloc(&xh, max_tok * max_in * sizeof(__half)));
  {
    std::vector<float> hx(max_tok * max_in);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0, 1);
    for (auto& f : hx) f = nd(rng);
    cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice);
  }
  MmqBuffers buf(x, max_tok, max_in);
  std::printf("%-5s %6s %6s %4s | %8s %6s %6s | %8s %8s | %6s %6s\n", "type", "n_out", "n_in",
              "tok", "mmh us", "TFLOPS", "GB/s", "mmq us", "cuBLAS", "/mmq", "/cuBLAS");
  const MmqShape shapes[] = {
      {4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}};
  for (Type t : {Type::Q4_K, Type::Q6_K, Type::Q5_K, Type::Q8_0}) {
    for (const MmqShape& sh : shapes) {
      const RotatingWeight weight(t, sh.n_out, sh.n_in);
      ASSERT_TRUE(weight.ok());
      const int copies = weight.copies;
      const uint64_t wbytes = weight.bytes;
      for (int64_t tok : {16, 32, 64, 128, 256}) {
        // KILN_MMH_SHAPES="14336x4096x64,...": only those (for a profiler).
        if (const char* only = std::getenv("KILN_MMH_SHAPES")) {
          const std::string key =
              std::to_string(sh.n_out) + "x" + std::to_string(sh.n_in) + "x" + std::to_string(tok);
          if (("," + std::string(only) + ",").find("," + key + ",") == std::string::npos) continue;
        }
        backend::cuda::mmh_prepare(x, tok, sh.n_in, xh, nullptr);
        const double us_h = time_graph_us(
            [&](int i, cudaStream_t s) {
              backend::cuda::mmh(weight(i), y, xh, tok, buf.scratch, s);
            },
            4 * copies);
        const double us_q = time_graph_us(
            [&](int i, cudaStream_t s) {
              backend::cuda::mmq(weight(i), y, buf.xq, buf.xds, tok, buf.scratch, s);
            },
            4 * copies);
        backend::cuda::matmul_set_mmh(ctx, 0);
        backend::cuda::matmul_set_mmq(ctx, 0);
        const double us_c = time_graph_us(
            [&](int i, cudaStream_t s) { backend::cuda::matmul(ctx, weight(i), x, y, tok, s); },
            2 * copies);
        std::printf("%-5s %6ld %6ld %4ld | %8.1f %6.0f %6.0f | %8.1f %8.1f | %5.2fx %5.2fx\n",
                    std::string(quant::type_name(t)).c_str(), sh.n_out, sh.n_in, tok, us_h,
                    2.0 * sh.n_out * sh.n_in * tok / us_h / 1e6, wbytes / us_h / 1e3, us_q, us_c,
                    us_q / us_h, us_c / us_h);
        std::fflush(stdout);
      }
    }
  }
  ASSERT_EQ(cudaSuccess, cudaGetLastError());
  cudaFree(x);
  cudaFree(y);
  cudaFree(xh);
  backend::cuda::destroy_matmul_context(ctx);
}

// Weights sharing one input (the 8B's q/k/v and gate/up): mmh_shared's one launch for all of
// them against mmh launched per weight and against matmul per weight (the dispatch without
// grouping: the 1,024-row weights on dequantize + cuBLAS above 16 tokens), us, x prepared once.
TEST(CudaMatmulBench, MmhShared) {
  KILN_BENCH_REQUIRE();
  const int64_t max_tok = 128, n_in = 4096, max_out = 14336;
  auto* ctx = backend::cuda::create_matmul_context(max_tok, n_in, max_out);
  ASSERT_NE(ctx, nullptr);
  float *x, *y;
  __half* xh;
  KILN_CUDA_OK(cudaMalloc(&x, max_tok * n_in * sizeof(float)));
  KILN_CUDA_OK(cudaMalloc(&y, 2 * max_tok * max_out * sizeof(float)));
  KILN_CUDA_OK(cudaMalloc(&xh, max_tok * n_in * sizeof(__half)));
  KILN_CUDA_OK(cudaMemset(x, 0, max_tok * n_in * sizeof(float)));
  MmqBuffers buf(x, max_tok, n_in);
  struct Group {
    const char* name;
    std::vector<std::pair<Type, int64_t>> weights;
  };
  const Group groups[] = {
      {"q+k+v Q4_K", {{Type::Q4_K, 4096}, {Type::Q4_K, 1024}, {Type::Q4_K, 1024}}},
      {"q+k Q4_K", {{Type::Q4_K, 4096}, {Type::Q4_K, 1024}}},
      {"v Q6_K", {{Type::Q6_K, 1024}}},
      {"gate+up Q4_K", {{Type::Q4_K, 14336}, {Type::Q4_K, 14336}}},
  };
  std::printf("%-13s %4s | %8s %6s | %8s %8s\n", "group", "tok", "shared", "GB/s", "mmh each",
              "matmul");
  for (const Group& gr : groups) {
    std::vector<std::unique_ptr<RotatingWeight>> rw;
    uint64_t bytes = 0;
    int copies = 8;
    for (const auto& [t, rows] : gr.weights) {
      rw.push_back(std::make_unique<RotatingWeight>(t, rows, n_in));
      ASSERT_TRUE(rw.back()->ok());
      bytes += rw.back()->bytes;
      copies = std::min(copies, rw.back()->copies);
    }
    const int n = static_cast<int>(rw.size());
    for (int64_t tok : {16, 32, 64, 128}) {
      backend::cuda::mmh_prepare(x, tok, n_in, xh, nullptr);
      std::vector<Weight> ws(n);
      std::vector<const Weight*> wp(n);
      std::vector<float*> yp(n);
      auto set = [&](int i) {
        int64_t off = 0;
        for (int j = 0; j < n; ++j) {
          ws[j] = (*rw[j])(i);
          wp[j] = &ws[j];
          yp[j] = y + off;
          off += tok * ws[j].n_out;
        }
      };
      const double us_shared = time_graph_us(
          [&](int i, cudaStream_t s) {
            set(i);
            backend::cuda::mmh_shared(wp.data(), yp.data(), n, xh, tok, buf.scratch, s);
          },
          4 * copies);
      const double us_each = time_graph_us(
          [&](int i, cudaStream_t s) {
            set(i);
            for (int j = 0; j < n; ++j) backend::cuda::mmh(ws[j], yp[j], xh, tok, buf.scratch, s);
          },
          4 * copies);
      const double us_matmul = time_graph_us(
          [&](int i, cudaStream_t s) {
            set(i);
            for (int j = 0; j < n; ++j) backend::cuda::matmul(ctx, ws[j], x, yp[j], tok, s);
          },
          2 * copies);
      std::printf("%-13s %4ld | %8.1f %6.0f | %8.1f %8.1f\n", gr.name, tok, us_shared,
                  bytes / us_shared / 1e3, us_each, us_matmul);
      std::fflush(stdout);
    }
  }
  ASSERT_EQ(cudaSuccess, cudaGetLastError());
  cudaFree(x);
  cudaFree(y);
  cudaFree(xh);
  backend::cuda::destroy_matmul_context(ctx);
}

TEST(CudaMatmulBench, MmqTilings) {
  KILN_BENCH_REQUIRE();
  const int64_t max_tok = 256;
  float *x, *y;
  KILN_CUDA_OK(cudaMalloc(&x, max_tok * 14336 * sizeof(float)));
  KILN_CUDA_OK(cudaMalloc(&y, max_tok * 14336 * sizeof(float)));
  cudaMemset(x, 0x3c, max_tok * 14336 * sizeof(float));
  MmqBuffers buf(x, max_tok, 14336);
  for (Type t : {Type::Q4_K, Type::Q6_K}) {
    for (const MmqShape& sh : {kMmqShapes[0], kMmqShapes[1], kMmqShapes[3]}) {
      const RotatingWeight weight(t, sh.n_out, sh.n_in);
      ASSERT_TRUE(weight.ok());
      const int copies = weight.copies;
      for (int64_t tok : {16, 64, 256}) {
        std::printf("%-5s %6ld x %6ld, %3ld tokens:", std::string(quant::type_name(t)).c_str(),
                    sh.n_out, sh.n_in, tok);
        for (int tile : {16, 32, 64}) {
          for (int splits : {1, 2, 4, 8}) {
            backend::cuda::MmqScratch sc = buf.scratch;
            sc.tile_tokens = tile;
            sc.splits = splits;
            const double us = time_graph_us(
                [&](int i, cudaStream_t s) {
                  backend::cuda::mmq(weight(i), y, buf.xq, buf.xds, tok, sc, s);
                },
                4 * copies);
            std::printf(" %d/%d %.1f", tile, splits, us);
          }
        }
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  }
  ASSERT_EQ(cudaSuccess, cudaGetLastError());
  cudaFree(x);
  cudaFree(y);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// What a decode step pays to bring its logits to the host for sampling: one row of a 128k /
// 152k vocabulary copied device -> pinned host (cudaMemcpyAsync + stream sync, the engine's
// way), and the host's greedy argmax over it. Compare with the step's time (kiln bench tg).
TEST(CudaMatmulBench, LogitsCopyPerStep) {
  KILN_BENCH_REQUIRE();
  cudaStream_t s;
  KILN_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int64_t vocab : {int64_t{128256}, int64_t{151936}}) {
    for (int64_t rows : {int64_t{1}, int64_t{8}}) {
      const size_t bytes = static_cast<size_t>(vocab * rows) * sizeof(float);
      float* d = nullptr;
      float* h = nullptr;
      KILN_CUDA_OK(cudaMalloc(&d, bytes));
      KILN_CUDA_OK(cudaMallocHost(&h, bytes));
      KILN_CUDA_OK(cudaMemset(d, 0, bytes));
      constexpr int kIters = 200;
      double copy_us = 0, argmax_us = 0;
      int64_t sink = 0;
      for (int it = 0; it < kIters + 10; ++it) {
        const auto t0 = std::chrono::steady_clock::now();
        cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        const auto t1 = std::chrono::steady_clock::now();
        for (int64_t r = 0; r < rows; ++r)
          sink += std::max_element(h + r * vocab, h + (r + 1) * vocab) - (h + r * vocab);
        const auto t2 = std::chrono::steady_clock::now();
        if (it >= 10) {
          copy_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
          argmax_us += std::chrono::duration<double, std::micro>(t2 - t1).count();
        }
      }
      std::printf("logits %ld rows x %ld: copy %.1f us (%.1f GB/s), host argmax %.1f us%s\n", rows,
                  vocab, copy_us / kIters, bytes / (copy_us / kIters) / 1e3, argmax_us / kIters,
                  sink < 0 ? "" : "");
      cudaFree(d);
      cudaFreeHost(h);
    }
  }
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace kiln
