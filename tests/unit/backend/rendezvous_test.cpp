// The multi-node rendezvous (rendezvous.h) over loopback, nodes as threads: every node gets
// every node's blob in node order; node 0 refuses a node that disagrees on --nnodes or takes a
// rank already taken (and goes on waiting for the right one); every wait gives up at its
// deadline naming what it waited for. tests/e2e/rendezvous_test.sh runs it between two kiln
// processes.
#include "kiln/backend/rendezvous.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

namespace kiln::backend {
namespace {

using namespace std::chrono_literals;

RendezvousOptions node(int nnodes, int rank, int port, std::chrono::milliseconds timeout = 10s) {
  RendezvousOptions o;
  o.nnodes = nnodes;
  o.node_rank = rank;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.timeout = timeout;
  return o;
}

TEST(Rendezvous, EveryNodeGetsEveryBlobInNodeOrder) {
  std::promise<int> port;
  auto master = std::async(std::launch::async, [&] {
    return rendezvous(node(3, 0, 0), "id-of-node-0", [&](int p) { port.set_value(p); });
  });
  const int p = port.get_future().get();
  // Node 2 comes before node 1: the order is the ranks', not the arrivals'.
  auto n2 = std::async(std::launch::async, [&] { return rendezvous(node(3, 2, p), "two"); });
  std::this_thread::sleep_for(50ms);
  auto n1 = std::async(std::launch::async, [&] { return rendezvous(node(3, 1, p), "one"); });
  const std::vector<std::string> want = {"id-of-node-0", "one", "two"};
  for (auto* f : {&master, &n1, &n2}) {
    auto got = f->get();
    ASSERT_TRUE(got.ok()) << got.error().message;
    EXPECT_EQ(*got, want);
  }
}

TEST(Rendezvous, ANodeThatStartsFirstWaitsForNodeZero) {
  // A free port: node 0 binds it after node 1 has started knocking.
  std::promise<int> port;
  auto probe = std::async(std::launch::async, [&] {
    return rendezvous(node(1, 0, 0), "", [&](int p) { port.set_value(p); });
  });
  const int p = port.get_future().get();
  ASSERT_TRUE(probe.get().ok());
  auto n1 = std::async(std::launch::async, [&] { return rendezvous(node(2, 1, p), "late"); });
  std::this_thread::sleep_for(300ms);
  auto master = rendezvous(node(2, 0, p), "first");
  ASSERT_TRUE(master.ok()) << master.error().message;
  auto got = n1.get();
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_EQ(*got, (std::vector<std::string>{"first", "late"}));
}

TEST(Rendezvous, RefusesANodeThatDisagreesAndWaitsForTheRightOne) {
  std::promise<int> port;
  auto master = std::async(std::launch::async, [&] {
    return rendezvous(node(2, 0, 0), "zero", [&](int p) { port.set_value(p); });
  });
  const int p = port.get_future().get();
  auto wrong = rendezvous(node(3, 1, p), "x");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("node 0 refused node 1: --nnodes 3 differs from node 0's 2"),
            std::string::npos)
      << wrong.error().message;
  auto right = rendezvous(node(2, 1, p), "one");
  ASSERT_TRUE(right.ok()) << right.error().message;
  ASSERT_TRUE(master.get().ok());
}

TEST(Rendezvous, GivesUpAtTheDeadlineNamingWhatItWaitedFor) {
  auto master = rendezvous(node(3, 0, 0, 200ms), "zero");
  ASSERT_FALSE(master.ok());
  EXPECT_NE(master.error().message.find("timed out with 1 of 3 nodes joined"), std::string::npos)
      << master.error().message;
  // Nobody listens on port 1 of loopback (a privileged port no test binds).
  auto lone = rendezvous(node(2, 1, 1, 300ms), "one");
  ASSERT_FALSE(lone.ok());
  EXPECT_NE(lone.error().message.find("node 1 timed out reaching node 0 at 127.0.0.1:1"),
            std::string::npos)
      << lone.error().message;
}

TEST(Rendezvous, ParsesTheMasterAddress) {
  RendezvousOptions o;
  ASSERT_TRUE(parse_master_addr("10.0.0.5:29500", &o).ok());
  EXPECT_EQ(o.master_addr, "10.0.0.5");
  EXPECT_EQ(o.master_port, 29500);
  ASSERT_TRUE(parse_master_addr("[::1]:1234", &o).ok());
  EXPECT_EQ(o.master_addr, "::1");
  EXPECT_EQ(o.master_port, 1234);
  for (const char* bad : {"host", "host:", ":80", "host:70000", "host:8x"})
    EXPECT_FALSE(parse_master_addr(bad, &o).ok()) << bad;
  EXPECT_FALSE(rendezvous(node(2, 2, 1), "").ok());  // rank outside 0..1
}

}  // namespace
}  // namespace kiln::backend
