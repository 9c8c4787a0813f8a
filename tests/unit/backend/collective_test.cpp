// The in-process collective backend (threads as ranks): results against a serial computation
// of the same thing (the rank-ordered sum bit for bit, the gather's order, messages between
// peers), on fresh random data, across repeated calls; and failure: a rank that aborts, a rank
// that never arrives and ranks that disagree make every rank's call fail instead of hanging.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/backend/cpu/cpu_collective.h"

namespace kiln {
namespace {

using backend::Collective;
using backend::cpu::CpuCommunicator;
using namespace std::chrono_literals;

// Runs body(rank, collective) on one thread per rank and joins them.
void run_ranks(CpuCommunicator& comm, const std::function<void(int, Collective&)>& body) {
  std::vector<std::unique_ptr<Collective>> ranks;
  for (int r = 0; r < comm.size(); ++r) ranks.push_back(comm.rank(r));
  std::vector<std::thread> threads;
  for (int r = 0; r < comm.size(); ++r)
    threads.emplace_back([&, r] { body(r, *ranks[static_cast<size_t>(r)]); });
  for (auto& t : threads) t.join();
}

std::vector<float> random_floats(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& f : v) f = nd(rng);
  return v;
}

TEST(CpuCollective, AllReduceSumIsTheRankOrderedSumOnEveryRank) {
  std::mt19937_64 rng(std::random_device{}());
  for (int size : {1, 2, 3, 4}) {
    CpuCommunicator comm(size);
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4099}}) {
      for (int round = 0; round < 3; ++round) {
        std::vector<std::vector<float>> data;
        for (int r = 0; r < size; ++r) data.push_back(random_floats(static_cast<size_t>(n), rng));
        std::vector<float> want(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          float s = data[0][static_cast<size_t>(i)];
          for (int r = 1; r < size; ++r) s += data[static_cast<size_t>(r)][static_cast<size_t>(i)];
          want[static_cast<size_t>(i)] = s;
        }
        std::vector<int> ok(static_cast<size_t>(size));
        run_ranks(comm, [&](int r, Collective& c) {
          ok[static_cast<size_t>(r)] =
              c.rank() == r && c.size() == size &&
              c.all_reduce_sum(data[static_cast<size_t>(r)].data(), n).ok();
        });
        for (int r = 0; r < size; ++r) {
          SCOPED_TRACE(testing::Message() << "size=" << size << " n=" << n << " rank=" << r);
          EXPECT_TRUE(ok[static_cast<size_t>(r)]);
          EXPECT_EQ(0, std::memcmp(data[static_cast<size_t>(r)].data(), want.data(),
                                   want.size() * sizeof(float)));
        }
      }
    }
  }
}

TEST(CpuCollective, AllGatherBarrierAndSendRecvInARing) {
  std::mt19937_64 rng(std::random_device{}());
  const int size = 4;
  const int64_t n = 333;
  CpuCommunicator comm(size);
  std::vector<std::vector<float>> in, gathered(size), got(size);
  for (int r = 0; r < size; ++r) in.push_back(random_floats(static_cast<size_t>(n), rng));
  std::atomic<int> failures{0};
  run_ranks(comm, [&](int r, Collective& c) {
    const auto i = static_cast<size_t>(r);
    gathered[i].assign(static_cast<size_t>(size * n), NAN);
    got[i].assign(static_cast<size_t>(n), NAN);
    for (int round = 0; round < 5; ++round) {
      if (!c.all_gather(in[i].data(), n, gathered[i].data()).ok()) ++failures;
      if (!c.barrier().ok()) ++failures;
      // Each rank sends to the next and receives from the one before; even ranks send first.
      const int next = (r + 1) % size, prev = (r + size - 1) % size;
      const uint64_t bytes = static_cast<uint64_t>(n) * sizeof(float);
      if (r % 2 == 0) {
        if (!c.send(in[i].data(), bytes, next).ok()) ++failures;
        if (!c.recv(got[i].data(), bytes, prev).ok()) ++failures;
      } else {
        if (!c.recv(got[i].data(), bytes, prev).ok()) ++failures;
        if (!c.send(in[i].data(), bytes, next).ok()) ++failures;
      }
    }
  });
  EXPECT_EQ(failures.load(), 0);
  for (int r = 0; r < size; ++r) {
    for (int q = 0; q < size; ++q)
      EXPECT_EQ(0, std::memcmp(gathered[static_cast<size_t>(r)].data() + q * n,
                               in[static_cast<size_t>(q)].data(), n * sizeof(float)))
          << "rank " << r << " slice " << q;
    EXPECT_EQ(got[static_cast<size_t>(r)], in[static_cast<size_t>((r + size - 1) % size)]);
  }
}

TEST(CpuCollective, AnAbortingRankFailsEveryRankWithoutHanging) {
  CpuCommunicator comm(3, 60s);
  std::vector<std::string> errors(3);
  const auto t0 = std::chrono::steady_clock::now();
  run_ranks(comm, [&](int r, Collective& c) {
    std::vector<float> v(16, 1.0f);
    if (r == 2) {
      std::this_thread::sleep_for(50ms);  // ranks 0 and 1 are waiting in the all-reduce
      c.abort("CUDA error on this rank");
    }
    const Status st = c.all_reduce_sum(v.data(), 16);
    if (!st.ok()) errors[static_cast<size_t>(r)] = st.error().message;
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  for (const std::string& e : errors)
    EXPECT_NE(e.find("rank 2 aborted: CUDA error"), std::string::npos) << e;
}

TEST(CpuCollective, AMissingRankTimesOutAndLaterCallsFail) {
  CpuCommunicator comm(2, 100ms);
  std::unique_ptr<Collective> r0 = comm.rank(0), r1 = comm.rank(1);
  std::vector<float> v(4, 1.0f);
  const Status st = r0->all_reduce_sum(v.data(), 4);  // rank 1 never comes
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("rank 0 waited 100 ms in all_reduce_sum"), std::string::npos)
      << st.error().message;
  EXPECT_FALSE(r1->barrier().ok());  // the communicator stays failed
  EXPECT_FALSE(r1->send(v.data(), 16, 0).ok());
}

TEST(CpuCollective, RanksThatDisagreeFailAlike) {
  {
    CpuCommunicator comm(2);
    std::vector<std::string> errors(2);
    run_ranks(comm, [&](int r, Collective& c) {
      std::vector<float> v(12, 1.0f);
      const Status st = c.all_reduce_sum(v.data(), r == 0 ? 10 : 12);
      if (!st.ok()) errors[static_cast<size_t>(r)] = st.error().message;
    });
    for (const std::string& e : errors)
      EXPECT_NE(e.find("rank 0 has 10 values, rank 1 has 12"), std::string::npos) << e;
  }
  {
    CpuCommunicator comm(2);
    std::vector<std::string> errors(2);
    run_ranks(comm, [&](int r, Collective& c) {
      std::vector<float> v(8, 1.0f), out(16);
      const Status st =
          r == 0 ? c.all_reduce_sum(v.data(), 8) : c.all_gather(v.data(), 8, out.data());
      if (!st.ok()) errors[static_cast<size_t>(r)] = st.error().message;
    });
    for (const std::string& e : errors)
      EXPECT_NE(e.find("rank 0 called all_reduce_sum, rank 1 called all_gather"), std::string::npos)
          << e;
  }
  {
    CpuCommunicator comm(2, 1000ms);
    std::vector<std::string> errors(2);
    run_ranks(comm, [&](int r, Collective& c) {
      std::vector<float> v(8, 1.0f);
      const Status st = r == 0 ? c.send(v.data(), 32, 1) : c.recv(v.data(), 16, 0);
      if (!st.ok()) errors[static_cast<size_t>(r)] = st.error().message;
    });
    for (const std::string& e : errors)
      EXPECT_NE(e.find("rank 0 sent 32 bytes to rank 1, which expected 16"), std::string::npos)
          << e;
  }
  CpuCommunicator comm(2);
  EXPECT_FALSE(comm.rank(0)->send(nullptr, 0, 0).ok());  // itself
  EXPECT_FALSE(comm.rank(0)->recv(nullptr, 0, 5).ok());  // no such rank
}

}  // namespace
}  // namespace kiln
