#include "kiln/backend/cpu/cpu_collective.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include <fmt/format.h>

#include "kiln/util/spin.h"
#include "kiln/util/thread_pool.h"

namespace kiln::backend::cpu {

class CpuCollective final : public Collective {
 public:
  CpuCollective(CpuCommunicator& comm, int rank) : c_(comm), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return c_.size_; }

  Status all_reduce_sum(float* data, int64_t n) override {
    KILN_TRY_STATUS(c_.rendezvous(rank_, "all_reduce_sum", true, n, data, true));
    // This rank's slice of the sum, over the ranks' buffers in rank order.
    const int p = c_.size_;
    const int64_t lo = n * rank_ / p, hi = n * (rank_ + 1) / p;
    for (int64_t i = lo; i < hi; ++i) {
      float s = static_cast<const float*>(c_.posted_[0])[i];
      for (int r = 1; r < p; ++r) s += static_cast<const float*>(c_.posted_[r])[i];
      c_.scratch_[i] = s;
    }
    KILN_TRY_STATUS(c_.rendezvous(rank_, "all_reduce_sum", false));
    std::memcpy(data, c_.scratch_.data(), static_cast<size_t>(n) * sizeof(float));
    // The scratch and the buffers stay until every rank is done with them.
    return c_.rendezvous(rank_, "all_reduce_sum", false);
  }

  Status all_gather(const float* in, int64_t n, float* out) override {
    KILN_TRY_STATUS(c_.rendezvous(rank_, "all_gather", true, n, in));
    for (int r = 0; r < c_.size_; ++r)
      std::memcpy(out + r * n, c_.posted_[r], static_cast<size_t>(n) * sizeof(float));
    return c_.rendezvous(rank_, "all_gather", false);  // the inputs stay until all have read them
  }

  Status send(const void* data, uint64_t bytes, int peer) override {
    KILN_TRY_STATUS(check_peer(peer, "send"));
    std::unique_lock lock(c_.mu_);
    CpuCommunicator::Mailbox& m = c_.mail_[static_cast<size_t>(rank_ * c_.size_ + peer)];
    if (!c_.wait_until(lock, rank_, "send", [&] { return !m.full; })) return Error{c_.failure_};
    m = {data, bytes, true, false};
    c_.wake_locked();
    if (!c_.wait_until(lock, rank_, "send", [&] { return m.taken; })) return Error{c_.failure_};
    m = {};
    c_.wake_locked();
    return {};
  }

  Status recv(void* data, uint64_t bytes, int peer) override {
    KILN_TRY_STATUS(check_peer(peer, "recv"));
    std::unique_lock lock(c_.mu_);
    CpuCommunicator::Mailbox& m = c_.mail_[static_cast<size_t>(peer * c_.size_ + rank_)];
    if (!c_.wait_until(lock, rank_, "recv", [&] { return m.full && !m.taken; }))
      return Error{c_.failure_};
    if (m.bytes != bytes)
      return c_.fail_locked(fmt::format("rank {} sent {} bytes to rank {}, which expected {}", peer,
                                        m.bytes, rank_, bytes));
    if (bytes > 0) std::memcpy(data, m.data, bytes);
    m.taken = true;
    c_.wake_locked();
    return {};
  }

  Status barrier() override { return c_.rendezvous(rank_, "barrier", true); }

  void abort(const std::string& why) override {
    std::lock_guard lock(c_.mu_);
    (void)c_.fail_locked(fmt::format("rank {} aborted: {}", rank_, why));
  }

 private:
  Status check_peer(int peer, const char* op) const {
    if (peer < 0 || peer >= c_.size_ || peer == rank_)
      return err("collective {}: rank {} named peer {} of a mesh of {}", op, rank_, peer, c_.size_);
    return {};
  }

  CpuCommunicator& c_;
  const int rank_;
};

CpuCommunicator::CpuCommunicator(int size, std::chrono::milliseconds timeout)
    : size_(std::max(1, size)),
      timeout_(timeout),
      spin_us_(util::default_spin_us(size_)),
      posted_(static_cast<size_t>(size_)),
      sizes_(static_cast<size_t>(size_)),
      ops_(static_cast<size_t>(size_), ""),
      mail_(static_cast<size_t>(size_ * size_)) {}

std::unique_ptr<Collective> CpuCommunicator::rank(int r) {
  KILN_ASSERT(r >= 0 && r < size_);
  return std::make_unique<CpuCollective>(*this, r);
}

Status CpuCommunicator::fail_locked(std::string why) {
  if (!failed_) {
    failed_ = true;
    failure_ = "collective: " + std::move(why);
  }
  wake_locked();
  return Error{failure_};
}

bool CpuCommunicator::wait_until(std::unique_lock<std::mutex>& lock, int rank, const char* what,
                                 const std::function<bool()>& done) {
  if (failed_ || done()) return !failed_;
  // Spin first, without the lock, until the state changes (the epoch read under the lock: a
  // change after it bumps it) or the spin time is up; then test again under the lock.
  if (spin_us_ > 0) {
    const auto spin_end = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
    for (;;) {
      const uint64_t seen = epoch_.load(std::memory_order_acquire);
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
                            spin_end - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) break;
      lock.unlock();
      const bool changed = util::spin_until(
          static_cast<int>(left), [&] { return epoch_.load(std::memory_order_acquire) != seen; });
      lock.lock();
      if (failed_ || done()) return !failed_;
      if (!changed) break;
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  if (!cv_.wait_until(lock, deadline, [&] { return failed_ || done(); }))
    (void)fail_locked(
        fmt::format("rank {} waited {} ms in {} for its peers", rank, timeout_.count(), what));
  return !failed_;
}

Status CpuCommunicator::rendezvous(int rank, const char* op, bool post, int64_t n, const void* ptr,
                                   bool scratch) {
  std::unique_lock lock(mu_);
  if (failed_) return Error{failure_};
  if (post) {
    posted_[static_cast<size_t>(rank)] = ptr;
    sizes_[static_cast<size_t>(rank)] = n;
    ops_[static_cast<size_t>(rank)] = op;
  }
  const int64_t gen = generation_;
  if (++arrived_ < size_) {
    if (!wait_until(lock, rank, op, [&] { return generation_ != gen; })) return Error{failure_};
    return {};
  }
  arrived_ = 0;
  if (post) {
    for (int r = 1; r < size_; ++r) {
      const auto i = static_cast<size_t>(r);
      if (std::strcmp(ops_[i], ops_[0]) != 0)
        return fail_locked(fmt::format("rank 0 called {}, rank {} called {}", ops_[0], r, ops_[i]));
      if (sizes_[i] != sizes_[0])
        return fail_locked(
            fmt::format("{}: rank 0 has {} values, rank {} has {}", op, sizes_[0], r, sizes_[i]));
    }
    if (scratch && scratch_.size() < static_cast<size_t>(n))
      scratch_.resize(static_cast<size_t>(n));
  }
  ++generation_;
  wake_locked();
  return {};
}

}  // namespace kiln::backend::cpu
