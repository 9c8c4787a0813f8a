// Snapshots of recurrent state at prefix checkpoints: prefix caching for hybrid models.
//
// A hybrid model (Gated DeltaNet layers beside attention) reads a cached prefix's KV blocks
// in its attention layers, but its recurrent layers need the state after that prefix, which
// no KV block can rebuild. So the scheduler copies a sequence's state slot, at a checkpoint
// (a multiple of a fixed number of full blocks), into a snapshot slot of the same
// StateCache, and a later request whose cached prefix ends at that checkpoint resumes from a
// copy of it instead of from position 0.
//
// Identity. A snapshot is keyed by the BlockIdentity (prefix_cache.h) of the block that ends
// at its checkpoint: the chained hash finds it, and the cached block with its generation
// confirms it. A lookup passes the identity of a prefix hit; the snapshot is handed out only
// when block and generation are equal too, i.e. the block kept, since the snapshot was taken,
// the identity of exactly the prefix the state was computed from. A hash collision or an
// evicted block therefore never hands out a state of other tokens, and a snapshot is only
// ever used together with the KV chain it belongs to.
//
// Slots. The store owns StateCache slots [first_slot, first_slot + num_slots). Each is free,
// reserved (a save in flight: the step's forward ends, then its state is copied in; not
// findable) or published (findable). When none is free, reserve() takes the least recently
// used published one. Pure bookkeeping: the engine issues the copies.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/kv/prefix_cache.h"

namespace kiln::kv {

class StateSnapshots {
 public:
  StateSnapshots(int32_t first_slot, int32_t num_slots);

  int32_t num_slots() const { return static_cast<int32_t>(slots_.size()); }
  int32_t num_published() const { return static_cast<int32_t>(by_hash_.size()); }
  int32_t num_reserved() const { return num_reserved_; }

  // A slot for a save: a free one, else the least recently used published one (forgotten).
  // -1 when every slot is reserved.
  int32_t reserve();
  // Makes a reserved slot findable as the state after the prefix that `id` ends; a snapshot
  // already published under the same hash is dropped (its slot freed): equal identity means
  // the same state, and a different one is stale (the prefix cache keeps one block per hash).
  void publish(int32_t slot, const BlockIdentity& id);
  // Gives a reserved slot back unpublished: its step failed, or its block got no identity.
  void unreserve(int32_t slot);
  // The slot holding the state after the prefix that hit `id` ends (a cached block's current
  // identity), marked most recently used; -1 when there is none. A snapshot under the same
  // hash but another block or generation is stale, and freed.
  int32_t find(const BlockIdentity& id);

  // One line per published snapshot, most recently used first: "slot <- #block/gen".
  std::string debug_string() const;
  // Every slot in exactly one state; the map holds exactly the published ones. Aborts on
  // failure.
  void check_invariants() const;

 private:
  enum class SlotState { kFree, kReserved, kPublished };
  struct Slot {
    SlotState state = SlotState::kFree;
    BlockIdentity id;        // kPublished
    uint64_t last_used = 0;  // kPublished: tick_ at publish or the last find
  };

  Slot& at(int32_t slot);
  void free_slot(int32_t slot);

  int32_t first_slot_ = 0;
  std::vector<Slot> slots_;                        // [num_slots], index slot - first_slot
  std::vector<int32_t> free_;                      // free slots (StateCache numbering)
  std::unordered_map<uint64_t, int32_t> by_hash_;  // hash -> published slot
  int32_t num_reserved_ = 0;
  uint64_t tick_ = 0;
};

}  // namespace kiln::kv
