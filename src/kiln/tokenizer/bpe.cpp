#include "kiln/tokenizer/bpe.h"

#include <queue>

namespace kiln::tokenizer::detail {
namespace {

struct Candidate {
  double priority;
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

using Queue = std::priority_queue<Candidate, std::vector<Candidate>, Later>;

void push_pair(const PairTable& pairs, const std::vector<Symbol>& syms, int32_t left, Queue& q) {
  if (left < 0) return;
  const int32_t right = syms[left].next;
  if (right < 0) return;
  const int32_t a = syms[left].id;
  const int32_t b = syms[right].id;
  if (a < 0 || b < 0) return;
  const PairMerge* m = pairs.find(a, b);
  if (m == nullptr) return;
  q.push({m->priority, left, right, a, b, m->merged});
}

}  // namespace

void merge_symbols(const PairTable& pairs, std::vector<Symbol>& syms) {
  const auto n = static_cast<int32_t>(syms.size());
  for (int32_t i = 0; i < n; ++i) {
    syms[i].prev = i - 1;
    syms[i].next = i + 1 < n ? i + 1 : -1;
  }
  if (n < 2) return;
  std::vector<Candidate> storage;
  storage.reserve(static_cast<size_t>(n));
  Queue q(Later{}, std::move(storage));
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(pairs, syms, i, q);
  while (!q.empty()) {
    const Candidate c = q.top();
    q.pop();
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
