#include "kiln/tokenizer/bpe.h"

#include <algorithm>
#include <bit>

namespace kiln::tokenizer::detail {
namespace {

struct Candidate {
  float priority;
  int32_t left;  // index of the left symbol; also its position, which breaks ties
  int32_t right;
  int32_t left_id;
  int32_t right_id;
  int32_t merged;
};

struct Later {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.left > b.left;
  }
};

// A binary heap on a vector this thread reuses for every word (no allocation per word).
using Queue = std::vector<Candidate>;

void push_pair(const PairTable& pairs, const std::vector<Symbol>& syms, int32_t left, Queue& q) {
  if (left < 0) return;
  const int32_t right = syms[left].next;
  if (right < 0) return;
  const int32_t a = syms[left].id;
  const int32_t b = syms[right].id;
  if (a < 0 || b < 0) return;
  const PairMerge* m = pairs.find(a, b);
  if (m == nullptr) return;
  q.push_back({m->priority, left, right, a, b, m->merged});
  std::push_heap(q.begin(), q.end(), Later{});
}

}  // namespace

void PairTable::reserve(size_t n) {
  size_t capacity = 16;
  while (capacity < 2 * n) capacity *= 2;  // load factor <= 0.5
  if (capacity > slots_.size()) grow(capacity);
}

void PairTable::grow(size_t capacity) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  shift_ = 64 - std::countr_zero(capacity);
  size_ = 0;
  for (const Slot& s : old) {
    if (s.key != kEmpty)
      add(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key), s.merge);
  }
}

void PairTable::add(int32_t left, int32_t right, PairMerge m) {
  if (2 * (size_ + 1) > slots_.size()) grow(slots_.empty() ? 16 : 2 * slots_.size());
  const uint64_t k = key(left, right);
  for (size_t i = slot_of(k);; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == k) return;  // first entry wins
    if (s.key == kEmpty) {
      s.key = k;
      s.merge = m;
      ++size_;
      return;
    }
  }
}

void merge_symbols(const PairTable& pairs, std::vector<Symbol>& syms) {
  const auto n = static_cast<int32_t>(syms.size());
  for (int32_t i = 0; i < n; ++i) {
    syms[i].prev = i - 1;
    syms[i].next = i + 1 < n ? i + 1 : -1;
  }
  if (n < 2) return;
  thread_local Queue q;
  q.clear();
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(pairs, syms, i, q);
  while (!q.empty()) {
    std::pop_heap(q.begin(), q.end(), Later{});
    const Candidate c = q.back();
    q.pop_back();
    Symbol& l = syms[c.left];
    // Stale: either side was merged away or changed since this candidate was queued.
    if (l.len == 0 || l.next != c.right || l.id != c.left_id) continue;
    Symbol& r = syms[c.right];
    if (r.len == 0 || r.id != c.right_id) continue;
    l.id = c.merged;
    l.len += r.len;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    r.len = 0;
    r.prev = r.next = -1;
    push_pair(pairs, syms, l.prev, q);
    push_pair(pairs, syms, c.left, q);
  }
}

}  // namespace kiln::tokenizer::detail
