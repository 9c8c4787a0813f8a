// Thread pool overhead and memory bandwidth.
//   bench_thread_pool_bench --benchmark_filter=Dispatch
// Figures: ns per empty parallel_for (what every kernel launch pays), GB/s of a parallel
// sum over 64 MiB (memory bound), and memcpy GB/s as the machine's ceiling for comparison.
// GB/s here is 1e9 bytes per second of wall time.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kiln/util/cpu.h"
#include "kiln/util/thread_pool.h"

namespace {

using kiln::util::ThreadPool;

constexpr int64_t kBufferBytes = int64_t{64} << 20;

// On a shared machine the best repetition is the cleanest figure: report min and max too
// (min for times, max for GB/s) beside the mean and median.
double stat_min(const std::vector<double>& v) {
  return *std::min_element(v.begin(), v.end());
}
double stat_max(const std::vector<double>& v) {
  return *std::max_element(v.begin(), v.end());
}

void set_gbps(benchmark::State& state, int64_t bytes_per_iteration) {
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(bytes_per_iteration) / 1e9,
      benchmark::Counter::kIsRate);
}

// An empty loop body over n = num_threads items: one item per thread, so every worker is
// woken and must report back. Workers spin between dispatches (the decode steady state).
void BM_EmptyDispatch(benchmark::State& state) {
  ThreadPool pool(static_cast<int>(state.range(0)));
  const int64_t n = pool.num_threads();
  for (auto _ : state) {
    pool.parallel_for(n, [](int64_t begin, int64_t end, int thread_idx) {
      benchmark::DoNotOptimize(begin + end + thread_idx);
    });
  }
}
BENCHMARK(BM_EmptyDispatch)
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->UseRealTime()
    ->ComputeStatistics("min", stat_min)
    ->ComputeStatistics("max", stat_max);

// The same with spin 0: every dispatch wakes sleeping workers through the condition variable
// and the caller sleeps until they finish (the cost after an idle period).
void BM_EmptyDispatchSleeping(benchmark::State& state) {
  ThreadPool pool(ThreadPool::Options{static_cast<int>(state.range(0)), 0});
  const int64_t n = pool.num_threads();
  for (auto _ : state) {
    pool.parallel_for(n, [](int64_t begin, int64_t end, int thread_idx) {
      benchmark::DoNotOptimize(begin + end + thread_idx);
    });
  }
}
BENCHMARK(BM_EmptyDispatchSleeping)
    ->ArgName("threads")
    ->Arg(2)
    ->UseRealTime()
    ->ComputeStatistics("min", stat_min)
    ->ComputeStatistics("max", stat_max);

// Dynamic scheduling: 64 chunks over the threads.
void BM_EmptyDispatchDynamic(benchmark::State& state) {
  ThreadPool pool(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    pool.parallel_for_dynamic(64, 1, [](int64_t begin, int64_t end, int thread_idx) {
      benchmark::DoNotOptimize(begin + end + thread_idx);
    });
  }
}
BENCHMARK(BM_EmptyDispatchDynamic)
    ->ArgName("threads")
    ->Arg(2)
    ->UseRealTime()
    ->ComputeStatistics("min", stat_min)
    ->ComputeStatistics("max", stat_max);

std::vector<uint64_t>& sum_buffer() {
  static std::vector<uint64_t> buffer = [] {
    std::vector<uint64_t> b(kBufferBytes / sizeof(uint64_t));
    for (size_t i = 0; i < b.size(); ++i) b[i] = i * 2654435761u;  // touch every page
    return b;
  }();
  return buffer;
}

// Sum of 64 MiB of uint64 with per-thread partials (static ranges).
void BM_Sum64MiB(benchmark::State& state) {
  ThreadPool pool(static_cast<int>(state.range(0)));
  const std::vector<uint64_t>& data = sum_buffer();
  std::vector<uint64_t> partial(pool.num_threads());
  for (auto _ : state) {
    pool.parallel_for(static_cast<int64_t>(data.size()),
                      [&](int64_t begin, int64_t end, int thread_idx) {
                        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
                        int64_t i = begin;
                        for (; i + 4 <= end; i += 4) {
                          s0 += data[i];
                          s1 += data[i + 1];
                          s2 += data[i + 2];
                          s3 += data[i + 3];
                        }
                        for (; i < end; ++i) s0 += data[i];
                        partial[thread_idx] = s0 + s1 + s2 + s3;
                      });
    uint64_t total = 0;
    for (uint64_t p : partial) total += p;
    benchmark::DoNotOptimize(total);
  }
  set_gbps(state, kBufferBytes);
}
BENCHMARK(BM_Sum64MiB)
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->ComputeStatistics("min", stat_min)
    ->ComputeStatistics("max", stat_max);

// memcpy of 64 MiB, split over the threads. GB/s counts bytes copied; the memory traffic is
// twice that (read + write, plus write-allocate reads unless the CPU streams the stores).
void BM_Memcpy64MiB(benchmark::State& state) {
  ThreadPool pool(static_cast<int>(state.range(0)));
  std::vector<char> src(kBufferBytes, 1), dst(kBufferBytes, 2);
  for (auto _ : state) {
    pool.parallel_for(kBufferBytes, [&](int64_t begin, int64_t end, int) {
      std::memcpy(dst.data() + begin, src.data() + begin, static_cast<size_t>(end - begin));
    });
    benchmark::ClobberMemory();
  }
  set_gbps(state, kBufferBytes);
}
BENCHMARK(BM_Memcpy64MiB)
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->ComputeStatistics("min", stat_min)
    ->ComputeStatistics("max", stat_max);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("kiln_cpu_features",
                              kiln::util::to_string(kiln::util::cpu_features()));
  benchmark::AddCustomContext("kiln_physical_cores",
                              std::to_string(kiln::util::num_physical_cores()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
