#include "kiln/kv/block_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kiln::kv {
namespace {

using ::testing::ElementsAre;

TEST(BlockPool, FreshPoolHandsOutAscendingIds) {
  BlockPool pool(4);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_THAT(pool.free_list(), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(pool.pop_free(), 0);
  EXPECT_EQ(pool.pop_free(), 1);
  EXPECT_EQ(pool.ref_count(0), 1);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.num_used(), 2);
  pool.check_invariants();
}

TEST(BlockPool, UnrefPlacesFrontOrBack) {
  BlockPool pool(4);
  const int32_t a = pool.pop_free();  // 0
  const int32_t b = pool.pop_free();  // 1
  pool.unref(a, FreePlace::kBack);    // reusable contents: evicted last
  pool.unref(b, FreePlace::kFront);   // nothing to keep: reused first
  EXPECT_THAT(pool.free_list(), ElementsAre(1, 2, 3, 0));
  EXPECT_EQ(pool.peek_free(), 1);
  pool.check_invariants();
}

TEST(BlockPool, SharedBlockStaysOffTheFreeListUntilLastReader) {
  BlockPool pool(3);
  const int32_t a = pool.pop_free();
  pool.ref(a);  // second reader
  EXPECT_EQ(pool.ref_count(a), 2);
  pool.unref(a, FreePlace::kBack);
  EXPECT_EQ(pool.ref_count(a), 1);
  EXPECT_THAT(pool.free_list(), ElementsAre(1, 2));  // still not handed out
  pool.unref(a, FreePlace::kBack);
  EXPECT_THAT(pool.free_list(), ElementsAre(1, 2, 0));
  pool.check_invariants();
}

TEST(BlockPool, RefOnFreeBlockTakesItFromTheMiddleOfTheList) {
  BlockPool pool(4);
  pool.ref(2);  // a prefix-cache hit on a free block
  EXPECT_THAT(pool.free_list(), ElementsAre(0, 1, 3));
  EXPECT_EQ(pool.num_free(), 3);
  pool.move_to_front(3);
  EXPECT_THAT(pool.free_list(), ElementsAre(3, 0, 1));
  pool.check_invariants();
}

TEST(BlockPool, DrainAndRefill) {
  BlockPool pool(5);
  std::vector<int32_t> taken;
  while (pool.num_free() > 0) taken.push_back(pool.pop_free());
  EXPECT_EQ(pool.peek_free(), -1);
  pool.check_invariants();
  for (int32_t b : taken) pool.unref(b, FreePlace::kBack);
  EXPECT_THAT(pool.free_list(), ElementsAre(0, 1, 2, 3, 4));
  pool.check_invariants();
}

}  // namespace
}  // namespace kiln::kv
