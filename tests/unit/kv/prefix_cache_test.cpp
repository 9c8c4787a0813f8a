#include "kiln/kv/prefix_cache.h"

#include <numeric>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kiln::kv {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<int32_t> iota_tokens(int32_t first, int32_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Allocates blocks for `tokens` (computed), registers the full ones; returns the table.
std::vector<int32_t> run_sequence(PrefixCache* c, const std::vector<int32_t>& tokens) {
  std::vector<int32_t> table = c->find_prefix(tokens);
  const int32_t num_hit = static_cast<int32_t>(table.size());
  c->acquire(table);
  const int32_t num_blocks =
      (static_cast<int32_t>(tokens.size()) + kBlockTokens - 1) / kBlockTokens;
  EXPECT_TRUE(c->allocate(num_blocks - num_hit, &table));
  c->cache_blocks(tokens, table, num_hit, static_cast<int32_t>(tokens.size()) / kBlockTokens);
  c->check_invariants();
  return table;
}

TEST(HashBlock, ChainsParentAndEveryToken) {
  const auto a = iota_tokens(0, 16);
  auto b = a;
  b[15] = 99;
  auto swapped = a;
  std::swap(swapped[0], swapped[1]);
  const uint64_t h = hash_block(kRootHash, a);
  EXPECT_EQ(h, hash_block(kRootHash, a));  // deterministic
  EXPECT_NE(h, hash_block(kRootHash, b));
  EXPECT_NE(h, hash_block(kRootHash, swapped));
  EXPECT_NE(h, hash_block(h, a));  // same tokens after another prefix
  EXPECT_NE(hash_block(kRootHash, iota_tokens(-1, 16)), hash_block(kRootHash, iota_tokens(0, 16)));
}

TEST(PrefixCache, PictureOfOneSequenceAndItsRelease) {
  PrefixCache c(6);
  const auto tokens = iota_tokens(100, 40);  // 2 full blocks + 8 tokens
  const auto table = run_sequence(&c, tokens);
  EXPECT_THAT(table, ElementsAre(0, 1, 2));
  EXPECT_EQ(c.debug_string(),
            "blocks: 6 total, 3 used, 3 free, 2 cached\n"
            "cached:\n"
            "  #0 ref=1 [100 101 102 .. 115]\n"
            "    #1 ref=1 [116 117 118 .. 131]\n"
            "private in use: #2(ref=1)\n"
            "free (evict first): 3 4 5\n");
  c.release(table);
  c.check_invariants();
  // The private partial block is reused first; the cached chain waits, tail before head.
  EXPECT_EQ(c.debug_string(),
            "blocks: 6 total, 0 used, 6 free, 2 cached\n"
            "cached:\n"
            "  #0 ref=0 [100 101 102 .. 115]\n"
            "    #1 ref=0 [116 117 118 .. 131]\n"
            "private in use:\n"
            "free (evict first): 2 3 4 5 1* 0*\n");
}

TEST(PrefixCache, FindsLongestChainOfFullBlocksButLeavesOneTokenToCompute) {
  PrefixCache c(8);
  c.release(run_sequence(&c, iota_tokens(100, 40)));
  EXPECT_THAT(c.find_prefix(concat(iota_tokens(100, 32), {7, 8, 9})), ElementsAre(0, 1));
  EXPECT_THAT(c.find_prefix(iota_tokens(100, 33)), ElementsAre(0, 1));
  // The whole prompt is cached: its last block is recomputed so logits exist.
  EXPECT_THAT(c.find_prefix(iota_tokens(100, 32)), ElementsAre(0));
  EXPECT_THAT(c.find_prefix(iota_tokens(100, 16)), IsEmpty());
  EXPECT_THAT(c.find_prefix(concat(iota_tokens(100, 16), iota_tokens(500, 20))), ElementsAre(0));
  EXPECT_THAT(c.find_prefix(iota_tokens(101, 40)), IsEmpty());
  EXPECT_THAT(c.find_prefix({}), IsEmpty());
  // Stats: the first sequence's 40 (a miss), then 35+33+32+16+36+40 queried.
  EXPECT_EQ(c.stats().num_queried_tokens, 40 + 35 + 33 + 32 + 16 + 36 + 40);
  EXPECT_EQ(c.stats().num_hit_tokens, 32 + 32 + 16 + 16);
}

TEST(PrefixCache, SharedBlocksAreCountedAndNeverHandedOutUnderAReader) {
  PrefixCache c(6);
  const auto prefix = iota_tokens(100, 32);
  const auto a = run_sequence(&c, concat(prefix, {1, 2, 3}));  // blocks 0 1 2
  const auto b = run_sequence(&c, concat(prefix, {4, 5}));     // hits 0 1, new 3
  EXPECT_THAT(b, ElementsAre(0, 1, 3));
  EXPECT_EQ(c.ref_count(0), 2);
  EXPECT_EQ(c.ref_count(1), 2);
  EXPECT_EQ(c.debug_string(),
            "blocks: 6 total, 4 used, 2 free, 2 cached\n"
            "cached:\n"
            "  #0 ref=2 [100 101 102 .. 115]\n"
            "    #1 ref=2 [116 117 118 .. 131]\n"
            "private in use: #2(ref=1) #3(ref=1)\n"
            "free (evict first): 4 5\n");
  c.release(a);
  EXPECT_EQ(c.ref_count(0), 1);
  EXPECT_FALSE(c.pool().is_free(0));
  // Asking for more than is free takes nothing.
  std::vector<int32_t> t;
  EXPECT_FALSE(c.allocate(4, &t));
  EXPECT_THAT(t, IsEmpty());
  EXPECT_EQ(c.num_free_blocks(), 3);
  EXPECT_TRUE(c.allocate(3, &t));
  EXPECT_EQ(std::set<int32_t>(t.begin(), t.end()), (std::set<int32_t>{2, 4, 5}));
  EXPECT_TRUE(c.is_cached(0) && c.is_cached(1));  // b still reads them
  EXPECT_EQ(c.stats().num_evictions, 0);
  c.release(t);
  c.release(b);
  c.check_invariants();
  EXPECT_EQ(c.num_free_blocks(), 6);
}

TEST(PrefixCache, EvictsLeastRecentlyReleasedFirstAndPrivateBlocksBeforeAnyCached) {
  PrefixCache c(6);
  const auto a_tokens = iota_tokens(0, 32);
  const auto b_tokens = iota_tokens(1000, 32);
  c.release(run_sequence(&c, a_tokens));  // blocks 0 1
  c.release(run_sequence(&c, b_tokens));  // blocks 2 3 (uncached ones go first)
  EXPECT_THAT(c.pool().free_list(), ElementsAre(4, 5, 1, 0, 3, 2));
  std::vector<int32_t> t;
  ASSERT_TRUE(c.allocate(3, &t));
  EXPECT_THAT(t, ElementsAre(4, 5, 1));  // A's tail goes first
  EXPECT_EQ(c.stats().num_evictions, 1);
  EXPECT_THAT(c.find_prefix(concat(a_tokens, {7})), ElementsAre(0));
  EXPECT_THAT(c.find_prefix(concat(b_tokens, {7})), ElementsAre(2, 3));
  // A hit refreshes: B's blocks become the most recently used.
  const auto hits = c.find_prefix(concat(b_tokens, {7}));
  c.acquire(hits);
  c.release(hits);
  EXPECT_THAT(c.pool().free_list(), ElementsAre(0, 3, 2));
  ASSERT_TRUE(c.allocate(1, &t));
  EXPECT_EQ(t.back(), 0);
  EXPECT_THAT(c.find_prefix(concat(a_tokens, {7})), IsEmpty());
  EXPECT_EQ(c.num_cached_blocks(), 2);
  c.check_invariants();
}

TEST(PrefixCache, ChildOfAnEvictedParentIsNeverHit) {
  PrefixCache c(4);
  const auto tokens = iota_tokens(0, 33);
  c.release(run_sequence(&c, tokens));  // 0 -> 1 cached, 2 private
  // Make the parent older than the child in LRU order, then evict the parent alone.
  const std::vector<int32_t> child{1};
  c.acquire(child);
  c.release(child);
  EXPECT_THAT(c.pool().free_list(), ElementsAre(2, 3, 0, 1));
  std::vector<int32_t> t;
  ASSERT_TRUE(c.allocate(3, &t));
  EXPECT_THAT(t, ElementsAre(2, 3, 0));
  c.release(t);
  EXPECT_THAT(c.find_prefix(tokens), IsEmpty());
  EXPECT_EQ(c.debug_string(),
            "blocks: 4 total, 0 used, 4 free, 1 cached\n"
            "cached:\n"
            "  #1 ref=0 [16 17 18 .. 31] (orphan)\n"
            "private in use:\n"
            "free (evict first): 2 3 0 1*\n");
  // The first block is computed again into a new block. Block 1 has the very hash of the
  // query's second block but its parent is gone: the exact check rejects it.
  std::vector<int32_t> table;
  ASSERT_TRUE(c.allocate(1, &table));
  c.cache_blocks(tokens, table, 0, 1);
  EXPECT_THAT(c.find_prefix(tokens), ElementsAre(table[0]));
  // Recomputing the second block replaces the orphan.
  ASSERT_TRUE(c.allocate(1, &table));
  c.cache_blocks(tokens, table, 1, 2);
  EXPECT_FALSE(c.is_cached(1));
  EXPECT_THAT(c.find_prefix(concat(tokens, {5})), ElementsAre(table[0], table[1]));
  c.release(table);
  c.check_invariants();
}

// A deliberately weak hash: any two blocks with the same token sum collide.
uint64_t sum_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = parent;
  for (int32_t t : tokens) h += static_cast<uint64_t>(t);
  return h;
}

TEST(PrefixCache, CollisionsNeverHandOutBlocksComputedAfterAnotherPrefix) {
  PrefixCache c(4, /*enable_caching=*/true, sum_hash);
  const auto x = iota_tokens(0, 16);
  auto z = x;  // same sum as x: collides with it
  std::swap(z[0], z[1]);
  const auto y = iota_tokens(16, 16);
  c.release(run_sequence(&c, concat(concat(x, y), {1})));  // x: #0, y: #1 (child of #0)
  // Evict x's block alone and reuse the same block id for z.
  const std::vector<int32_t> child{1};
  c.acquire(child);
  c.release(child);
  std::vector<int32_t> t;
  ASSERT_TRUE(c.allocate(3, &t));
  ASSERT_THAT(t, ElementsAre(2, 3, 0));
  c.release(std::vector<int32_t>{2, 3});
  c.release(std::vector<int32_t>{0});
  std::vector<int32_t> zt;
  ASSERT_TRUE(c.allocate(1, &zt));
  ASSERT_THAT(zt, ElementsAre(0));
  c.cache_blocks(z, zt, 0, 1);
  // Query z then y: every hash matches block for block, and block #1 even links to id #0,
  // but #0 now holds z, not the x that #1 was computed after (its generation moved on).
  EXPECT_THAT(c.find_prefix(concat(concat(z, y), {1})), ElementsAre(0));
  // Query x then y: x's hash finds z's block, whose tokens differ.
  EXPECT_THAT(c.find_prefix(concat(concat(x, y), {1})), IsEmpty());
  c.release(zt);
  c.check_invariants();
}

TEST(PrefixCache, BlocksComputedTwiceAtOnceKeepOneCopyAndChainThroughIt) {
  PrefixCache c(8);
  const auto tokens = iota_tokens(0, 48);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(c.allocate(2, &a));  // 0 1
  ASSERT_TRUE(c.allocate(2, &b));  // 2 3: both missed, both compute the same 32 tokens
  c.cache_blocks(tokens, a, 0, 2);
  c.cache_blocks(tokens, b, 0, 2);
  EXPECT_EQ(c.num_cached_blocks(), 2);
  EXPECT_FALSE(c.is_cached(2));
  ASSERT_TRUE(c.allocate(1, &b));  // b goes on: its third block chains through a's copy
  c.cache_blocks(tokens, b, 2, 3);
  EXPECT_TRUE(c.is_cached(4));
  EXPECT_EQ(c.debug_string(),
            "blocks: 8 total, 5 used, 3 free, 3 cached\n"
            "cached:\n"
            "  #0 ref=1 [0 1 2 .. 15]\n"
            "    #1 ref=1 [16 17 18 .. 31]\n"
            "      #4 ref=1 [32 33 34 .. 47]\n"
            "private in use: #2(ref=1) #3(ref=1)\n"
            "free (evict first): 5 6 7\n");
  c.release(a);
  c.release(b);
  // a released first, so its blocks are older than b's third block.
  EXPECT_THAT(c.pool().free_list(), ElementsAre(2, 3, 5, 6, 7, 1, 0, 4));
  EXPECT_THAT(c.find_prefix(concat(tokens, {1})), ElementsAre(0, 1, 4));
  c.check_invariants();
}

TEST(PrefixCache, DisabledCachesNothing) {
  PrefixCache c(4, /*enable_caching=*/false);
  const auto tokens = iota_tokens(0, 40);
  const auto t = run_sequence(&c, tokens);
  EXPECT_EQ(c.num_cached_blocks(), 0);
  c.release(t);
  EXPECT_THAT(c.find_prefix(tokens), IsEmpty());
  EXPECT_THAT(c.pool().free_list(), ElementsAre(0, 1, 2, 3));
  c.check_invariants();
}

}  // namespace
}  // namespace kiln::kv
