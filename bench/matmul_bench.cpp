// CPU matmul kernels: GEMV (decode, one token) over a 4096 x 4096 weight, reported as weight
// GB/s against the machine's copy bandwidth (BM_memcpy), and GEMM (prefill, 512 tokens) in
// GFLOP/s, per weight type and kernel path, on util::default_num_threads() threads; plus
// llama.cpp's test-backend-ops MUL_MAT perf shape (4096 x 14336) on the best path, and the
// single-thread decode kernel cost at a model shape (gemv1t/..., CPU time, minimum of 20
// repetitions), and small decode batches (batch/TYPE/PATH/N: N tokens at once, as a server
// steps N concurrent sequences) whose cost per step should stay near one token's.
//
//   ./build/bench_matmul_bench --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kiln/backend/cpu/matmul.h"
#include "kiln/backend/cpu/pack.h"
#include "kiln/quant/convert.h"
#include "kiln/quant/types.h"
#include "kiln/util/thread_pool.h"

namespace {

using kiln::backend::Weight;
using kiln::backend::cpu::KernelPath;
using kiln::quant::Type;

constexpr int64_t kDim = 4096;
constexpr int64_t kPrefillTokens = 512;

kiln::util::ThreadPool& pool() {
  static kiln::util::ThreadPool p(kiln::util::default_num_threads());
  return p;
}

struct BenchWeight {
  std::vector<uint8_t> bytes;
  Weight w;
};

const BenchWeight& weight(Type type, int64_t n_in, int64_t n_out = kDim) {
  struct Key {
    Type type;
    int64_t n_in, n_out;
  };
  static std::vector<std::pair<Key, BenchWeight>> cache;
  for (auto& [key, bw] : cache)
    if (key.type == type && key.n_in == n_in && key.n_out == n_out) return bw;
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 1.0f);
  BenchWeight bw;
  const uint64_t rb = *kiln::quant::row_bytes(type, static_cast<uint64_t>(n_in));
  bw.bytes.resize(rb * static_cast<uint64_t>(n_out));
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int64_t o = 0; o < n_out; ++o) {
    for (float& v : row) v = g(rng);
    (void)kiln::quant::quantize_row(type, row.data(), bw.bytes.data() + o * rb, n_in);
  }
  bw.w = Weight{type, n_in, n_out, bw.bytes.data(), rb};
  cache.emplace_back(Key{type, n_in, n_out}, std::move(bw));
  return cache.back().second;
}

std::vector<float> acts(int64_t n_tokens, int64_t n_in) {
  std::mt19937 rng(2);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_tokens * n_in));
  for (float& v : x) v = g(rng);
  return x;
}

void bm_memcpy(benchmark::State& state) {
  const size_t n = size_t{256} << 20;
  std::vector<uint8_t> a(n, 1), b(n, 2);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), n);
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  // Copy bandwidth counts the bytes read plus the bytes written.
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * static_cast<int64_t>(n));
}

// The same copy split over the pool's threads (the ceiling for multithreaded GEMV).
void bm_memcpy_threads(benchmark::State& state) {
  const int64_t n = int64_t{256} << 20;
  std::vector<uint8_t> a(static_cast<size_t>(n), 1), b(static_cast<size_t>(n), 2);
  for (auto _ : state) {
    pool().parallel_for(n >> 20, [&](int64_t begin, int64_t end, int) {
      std::memcpy(b.data() + (begin << 20), a.data() + (begin << 20),
                  static_cast<size_t>((end - begin) << 20));
    });
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * n);
}

// The weight with its packed copy (pack.h), as the model loader makes it.
Weight packed_weight(Type type, int64_t n_in) {
  static kiln::backend::cpu::PackedStore store;
  static std::vector<std::pair<const uint8_t*, Weight>> done;
  const Weight& w = weight(type, n_in).w;
  for (auto& [data, pw] : done)
    if (data == w.data) return pw;
  Weight pw = w;
  store.pack(&pw);
  done.emplace_back(w.data, pw);
  return pw;
}

void bm_matmul(benchmark::State& state, Type type, KernelPath path, int64_t n_tokens, int64_t n_in,
               bool packed = false) {
  if (!kiln::backend::cpu::path_available(path)) {
    state.SkipWithError("path not available on this CPU");
    return;
  }
  const BenchWeight& bw = weight(type, n_in);
  const Weight w = packed ? packed_weight(type, n_in) : bw.w;
  if (packed && w.prepared == nullptr) {
    state.SkipWithError("no packed layout for this type here");
    return;
  }
  const std::vector<float> x = acts(n_tokens, n_in);
  std::vector<float> y(static_cast<size_t>(n_tokens * kDim));
  for (auto _ : state) {
    kiln::backend::cpu::matmul_on_path(w, x.data(), y.data(), n_tokens, &pool(), path);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(bw.bytes.size()));
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * kDim * static_cast<double>(n_in) * static_cast<double>(n_tokens) * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate);
}

// Decode kernel cost on one thread at a model shape (Qwen3-0.6B's FFN up: 3072 x 1024, 3 MB
// or less, L3-resident): compute, not DRAM. Reported with the minimum over repetitions,
// which a machine shared with other jobs disturbs least.
void bm_gemv_1t(benchmark::State& state, Type type, KernelPath path) {
  if (!kiln::backend::cpu::path_available(path)) {
    state.SkipWithError("path not available on this CPU");
    return;
  }
  constexpr int64_t kIn = 1024, kOut = 3072;
  const BenchWeight& bw = weight(type, kIn, kOut);
  const std::vector<float> x = acts(1, kIn);
  std::vector<float> y(static_cast<size_t>(kOut));
  for (auto _ : state) {
    kiln::backend::cpu::matmul_on_path(bw.w, x.data(), y.data(), 1, nullptr, path);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(bw.bytes.size()));
}

double min_of(const std::vector<double>& v) {
  double m = v.empty() ? 0.0 : v[0];
  for (double d : v) m = d < m ? d : m;
  return m;
}

// Model-like shapes whose weights (35-260 MB) do not fit in L3: DRAM streaming plus compute,
// as the model's decode (N = 1) and a server's 8-sequence step (N = 8) see them; packed as
// the model loader packs them.
void bm_shape(benchmark::State& state, Type type, int64_t n_in, int64_t n_out, int64_t n) {
  const KernelPath path = kiln::backend::cpu::best_kernel_path();
  static kiln::backend::cpu::PackedStore store;
  const BenchWeight& bw = weight(type, n_in, n_out);
  Weight w = bw.w;
  store.pack(&w);
  const std::vector<float> x = acts(n, n_in);
  std::vector<float> y(static_cast<size_t>(n * n_out));
  for (auto _ : state) {
    kiln::backend::cpu::matmul_on_path(w, x.data(), y.data(), n, &pool(), path);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(bw.bytes.size()));
  state.counters["GMAC/s"] = benchmark::Counter(
      static_cast<double>(n_in) * static_cast<double>(n_out) * static_cast<double>(n) * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
  for (Type t : {Type::Q8_0, Type::Q4_K, Type::Q6_K}) {
    for (auto [ni, no] : {std::pair<int64_t, int64_t>{2048, 128256}, {2048, 16384}, {8192, 4096}}) {
      for (int64_t n : {1, 8}) {
        const std::string name = "shape/" + std::string(kiln::quant::type_name(t)) + "/" +
                                 std::to_string(ni) + "x" + std::to_string(no) + "/" +
                                 std::to_string(n);
        benchmark::RegisterBenchmark(name.c_str(), bm_shape, t, ni, no, n)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  for (Type t : {Type::Q4_K, Type::Q5_K, Type::Q6_K, Type::Q8_0, Type::Q4_0}) {
    const KernelPath p = kiln::backend::cpu::best_kernel_path();
    const std::string name = "gemv1t/" + std::string(kiln::quant::type_name(t)) + "/" +
                             kiln::backend::cpu::path_name(p) + "/3072x1024";
    benchmark::RegisterBenchmark(name.c_str(), bm_gemv_1t, t, p)
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(0.05)
        ->Repetitions(20)
        ->ComputeStatistics("min", min_of)
        ->ReportAggregatesOnly(true);
  }
  for (Type t : {Type::Q4_K, Type::Q6_K, Type::Q8_0}) {
    const KernelPath p = kiln::backend::cpu::best_kernel_path();
    for (int64_t n : {1, 2, 4, 8, 16, 32}) {
      const std::string name = "batch/" + std::string(kiln::quant::type_name(t)) + "/" +
                               kiln::backend::cpu::path_name(p) + "/" + std::to_string(n);
      benchmark::RegisterBenchmark(name.c_str(), bm_matmul, t, p, n, kDim, false)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("packed" + name).c_str(), bm_matmul, t, p, n, kDim, true)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  benchmark::RegisterBenchmark("memcpy_256MiB", bm_memcpy)->UseRealTime();
  benchmark::RegisterBenchmark("memcpy_256MiB_pool", bm_memcpy_threads)->UseRealTime();
  const Type types[] = {Type::Q4_K, Type::Q6_K, Type::Q8_0, Type::Q5_K,
                        Type::Q4_0, Type::F16,  Type::BF16, Type::F32};
  const KernelPath paths[] = {KernelPath::Scalar, KernelPath::Avx2, KernelPath::Avx512};
  for (Type t : types) {
    for (KernelPath p : paths) {
      if (!kiln::backend::cpu::path_available(p)) continue;
      const std::string name =
          std::string(kiln::quant::type_name(t)) + "/" + kiln::backend::cpu::path_name(p);
      benchmark::RegisterBenchmark(("gemv/" + name).c_str(), bm_matmul, t, p, int64_t{1}, kDim,
                                   false)
          ->UseRealTime();
      if (p != KernelPath::Scalar) {  // scalar prefill takes minutes per iteration
        benchmark::RegisterBenchmark(("gemm512/" + name).c_str(), bm_matmul, t, p, kPrefillTokens,
                                     kDim, false)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

// llama.cpp's test-backend-ops perf shape (MUL_MAT m=4096, k=14336, n=1 and 512), for a
// side-by-side with `test-backend-ops perf -o MUL_MAT -b CPU`.
void register_ggml_shape() {
  constexpr int64_t kFfn = 14336;
  for (Type t : {Type::Q4_K, Type::Q6_K, Type::Q8_0, Type::Q4_0, Type::F16}) {
    const KernelPath p = kiln::backend::cpu::best_kernel_path();
    const std::string name =
        std::string(kiln::quant::type_name(t)) + "/" + kiln::backend::cpu::path_name(p) + "/k14336";
    benchmark::RegisterBenchmark(("gemv/" + name).c_str(), bm_matmul, t, p, int64_t{1}, kFfn, false)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("gemm512/" + name).c_str(), bm_matmul, t, p, kPrefillTokens, kFfn,
                                 false)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  register_ggml_shape();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
