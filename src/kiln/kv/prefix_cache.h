// The prefix cache and KV block manager: gives sequences their blocks, and remembers full
// blocks after their sequences finish so that a later request with the same prefix reuses
// them instead of prefilling them again (vLLM "automatic prefix caching", SGLang radix cache).
//
// Identity. A full block (kBlockTokens computed tokens) is keyed by
//   hash_i = hash_block(hash_{i-1}, tokens of block i),  hash_{-1} = kRootHash,
// a 64-bit chained hash, so equal keys mean "same tokens after the same prefix". The hash is
// only the index: a hit is confirmed exactly, never on the hash alone. Each cached block
// stores its tokens and a link to its parent (the cached block holding the previous 16 tokens,
// with that block's generation number, bumped whenever a block loses its identity). A lookup
// walks the chain from the first block and accepts block i only if its tokens are equal and
// its parent link is the block it accepted at i-1 at the same generation. By induction the
// whole prefix is equal, so a hash collision can never hand out wrong KV.
//
// Sharing. Blocks are reference counted (block_pool.h): a sequence holds one reference per
// block of its table. Only full blocks are cached and shared; a partial last block is always
// private. A finished sequence's blocks keep their identity at ref_count 0 and are evicted
// LRU (least recently released first) when new blocks are needed; blocks with no identity
// are reused before any cached one. A referenced block is never evicted.
//
// Duplicates. Two sequences may compute the same block at once (both missed); the second
// one to register it stays uncached but remembers the cached twin, so its own later blocks
// can still be cached with the twin as their parent.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/kv/block_pool.h"
#include "kiln/kv/kv_cache.h"

namespace kiln::kv {

inline constexpr uint64_t kRootHash = 0x6b696c6e2d6b7621ULL;  // "kiln-kv!"

// The chained hash of one full block: a seeded splitmix64-style mix of the parent hash and
// each token. Deterministic across runs and machines.
uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> tokens);
using BlockHashFn = uint64_t (*)(uint64_t parent_hash, std::span<const int32_t> tokens);

// Who holds a prefix's identity: the cached block of chained hash `hash`, at generation `gen`
// (bumped whenever the block loses its identity). While the block is cached at that
// generation it stands for exactly the same tokens after exactly the same prefix, so this
// names a whole prefix without holding its tokens (state_snapshots.h keys snapshots by it).
struct BlockIdentity {
  uint64_t hash = 0;
  int32_t block = -1;
  uint32_t gen = 0;
  bool operator==(const BlockIdentity&) const = default;
};

struct PrefixCacheStats {
  int64_t num_queried_tokens = 0;  // prompt tokens looked up (find_prefix calls)
  int64_t num_hit_tokens = 0;      // of them, found cached
  int64_t num_evictions = 0;       // cached blocks whose identity was dropped to reuse them
};

class PrefixCache {
 public:
  // enable_caching false: plain block allocation, nothing is ever found or kept. `hash` is
  // for tests, which pass a deliberately colliding one to show collisions are harmless.
  explicit PrefixCache(int32_t num_blocks, bool enable_caching = true,
                       BlockHashFn hash = hash_block);

  int32_t num_blocks() const { return pool_.num_blocks(); }
  // Blocks with no reader, evictable cached ones included: what allocate() can hand out.
  int32_t num_free_blocks() const { return pool_.num_free(); }
  int32_t num_used_blocks() const { return pool_.num_used(); }
  int32_t num_cached_blocks() const { return static_cast<int32_t>(by_hash_.size()); }
  int32_t ref_count(int32_t block) const { return pool_.ref_count(block); }
  bool is_cached(int32_t block) const;
  const BlockPool& pool() const { return pool_; }
  const PrefixCacheStats& stats() const { return stats_; }
  bool enabled() const { return enabled_; }

  // The longest chain of cached full blocks holding a prefix of `tokens`, capped at
  // (tokens.size() - 1) / kBlockTokens blocks so that at least one token is left to compute
  // (the forward needs it to produce logits). Takes no reference. Counts into stats when
  // `count_stats`.
  std::vector<int32_t> find_prefix(std::span<const int32_t> tokens, bool count_stats = true);
  // Free-list blocks consumed by acquire(hits) then allocate(num_new): hit blocks that are
  // free leave the free list too.
  int32_t num_blocks_needed(std::span<const int32_t> hits, int32_t num_new) const;
  // Takes one reference on each block (a prefix hit).
  void acquire(std::span<const int32_t> hits);
  // Appends `n` fresh blocks to `table`, evicting LRU cached blocks as needed. Returns false
  // and takes nothing when fewer than n blocks are free.
  bool allocate(int32_t n, std::vector<int32_t>* table);
  // Registers blocks [from_block, to_block) of a sequence's table as cached full blocks.
  // `tokens` holds at least to_block * kBlockTokens tokens (the sequence's tokens, whose KV
  // is computed). Blocks [0, from_block) must have been registered by earlier calls.
  void cache_blocks(std::span<const int32_t> tokens, std::span<const int32_t> table,
                    int32_t from_block, int32_t to_block);
  // The identity of a registered block of a sequence's table (or of a hit): the cached block
  // holding it (itself, or the twin it duplicates). None when the block has no identity (not
  // registered, left private by a collision) or its twin has lost it since.
  std::optional<BlockIdentity> identity(int32_t block) const;
  // Drops the sequence's reference on every block of its table, last block first, so that
  // the tail of a prefix is evicted before its head.
  void release(std::span<const int32_t> table);

  // A readable picture: the cached blocks as a forest (child indented under its parent), the
  // used uncached blocks, and the free list in eviction order (cached ones marked '*').
  std::string debug_string() const;
  // Verifies the pool's invariants and the cache's (every cached block in the map under its
  // own hash, free blocks with identity at the back part of the list). O(num_blocks).
  void check_invariants() const;

 private:
  struct BlockMeta {
    uint64_t hash = 0;
    bool cached = false;      // in by_hash_
    int32_t parent = -1;      // cached block holding the previous 16 tokens; -1: first block
    uint32_t parent_gen = 0;  // gen_[parent] when linked
    int32_t twin = -1;        // registered full block: the cached block with equal identity
    uint32_t twin_gen = 0;
    std::array<int32_t, kBlockTokens> tokens{};
  };

  bool link_valid(int32_t block, uint32_t gen) const;
  bool parent_valid(const BlockMeta& m) const;
  void drop_identity(int32_t block);
  void reset_meta(int32_t block);
  void print_subtree(std::string* out, int32_t block, int depth,
                     const std::vector<std::vector<int32_t>>& children) const;

  BlockPool pool_;
  bool enabled_ = true;
  BlockHashFn hash_ = hash_block;
  std::vector<BlockMeta> meta_;  // [num_blocks]
  std::vector<uint32_t> gen_;    // [num_blocks]
  std::unordered_map<uint64_t, int32_t> by_hash_;
  PrefixCacheStats stats_;
};

}  // namespace kiln::kv
