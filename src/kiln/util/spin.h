// Waiting without sleeping, for the short waits of threads that hand work to each other (the
// thread pool's workers, the in-process collective's ranks): a sleeping thread takes tens of
// microseconds to wake, a spinning one a fraction of one.
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

namespace kiln::util {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield" ::: "memory");
#endif
}

// Number of pause-instruction spins before spinning switches to yielding the CPU (~1-7 us:
// a pause takes 10-50 ns depending on the CPU).
inline constexpr uint32_t kNumPauseSpins = 128;

// Waits for done() for up to spin_us without sleeping; true when done() became true.
// First spins with the pause instruction (lowest wake-up latency), then yields the CPU
// between checks: when the machine is oversubscribed the thread we wait for may need this
// very core, and a pure spin would hold it until the time slice ends.
template <typename Done>
bool spin_until(int spin_us, Done done) {
  if (done()) return true;
  if (spin_us <= 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (uint32_t i = 1;; ++i) {
    if (i < kNumPauseSpins) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
    if (done()) return true;
    // Reading the clock costs ~20 ns; while pausing look at it every 64 spins only.
    if ((i >= kNumPauseSpins || (i & 63) == 0) && std::chrono::steady_clock::now() >= deadline) {
      return false;
    }
  }
}

}  // namespace kiln::util
