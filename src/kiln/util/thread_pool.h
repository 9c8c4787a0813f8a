// A thread pool for kernel parallel-for loops: low overhead per dispatch, deterministic
// static ranges, no heap allocation per call.
//
// A pool of num_threads runs every loop on num_threads - 1 worker threads plus the calling
// thread (thread_idx 0). Idle workers spin on the dispatch counter for a bounded time (pause
// instruction), then sleep on a condition variable, so back-to-back dispatches cost about a
// microsecond while an idle pool uses no CPU. The caller waits for the workers the same way.
//
//   kiln::util::ThreadPool pool(8);
//   std::vector<double> partial(pool.num_threads());
//   pool.parallel_for(n, [&](int64_t begin, int64_t end, int thread_idx) {
//     for (int64_t i = begin; i < end; ++i) partial[thread_idx] += x[i];
//   });
//
// Rules for tasks:
// - Tasks must not throw. (If one does anyway, the exception never escapes a worker thread:
//   the pool waits for the other threads, then rethrows the first exception in the caller.)
// - A task must not call parallel_for on the pool that runs it (asserted); it deadlocks.
// - parallel_for from several threads at once is safe but serialized: one loop at a time.
// - The pool must outlive its loops; destroying it while idle is safe (workers are joined).
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

namespace kiln::util {

// A half-open index range [begin, end).
struct IndexRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// The static range of thread_idx when [0, n) is split over num_threads: contiguous, in
// thread order, sizes differ by at most one (the first n % num_threads threads get one more).
// A pure function of (n, num_threads, thread_idx): kernels rely on it for reproducible
// reductions. Threads past n get an empty range.
IndexRange static_range(int64_t n, int num_threads, int thread_idx);

// Default thread count for compute: physical cores available to this process.
int default_num_threads();
// How long idle workers of a pool of num_threads spin before sleeping (Options::spin_us = -1):
// KILN_POOL_SPIN_US when set, else 200 us, or 0 when the threads exceed the available cores.
int default_spin_us(int num_threads);

class ThreadPool {
 public:
  struct Options {
    // Including the calling thread; 1 runs every loop inline. Must be in [1, 4096]
    // (asserted: callers validate user input such as -t first).
    int num_threads = 1;
    // How long an idle worker (and a caller waiting for workers) spins before sleeping.
    // Negative: the environment variable KILN_POOL_SPIN_US if set (0..1000000), else
    // automatic: 200 us, or 0 when num_threads exceeds the available cores, where spinning
    // would steal the CPU from the threads doing the work. Set 0 on machines shared with
    // other busy processes: a spinning thread there delays the thread it waits for.
    int spin_us = -1;
  };

  explicit ThreadPool(int num_threads);
  explicit ThreadPool(const Options& options);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }
  int spin_us() const { return spin_us_; }

  // Calls fn(begin, end, thread_idx) once for each thread whose static_range(n, num_threads(),
  // thread_idx) is non-empty, in parallel; returns when all calls have returned. n <= 0 calls
  // nothing. fn is any callable; it is referenced, not copied.
  template <typename F>
  void parallel_for(int64_t n, F&& fn) {
    run(n, 0, make_task(fn));
  }

  // Splits [0, n) into chunks of chunk_size (the last may be shorter); threads take chunks
  // from a shared atomic counter until none is left, calling fn(begin, end, thread_idx) per
  // chunk. For uneven work; which thread runs which chunk is not deterministic.
  template <typename F>
  void parallel_for_dynamic(int64_t n, int64_t chunk_size, F&& fn) {
    run(n, chunk_size < 1 ? 1 : chunk_size, make_task(fn));
  }

  struct State;  // shared with the worker threads (thread_pool.cpp)

 private:
  // A non-owning reference to the loop body (no allocation, unlike std::function).
  struct Task {
    void* ctx;
    void (*call)(void* ctx, int64_t begin, int64_t end, int thread_idx);
  };
  template <typename F>
  static Task make_task(F& fn) {
    using Fn = std::remove_reference_t<F>;
    return Task{const_cast<void*>(static_cast<const void*>(&fn)),
                [](void* ctx, int64_t begin, int64_t end, int thread_idx) {
                  (*static_cast<Fn*>(ctx))(begin, end, thread_idx);
                }};
  }
  // chunk_size 0: static ranges; otherwise dynamic chunks.
  void run(int64_t n, int64_t chunk_size, Task task);
  void run_inline(int64_t n, int64_t chunk_size, Task task);

  int num_threads_ = 1;
  int spin_us_ = 0;
  std::unique_ptr<State> state_;  // null when num_threads_ == 1
};

}  // namespace kiln::util
