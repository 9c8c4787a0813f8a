#include "kiln/util/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#endif

#include "kiln/util/cpu.h"
#include "kiln/util/log.h"
#include "kiln/util/spin.h"
#include "kiln/util/status.h"

namespace kiln::util {
namespace {

constexpr size_t kCacheLine = 64;

}  // namespace

// Shared between the caller and the workers. Protocol of one dispatch (caller = thread 0):
//   caller: writes the job fields and num_done = 0, then epoch += 1 (seq_cst), then wakes
//           sleeping workers; runs its own share; waits until num_done == num_workers.
//   worker: waits for epoch != last seen (acquire), runs its share, num_done += 1.
// The caller rewrites the job fields only after every worker has counted itself done, and a
// worker reads them only between seeing the new epoch and counting itself done.
// Sleeping uses the Dekker pattern on (epoch, num_sleeping) and (num_done, caller_sleeping),
// all seq_cst, so a wake-up cannot be lost: either the sleeper sees the new value before it
// blocks, or the waker sees the sleeper's count and takes the mutex before notifying.
struct ThreadPool::State {
  const ThreadPool* owner = nullptr;
  int num_threads = 1;
  int num_workers = 0;  // num_threads - 1
  int spin_us = 0;

  alignas(kCacheLine) std::atomic<uint64_t> epoch{0};
  std::atomic<bool> stop{false};
  std::atomic<int> num_sleeping{0};

  // The job of the current epoch; written only by the dispatching thread.
  alignas(kCacheLine) Task task{};
  int64_t n = 0;
  int64_t chunk_size = 0;  // 0: static ranges
  int64_t num_chunks = 0;

  alignas(kCacheLine) std::atomic<int64_t> next_chunk{0};
  alignas(kCacheLine) std::atomic<int> num_done{0};
  std::atomic<bool> caller_sleeping{false};

  alignas(kCacheLine) std::mutex work_mutex;
  std::condition_variable work_cv;
  std::mutex done_mutex;
  std::condition_variable done_cv;
  std::mutex dispatch_mutex;  // one loop at a time

  std::mutex error_mutex;
  std::exception_ptr error;  // first exception thrown by a task in this dispatch

  std::vector<std::thread> workers;

  void execute(int thread_idx) noexcept;
  void worker_main(int thread_idx) noexcept;
  void wake_workers();
  void wait_for_workers();
};

namespace {
// The pool whose task the current thread is running (to catch nested parallel_for).
thread_local const ThreadPool* t_running_pool = nullptr;

struct RunningGuard {
  explicit RunningGuard(const ThreadPool* pool) : saved(t_running_pool) { t_running_pool = pool; }
  ~RunningGuard() { t_running_pool = saved; }
  const ThreadPool* saved;
};
}  // namespace

IndexRange static_range(int64_t n, int num_threads, int thread_idx) {
  if (n <= 0 || num_threads <= 0 || thread_idx < 0 || thread_idx >= num_threads) return {};
  const int64_t base = n / num_threads;
  const int64_t rem = n % num_threads;
  const int64_t begin = thread_idx * base + std::min<int64_t>(thread_idx, rem);
  const int64_t size = base + (thread_idx < rem ? 1 : 0);
  return {begin, begin + size};
}

namespace {

constexpr int kDefaultSpinUs = 200;
constexpr long kMaxSpinUs = 1000000;

}  // namespace

int default_spin_us(int num_threads) {
  if (const char* env = std::getenv("KILN_POOL_SPIN_US"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long value = std::strtol(env, &end, 10);
    if (*end == '\0' && value >= 0 && value <= kMaxSpinUs) return static_cast<int>(value);
    log::warn("ignoring KILN_POOL_SPIN_US='{}': expected microseconds in [0, {}]", env, kMaxSpinUs);
  }
  return num_threads <= num_available_cores() ? kDefaultSpinUs : 0;
}

int default_num_threads() {
  return num_physical_cores();
}

void ThreadPool::State::execute(int thread_idx) noexcept {
  try {
    if (chunk_size == 0) {
      const IndexRange r = static_range(n, num_threads, thread_idx);
      if (r.begin < r.end) task.call(task.ctx, r.begin, r.end, thread_idx);
      return;
    }
    for (;;) {
      const int64_t chunk = next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (chunk >= num_chunks) return;
      const int64_t begin = chunk * chunk_size;
      task.call(task.ctx, begin, std::min(n, begin + chunk_size), thread_idx);
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(error_mutex);
    if (!error) error = std::current_exception();
  }
}

void ThreadPool::State::worker_main(int thread_idx) noexcept {
  t_running_pool = owner;
  uint64_t seen = 0;
  for (;;) {
    auto changed = [&] { return epoch.load(std::memory_order_acquire) != seen; };
    if (!spin_until(spin_us, changed)) {
      std::unique_lock<std::mutex> lock(work_mutex);
      num_sleeping.fetch_add(1, std::memory_order_seq_cst);
      work_cv.wait(lock, [&] { return epoch.load(std::memory_order_seq_cst) != seen; });
      num_sleeping.fetch_sub(1, std::memory_order_relaxed);
    }
    seen = epoch.load(std::memory_order_acquire);
    if (stop.load(std::memory_order_acquire)) return;
    execute(thread_idx);
    if (num_done.fetch_add(1, std::memory_order_seq_cst) + 1 == num_workers &&
        caller_sleeping.load(std::memory_order_seq_cst)) {
      std::lock_guard<std::mutex> lock(done_mutex);
      done_cv.notify_one();
    }
  }
}

void ThreadPool::State::wake_workers() {
  epoch.fetch_add(1, std::memory_order_seq_cst);
  if (num_sleeping.load(std::memory_order_seq_cst) > 0) {
    // Taking the mutex orders us after any worker between its count and its wait.
    { std::lock_guard<std::mutex> lock(work_mutex); }
    work_cv.notify_all();
  }
}

void ThreadPool::State::wait_for_workers() {
  auto all_done = [&] { return num_done.load(std::memory_order_acquire) == num_workers; };
  if (spin_until(spin_us, all_done)) return;
  std::unique_lock<std::mutex> lock(done_mutex);
  caller_sleeping.store(true, std::memory_order_seq_cst);
  done_cv.wait(lock, [&] { return num_done.load(std::memory_order_seq_cst) == num_workers; });
  caller_sleeping.store(false, std::memory_order_relaxed);
}

ThreadPool::ThreadPool(int num_threads) : ThreadPool(Options{num_threads, -1}) {}

ThreadPool::ThreadPool(const Options& options) : num_threads_(options.num_threads) {
  KILN_ASSERT(num_threads_ >= 1 && num_threads_ <= 4096);
  spin_us_ = options.spin_us >= 0 ? options.spin_us : default_spin_us(num_threads_);
  if (num_threads_ == 1) return;
  state_ = std::make_unique<State>();
  State& s = *state_;
  s.owner = this;
  s.num_threads = num_threads_;
  s.num_workers = num_threads_ - 1;
  s.spin_us = spin_us_;
  s.workers.reserve(s.num_workers);
  for (int i = 1; i < num_threads_; ++i) {
    s.workers.emplace_back([&s, i] { s.worker_main(i); });
#if defined(__linux__)
    const std::string name = "kiln-pool-" + std::to_string(i);
    pthread_setname_np(s.workers.back().native_handle(), name.substr(0, 15).c_str());
#endif
  }
}

ThreadPool::~ThreadPool() {
  if (!state_) return;
  State& s = *state_;
  {
    std::lock_guard<std::mutex> dispatch(s.dispatch_mutex);
    s.stop.store(true, std::memory_order_release);
    s.wake_workers();
  }
  for (std::thread& t : s.workers) t.join();
}

void ThreadPool::run_inline(int64_t n, int64_t chunk_size, Task task) {
  RunningGuard guard(this);
  if (chunk_size == 0) {
    task.call(task.ctx, 0, n, 0);
    return;
  }
  for (int64_t begin = 0; begin < n; begin += chunk_size) {
    task.call(task.ctx, begin, std::min(n, begin + chunk_size), 0);
  }
}

void ThreadPool::run(int64_t n, int64_t chunk_size, Task task) {
  if (n <= 0) return;
  if (t_running_pool == this) {
    std::fprintf(stderr, "kiln: parallel_for called from a task of the same thread pool\n");
    std::abort();
  }
  // One thread, or a single static range: no one to hand work to.
  if (!state_ || (chunk_size == 0 && n == 1) || (chunk_size > 0 && n <= chunk_size)) {
    run_inline(n, chunk_size, task);
    return;
  }
  State& s = *state_;
  std::lock_guard<std::mutex> dispatch(s.dispatch_mutex);
  s.task = task;
  s.n = n;
  s.chunk_size = chunk_size;
  s.num_chunks = chunk_size == 0 ? 0 : (n - 1) / chunk_size + 1;
  s.next_chunk.store(0, std::memory_order_relaxed);
  s.num_done.store(0, std::memory_order_relaxed);
  s.wake_workers();  // seq_cst: publishes the fields above
  {
    RunningGuard guard(this);
    s.execute(0);
  }
  s.wait_for_workers();
  if (s.error) {
    std::exception_ptr error = std::exchange(s.error, nullptr);
    std::rethrow_exception(error);
  }
}

}  // namespace kiln::util
