// The in-process collective backend: the ranks of a mesh are threads of one process sharing a
// CpuCommunicator; each thread holds the CpuCollective of its rank (backend/collective.h says
// what the calls mean). For the sharded forward on any machine (`--device cpu --tp 2`) and its
// tests, as NCCL would carry it between GPUs.
//
// How. A collective call is a rendezvous: every rank posts its buffer and waits until all
// have (a generation-counted barrier under one mutex); all_reduce_sum then has each rank add
// one slice of the values over the ranks' posted buffers in rank order into shared scratch, a
// second barrier, and each rank copies the whole sum back into its buffer (a third barrier
// keeps the scratch and the posted buffers alive until every rank is done with them).
// all_gather copies every rank's posted input into its own output between two barriers.
// send/recv meet in a mailbox per (sender, receiver) pair; the sender waits until the
// receiver has copied. Every wait has the communicator's deadline; a rank that times out or
// aborts marks the communicator failed and wakes every waiter, so no rank hangs. A waiting rank
// first spins (util::spin_until, as the thread pool's workers: 200 us where the ranks' threads
// fit the cores, KILN_POOL_SPIN_US) on a counter every change bumps, then sleeps on the
// condition variable: the peer is usually microseconds behind, and a wake from sleep took
// ~30 us of every all-reduce (3 barriers each, 2 all-reduces a layer).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/backend/collective.h"

namespace kiln::backend::cpu {

class CpuCommunicator {
 public:
  // size ranks; every wait gives up after `timeout` (the failure names the rank that waited).
  explicit CpuCommunicator(int size,
                           std::chrono::milliseconds timeout = std::chrono::milliseconds(60000));
  int size() const { return size_; }
  // The rank's end of the communicator (0 <= rank < size); the communicator must outlive it.
  std::unique_ptr<Collective> rank(int r);

 private:
  friend class CpuCollective;
  // A barrier of collective call `op`. With post, this rank's buffer and value count for the
  // call go up first, and the last rank to arrive checks that every rank called the same op
  // with the same count (else the communicator fails, on every rank alike) and, with scratch,
  // sizes the shared scratch; then every rank goes on.
  Status rendezvous(int rank, const char* op, bool post, int64_t n = 0, const void* ptr = nullptr,
                    bool scratch = false);
  Status fail_locked(std::string why);
  // After a change of the shared state (under mu_): wakes the waiters, spinning or asleep.
  void wake_locked() {
    epoch_.fetch_add(1, std::memory_order_release);
    cv_.notify_all();
  }
  // Waits (spinning, then on cv_) until done() or failure; false (and the communicator failed)
  // on either failure or the deadline.
  bool wait_until(std::unique_lock<std::mutex>& lock, int rank, const char* what,
                  const std::function<bool()>& done);

  const int size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> epoch_{0};  // bumped by every wake_locked()
  const int spin_us_;
  bool failed_ = false;
  std::string failure_;
  // Barrier: arrivals in the current generation.
  int64_t generation_ = 0;
  int arrived_ = 0;
  // The current collective's posts (by rank): buffer, value count, call.
  std::vector<const void*> posted_;
  std::vector<int64_t> sizes_;
  std::vector<const char*> ops_;
  std::vector<float> scratch_;
  // Mailboxes [sender * size + receiver]: the posted send, and whether it was taken.
  struct Mailbox {
    const void* data = nullptr;
    uint64_t bytes = 0;
    bool full = false;
    bool taken = false;
  };
  std::vector<Mailbox> mail_;
};

}  // namespace kiln::backend::cpu
