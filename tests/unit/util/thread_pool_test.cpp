#include "kiln/util/thread_pool.h"

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/util/cpu.h"

namespace kiln::util {
namespace {

struct Call {
  int64_t begin, end;
  int thread_idx;
  bool operator==(const Call&) const = default;
};

// Runs one static loop and checks every index is visited exactly once with a valid thread
// index; returns the calls sorted by thread.
std::vector<Call> check_cover_static(ThreadPool& pool, int64_t n) {
  std::vector<std::atomic<int>> visits(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::mutex mu;
  std::vector<Call> calls;
  pool.parallel_for(n, [&](int64_t begin, int64_t end, int thread_idx) {
    for (int64_t i = begin; i < end; ++i) visits[i].fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu);
    calls.push_back({begin, end, thread_idx});
  });
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(visits[i].load(), 1) << "n=" << n << " i=" << i;
  std::sort(calls.begin(), calls.end(),
            [](const Call& a, const Call& b) { return a.thread_idx < b.thread_idx; });
  for (size_t k = 0; k < calls.size(); ++k) {
    EXPECT_GE(calls[k].thread_idx, 0);
    EXPECT_LT(calls[k].thread_idx, pool.num_threads());
    EXPECT_LT(calls[k].begin, calls[k].end);  // never called with an empty range
    if (k > 0) {
      EXPECT_NE(calls[k].thread_idx, calls[k - 1].thread_idx);  // once per thread
    }
  }
  return calls;
}

TEST(StaticRange, HandComputedSplits) {
  // 10 over 4: sizes 3 3 2 2.
  const int64_t expect10[4][2] = {{0, 3}, {3, 6}, {6, 8}, {8, 10}};
  for (int t = 0; t < 4; ++t) {
    const IndexRange r = static_range(10, 4, t);
    EXPECT_EQ(r.begin, expect10[t][0]);
    EXPECT_EQ(r.end, expect10[t][1]);
  }
  // Fewer items than threads: the first n threads get one each, the rest nothing.
  EXPECT_EQ(static_range(2, 4, 1).begin, 1);
  EXPECT_EQ(static_range(2, 4, 1).end, 2);
  EXPECT_EQ(static_range(2, 4, 2).end - static_range(2, 4, 2).begin, 0);
  EXPECT_EQ(static_range(0, 4, 0).end, 0);
  // Out of range thread index: empty.
  EXPECT_EQ(static_range(10, 4, 4).end, 0);
  EXPECT_EQ(static_range(10, 4, -1).end, 0);
  // No overflow at the top of int64.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(static_range(kMax, 3, 2).end, kMax);
  EXPECT_EQ(static_range(kMax, 3, 0).end, kMax / 3 + 1);  // kMax % 3 == 1
}

TEST(ThreadPool, StaticCoversEveryIndexOnce) {
  for (int num_threads : {1, 2, 3, 4, 7}) {
    ThreadPool pool(num_threads);
    EXPECT_EQ(pool.num_threads(), num_threads);
    const int t = num_threads;
    for (int64_t n :
         {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{t - 1}, int64_t{t}, int64_t{t + 1},
          int64_t{2 * t + 1}, int64_t{1000}, int64_t{1001}, int64_t{65537}}) {
      const std::vector<Call> calls = check_cover_static(pool, n);
      // The calls are exactly the non-empty static ranges.
      std::vector<Call> expected;
      for (int i = 0; i < num_threads; ++i) {
        const IndexRange r = static_range(n, num_threads, i);
        if (r.begin < r.end) expected.push_back({r.begin, r.end, i});
      }
      EXPECT_EQ(calls, expected) << "threads=" << num_threads << " n=" << n;
    }
  }
}

TEST(ThreadPool, StaticRangesAreDeterministic) {
  // Two pools of the same size, several runs each: identical (range, thread) assignment.
  ThreadPool a(4), b(4);
  for (int64_t n : {5, 97, 4096, 100003}) {
    const std::vector<Call> first = check_cover_static(a, n);
    for (int rep = 0; rep < 5; ++rep) {
      EXPECT_EQ(check_cover_static(a, n), first);
      EXPECT_EQ(check_cover_static(b, n), first);
    }
  }
}

TEST(ThreadPool, FloatReductionIsBitwiseReproducible) {
  // Per-thread partials over static ranges, combined in thread order: the same bits on every
  // run and in every pool of the same size, though float addition is not associative.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
  std::vector<float> x(100003);
  for (float& v : x) v = dist(rng);
  auto reduce = [&](ThreadPool& pool) {
    std::vector<float> partial(pool.num_threads(), 0.0f);
    pool.parallel_for(static_cast<int64_t>(x.size()), [&](int64_t begin, int64_t end, int t) {
      float s = 0.0f;
      for (int64_t i = begin; i < end; ++i) s += x[i];
      partial[t] = s;
    });
    float total = 0.0f;
    for (float p : partial) total += p;
    return total;
  };
  ThreadPool a(3), b(ThreadPool::Options{3, 0});
  const float first = reduce(a);
  // The reference: the same static ranges summed serially.
  float expected = 0.0f;
  for (int t = 0; t < 3; ++t) {
    const IndexRange r = static_range(static_cast<int64_t>(x.size()), 3, t);
    float s = 0.0f;
    for (int64_t i = r.begin; i < r.end; ++i) s += x[i];
    expected += s;
  }
  EXPECT_EQ(std::bit_cast<uint32_t>(first), std::bit_cast<uint32_t>(expected));
  for (int rep = 0; rep < 50; ++rep) {
    EXPECT_EQ(std::bit_cast<uint32_t>(reduce(a)), std::bit_cast<uint32_t>(first));
    EXPECT_EQ(std::bit_cast<uint32_t>(reduce(b)), std::bit_cast<uint32_t>(first));
  }
}

TEST(ThreadPool, DynamicCoversEveryIndexOnce) {
  for (int num_threads : {1, 2, 3, 5}) {
    ThreadPool pool(num_threads);
    for (int64_t chunk : {1, 7, 64, 1000}) {
      for (int64_t n : {0, 1, 6, 7, 8, 63, 129, 1000, 5001}) {
        std::vector<std::atomic<int>> visits(static_cast<size_t>(n));
        std::atomic<int64_t> num_calls{0};
        std::atomic<bool> bad{false};
        pool.parallel_for_dynamic(n, chunk, [&](int64_t begin, int64_t end, int thread_idx) {
          if (thread_idx < 0 || thread_idx >= num_threads) bad = true;
          if (begin % chunk != 0 || end - begin > chunk || end <= begin || end > n) bad = true;
          for (int64_t i = begin; i < end; ++i) visits[i].fetch_add(1);
          num_calls.fetch_add(1);
        });
        EXPECT_FALSE(bad.load());
        EXPECT_EQ(num_calls.load(), (n + chunk - 1) / chunk);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(visits[i].load(), 1) << "n=" << n << " i=" << i;
      }
    }
  }
}

// Sum of i over [0, n) with per-thread partials, the way kernels reduce.
int64_t pool_sum(ThreadPool& pool, int64_t n) {
  std::vector<int64_t> partial(pool.num_threads(), 0);
  pool.parallel_for(n, [&](int64_t begin, int64_t end, int thread_idx) {
    int64_t s = 0;
    for (int64_t i = begin; i < end; ++i) s += i;
    partial[thread_idx] += s;
  });
  int64_t total = 0;
  for (int64_t p : partial) total += p;
  return total;
}

TEST(ThreadPool, RepeatedDispatchesAreCorrect) {
  // Spinning (2 threads) and sleeping (spin 0, more threads than this CI machine's cores).
  for (ThreadPool::Options options : {ThreadPool::Options{2, -1}, ThreadPool::Options{4, 0}}) {
    ThreadPool pool(options);
    int num_wrong = 0;
    for (int i = 0; i < 10000; ++i) {
      const int64_t n = i % 97;
      if (pool_sum(pool, n) != n * (n - 1) / 2) ++num_wrong;
    }
    EXPECT_EQ(num_wrong, 0) << "threads=" << options.num_threads;
  }
}

TEST(ThreadPool, SleepingWorkersWakeUp) {
  ThreadPool pool(ThreadPool::Options{3, 10});
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the spin: all asleep
    EXPECT_EQ(pool_sum(pool, 1000), 999 * 1000 / 2);
  }
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

TEST(ThreadPool, IdlePoolSleeps) {
  // 3 workers spinning through 200 ms of idle time would burn ~600 ms of CPU; after their
  // 1 ms spin they must sleep and burn (almost) nothing.
  ThreadPool pool(ThreadPool::Options{4, 1000});
  EXPECT_EQ(pool_sum(pool, 1000), 999 * 1000 / 2);
  const double start = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double used = process_cpu_seconds() - start;
  EXPECT_LT(used, 0.05) << "CPU seconds used by an idle pool";
  EXPECT_EQ(pool_sum(pool, 1000), 999 * 1000 / 2);
}

TEST(ThreadPool, WorkersAreOtherThreadsAndCallerIsZero) {
  ThreadPool pool(3);
  std::vector<std::thread::id> ids(3);
  pool.parallel_for(
      3, [&](int64_t, int64_t, int thread_idx) { ids[thread_idx] = std::this_thread::get_id(); });
  EXPECT_EQ(ids[0], std::this_thread::get_id());
  EXPECT_NE(ids[1], ids[0]);
  EXPECT_NE(ids[2], ids[0]);
  EXPECT_NE(ids[1], ids[2]);
}

TEST(ThreadPool, OneThreadRunsInline) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.num_threads(), 1);
  std::vector<Call> calls;
  std::thread::id id;
  pool.parallel_for(12345, [&](int64_t begin, int64_t end, int thread_idx) {
    calls.push_back({begin, end, thread_idx});  // no lock needed: inline
    id = std::this_thread::get_id();
  });
  EXPECT_EQ(calls, (std::vector<Call>{{0, 12345, 0}}));
  EXPECT_EQ(id, std::this_thread::get_id());
  calls.clear();
  pool.parallel_for_dynamic(25, 10, [&](int64_t begin, int64_t end, int thread_idx) {
    calls.push_back({begin, end, thread_idx});
  });
  EXPECT_EQ(calls, (std::vector<Call>{{0, 10, 0}, {10, 20, 0}, {20, 25, 0}}));
}

TEST(ThreadPool, AcceptsStdFunctionAndMutableLambdas) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  const std::function<void(int64_t, int64_t, int)> fn = [&](int64_t b, int64_t e, int) {
    total += e - b;
  };
  pool.parallel_for(100, fn);
  EXPECT_EQ(total.load(), 100);
  pool.parallel_for(50, [&total](int64_t b, int64_t e, int) mutable { total += e - b; });
  EXPECT_EQ(total.load(), 150);
}

TEST(ThreadPool, ConcurrentCallersAreSerialized) {
  ThreadPool pool(3);
  std::atomic<int> num_wrong{0};
  auto caller = [&](int64_t n) {
    for (int i = 0; i < 300; ++i) {
      if (pool_sum(pool, n) != n * (n - 1) / 2) num_wrong.fetch_add(1);
    }
  };
  std::thread a(caller, 1000), b(caller, 777);
  a.join();
  b.join();
  EXPECT_EQ(num_wrong.load(), 0);
}

TEST(ThreadPool, TaskExceptionReachesCallerAndPoolStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(3,
                                 [](int64_t, int64_t, int thread_idx) {
                                   if (thread_idx == 2) throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
  EXPECT_THROW(pool.parallel_for(3,
                                 [](int64_t, int64_t, int thread_idx) {
                                   if (thread_idx == 0) throw std::runtime_error("caller");
                                 }),
               std::runtime_error);
  EXPECT_EQ(pool_sum(pool, 10000), 9999LL * 10000 / 2);
}

TEST(ThreadPool, DestroyWhileIdle) {
  for (int i = 0; i < 20; ++i) {
    ThreadPool fresh(4);  // destroyed right after construction, workers maybe not started
  }
  for (int i = 0; i < 10; ++i) {
    auto pool = std::make_unique<ThreadPool>(ThreadPool::Options{3, i % 2 == 0 ? 0 : 200});
    EXPECT_EQ(pool_sum(*pool, 100), 4950);
    if (i % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // asleep
    pool.reset();
  }
}

TEST(ThreadPoolDeathTest, NestedDispatchOnSamePoolAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ThreadPool pool(2);
  EXPECT_DEATH(
      pool.parallel_for(
          2, [&](int64_t, int64_t, int) { pool.parallel_for(2, [](int64_t, int64_t, int) {}); }),
      "same thread pool");
}

TEST(ThreadPool, NestedDispatchOnAnotherPoolWorks) {
  ThreadPool outer(2), inner(2);
  std::atomic<int64_t> total{0};
  outer.parallel_for(2, [&](int64_t, int64_t, int) { total += pool_sum(inner, 100); });
  EXPECT_EQ(total.load(), 2 * 4950);
}

TEST(ThreadPool, SpinFromOptionsOrEnvironment) {
  EXPECT_EQ(ThreadPool(ThreadPool::Options{2, 0}).spin_us(), 0);
  EXPECT_EQ(ThreadPool(ThreadPool::Options{2, 1234}).spin_us(), 1234);
  const char* saved = std::getenv("KILN_POOL_SPIN_US");
  const std::string saved_value = saved != nullptr ? saved : "";
  setenv("KILN_POOL_SPIN_US", "37", 1);
  EXPECT_EQ(ThreadPool(2).spin_us(), 37);
  EXPECT_EQ(ThreadPool(ThreadPool::Options{2, 5}).spin_us(), 5);  // explicit wins
  // Invalid values are ignored (with a warning): automatic spin.
  unsetenv("KILN_POOL_SPIN_US");
  const int automatic = ThreadPool(2).spin_us();
  for (const char* bad : {"abc", "-5", "12us", "99999999"}) {
    setenv("KILN_POOL_SPIN_US", bad, 1);
    EXPECT_EQ(ThreadPool(2).spin_us(), automatic) << bad;
  }
  // Automatic: no spinning when the pool has more threads than CPUs to run them.
  unsetenv("KILN_POOL_SPIN_US");
  EXPECT_EQ(ThreadPool(num_available_cores() + 1).spin_us(), 0);
  EXPECT_EQ(ThreadPool(1).spin_us(), 200);
  if (saved != nullptr) setenv("KILN_POOL_SPIN_US", saved_value.c_str(), 1);
}

TEST(ThreadPool, DefaultThreadCountIsPositive) {
  EXPECT_GE(default_num_threads(), 1);
}

}  // namespace
}  // namespace kiln::util
