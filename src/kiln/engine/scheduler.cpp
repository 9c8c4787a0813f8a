#include "kiln/engine/scheduler.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "kiln/util/status.h"

namespace kiln::engine {
namespace {

using kv::kBlockTokens;

int32_t blocks_for(int32_t num_tokens) {
  return (num_tokens + kBlockTokens - 1) / kBlockTokens;
}

bool by_arrival(const Sequence* a, const Sequence* b) {
  return a->arrival < b->arrival;
}

}  // namespace

const char* admit_errc_name(AdmitErrc code) {
  switch (code) {
    case AdmitErrc::kOk:
      return "ok";
    case AdmitErrc::kInvalidRequest:
      return "invalid_request";
    case AdmitErrc::kContextLengthExceeded:
      return "context_length_exceeded";
    case AdmitErrc::kQueueFull:
      return "queue_full";
  }
  return "?";
}

backend::AttnBatch StepPlan::attn_batch() const {
  backend::AttnBatch b;
  b.num_seqs = num_seqs();
  b.qo_indptr = qo_indptr.data();
  b.kv_indptr = kv_indptr.data();
  b.kv_indices = kv_indices.data();
  b.kv_len = kv_len.data();
  b.positions = positions.data();
  return b;
}

Status validate(const SchedulerConfig& cfg) {
  if (cfg.max_batch_tokens < 1)
    return err("max_batch_tokens must be >= 1, got {}", cfg.max_batch_tokens);
  if (cfg.max_seqs < 1) return err("max_seqs must be >= 1, got {}", cfg.max_seqs);
  if (cfg.num_blocks < 1) return err("num_blocks must be >= 1, got {}", cfg.num_blocks);
  if (cfg.max_context < 1) return err("max_context must be >= 1, got {}", cfg.max_context);
  if (cfg.max_waiting < 0) return err("max_waiting must be >= 0, got {}", cfg.max_waiting);
  if (cfg.step_prompt_tokens < 0)
    return err("step_prompt_tokens must be >= 0, got {}", cfg.step_prompt_tokens);
  if (cfg.state_checkpoint_blocks < 1)
    return err("state_checkpoint_blocks must be >= 1, got {}", cfg.state_checkpoint_blocks);
  if (cfg.state_snapshots < 0)
    return err("state_snapshots must be >= 0, got {}", cfg.state_snapshots);
  return {};
}

Scheduler::Scheduler(const SchedulerConfig& cfg)
    : cfg_(cfg),
      checkpoints_(cfg.state_slots && cfg.enable_prefix_cache && cfg.state_snapshots > 0),
      // Without snapshots a hybrid model could not resume after any cached block.
      kv_(cfg.num_blocks, cfg.enable_prefix_cache && (!cfg.state_slots || checkpoints_),
          cfg.block_hash),
      snapshots_(cfg.max_seqs, checkpoints_ ? cfg.state_snapshots : 0) {
  KILN_ASSERT(cfg.max_batch_tokens >= 1 && cfg.max_seqs >= 1 && cfg.max_context >= 1);
  KILN_ASSERT(cfg.max_waiting >= 0 && cfg.state_checkpoint_blocks >= 1 && cfg.state_snapshots >= 0);
  if (cfg.state_slots)
    for (int32_t s = cfg.max_seqs - 1; s >= 0; --s) free_state_slots_.push_back(s);
}

void Scheduler::release_state_slot(Sequence* seq) {
  if (seq->state_slot < 0) return;
  free_state_slots_.push_back(seq->state_slot);
  seq->state_slot = -1;
}

int32_t Scheduler::token_limit() const {
  const int64_t pool_tokens = static_cast<int64_t>(cfg_.num_blocks) * kBlockTokens;
  return static_cast<int32_t>(std::min<int64_t>(cfg_.max_context, pool_tokens));
}

Admission Scheduler::add(Request req) {
  const int64_t num_prompt = static_cast<int64_t>(req.prompt_tokens.size());
  if (num_prompt == 0) return {AdmitErrc::kInvalidRequest, "the prompt is empty"};
  if (req.max_tokens < 1) {
    return {AdmitErrc::kInvalidRequest,
            fmt::format("max_tokens must be at least 1, got {}", req.max_tokens)};
  }
  if (seqs_.count(req.id) != 0) {
    return {AdmitErrc::kInvalidRequest, fmt::format("request id {} is already queued", req.id)};
  }
  // The whole sequence must fit in the context, and alone in the KV pool: that is what lets
  // the oldest sequence always run to the end once everyone newer is preempted.
  const int64_t num_total = num_prompt + (req.prefill_only ? 0 : req.max_tokens);
  if (num_total > token_limit()) {
    return {AdmitErrc::kContextLengthExceeded,
            fmt::format("This model's maximum context length is {} tokens. However, you "
                        "requested {} tokens ({} in the prompt, {} for the completion).",
                        token_limit(), num_total, num_prompt, req.max_tokens)};
  }
  if (req.whole_prompt && num_prompt > cfg_.max_batch_tokens) {
    return {AdmitErrc::kContextLengthExceeded,
            fmt::format("This model's maximum input is {} tokens (its input is one step: "
                        "--max-batch-tokens). However, you requested {} tokens.",
                        cfg_.max_batch_tokens, num_prompt)};
  }
  if (static_cast<int32_t>(waiting_.size()) >= cfg_.max_waiting) {
    return {AdmitErrc::kQueueFull,
            fmt::format("the server is busy: {} requests are waiting", waiting_.size())};
  }
  auto seq = std::make_unique<Sequence>();
  seq->id = req.id;
  seq->tokens = std::move(req.prompt_tokens);
  seq->num_prompt_tokens = static_cast<int32_t>(num_prompt);
  seq->max_tokens = req.max_tokens;
  seq->reuse_prefix = req.reuse_prefix && !req.whole_prompt;
  seq->whole_prompt = req.whole_prompt;
  seq->arrival = next_arrival_++;
  waiting_.push_back(seq.get());  // the newest arrival: the back keeps arrival order
  seqs_.emplace(seq->id, std::move(seq));
  return {};
}

bool Scheduler::cancel(SeqId id) {
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  if (!it->second->cancel_requested) {
    it->second->cancel_requested = true;
    pending_cancels_.push_back(id);
  }
  return true;
}

const Sequence* Scheduler::find(SeqId id) const {
  const auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

StepPlan Scheduler::schedule() {
  KILN_ASSERT(!step_in_flight_);  // update() the previous plan first
  StepPlan plan;
  apply_cancels(&plan);
  int32_t budget = cfg_.max_batch_tokens;
  int32_t prompt_tokens = 0;
  std::vector<Chosen> chosen;
  schedule_running(/*decodes=*/true, &budget, nullptr, &chosen, &plan);
  schedule_running(/*decodes=*/false, &budget, &prompt_tokens, &chosen, &plan);
  // After a preemption the pool is tight: admitting now would only take back the blocks just
  // freed (and likely preempt again next step). vLLM v1 makes the same call.
  if (plan.preempted.empty()) admit_waiting(&budget, &prompt_tokens, &chosen, &plan);
  build_plan(chosen, &plan);
  step_in_flight_ = true;
  ++stats_.num_steps;
  return plan;
}

void Scheduler::apply_cancels(StepPlan* plan) {
  for (SeqId id : pending_cancels_) {
    const auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;  // finished in the meantime
    Sequence* seq = it->second.get();
    if (seq->status == SeqStatus::kRunning) {
      running_.erase(std::find(running_.begin(), running_.end(), seq));
    } else {
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
    }
    plan->cancelled.push_back(id);
    finish(seq, SeqFinishReason::kCancelled);
  }
  pending_cancels_.clear();
}

// One pass over the running sequences, oldest first: the decode pass takes those with one
// token left, the chunk pass those still catching up on a prompt (or on recompute).
void Scheduler::schedule_running(bool decodes, int32_t* budget, int32_t* prompt_tokens,
                                 std::vector<Chosen>* chosen, StepPlan* plan) {
  for (size_t i = 0; i < running_.size() && *budget > 0; ++i) {
    Sequence* seq = running_[i];
    const int32_t num_left = seq->num_tokens() - seq->num_computed_tokens;
    KILN_ASSERT(num_left >= 1);
    if ((num_left == 1) != decodes) continue;
    if (!decodes && !takes_prompts(*prompt_tokens)) break;
    const int32_t n =
        cut_at_checkpoint(*seq, seq->num_computed_tokens, std::min(num_left, *budget));
    // Admitted whole, so never left catching up; kept whole should that change.
    if (seq->whole_prompt && n < num_left) continue;
    // grow() only ever preempts running_.back(), which is newer than seq (index > i) or seq
    // itself (then the loop ends), so index i stays valid.
    if (!grow(seq, n, budget, chosen, plan)) break;
    chosen->push_back({seq, n});
    *budget -= n;
    if (!decodes) *prompt_tokens += n;
  }
}

bool Scheduler::takes_prompts(int32_t prompt_tokens) const {
  return cfg_.step_prompt_tokens <= 0 || prompt_tokens < cfg_.step_prompt_tokens;
}

// Only the state at the end of a step exists, so a slice [first, first + n) that crosses a
// checkpoint of the prompt ends at the last one it crosses, where build_plan() saves it. Not
// at every one crossed: a long prompt would then prefill a checkpoint's worth per step. The
// last one matters most: a conversation's next turn resumes from the last checkpoint of this
// prompt.
int32_t Scheduler::cut_at_checkpoint(const Sequence& seq, int32_t first, int32_t n) const {
  if (!checkpoints_ || seq.whole_prompt) return n;
  const int32_t every = cfg_.state_checkpoint_blocks * kBlockTokens;
  const int32_t cut = std::min(first + n, seq.num_prompt_tokens) / every * every;
  return cut > first ? cut - first : n;
}

// Keeps the longest prefix of the hits that ends at a checkpoint with a snapshot (the state
// can resume only there) and drops the rest. The snapshot's slot, or -1 with no hit kept.
int32_t Scheduler::trim_to_snapshot(std::vector<int32_t>* hits) {
  const int32_t every = cfg_.state_checkpoint_blocks;
  for (int32_t k = static_cast<int32_t>(hits->size()) / every * every; k > 0; k -= every) {
    const std::optional<kv::BlockIdentity> id = kv_.identity((*hits)[k - 1]);
    KILN_ASSERT(id.has_value());  // a hit is a cached block
    const int32_t slot = snapshots_.find(*id);
    if (slot >= 0) {
      hits->resize(static_cast<size_t>(k));
      return slot;
    }
  }
  hits->clear();
  return -1;
}

// Makes seq's block table cover num_computed_tokens + n tokens, preempting the newest running
// sequences while blocks are short. False when seq itself had to be preempted.
bool Scheduler::grow(Sequence* seq, int32_t n, int32_t* budget, std::vector<Chosen>* chosen,
                     StepPlan* plan) {
  const int32_t num_new =
      blocks_for(seq->num_computed_tokens + n) - static_cast<int32_t>(seq->block_table.size());
  while (!kv_.allocate(std::max(num_new, 0), &seq->block_table)) {
    Sequence* victim = running_.back();
    preempt(victim, budget, chosen, plan);
    if (victim == seq) return false;
  }
  return true;
}

void Scheduler::preempt(Sequence* seq, int32_t* budget, std::vector<Chosen>* chosen,
                        StepPlan* plan) {
  KILN_ASSERT(!running_.empty() && running_.back() == seq);
  running_.pop_back();
  // Already given tokens this step (a decode, when a chunk needs its blocks): take them back.
  const auto it =
      std::find_if(chosen->begin(), chosen->end(), [seq](const Chosen& c) { return c.seq == seq; });
  if (it != chosen->end()) {
    *budget += it->num_tokens;
    chosen->erase(it);
  }
  kv_.release(seq->block_table);
  seq->block_table.clear();
  release_state_slot(seq);  // recomputed from position 0: a fresh state then
  seq->num_computed_tokens = 0;
  seq->num_registered_blocks = 0;
  seq->status = SeqStatus::kPreempted;
  ++seq->num_preemptions;
  ++stats_.num_preemptions;
  insert_waiting(seq);
  plan->preempted.push_back(seq->id);
}

// FCFS: the front waits until it fits; nobody behind it jumps the queue.
void Scheduler::admit_waiting(int32_t* budget, int32_t* prompt_tokens, std::vector<Chosen>* chosen,
                              StepPlan* plan) {
  while (!waiting_.empty() && *budget > 0 && takes_prompts(*prompt_tokens) &&
         static_cast<int32_t>(running_.size()) < cfg_.max_seqs) {
    Sequence* seq = waiting_.front();
    KILN_ASSERT(seq->block_table.empty() && seq->num_computed_tokens == 0);
    std::vector<int32_t> hits = seq->reuse_prefix
                                    ? kv_.find_prefix(seq->tokens, /*count_stats=*/false)
                                    : std::vector<int32_t>{};
    const int32_t restore_slot = cfg_.state_slots ? trim_to_snapshot(&hits) : -1;
    const int32_t num_hit_tokens = static_cast<int32_t>(hits.size()) * kBlockTokens;
    const int32_t n = cut_at_checkpoint(*seq, num_hit_tokens,
                                        std::min(seq->num_tokens() - num_hit_tokens, *budget));
    if (seq->whole_prompt && n < seq->num_tokens()) break;  // waits for a step with room
    const int32_t num_new = blocks_for(num_hit_tokens + n) - static_cast<int32_t>(hits.size());
    if (kv_.num_blocks_needed(hits, num_new) > kv_.num_free_blocks()) break;
    kv_.acquire(hits);  // before allocate(), which could otherwise evict a hit
    const bool ok = kv_.allocate(num_new, &seq->block_table);
    KILN_ASSERT(ok);
    seq->block_table.insert(seq->block_table.begin(), hits.begin(), hits.end());
    seq->num_computed_tokens = num_hit_tokens;
    seq->num_registered_blocks = static_cast<int32_t>(hits.size());
    if (seq->status == SeqStatus::kWaiting) {  // first admission: what usage reports
      seq->num_cached_prompt_tokens = std::min(num_hit_tokens, seq->num_prompt_tokens);
      stats_.num_prompt_tokens += seq->num_prompt_tokens;
      stats_.num_cached_prompt_tokens += seq->num_cached_prompt_tokens;
    }
    seq->status = SeqStatus::kRunning;
    if (cfg_.state_slots) {  // fewer than max_seqs run, so a slot is free
      KILN_ASSERT(!free_state_slots_.empty());
      seq->state_slot = free_state_slots_.back();
      free_state_slots_.pop_back();
    }
    if (restore_slot >= 0) {
      plan->state_restores.push_back({restore_slot, seq->state_slot});
      ++stats_.num_state_restores;
    }
    waiting_.pop_front();
    insert_running(seq);
    chosen->push_back({seq, n});
    *budget -= n;
    *prompt_tokens += n;
  }
}

void Scheduler::build_plan(const std::vector<Chosen>& chosen, StepPlan* plan) {
  plan->qo_indptr.push_back(0);
  plan->kv_indptr.push_back(0);
  for (const Chosen& c : chosen) {
    const Sequence& seq = *c.seq;
    const int32_t first = seq.num_computed_tokens;
    const int32_t end = first + c.num_tokens;
    const bool needs_logits = end == seq.num_tokens();
    // A slice ending at a checkpoint of the prompt saves its state (not with every snapshot
    // slot reserved by this step's others). Generated tokens get none: a long generation would
    // push the prompts' snapshots out, and the next turn of a chat rarely resends an answer
    // token for token (templates drop the reasoning, re-serialize tool calls).
    int32_t save_slot = -1;
    if (checkpoints_ && end <= seq.num_prompt_tokens &&
        end % (cfg_.state_checkpoint_blocks * kBlockTokens) == 0) {
      save_slot = snapshots_.reserve();
      if (save_slot >= 0) plan->state_saves.push_back({seq.state_slot, save_slot});
    }
    plan->seqs.push_back({seq.id, first, c.num_tokens, needs_logits, seq.state_slot, save_slot});
    if (cfg_.state_slots) plan->state_slots.push_back(seq.state_slot);
    for (int32_t t = first; t < end; ++t) {
      plan->token_ids.push_back(seq.tokens[t]);
      plan->positions.push_back(t);
    }
    plan->qo_indptr.push_back(plan->num_tokens());
    const int32_t num_kv_blocks = blocks_for(end);
    KILN_ASSERT(num_kv_blocks == static_cast<int32_t>(seq.block_table.size()));
    plan->kv_indices.insert(plan->kv_indices.end(), seq.block_table.begin(), seq.block_table.end());
    plan->kv_indptr.push_back(static_cast<int32_t>(plan->kv_indices.size()));
    plan->kv_len.push_back(end);
    if (needs_logits) plan->logits_rows.push_back(plan->num_tokens() - 1);
  }
}

void Scheduler::abandon(const StepPlan& plan) {
  KILN_ASSERT(step_in_flight_);
  for (const ScheduledSeq& s : plan.seqs)
    if (s.save_slot >= 0) snapshots_.unreserve(s.save_slot);
  step_in_flight_ = false;
}

// The slice's save is findable once the block ending at the checkpoint has an identity, keyed
// by it; a block left private (a hash collision) gets no snapshot.
void Scheduler::publish_snapshot(const Sequence& seq, const ScheduledSeq& s) {
  const int32_t last_block = (s.first_token + s.num_tokens) / kBlockTokens - 1;
  const std::optional<kv::BlockIdentity> id = kv_.identity(seq.block_table[last_block]);
  if (!id) {
    snapshots_.unreserve(s.save_slot);
    return;
  }
  snapshots_.publish(s.save_slot, *id);
  ++stats_.num_state_saves;
}

std::vector<FinishedSeq> Scheduler::update(const StepPlan& plan,
                                           std::span<const SeqOutput> outputs) {
  KILN_ASSERT(step_in_flight_);
  step_in_flight_ = false;
  std::unordered_map<SeqId, const SeqOutput*> by_id;
  for (const SeqOutput& o : outputs) by_id[o.id] = &o;
  std::vector<FinishedSeq> finished;
  for (const ScheduledSeq& s : plan.seqs) {
    const auto it = seqs_.find(s.id);
    KILN_ASSERT(it != seqs_.end());
    Sequence* seq = it->second.get();
    KILN_ASSERT(seq->status == SeqStatus::kRunning && seq->num_computed_tokens == s.first_token);
    seq->num_computed_tokens += s.num_tokens;
    // Blocks whose 16 tokens now all have KV become shareable.
    const int32_t num_full = seq->num_computed_tokens / kBlockTokens;
    kv_.cache_blocks(seq->tokens, seq->block_table, seq->num_registered_blocks, num_full);
    seq->num_registered_blocks = std::max(seq->num_registered_blocks, num_full);
    if (s.save_slot >= 0) publish_snapshot(*seq, s);
    const auto out = by_id.find(s.id);
    const SeqOutput* o = out == by_id.end() ? nullptr : out->second;
    KILN_ASSERT(!s.needs_logits || (o != nullptr && o->token >= 0));  // engine contract
    SeqFinishReason reason = SeqFinishReason::kNone;
    if (s.needs_logits) {
      seq->tokens.push_back(o->token);
      if (seq->num_output_tokens() >= seq->max_tokens) reason = SeqFinishReason::kLength;
    }
    if (o != nullptr && o->stop) reason = SeqFinishReason::kStop;
    if (reason == SeqFinishReason::kNone) continue;
    running_.erase(std::find(running_.begin(), running_.end(), seq));
    finished.push_back({seq->id, reason, seq->num_prompt_tokens, seq->num_output_tokens(),
                        seq->num_cached_prompt_tokens});
    finish(seq, reason);
  }
  return finished;
}

// Releases the blocks (into the prefix cache) and forgets the sequence. It must already be
// out of running_ and waiting_.
void Scheduler::finish(Sequence* seq, SeqFinishReason reason) {
  kv_.release(seq->block_table);
  seq->block_table.clear();
  release_state_slot(seq);
  seq->status = SeqStatus::kFinished;
  seq->finish_reason = reason;
  const SeqId id = seq->id;  // erase() must not read a key from the node it destroys
  seqs_.erase(id);           // seq dangles from here
}

void Scheduler::insert_running(Sequence* seq) {
  running_.insert(std::upper_bound(running_.begin(), running_.end(), seq, by_arrival), seq);
}

void Scheduler::insert_waiting(Sequence* seq) {
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), seq, by_arrival), seq);
}

void Scheduler::check_invariants() const {
  kv_.check_invariants();
  snapshots_.check_invariants();
  KILN_ASSERT(step_in_flight_ || snapshots_.num_reserved() == 0);  // saves end with their step
  KILN_ASSERT(static_cast<int32_t>(running_.size()) <= cfg_.max_seqs);
  KILN_ASSERT(running_.size() + waiting_.size() == seqs_.size());
  KILN_ASSERT(std::is_sorted(running_.begin(), running_.end(), by_arrival));
  KILN_ASSERT(std::is_sorted(waiting_.begin(), waiting_.end(), by_arrival));
  std::vector<int32_t> num_holders(static_cast<size_t>(kv_.num_blocks()), 0);
  for (const Sequence* seq : running_) {
    KILN_ASSERT(seq->status == SeqStatus::kRunning);
    KILN_ASSERT(seq->num_computed_tokens < seq->num_tokens());  // something left to compute
    if (!step_in_flight_) {
      KILN_ASSERT(static_cast<int32_t>(seq->block_table.size()) ==
                  blocks_for(seq->num_computed_tokens));
    }
    KILN_ASSERT(seq->num_registered_blocks <= seq->num_computed_tokens / kBlockTokens);
    KILN_ASSERT(seq->num_output_tokens() < seq->max_tokens);
    KILN_ASSERT(seq->num_tokens() <= token_limit());
    for (int32_t b : seq->block_table) ++num_holders[b];
    KILN_ASSERT((seq->state_slot >= 0) == cfg_.state_slots);
  }
  for (const Sequence* seq : waiting_) {
    KILN_ASSERT(seq->status == SeqStatus::kWaiting || seq->status == SeqStatus::kPreempted);
    KILN_ASSERT(seq->block_table.empty() && seq->num_computed_tokens == 0);
    KILN_ASSERT(seq->state_slot < 0);
  }
  // Every slot is either free or held by exactly one running sequence.
  if (cfg_.state_slots) {
    std::vector<int32_t> holders(static_cast<size_t>(cfg_.max_seqs), 0);
    for (int32_t s : free_state_slots_) ++holders[static_cast<size_t>(s)];
    for (const Sequence* seq : running_) ++holders[static_cast<size_t>(seq->state_slot)];
    for (int32_t h : holders) KILN_ASSERT(h == 1);
  }
  // A block's readers are exactly the tables that hold it (so nothing is freed under one).
  for (int32_t b = 0; b < kv_.num_blocks(); ++b) KILN_ASSERT(num_holders[b] == kv_.ref_count(b));
}

}  // namespace kiln::engine
