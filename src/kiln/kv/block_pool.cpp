#include "kiln/kv/block_pool.h"

#include "kiln/util/status.h"

namespace kiln::kv {

BlockPool::BlockPool(int32_t num_blocks)
    : num_blocks_(num_blocks),
      ref_count_(static_cast<size_t>(num_blocks), 0),
      prev_(static_cast<size_t>(num_blocks) + 1, -1),
      next_(static_cast<size_t>(num_blocks) + 1, -1) {
  KILN_ASSERT(num_blocks >= 1);
  const int32_t sentinel = num_blocks_;
  prev_[sentinel] = sentinel;
  next_[sentinel] = sentinel;
  // Ascending ids front to back, so a fresh pool hands out 0, 1, 2, ...
  for (int32_t b = 0; b < num_blocks_; ++b) link_after(prev_[sentinel], b);
  num_free_ = num_blocks_;
}

int32_t BlockPool::ref_count(int32_t block) const {
  KILN_ASSERT(block >= 0 && block < num_blocks_);
  return ref_count_[block];
}

int32_t BlockPool::peek_free() const {
  const int32_t first = next_[num_blocks_];
  return first == num_blocks_ ? -1 : first;
}

int32_t BlockPool::pop_free() {
  const int32_t block = peek_free();
  KILN_ASSERT(block >= 0);
  KILN_ASSERT(ref_count_[block] == 0);
  unlink(block);
  --num_free_;
  ref_count_[block] = 1;
  return block;
}

void BlockPool::ref(int32_t block) {
  KILN_ASSERT(block >= 0 && block < num_blocks_);
  if (ref_count_[block] == 0) {
    KILN_ASSERT(on_list(block));
    unlink(block);
    --num_free_;
  }
  ++ref_count_[block];
}

void BlockPool::unref(int32_t block, FreePlace place) {
  KILN_ASSERT(block >= 0 && block < num_blocks_);
  KILN_ASSERT(ref_count_[block] > 0);
  if (--ref_count_[block] > 0) return;
  KILN_ASSERT(!on_list(block));
  const int32_t sentinel = num_blocks_;
  link_after(place == FreePlace::kFront ? sentinel : prev_[sentinel], block);
  ++num_free_;
}

void BlockPool::move_to_front(int32_t block) {
  KILN_ASSERT(block >= 0 && block < num_blocks_);
  KILN_ASSERT(ref_count_[block] == 0 && on_list(block));
  unlink(block);
  link_after(num_blocks_, block);
}

std::vector<int32_t> BlockPool::free_list() const {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(num_free_));
  for (int32_t b = next_[num_blocks_]; b != num_blocks_; b = next_[b]) out.push_back(b);
  return out;
}

void BlockPool::check_invariants() const {
  const int32_t sentinel = num_blocks_;
  std::vector<char> seen(static_cast<size_t>(num_blocks_), 0);
  int32_t num_listed = 0;
  for (int32_t b = next_[sentinel]; b != sentinel; b = next_[b]) {
    KILN_ASSERT(b >= 0 && b < num_blocks_);
    KILN_ASSERT(!seen[b]);  // I1: on the list once
    seen[b] = 1;
    KILN_ASSERT(ref_count_[b] == 0);    // I1: free blocks have no reader
    KILN_ASSERT(prev_[next_[b]] == b);  // links agree
    ++num_listed;
    KILN_ASSERT(num_listed <= num_blocks_);
  }
  int32_t num_zero = 0;
  for (int32_t b = 0; b < num_blocks_; ++b) {
    KILN_ASSERT(ref_count_[b] >= 0);
    if (ref_count_[b] == 0) {
      ++num_zero;
      KILN_ASSERT(seen[b]);  // I1: every unreferenced block is on the list
    } else {
      KILN_ASSERT(prev_[b] == -1 && next_[b] == -1);
    }
  }
  KILN_ASSERT(num_listed == num_free_ && num_zero == num_free_);  // I2
}

void BlockPool::link_after(int32_t at, int32_t block) {
  const int32_t after = next_[at];
  prev_[block] = at;
  next_[block] = after;
  next_[at] = block;
  prev_[after] = block;
}

void BlockPool::unlink(int32_t block) {
  next_[prev_[block]] = next_[block];
  prev_[next_[block]] = prev_[block];
  prev_[block] = -1;
  next_[block] = -1;
}

}  // namespace kiln::kv
