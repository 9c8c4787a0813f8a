#include "kiln/kv/state_snapshots.h"

#include <algorithm>

#include <fmt/format.h>

#include "kiln/util/status.h"

namespace kiln::kv {

StateSnapshots::StateSnapshots(int32_t first_slot, int32_t num_slots)
    : first_slot_(first_slot), slots_(static_cast<size_t>(num_slots)) {
  KILN_ASSERT(first_slot >= 0 && num_slots >= 0);
  // Popped from the back: the lowest slot first, which keeps pictures and tests readable.
  for (int32_t s = first_slot + num_slots - 1; s >= first_slot; --s) free_.push_back(s);
}

StateSnapshots::Slot& StateSnapshots::at(int32_t slot) {
  KILN_ASSERT(slot >= first_slot_ && slot < first_slot_ + num_slots());
  return slots_[static_cast<size_t>(slot - first_slot_)];
}

void StateSnapshots::free_slot(int32_t slot) {
  at(slot) = Slot{};
  free_.push_back(slot);
}

int32_t StateSnapshots::reserve() {
  int32_t slot = -1;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    // O(num_slots): a reserve is at most one per checkpoint a sequence reaches, and the
    // store holds a few slots per running sequence.
    uint64_t oldest = UINT64_MAX;
    for (int32_t i = 0; i < num_slots(); ++i) {
      const Slot& s = slots_[static_cast<size_t>(i)];
      if (s.state == SlotState::kPublished && s.last_used < oldest) {
        oldest = s.last_used;
        slot = first_slot_ + i;
      }
    }
    if (slot < 0) return -1;
    by_hash_.erase(at(slot).id.hash);
  }
  at(slot) = Slot{SlotState::kReserved, {}, 0};
  ++num_reserved_;
  return slot;
}

void StateSnapshots::publish(int32_t slot, const BlockIdentity& id) {
  Slot& s = at(slot);
  KILN_ASSERT(s.state == SlotState::kReserved && id.block >= 0);
  if (const auto it = by_hash_.find(id.hash); it != by_hash_.end()) {
    const int32_t old = it->second;
    by_hash_.erase(it);
    free_slot(old);
  }
  s.state = SlotState::kPublished;
  s.id = id;
  s.last_used = ++tick_;
  by_hash_.emplace(id.hash, slot);
  --num_reserved_;
}

void StateSnapshots::unreserve(int32_t slot) {
  KILN_ASSERT(at(slot).state == SlotState::kReserved);
  free_slot(slot);
  --num_reserved_;
}

int32_t StateSnapshots::find(const BlockIdentity& id) {
  const auto it = by_hash_.find(id.hash);
  if (it == by_hash_.end()) return -1;
  const int32_t slot = it->second;
  Slot& s = at(slot);
  if (s.id != id) {
    by_hash_.erase(it);
    free_slot(slot);
    return -1;
  }
  s.last_used = ++tick_;
  return slot;
}

std::string StateSnapshots::debug_string() const {
  std::vector<int32_t> published;
  for (const auto& [hash, slot] : by_hash_) published.push_back(slot);
  std::sort(published.begin(), published.end(), [this](int32_t a, int32_t b) {
    return slots_[static_cast<size_t>(a - first_slot_)].last_used >
           slots_[static_cast<size_t>(b - first_slot_)].last_used;
  });
  std::string out = fmt::format("snapshots: {} slots, {} published, {} reserved, {} free\n",
                                num_slots(), num_published(), num_reserved_, free_.size());
  for (int32_t slot : published) {
    const BlockIdentity& id = slots_[static_cast<size_t>(slot - first_slot_)].id;
    out += fmt::format("  {} <- #{}/{}\n", slot, id.block, id.gen);
  }
  return out;
}

void StateSnapshots::check_invariants() const {
  int32_t num_free = 0, num_reserved = 0, num_published = 0;
  for (int32_t i = 0; i < num_slots(); ++i) {
    const Slot& s = slots_[static_cast<size_t>(i)];
    switch (s.state) {
      case SlotState::kFree:
        ++num_free;
        KILN_ASSERT(std::count(free_.begin(), free_.end(), first_slot_ + i) == 1);
        break;
      case SlotState::kReserved:
        ++num_reserved;
        break;
      case SlotState::kPublished: {
        ++num_published;
        const auto it = by_hash_.find(s.id.hash);
        KILN_ASSERT(it != by_hash_.end() && it->second == first_slot_ + i);
        break;
      }
    }
  }
  KILN_ASSERT(num_free == static_cast<int32_t>(free_.size()));
  KILN_ASSERT(num_reserved == num_reserved_);
  KILN_ASSERT(num_published == static_cast<int32_t>(by_hash_.size()));
}

}  // namespace kiln::kv
