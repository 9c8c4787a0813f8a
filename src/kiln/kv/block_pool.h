// The block pool: which KV blocks (kBlockTokens tokens each, storage in kv_cache.h) are in
// use, by how many readers, and which free block goes next. No hashing here: the prefix cache
// (prefix_cache.h) layers block identity on top.
//
// Invariants (check_invariants() verifies all of them; the cheap ones are KILN_ASSERTed on
// every call):
//   I1. Every block id in [0, num_blocks) is in exactly one state: referenced
//       (ref_count > 0, not on the free list) or free (ref_count == 0, on the free list once).
//   I2. num_free() == the length of the free list == the number of blocks with ref_count 0.
//   I3. The free list is in eviction order: the front is taken first by pop_free(). Blocks
//       whose contents nobody can reuse go to the front (reused first); blocks that may be
//       reused (a cached prefix) go to the back, so the front of the cached part is the least
//       recently released one (LRU).
//   I4. A referenced block is never handed out by pop_free(): a shared block cannot be freed
//       under a reader.
// Block tables (owned by sequences) are append-only while a sequence runs; releasing a
// sequence drops one reference per block of its table.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::kv {

// Where a block whose last reference goes joins the free list.
enum class FreePlace {
  kFront,  // contents not reusable: take it first
  kBack,   // contents reusable (cached): take it last, LRU among its peers
};

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_free() const { return num_free_; }
  int32_t num_used() const { return num_blocks_ - num_free_; }
  int32_t ref_count(int32_t block) const;
  bool is_free(int32_t block) const { return ref_count(block) == 0; }

  // The block pop_free() would return next, or -1 when none is free.
  int32_t peek_free() const;
  // Takes the first free block in eviction order (its ref_count becomes 1). Precondition:
  // num_free() > 0. The caller drops whatever identity the block had (prefix_cache.h).
  int32_t pop_free();
  // Adds a reference; a free block leaves the free list (a prefix-cache hit on a free block).
  void ref(int32_t block);
  // Drops a reference; at zero the block joins the free list at `place`.
  void unref(int32_t block, FreePlace place);
  // Moves a free block to the front of the free list (its contents stopped being reusable).
  void move_to_front(int32_t block);

  // The free list, front first (eviction order). For tests and debug pictures.
  std::vector<int32_t> free_list() const;
  // Verifies I1-I3 by walking the whole list: O(num_blocks). Aborts on a violation.
  void check_invariants() const;

 private:
  // The free list is a circular doubly linked list through prev_/next_, with the sentinel
  // node num_blocks_; a block not on the list has prev_ == next_ == -1.
  void link_after(int32_t at, int32_t block);
  void unlink(int32_t block);
  bool on_list(int32_t block) const { return next_[block] >= 0; }

  int32_t num_blocks_ = 0;
  int32_t num_free_ = 0;
  std::vector<int32_t> ref_count_;  // [num_blocks]
  std::vector<int32_t> prev_;       // [num_blocks + 1], sentinel last
  std::vector<int32_t> next_;       // [num_blocks + 1]
};

}  // namespace kiln::kv
