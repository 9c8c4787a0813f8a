#include "kiln/kv/prefix_cache.h"

#include <algorithm>

#include <fmt/format.h>

#include "kiln/util/status.h"

namespace kiln::kv {
namespace {

// splitmix64's finalizer (Steele, Lea, Flood 2014): a bijection on 64 bits with full
// avalanche, so every input bit reaches every output bit.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string block_tokens_string(std::span<const int32_t> t) {
  return fmt::format("[{} {} {} .. {}]", t[0], t[1], t[2], t[t.size() - 1]);
}

}  // namespace

uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent_hash ^ 0x2545f4914f6cdd1dULL);
  for (int32_t t : tokens) h = mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) << 1));
  return mix64(h ^ static_cast<uint64_t>(tokens.size()));
}

PrefixCache::PrefixCache(int32_t num_blocks, bool enable_caching, BlockHashFn hash)
    : pool_(num_blocks),
      enabled_(enable_caching),
      hash_(hash),
      meta_(static_cast<size_t>(num_blocks)),
      gen_(static_cast<size_t>(num_blocks), 0) {}

bool PrefixCache::is_cached(int32_t block) const {
  KILN_ASSERT(block >= 0 && block < num_blocks());
  return meta_[block].cached;
}

bool PrefixCache::link_valid(int32_t block, uint32_t gen) const {
  return block >= 0 && meta_[block].cached && gen_[block] == gen;
}

bool PrefixCache::parent_valid(const BlockMeta& m) const {
  return m.parent < 0 || link_valid(m.parent, m.parent_gen);
}

std::vector<int32_t> PrefixCache::find_prefix(std::span<const int32_t> tokens, bool count_stats) {
  std::vector<int32_t> hits;
  if (count_stats) stats_.num_queried_tokens += static_cast<int64_t>(tokens.size());
  if (!enabled_ || tokens.empty()) return hits;
  const size_t max_blocks = (tokens.size() - 1) / kBlockTokens;
  uint64_t h = kRootHash;
  int32_t prev = -1;
  for (size_t i = 0; i < max_blocks; ++i) {
    const auto blk = tokens.subspan(i * kBlockTokens, kBlockTokens);
    h = hash_(h, blk);
    const auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const int32_t b = it->second;
    const BlockMeta& m = meta_[b];
    // The exact check: equal tokens after the very block accepted one step earlier.
    if (!std::equal(blk.begin(), blk.end(), m.tokens.begin())) break;
    if (m.parent != prev || (prev >= 0 && m.parent_gen != gen_[prev])) break;
    hits.push_back(b);
    prev = b;
  }
  if (count_stats) stats_.num_hit_tokens += static_cast<int64_t>(hits.size()) * kBlockTokens;
  return hits;
}

int32_t PrefixCache::num_blocks_needed(std::span<const int32_t> hits, int32_t num_new) const {
  int32_t n = num_new;
  for (int32_t b : hits) n += pool_.is_free(b) ? 1 : 0;
  return n;
}

void PrefixCache::acquire(std::span<const int32_t> hits) {
  for (int32_t b : hits) {
    KILN_ASSERT(meta_[b].cached);
    pool_.ref(b);
  }
}

bool PrefixCache::allocate(int32_t n, std::vector<int32_t>* table) {
  KILN_ASSERT(n >= 0);
  if (pool_.num_free() < n) return false;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = pool_.pop_free();
    if (meta_[b].cached) {
      drop_identity(b);
      ++stats_.num_evictions;
    }
    reset_meta(b);
    table->push_back(b);
  }
  return true;
}

void PrefixCache::cache_blocks(std::span<const int32_t> tokens, std::span<const int32_t> table,
                               int32_t from_block, int32_t to_block) {
  if (!enabled_ || from_block >= to_block) return;
  KILN_ASSERT(from_block >= 0 && static_cast<size_t>(to_block) <= table.size());
  KILN_ASSERT(static_cast<size_t>(to_block) * kBlockTokens <= tokens.size());
  int32_t prev = -1;
  uint32_t prev_gen = 0;
  uint64_t h = kRootHash;
  if (from_block > 0) {
    const BlockMeta& pm = meta_[table[from_block - 1]];
    // The previous block lost its identity (or never had one): the rest stays private.
    if (!link_valid(pm.twin, pm.twin_gen)) return;
    prev = pm.twin;
    prev_gen = pm.twin_gen;
    h = meta_[prev].hash;
  }
  for (int32_t i = from_block; i < to_block; ++i) {
    const int32_t b = table[i];
    const auto blk = tokens.subspan(static_cast<size_t>(i) * kBlockTokens, kBlockTokens);
    h = hash_(h, blk);
    BlockMeta& m = meta_[b];
    KILN_ASSERT(!m.cached && m.twin < 0);  // a block is registered once per allocation
    if (const auto it = by_hash_.find(h); it != by_hash_.end()) {
      const int32_t e = it->second;
      const BlockMeta& em = meta_[e];
      const bool same = std::equal(blk.begin(), blk.end(), em.tokens.begin()) &&
                        em.parent == prev && (prev < 0 || em.parent_gen == prev_gen);
      if (same) {  // computed twice at once: keep the first, remember it as our twin
        m.twin = e;
        m.twin_gen = gen_[e];
        prev = e;
        prev_gen = gen_[e];
        continue;
      }
      if (parent_valid(em)) return;  // a true 64-bit collision: leave the rest private
      drop_identity(e);              // an orphan whose prefix is gone: replace it
    }
    m.hash = h;
    m.cached = true;
    m.parent = prev;
    m.parent_gen = prev_gen;
    std::copy(blk.begin(), blk.end(), m.tokens.begin());
    m.twin = b;
    m.twin_gen = gen_[b];
    by_hash_.emplace(h, b);
    prev = b;
    prev_gen = gen_[b];
  }
}

std::optional<BlockIdentity> PrefixCache::identity(int32_t block) const {
  KILN_ASSERT(block >= 0 && block < num_blocks());
  const BlockMeta& m = meta_[block];
  if (!link_valid(m.twin, m.twin_gen)) return std::nullopt;
  return BlockIdentity{meta_[m.twin].hash, m.twin, m.twin_gen};
}

void PrefixCache::release(std::span<const int32_t> table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    pool_.unref(*it, meta_[*it].cached ? FreePlace::kBack : FreePlace::kFront);
  }
}

void PrefixCache::drop_identity(int32_t block) {
  BlockMeta& m = meta_[block];
  KILN_ASSERT(m.cached);
  const auto it = by_hash_.find(m.hash);
  KILN_ASSERT(it != by_hash_.end() && it->second == block);
  by_hash_.erase(it);
  m.cached = false;
  m.twin = -1;
  ++gen_[block];  // every link to the old identity goes stale
  if (pool_.is_free(block)) pool_.move_to_front(block);
}

void PrefixCache::reset_meta(int32_t block) {
  KILN_ASSERT(!meta_[block].cached);
  meta_[block] = BlockMeta{};
}

void PrefixCache::print_subtree(std::string* out, int32_t block, int depth,
                                const std::vector<std::vector<int32_t>>& children) const {
  const BlockMeta& m = meta_[block];
  *out += fmt::format("{:{}}#{} ref={} {}{}\n", "", 2 + 2 * depth, block, pool_.ref_count(block),
                      block_tokens_string(m.tokens), parent_valid(m) ? "" : " (orphan)");
  for (int32_t c : children[block]) print_subtree(out, c, depth + 1, children);
}

std::string PrefixCache::debug_string() const {
  std::string out = fmt::format("blocks: {} total, {} used, {} free, {} cached\n", num_blocks(),
                                num_used_blocks(), num_free_blocks(), num_cached_blocks());
  std::vector<std::vector<int32_t>> children(static_cast<size_t>(num_blocks()));
  std::vector<int32_t> roots;
  std::vector<int32_t> private_used;
  for (int32_t b = 0; b < num_blocks(); ++b) {
    const BlockMeta& m = meta_[b];
    if (!m.cached) {
      if (!pool_.is_free(b)) private_used.push_back(b);
    } else if (m.parent >= 0 && parent_valid(m)) {
      children[m.parent].push_back(b);
    } else {
      roots.push_back(b);
    }
  }
  out += "cached:\n";
  for (int32_t r : roots) print_subtree(&out, r, 0, children);
  out += "private in use:";
  for (int32_t b : private_used) out += fmt::format(" #{}(ref={})", b, pool_.ref_count(b));
  out += "\nfree (evict first):";
  for (int32_t b : pool_.free_list()) out += fmt::format(" {}{}", b, meta_[b].cached ? "*" : "");
  out += "\n";
  return out;
}

void PrefixCache::check_invariants() const {
  pool_.check_invariants();
  KILN_ASSERT(enabled_ || by_hash_.empty());
  size_t num_cached = 0;
  for (int32_t b = 0; b < num_blocks(); ++b) {
    const BlockMeta& m = meta_[b];
    if (!m.cached) continue;
    ++num_cached;
    const auto it = by_hash_.find(m.hash);
    KILN_ASSERT(it != by_hash_.end() && it->second == b);
    KILN_ASSERT(m.twin == b && m.twin_gen == gen_[b]);
  }
  KILN_ASSERT(num_cached == by_hash_.size());
  // Free list: blocks with no identity first, then the cached ones (I3 of block_pool.h).
  bool in_cached_part = false;
  for (int32_t b : pool_.free_list()) {
    if (meta_[b].cached) in_cached_part = true;
    KILN_ASSERT(meta_[b].cached || !in_cached_part);
  }
}

}  // namespace kiln::kv
