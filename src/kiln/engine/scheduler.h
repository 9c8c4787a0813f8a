// The scheduler: pure logic, no model. Each engine step is schedule() -> execute -> update()
// (vLLM v1 engine core). There is no prefill or decode mode: every running sequence has
// num_tokens - num_computed_tokens tokens to catch up, and a step gives each of them a slice
// of a per-step token budget:
//   1. decode tokens of running sequences (one token left), oldest first;
//   2. prompt chunks of running sequences still prefilling (chunked prefill), oldest first;
//   3. waiting sequences, strictly FCFS, admitted while budget, max_seqs and blocks allow,
//      each first reusing its longest cached prefix (prefix_cache.h); none in a step that
//      had to preempt.
// Steps 2 and 3 stop taking prompts once the step holds step_prompt_tokens prompt tokens
// (when set): prompts that arrive together then finish prefill, and sample their first
// token, a few per step instead of all at the end of one big step.
// When a running sequence needs a block and none is free, the newest running sequence is
// preempted by recompute: its blocks go back (into the prefix cache, so it gets most of them
// back cheaply), num_computed_tokens = 0, and it is queued at the front of the waiting queue.
// Hybrid models (state_slots) reuse a prefix only up to a checkpoint whose recurrent state was
// saved (kv/state_snapshots.h): a chunk that crosses a checkpoint of its prompt ends at the
// last one it crosses, the step saves the state there, and an admitted sequence resumes from the
// longest cached prefix that ends at a checkpoint with a snapshot.
// See docs/scheduler.md for the picture. Not thread-safe: the engine thread owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/backend/weight.h"
#include "kiln/engine/request.h"
#include "kiln/kv/prefix_cache.h"
#include "kiln/kv/state_snapshots.h"
#include "kiln/util/status.h"

namespace kiln::engine {

struct SchedulerConfig {
  int32_t max_batch_tokens = 2048;  // tokens computed per step, all sequences together
  int32_t max_seqs = 64;            // running sequences at most
  int32_t num_blocks = 1024;        // KV blocks of kv::kBlockTokens tokens in the pool
  int32_t max_context = 4096;       // prompt + max_tokens of one sequence at most
  int32_t max_waiting = 256;        // waiting queue bound: add() beyond it is queue_full
  // Once a step holds this many prompt tokens it takes no further prompt (one already taken
  // still gets its whole chunk); 0: prompts fill the step's budget.
  int32_t step_prompt_tokens = 0;
  bool enable_prefix_cache = true;
  // Hybrid models (Gated DeltaNet layers): each running sequence holds one of max_seqs
  // recurrent-state slots [0, max_seqs), taken when it starts running and given back when it
  // stops (finished, cancelled, preempted).
  bool state_slots = false;
  // Their prefix caching: a cached block of KV cannot rebuild the recurrent state at its end,
  // so the state is saved every state_checkpoint_blocks full blocks into one of
  // state_snapshots snapshot slots [max_seqs, max_seqs + state_snapshots) of the same state
  // storage, and a prefix is reused only up to a checkpoint with a snapshot. 0 snapshots: no
  // prefix is reused.
  int32_t state_checkpoint_blocks = 8;
  int32_t state_snapshots = 0;
  kv::BlockHashFn block_hash = kv::hash_block;  // tests swap in a colliding one
};

// The config's own bounds (max_batch_tokens, max_seqs, num_blocks, max_context >= 1,
// max_waiting, step_prompt_tokens and state_snapshots >= 0, state_checkpoint_blocks >= 1): an error
// naming the field, for configs that come from user input. The Scheduler asserts them.
Status validate(const SchedulerConfig& cfg);

// Why add() refused a request. The names are the wire codes (error.code) the server sends.
enum class AdmitErrc {
  kOk,
  kInvalidRequest,         // 400: empty prompt, max_tokens < 1, duplicate id
  kContextLengthExceeded,  // 400: prompt + max_tokens beyond the context (or the KV pool)
  kQueueFull,              // 429: the waiting queue is at max_waiting
};
const char* admit_errc_name(AdmitErrc code);

struct Admission {
  AdmitErrc code = AdmitErrc::kOk;
  std::string message;
  bool ok() const { return code == AdmitErrc::kOk; }
};

// One sequence's share of a step: tokens [first_token, first_token + num_tokens) of it,
// at positions equal to their indices.
struct ScheduledSeq {
  SeqId id = 0;
  int32_t first_token = 0;
  int32_t num_tokens = 0;
  bool needs_logits = false;  // the slice ends at the sequence's last known token: sample
  int32_t state_slot = -1;    // its recurrent-state slot (SchedulerConfig::state_slots)
  int32_t save_slot = -1;     // the slice ends at a prompt checkpoint: the snapshot slot it
                              // saves to
};

// A copy of one recurrent-state slot into another (Backend::state_copy).
struct StateCopy {
  int32_t src_slot = -1;
  int32_t dst_slot = -1;
};

// The step, flat: rows of all sequences back to back, in `seqs` order.
struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  std::vector<int32_t> token_ids;  // [num_tokens]
  std::vector<int32_t> positions;  // [num_tokens]
  // Paged attention metadata (backend::AttnBatch): sequence s owns rows
  // [qo_indptr[s], qo_indptr[s+1]) and blocks kv_indices[kv_indptr[s] .. kv_indptr[s+1]);
  // kv_len[s] = tokens valid after this step's KV writes.
  std::vector<int32_t> qo_indptr;   // [num_seqs + 1]
  std::vector<int32_t> kv_indptr;   // [num_seqs + 1]
  std::vector<int32_t> kv_indices;  // [kv_indptr.back()]
  std::vector<int32_t> kv_len;      // [num_seqs]
  // Flat row of the last token of each sequence with needs_logits, in `seqs` order.
  std::vector<int32_t> logits_rows;
  std::vector<int32_t> state_slots;  // [num_seqs] with SchedulerConfig::state_slots, else empty
  // Snapshots (SchedulerConfig::state_snapshots). Restores are copied BEFORE the step's
  // forward: a snapshot into the slot of a sequence that resumes after a cached prefix (its
  // first row is not at position 0, so the forward continues from the slot). Saves are copied
  // AFTER it: the slot of a sequence whose slice ends at a checkpoint into a snapshot slot,
  // which update() then makes findable. A save may take over (LRU) the very snapshot a restore
  // of the same step reads: restores before the forward, saves after it keep that exact.
  std::vector<StateCopy> state_restores;
  std::vector<StateCopy> state_saves;
  std::vector<SeqId> preempted;  // sent back to the waiting queue this step
  std::vector<SeqId> cancelled;  // cancelled and freed this step (finished, kCancelled)

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(seqs.size()); }
  bool empty() const { return seqs.empty(); }
  // A view for the forward; valid while this plan lives and is not modified.
  backend::AttnBatch attn_batch() const;
};

// What the engine reports for one scheduled sequence after execute: the sampled token (only
// for those with needs_logits) and whether a stop condition (EOS, stop string) hit.
struct SeqOutput {
  SeqId id = 0;
  int32_t token = -1;
  bool stop = false;
};

struct FinishedSeq {
  SeqId id = 0;
  SeqFinishReason reason = SeqFinishReason::kNone;
  int32_t num_prompt_tokens = 0;
  int32_t num_output_tokens = 0;
  int32_t num_cached_prompt_tokens = 0;
};

struct SchedulerStats {
  int64_t num_steps = 0;
  int64_t num_preemptions = 0;
  int64_t num_prompt_tokens = 0;         // prompts admitted (first admission)
  int64_t num_cached_prompt_tokens = 0;  // of them, found in the prefix cache
  int64_t num_state_saves = 0;           // snapshots published (hybrid models)
  int64_t num_state_restores = 0;        // admissions that resumed from a snapshot
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& cfg);

  // Queues a request, or says why not, before any work is done.
  Admission add(Request req);
  // Marks a waiting or running sequence cancelled; the next schedule() frees its blocks and
  // reports it in StepPlan::cancelled. False for an unknown (or finished) id.
  bool cancel(SeqId id);
  // Ends a step whose forward failed, instead of update(): nothing it computed counts (no
  // token advances, no block becomes shareable). The caller cancels its sequences.
  void abandon(const StepPlan& plan);

  // Plans the next step. Call update() with its outputs before the next schedule().
  StepPlan schedule();
  // Applies the step's outputs: advances num_computed_tokens, appends sampled tokens,
  // registers newly full blocks in the prefix cache, finishes sequences (stop, max_tokens)
  // and releases their blocks. `outputs` has one entry per sequence of the plan with
  // needs_logits (others may be listed with stop only). Returns the sequences finished.
  std::vector<FinishedSeq> update(const StepPlan& plan, std::span<const SeqOutput> outputs);

  const Sequence* find(SeqId id) const;
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  bool has_work() const { return !seqs_.empty(); }
  const kv::PrefixCache& kv() const { return kv_; }
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerConfig& config() const { return cfg_; }
  // Recurrent-state slots held by running sequences (SchedulerConfig::state_slots).
  int32_t num_used_state_slots() const {
    return cfg_.state_slots ? cfg_.max_seqs - static_cast<int32_t>(free_state_slots_.size()) : 0;
  }
  const kv::StateSnapshots& snapshots() const { return snapshots_; }

  // Verifies the scheduler's and the cache's invariants (between steps): block tables cover
  // exactly the computed tokens, every block's ref_count equals the number of tables that
  // hold it, queues sorted by arrival, caps respected. O(blocks + tokens). Aborts on failure.
  void check_invariants() const;

 private:
  struct Chosen {
    Sequence* seq;
    int32_t num_tokens;
  };

  void apply_cancels(StepPlan* plan);
  // prompt_tokens: the step's prompt tokens so far (the chunk pass adds to it; null for the
  // decode pass).
  void schedule_running(bool decodes, int32_t* budget, int32_t* prompt_tokens,
                        std::vector<Chosen>* chosen, StepPlan* plan);
  bool grow(Sequence* seq, int32_t num_tokens, int32_t* budget, std::vector<Chosen>* chosen,
            StepPlan* plan);
  void preempt(Sequence* seq, int32_t* budget, std::vector<Chosen>* chosen, StepPlan* plan);
  void admit_waiting(int32_t* budget, int32_t* prompt_tokens, std::vector<Chosen>* chosen,
                     StepPlan* plan);
  bool takes_prompts(int32_t prompt_tokens) const;
  int32_t cut_at_checkpoint(const Sequence& seq, int32_t first, int32_t n) const;
  int32_t trim_to_snapshot(std::vector<int32_t>* hits);
  void publish_snapshot(const Sequence& seq, const ScheduledSeq& s);
  void build_plan(const std::vector<Chosen>& chosen, StepPlan* plan);
  void insert_running(Sequence* seq);
  void insert_waiting(Sequence* seq);
  void finish(Sequence* seq, SeqFinishReason reason);
  void release_state_slot(Sequence* seq);
  int32_t token_limit() const;

  SchedulerConfig cfg_;
  bool checkpoints_ = false;  // hybrid model with prefix caching and snapshot slots
  kv::PrefixCache kv_;
  kv::StateSnapshots snapshots_;
  std::unordered_map<SeqId, std::unique_ptr<Sequence>> seqs_;
  std::vector<Sequence*> running_;  // sorted by arrival: back() is the newest
  std::deque<Sequence*> waiting_;   // sorted by arrival: front() is admitted next
  std::vector<SeqId> pending_cancels_;
  std::vector<int32_t> free_state_slots_;  // max_seqs of them: a running sequence never waits
  uint64_t next_arrival_ = 0;
  bool step_in_flight_ = false;
  SchedulerStats stats_;
};

}  // namespace kiln::engine
