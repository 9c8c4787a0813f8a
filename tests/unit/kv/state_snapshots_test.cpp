#include "kiln/kv/state_snapshots.h"

#include <numeric>

#include <gtest/gtest.h>

namespace kiln::kv {
namespace {

std::vector<int32_t> iota_tokens(int32_t first, int32_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(StateSnapshots, SlotsFollowTheSequenceSlotsAndComeBackInTurn) {
  StateSnapshots s(/*first_slot=*/4, /*num_slots=*/2);
  EXPECT_EQ(s.reserve(), 4);
  EXPECT_EQ(s.reserve(), 5);
  EXPECT_EQ(s.reserve(), -1);  // both saves in flight: nothing to take
  s.unreserve(4);
  EXPECT_EQ(s.num_reserved(), 1);
  EXPECT_EQ(s.reserve(), 4);
  s.check_invariants();
}

TEST(StateSnapshots, FoundOnlyUnderTheSameBlockAndGeneration) {
  StateSnapshots s(0, 4);
  const BlockIdentity id{0x1234, 7, 3};
  const int32_t slot = s.reserve();
  EXPECT_EQ(s.find(id), -1);  // reserved: its save has not happened yet
  s.publish(slot, id);
  EXPECT_EQ(s.find(id), slot);
  // Equal hash, another prefix (a collision) or the same block after it lost its identity:
  // never this state. The stale snapshot is freed.
  EXPECT_EQ(s.find({0x1234, 8, 3}), -1);
  EXPECT_EQ(s.num_published(), 0);
  const int32_t again = s.reserve();
  s.publish(again, id);
  EXPECT_EQ(s.find({0x1234, 7, 4}), -1);
  EXPECT_EQ(s.find(id), -1);
  s.check_invariants();
}

TEST(StateSnapshots, PublishingTheSameHashReplacesAndTheLeastRecentlyUsedGoesFirst) {
  StateSnapshots s(10, 3);
  const BlockIdentity a{1, 0, 0}, b{2, 1, 0}, c{3, 2, 0}, d{4, 3, 0};
  int32_t sa = s.reserve(), sb = s.reserve(), sc = s.reserve();
  s.publish(sa, a);
  s.publish(sb, b);
  s.publish(sc, c);
  EXPECT_EQ(s.find(a), sa);  // a is now the most recently used; b the least
  const int32_t sd = s.reserve();
  EXPECT_EQ(sd, sb);
  EXPECT_EQ(s.find(b), -1);
  s.publish(sd, d);
  // Two sequences saved the same checkpoint: the later save replaces the earlier one.
  const int32_t sa2 = s.reserve();  // evicts c, the least recently used now
  EXPECT_EQ(sa2, sc);
  s.publish(sa2, a);
  EXPECT_EQ(s.find(a), sa2);
  EXPECT_EQ(s.num_published(), 2);
  EXPECT_EQ(s.reserve(), sa);  // the replaced slot was freed
  s.check_invariants();
  EXPECT_NE(s.debug_string().find("#0/0"), std::string::npos) << s.debug_string();
}

// With the prefix cache: a snapshot keyed by the identity of a sequence's checkpoint block is
// found from a later hit on the same prefix, and lost with the block's identity.
TEST(StateSnapshots, KeyedByThePrefixCachesIdentityOfTheCheckpointBlock) {
  PrefixCache c(4);
  const auto tokens = iota_tokens(100, 2 * kBlockTokens + 1);
  std::vector<int32_t> table;
  ASSERT_TRUE(c.allocate(3, &table));
  c.cache_blocks(tokens, table, 0, 2);
  const auto id = c.identity(table[1]);
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(id->block, table[1]);
  StateSnapshots s(2, 1);
  const int32_t slot = s.reserve();
  s.publish(slot, *id);
  c.release(table);
  const auto hits = c.find_prefix(tokens);
  ASSERT_EQ(hits.size(), 2u);
  EXPECT_EQ(s.find(*c.identity(hits[1])), slot);
  // Four fresh blocks evict the cached ones: the identity is gone, and so is the snapshot.
  std::vector<int32_t> other;
  ASSERT_TRUE(c.allocate(4, &other));
  EXPECT_FALSE(c.identity(table[1]).has_value());
  EXPECT_TRUE(c.find_prefix(tokens).empty());
}

}  // namespace
}  // namespace kiln::kv
