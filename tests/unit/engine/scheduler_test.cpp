// Scheduler tests in the style of vLLM's tests/v1/core/test_scheduler.py: no model, fabricated
// outputs. The fake engine below is stricter than fabricated tokens alone: it keeps a fake KV
// cache (one token id per slot), writes every scheduled row into the slot its block table
// names, and "samples" the next token as a hash of the context read back through the block
// table. A wrong block table, a prefix-cache hit on the wrong block, or a write into a shared
// block changes the tokens, and every finished sequence is compared with a reference
// generation computed straight from its prompt.
#include "kiln/engine/scheduler.h"

#include <array>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kiln::engine {
namespace {

using kv::kBlockTokens;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

// The fake model. Like real KV, the value stored for position p depends on every token up to
// p: kv_value chains the previous position's value with the token. The next token is a hash
// of all the values of the context, so a block holding the right tokens computed after a
// different prefix still gives a different token.
uint64_t kv_value(uint64_t prev, int32_t token) {
  uint64_t x = prev ^ (static_cast<uint64_t>(static_cast<uint32_t>(token)) * 0x9e3779b97f4a7c15ULL);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
constexpr uint64_t kKvSeed = 12345;

int32_t sample(std::span<const uint64_t> kv) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the values
  for (uint64_t v : kv) {
    h ^= v;
    h *= 1099511628211ULL;
  }
  return 100 + static_cast<int32_t>(h % 30000);
}

// The model run straight on a token list, no cache: the oracle.
int32_t model_token(std::span<const int32_t> context) {
  std::vector<uint64_t> kv;
  uint64_t prev = kKvSeed;
  for (int32_t t : context) kv.push_back(prev = kv_value(prev, t));
  return sample(kv);
}

std::vector<int32_t> iota_tokens(int32_t first, int32_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

using StopFn = std::function<bool(int32_t token)>;

// What the sequence must generate: greedy from its prompt, up to max_tokens or a stop.
std::vector<int32_t> reference_output(std::vector<int32_t> ctx, int32_t max_tokens,
                                      const StopFn& stop) {
  std::vector<int32_t> out;
  while (static_cast<int32_t>(out.size()) < max_tokens) {
    const int32_t t = model_token(ctx);
    out.push_back(t);
    ctx.push_back(t);
    if (stop && stop(t)) break;
  }
  return out;
}

class FakeEngine {
 public:
  explicit FakeEngine(Scheduler* s)
      : s_(s),
        slots_(static_cast<size_t>(s->kv().num_blocks())),
        states_(static_cast<size_t>(s->config().max_seqs + s->config().state_snapshots), 0) {
    for (auto& b : slots_) b.fill(0);
  }

  Admission add(SeqId id, std::vector<int32_t> prompt, int32_t max_tokens) {
    Admission a = s_->add({id, prompt, max_tokens});
    if (a.ok()) requests_[id] = {std::move(prompt), max_tokens};
    return a;
  }

  // schedule -> fake forward -> update, with checks on the plan; returns the plan.
  StepPlan step() {
    running_before_.clear();
    for (const auto& [id, r] : requests_) {
      const Sequence* seq = s_->find(id);
      if (seq != nullptr && seq->status == SeqStatus::kRunning) running_before_.insert(id);
    }
    StepPlan plan = s_->schedule();
    check_plan(plan);
    restore_states(plan);
    std::vector<SeqOutput> outputs;
    for (int32_t i = 0; i < plan.num_seqs(); ++i) {
      const ScheduledSeq& sc = plan.seqs[i];
      write_kv(plan, i);
      if (s_->config().state_slots) advance_state(plan, i);
      if (!sc.needs_logits) continue;
      const int32_t token = sample(read_context(plan, i));
      outputs.push_back({sc.id, token, stop_ && stop_(token)});
      generated_[sc.id].push_back(token);
    }
    save_states(plan);
    for (SeqId id : plan.cancelled) cancelled_.insert(id);
    for (const FinishedSeq& f : s_->update(plan, outputs)) finished_[f.id] = f;
    s_->check_invariants();
    return plan;
  }

  // Steps until nothing is left (bounded).
  void drain(int32_t max_steps = 100000) {
    for (int32_t i = 0; i < max_steps && s_->has_work(); ++i) step();
    ASSERT_FALSE(s_->has_work());
  }

  // Every finished (not cancelled) sequence generated exactly the reference tokens.
  void expect_outputs_match_reference() const {
    for (const auto& [id, f] : finished_) {
      const auto& r = requests_.at(id);
      EXPECT_EQ(generated_.at(id), reference_output(r.prompt, r.max_tokens, stop_))
          << "sequence " << id;
      EXPECT_EQ(f.num_output_tokens, static_cast<int32_t>(generated_.at(id).size()));
    }
  }

  void set_stop(StopFn stop) { stop_ = std::move(stop); }
  int64_t num_restores() const { return num_restores_; }
  const std::map<SeqId, FinishedSeq>& finished() const { return finished_; }
  const std::set<SeqId>& cancelled() const { return cancelled_; }
  const std::vector<int32_t>& generated(SeqId id) { return generated_[id]; }

 private:
  struct Req {
    std::vector<int32_t> prompt;
    int32_t max_tokens;
  };

  void check_plan(const StepPlan& plan) {
    const SchedulerConfig& cfg = s_->config();
    EXPECT_LE(plan.num_tokens(), cfg.max_batch_tokens);
    EXPECT_LE(plan.num_seqs(), cfg.max_seqs);
    ASSERT_EQ(plan.qo_indptr.size(), plan.seqs.size() + 1);
    ASSERT_EQ(plan.kv_indptr.size(), plan.seqs.size() + 1);
    ASSERT_EQ(plan.kv_len.size(), plan.seqs.size());
    EXPECT_EQ(plan.positions.size(), plan.token_ids.size());
    // Decodes of running sequences come before any prompt chunk of them.
    bool seen_chunk = false;
    int32_t prompt_tokens = 0, last_prompt_slice = 0;
    std::set<SeqId> seen;
    int32_t num_logits = 0;
    for (int32_t i = 0; i < plan.num_seqs(); ++i) {
      const ScheduledSeq& sc = plan.seqs[i];
      EXPECT_TRUE(seen.insert(sc.id).second) << "sequence scheduled twice";
      const Sequence* seq = s_->find(sc.id);
      ASSERT_NE(seq, nullptr);
      EXPECT_EQ(plan.qo_indptr[i + 1] - plan.qo_indptr[i], sc.num_tokens);
      EXPECT_EQ(plan.kv_len[i], sc.first_token + sc.num_tokens);
      EXPECT_EQ(plan.kv_indptr[i + 1] - plan.kv_indptr[i],
                (plan.kv_len[i] + kBlockTokens - 1) / kBlockTokens);
      EXPECT_EQ(sc.needs_logits, sc.first_token + sc.num_tokens == seq->num_tokens());
      if (sc.needs_logits) {
        EXPECT_EQ(plan.logits_rows[num_logits++], plan.qo_indptr[i + 1] - 1);
      }
      const bool decode =
          running_before_.count(sc.id) != 0 && seq->num_tokens() - sc.first_token == 1;
      if (running_before_.count(sc.id) != 0) {
        EXPECT_FALSE(decode && seen_chunk) << "decode after a prompt chunk";
        seen_chunk = seen_chunk || !decode;
      }
      if (!decode) {
        prompt_tokens += sc.num_tokens;
        last_prompt_slice = sc.num_tokens;
      }
      for (int32_t r = plan.qo_indptr[i]; r < plan.qo_indptr[i + 1]; ++r) {
        EXPECT_EQ(plan.positions[r], sc.first_token + (r - plan.qo_indptr[i]));
        EXPECT_EQ(plan.token_ids[r], seq->tokens[plan.positions[r]]);
      }
    }
    EXPECT_EQ(num_logits, static_cast<int32_t>(plan.logits_rows.size()));
    // No prompt was taken after the step held step_prompt_tokens prompt tokens.
    if (cfg.step_prompt_tokens > 0) {
      EXPECT_LT(prompt_tokens - last_prompt_slice, cfg.step_prompt_tokens);
    }
    // A sequence preempted or cancelled in this step is not in it; a step that preempted
    // admits nobody new.
    for (SeqId id : plan.preempted) EXPECT_EQ(seen.count(id), 0u);
    for (SeqId id : plan.cancelled) EXPECT_EQ(seen.count(id), 0u);
    if (!plan.preempted.empty()) {
      for (SeqId id : seen) EXPECT_EQ(running_before_.count(id), 1u) << "admitted " << id;
    }
  }

  uint64_t& slot(const StepPlan& plan, int32_t i, int32_t pos) {
    const int32_t block = plan.kv_indices[plan.kv_indptr[i] + pos / kBlockTokens];
    return slots_[block][pos % kBlockTokens];
  }

  // Each row reads the value of the position before it through the block table (attention
  // over the cached prefix) and writes its own.
  void write_kv(const StepPlan& plan, int32_t i) {
    for (int32_t r = plan.qo_indptr[i]; r < plan.qo_indptr[i + 1]; ++r) {
      const int32_t pos = plan.positions[r];
      const int32_t block = plan.kv_indices[plan.kv_indptr[i] + pos / kBlockTokens];
      // Only a private block is ever written: shared and cached blocks are read-only.
      ASSERT_EQ(s_->kv().ref_count(block), 1);
      ASSERT_FALSE(s_->kv().is_cached(block));
      const uint64_t prev = pos == 0 ? kKvSeed : slot(plan, i, pos - 1);
      slot(plan, i, pos) = kv_value(prev, plan.token_ids[r]);
    }
  }

  // A recurrent state per slot, as a hybrid model keeps it: the chain of kv_value over every
  // token of the sequence, from the seed at position 0, on from what the slot holds
  // otherwise. It must end where the KV chain ends: a sequence given another's slot, or a
  // slot's stale state, does not.
  void advance_state(const StepPlan& plan, int32_t i) {
    const ScheduledSeq& sc = plan.seqs[i];
    ASSERT_EQ(plan.state_slots.size(), plan.seqs.size());
    ASSERT_EQ(plan.state_slots[i], sc.state_slot);
    ASSERT_GE(sc.state_slot, 0);
    uint64_t& st = states_[static_cast<size_t>(sc.state_slot)];
    if (sc.first_token == 0) st = kKvSeed;
    for (int32_t r = plan.qo_indptr[i]; r < plan.qo_indptr[i + 1]; ++r)
      st = kv_value(st, plan.token_ids[r]);
    EXPECT_EQ(st, slot(plan, i, sc.first_token + sc.num_tokens - 1)) << "sequence " << sc.id;
  }

  // Before the forward: each restore copies a snapshot into the slot of a sequence that resumes
  // after a cached prefix, which must be exactly the state the KV chain holds at the end of
  // that prefix (a snapshot of other tokens, or a stale one, is not).
  void restore_states(const StepPlan& plan) {
    const SchedulerConfig& cfg = s_->config();
    for (const StateCopy& c : plan.state_restores) {
      ASSERT_GE(c.src_slot, cfg.max_seqs);
      ASSERT_LT(c.src_slot, cfg.max_seqs + cfg.state_snapshots);
      int32_t i = 0;
      while (i < plan.num_seqs() && plan.seqs[i].state_slot != c.dst_slot) ++i;
      ASSERT_LT(i, plan.num_seqs()) << "a restore into a slot nobody runs in";
      const ScheduledSeq& sc = plan.seqs[i];
      ASSERT_GT(sc.first_token, 0);
      EXPECT_EQ(sc.first_token % (cfg.state_checkpoint_blocks * kBlockTokens), 0);
      states_[static_cast<size_t>(c.dst_slot)] = states_[static_cast<size_t>(c.src_slot)];
      EXPECT_EQ(states_[static_cast<size_t>(c.dst_slot)], slot(plan, i, sc.first_token - 1))
          << "sequence " << sc.id << " restored a wrong state";
      ++num_restores_;
    }
  }

  // After the forward: each save copies the slot of a sequence whose slice ended at a
  // checkpoint into its snapshot slot.
  void save_states(const StepPlan& plan) {
    const SchedulerConfig& cfg = s_->config();
    size_t num_saves = 0;
    for (const ScheduledSeq& sc : plan.seqs) {
      if (sc.save_slot < 0) continue;
      ASSERT_LT(num_saves, plan.state_saves.size());
      const StateCopy& c = plan.state_saves[num_saves++];
      EXPECT_EQ(c.src_slot, sc.state_slot);
      EXPECT_EQ(c.dst_slot, sc.save_slot);
      EXPECT_GE(c.dst_slot, cfg.max_seqs);
      EXPECT_LE(sc.first_token + sc.num_tokens, s_->find(sc.id)->num_prompt_tokens);
      EXPECT_EQ((sc.first_token + sc.num_tokens) % (cfg.state_checkpoint_blocks * kBlockTokens), 0);
      states_[static_cast<size_t>(c.dst_slot)] = states_[static_cast<size_t>(c.src_slot)];
    }
    EXPECT_EQ(num_saves, plan.state_saves.size());
  }

  std::vector<uint64_t> read_context(const StepPlan& plan, int32_t i) {
    std::vector<uint64_t> kv;
    for (int32_t pos = 0; pos < plan.kv_len[i]; ++pos) kv.push_back(slot(plan, i, pos));
    return kv;
  }

  Scheduler* s_;
  std::vector<std::array<uint64_t, kBlockTokens>> slots_;  // the fake KV: [num_blocks][16]
  std::vector<uint64_t> states_;  // the fake recurrent state: [max_seqs + state_snapshots]
  int64_t num_restores_ = 0;
  std::map<SeqId, Req> requests_;
  std::map<SeqId, std::vector<int32_t>> generated_;
  std::map<SeqId, FinishedSeq> finished_;
  std::set<SeqId> cancelled_;
  std::set<SeqId> running_before_;  // running when schedule() was called
  StopFn stop_;
};

SchedulerConfig config(int32_t max_batch_tokens, int32_t num_blocks, int32_t max_seqs = 16) {
  SchedulerConfig c;
  c.max_batch_tokens = max_batch_tokens;
  c.num_blocks = num_blocks;
  c.max_seqs = max_seqs;
  c.max_context = 4096;
  c.max_waiting = 64;
  return c;
}

std::vector<SeqId> ids_of(const StepPlan& plan) {
  std::vector<SeqId> ids;
  for (const ScheduledSeq& s : plan.seqs) ids.push_back(s.id);
  return ids;
}

TEST(Scheduler, ValidateNamesTheBadField) {
  EXPECT_TRUE(validate(SchedulerConfig{}).ok());
  SchedulerConfig c;
  c.max_seqs = 0;
  ASSERT_FALSE(validate(c).ok());
  EXPECT_NE(validate(c).error().message.find("max_seqs"), std::string::npos);
  c = SchedulerConfig{};
  c.max_batch_tokens = 0;
  ASSERT_FALSE(validate(c).ok());
  EXPECT_NE(validate(c).error().message.find("max_batch_tokens"), std::string::npos);
  c = SchedulerConfig{};
  c.max_waiting = -1;
  EXPECT_FALSE(validate(c).ok());
  c = SchedulerConfig{};
  c.state_checkpoint_blocks = 0;
  ASSERT_FALSE(validate(c).ok());
  EXPECT_NE(validate(c).error().message.find("state_checkpoint_blocks"), std::string::npos);
  c = SchedulerConfig{};
  c.state_snapshots = -1;
  EXPECT_FALSE(validate(c).ok());
}

TEST(Scheduler, AdmissionErrorsComeBeforeAnyWork) {
  SchedulerConfig cfg = config(64, 100);
  cfg.max_context = 64;
  cfg.max_waiting = 2;
  cfg.max_seqs = 1;
  Scheduler s(cfg);
  Admission a = s.add({1, iota_tokens(0, 60), 5});
  EXPECT_EQ(a.code, AdmitErrc::kContextLengthExceeded);
  EXPECT_STREQ(admit_errc_name(a.code), "context_length_exceeded");
  EXPECT_THAT(a.message, ::testing::HasSubstr("maximum context length is 64 tokens"));
  EXPECT_THAT(a.message, ::testing::HasSubstr("65 tokens (60 in the prompt, 5 for"));
  EXPECT_FALSE(s.has_work());
  EXPECT_TRUE(s.add({1, iota_tokens(0, 60), 4}).ok());
  EXPECT_EQ(s.add({1, {1}, 1}).code, AdmitErrc::kInvalidRequest);  // duplicate id
  EXPECT_EQ(s.add({2, {}, 1}).code, AdmitErrc::kInvalidRequest);
  EXPECT_EQ(s.add({2, {1}, 0}).code, AdmitErrc::kInvalidRequest);
  EXPECT_TRUE(s.add({2, {1}, 1}).ok());
  const Admission full = s.add({3, {1}, 1});
  EXPECT_EQ(full.code, AdmitErrc::kQueueFull);
  EXPECT_STREQ(admit_errc_name(full.code), "queue_full");
  EXPECT_EQ(s.num_waiting(), 2);
  // Once the queue moves, there is room again.
  FakeEngine e(&s);
  e.step();
  EXPECT_EQ(s.num_waiting(), 1);  // max_seqs = 1: 2 waits
  EXPECT_TRUE(s.add({3, {1}, 1}).ok());
  e.drain();
  EXPECT_EQ(s.kv().num_free_blocks(), 100);
}

TEST(Scheduler, ASequenceMustFitInTheKvPoolAlone) {
  Scheduler s(config(64, 2));  // 32 tokens of KV
  const Admission a = s.add({1, iota_tokens(0, 30), 3});
  EXPECT_EQ(a.code, AdmitErrc::kContextLengthExceeded);
  EXPECT_THAT(a.message, ::testing::HasSubstr("is 32 tokens"));
  EXPECT_TRUE(s.add({1, iota_tokens(0, 30), 2}).ok());
}

TEST(Scheduler, PlanIsFlatWithCsrMetadata) {
  Scheduler s(config(100, 16));
  FakeEngine e(&s);
  ASSERT_TRUE(e.add(1, iota_tokens(1000, 20), 4).ok());
  ASSERT_TRUE(e.add(2, iota_tokens(2000, 5), 4).ok());
  StepPlan p = e.step();
  ASSERT_THAT(ids_of(p), ElementsAre(1, 2));
  EXPECT_EQ(p.seqs[0].first_token, 0);
  EXPECT_EQ(p.seqs[0].num_tokens, 20);
  EXPECT_TRUE(p.seqs[0].needs_logits && p.seqs[1].needs_logits);
  EXPECT_EQ(p.token_ids, concat(iota_tokens(1000, 20), iota_tokens(2000, 5)));
  EXPECT_EQ(p.positions, concat(iota_tokens(0, 20), iota_tokens(0, 5)));
  EXPECT_THAT(p.qo_indptr, ElementsAre(0, 20, 25));
  EXPECT_THAT(p.kv_indptr, ElementsAre(0, 2, 3));
  EXPECT_THAT(p.kv_indices, ElementsAre(0, 1, 2));
  EXPECT_THAT(p.kv_len, ElementsAre(20, 5));
  EXPECT_THAT(p.logits_rows, ElementsAre(19, 24));
  const backend::AttnBatch b = p.attn_batch();
  EXPECT_EQ(b.num_seqs, 2);
  EXPECT_EQ(b.kv_indices[2], 2);
  EXPECT_EQ(b.positions[24], 4);
  // The next step is one decode token each, reading 21 and 6 tokens of KV.
  p = e.step();
  EXPECT_THAT(p.positions, ElementsAre(20, 5));
  EXPECT_THAT(p.token_ids, ElementsAre(e.generated(1)[0], e.generated(2)[0]));
  EXPECT_THAT(p.kv_len, ElementsAre(21, 6));
  EXPECT_THAT(p.kv_indices, ElementsAre(0, 1, 2));
  EXPECT_EQ(s.find(1)->num_computed_tokens, 21);
  e.drain();
  e.expect_outputs_match_reference();
  EXPECT_EQ(e.finished().at(1).reason, SeqFinishReason::kLength);
  EXPECT_EQ(s.kv().num_free_blocks(), 16);
}

TEST(Scheduler, LongPromptIsChunkedWhileAnotherKeepsDecodingEveryStep) {
  Scheduler s(config(32, 64));
  FakeEngine e(&s);
  ASSERT_TRUE(e.add(1, iota_tokens(0, 8), 40).ok());
  e.step();  // 1's prompt
  ASSERT_TRUE(e.add(2, iota_tokens(500, 100), 5).ok());
  std::vector<int32_t> chunk_starts;
  for (int step = 0; step < 4; ++step) {
    const StepPlan p = e.step();
    ASSERT_THAT(ids_of(p), ElementsAre(1, 2));
    EXPECT_EQ(p.seqs[0].num_tokens, 1);  // the decode first
    EXPECT_TRUE(p.seqs[0].needs_logits);
    chunk_starts.push_back(p.seqs[1].first_token);
    EXPECT_EQ(p.seqs[1].needs_logits, step == 3);  // only the last chunk samples
    EXPECT_EQ(p.num_tokens(), step < 3 ? 32 : 1 + 7);
  }
  EXPECT_THAT(chunk_starts, ElementsAre(0, 31, 62, 93));
  EXPECT_EQ(e.generated(1).size(), 5u);  // one token per step, prompt chunks or not
  EXPECT_EQ(e.generated(2).size(), 1u);
  e.drain();
  e.expect_outputs_match_reference();
  EXPECT_EQ(s.kv().num_free_blocks(), 64);
}

// With step_prompt_tokens, prompts that arrive together finish prefill a few per step (each
// samples its first token as soon as its own prefill is done) instead of all in one step; a
// prompt once taken still gets its whole chunk of the budget.
TEST(Scheduler, StepPromptTokensLetPromptsArrivingTogetherSampleInTurn) {
  SchedulerConfig cfg = config(512, 64);
  cfg.step_prompt_tokens = 64;
  Scheduler s(cfg);
  FakeEngine e(&s);
  for (SeqId id = 1; id <= 6; ++id) ASSERT_TRUE(e.add(id, iota_tokens(100 * id, 37), 4).ok());
  StepPlan p = e.step();
  EXPECT_THAT(ids_of(p), ElementsAre(1, 2));  // 74 prompt tokens >= 64: no third
  EXPECT_EQ(p.logits_rows.size(), 2u);
  p = e.step();
  EXPECT_THAT(ids_of(p), ElementsAre(1, 2, 3, 4));  // the decodes, then two more prompts
  EXPECT_EQ(p.num_tokens(), 2 + 74);
  p = e.step();
  EXPECT_THAT(ids_of(p), ElementsAre(1, 2, 3, 4, 5, 6));
  e.drain();
  e.expect_outputs_match_reference();

  // A long prompt takes its whole chunk; the short one behind it waits one step.
  ASSERT_TRUE(e.add(7, iota_tokens(7000, 300), 2).ok());
  ASSERT_TRUE(e.add(8, iota_tokens(8000, 10), 2).ok());
  p = e.step();
  ASSERT_THAT(ids_of(p), ElementsAre(7));
  EXPECT_EQ(p.num_tokens(), 300);
  p = e.step();
  EXPECT_THAT(ids_of(p), ElementsAre(7, 8));
  e.drain();
  e.expect_outputs_match_reference();

  // 0 (the SchedulerConfig default): prompts fill the budget.
  cfg.step_prompt_tokens = 0;
  Scheduler all(cfg);
  FakeEngine f(&all);
  for (SeqId id = 1; id <= 6; ++id) ASSERT_TRUE(f.add(id, iota_tokens(100 * id, 37), 4).ok());
  EXPECT_EQ(f.step().num_seqs(), 6);
}

TEST(Scheduler, AdmitsFirstComeFirstServedUnderTheSequenceCap) {
  Scheduler s(config(100, 64, /*max_seqs=*/2));
  FakeEngine e(&s);
  ASSERT_TRUE(e.add(1, iota_tokens(0, 5), 2).ok());
  ASSERT_TRUE(e.add(2, iota_tokens(100, 5), 10).ok());
  ASSERT_TRUE(e.add(3, iota_tokens(200, 5), 10).ok());
  ASSERT_TRUE(e.add(4, iota_tokens(300, 5), 10).ok());
  EXPECT_THAT(ids_of(e.step()), ElementsAre(1, 2));
  EXPECT_EQ(s.num_waiting(), 2);
  EXPECT_THAT(ids_of(e.step()), ElementsAre(1, 2));  // 1 reaches max_tokens = 2
  EXPECT_EQ(e.finished().count(1), 1u);
  EXPECT_THAT(ids_of(e.step()), ElementsAre(2, 3));  // 3 before 4
  EXPECT_EQ(s.find(4)->status, SeqStatus::kWaiting);
  e.drain();
  e.expect_outputs_match_reference();
}

TEST(Scheduler, TheHeadOfTheQueueWaitsForBlocksAndNobodyJumpsIt) {
  Scheduler s(config(200, 8));  // 128 tokens of KV
  FakeEngine e(&s);
  ASSERT_TRUE(e.add(1, iota_tokens(0, 70), 20).ok());  // 5 blocks
  e.step();
  ASSERT_TRUE(e.add(2, iota_tokens(100, 60), 10).ok());  // needs 4 blocks, 3 are free
  ASSERT_TRUE(e.add(3, iota_tokens(200, 5), 2).ok());    // would fit, but 2 is first
  for (int i = 0; i < 5; ++i) EXPECT_THAT(ids_of(e.step()), ElementsAre(1));
  EXPECT_EQ(s.num_waiting(), 2);
  e.drain();
  e.expect_outputs_match_reference();
  EXPECT_EQ(s.kv().num_free_blocks(), 8);
}

TEST(Scheduler, PreemptsTheNewestWhenBlocksRunOutAndItResumesWithTheSameTokens) {
  Scheduler s(config(256, 10));  // 160 tokens of KV; each sequence reaches 7 blocks
  FakeEngine e(&s);
  ASSERT_TRUE(e.add(1, iota_tokens(0, 40), 60).ok());
  ASSERT_TRUE(e.add(2, iota_tokens(1000, 40), 60).ok());
  std::vector<SeqId> preempted;
  int32_t resume_first_token = -1;
  for (int i = 0; i < 400 && s.has_work(); ++i) {
    const bool was_preempted = s.find(2) && s.find(2)->status == SeqStatus::kPreempted;
    const StepPlan p = e.step();
    preempted.insert(preempted.end(), p.preempted.begin(), p.preempted.end());
    if (was_preempted && resume_first_token < 0) {
      for (const ScheduledSeq& sc : p.seqs) {
        if (sc.id == 2) resume_first_token = sc.first_token;
      }
    }
  }
  EXPECT_FALSE(s.has_work());
  ASSERT_FALSE(preempted.empty());
  EXPECT_EQ(preempted[0], 2);  // the newest, never the oldest
  EXPECT_EQ(std::count(preempted.begin(), preempted.end(), 1), 0);
  EXPECT_EQ(s.stats().num_preemptions, static_cast<int64_t>(preempted.size()));
  // 2 had computed 80 tokens (5 blocks). Released tail first, its last two blocks were
  // evicted for 1's growth; the first three came back from the prefix cache.
  EXPECT_EQ(resume_first_token, 48);
  EXPECT_EQ(e.finished().size(), 2u);
  EXPECT_EQ(e.generated(2).size(), 60u);
  e.expect_outputs_match_reference();
  EXPECT_EQ(s.kv().num_free_blocks(), 10);
}

TEST(Scheduler, SecondRequestReusesTheCachedPrefixAndSharesItsBlocks) {
  Scheduler s(config(256, 32));
  FakeEngine e(&s);
  const auto prefix = iota_tokens(5000, 64);
  ASSERT_TRUE(e.add(1, concat(prefix, iota_tokens(0, 6)), 3).ok());
  e.drain();
  ASSERT_TRUE(e.add(2, concat(prefix, iota_tokens(50, 10)), 30).ok());
  StepPlan p = e.step();
  ASSERT_THAT(ids_of(p), ElementsAre(2));
  EXPECT_EQ(p.seqs[0].first_token, 64);  // only the suffix is prefilled
  EXPECT_EQ(p.seqs[0].num_tokens, 10);
  EXPECT_EQ(s.find(2)->num_cached_prompt_tokens, 64);
  // 1's four cached blocks, then 1's private partial block: reused first, it had no identity.
  EXPECT_THAT(p.kv_indices, ElementsAre(0, 1, 2, 3, 4));
  // A third request with the same prefix shares the blocks with the running second one.
  ASSERT_TRUE(e.add(3, concat(prefix, iota_tokens(70, 3)), 2).ok());
  p = e.step();
  EXPECT_EQ(p.seqs[1].id, 3);
  EXPECT_EQ(p.seqs[1].first_token, 64);
  for (int32_t b : {0, 1, 2, 3}) EXPECT_EQ(s.kv().ref_count(b), 2);
  EXPECT_EQ(s.kv().debug_string(),
            "blocks: 32 total, 6 used, 26 free, 4 cached\n"
            "cached:\n"
            "  #0 ref=2 [5000 5001 5002 .. 5015]\n"
            "    #1 ref=2 [5016 5017 5018 .. 5031]\n"
            "      #2 ref=2 [5032 5033 5034 .. 5047]\n"
            "        #3 ref=2 [5048 5049 5050 .. 5063]\n"
            "private in use: #4(ref=1) #5(ref=1)\n"
            "free (evict first): 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 "
            "27 28 29 30 31\n");
  EXPECT_EQ(s.stats().num_prompt_tokens, 70 + 74 + 67);
  EXPECT_EQ(s.stats().num_cached_prompt_tokens, 64 + 64);
  e.drain();
  e.expect_outputs_match_reference();
  EXPECT_EQ(e.finished().at(3).num_cached_prompt_tokens, 64);
  EXPECT_EQ(s.kv().num_free_blocks(), 32);
}

TEST(Scheduler, AFullyCachedPromptStillComputesItsLastBlock) {
  Scheduler s(config(256, 16));
  FakeEngine e(&s);
  const auto prompt = iota_tokens(0, 64);
  ASSERT_TRUE(e.add(1, prompt, 1).ok());
  e.drain();
  ASSERT_TRUE(e.add(2, prompt, 1).ok());
  const StepPlan p = e.step();
  ASSERT_EQ(p.num_seqs(), 1);
  EXPECT_EQ(p.seqs[0].first_token, 48);
  EXPECT_EQ(p.seqs[0].num_tokens, 16);
  EXPECT_TRUE(p.seqs[0].needs_logits);
  EXPECT_EQ(e.finished().at(2).num_cached_prompt_tokens, 48);
  e.expect_outputs_match_reference();
  EXPECT_EQ(e.generated(1), e.generated(2));  // the cache is transparent
}

// Embed requests (the engine's GenerationRequest::embed): a prefill-only request's context
// check counts its prompt alone, and one that may not reuse a prefix (mean / CLS pooling need
// every row) computes every token even when the cache holds its blocks.
TEST(Scheduler, PrefillOnlyAndNoPrefixReuse) {
  SchedulerConfig cfg = config(256, 32);
  cfg.max_context = 64;
  Scheduler s(cfg);
  Request whole{1, iota_tokens(0, 64), 1};
  whole.prefill_only = true;
  EXPECT_TRUE(s.add(whole).ok());
  EXPECT_EQ(s.add({2, iota_tokens(0, 64), 1}).code, AdmitErrc::kContextLengthExceeded);
  StepPlan p = s.schedule();
  ASSERT_EQ(p.num_seqs(), 1);
  EXPECT_EQ(p.seqs[0].num_tokens, 64);
  EXPECT_TRUE(p.seqs[0].needs_logits);
  const std::vector<SeqOutput> stop1 = {{1, 0, true}};
  auto fin = s.update(p, stop1);
  ASSERT_EQ(fin.size(), 1u);
  EXPECT_EQ(fin[0].reason, SeqFinishReason::kStop);
  s.check_invariants();
  // Its full blocks are cached now: a request that may reuse them starts at 48 (the last
  // block is always computed), one that may not starts at 0.
  Request reuse{3, iota_tokens(0, 64), 1};
  reuse.prefill_only = true;
  Request fresh{4, iota_tokens(0, 64), 1};
  fresh.prefill_only = true;
  fresh.reuse_prefix = false;
  ASSERT_TRUE(s.add(reuse).ok());
  ASSERT_TRUE(s.add(fresh).ok());
  p = s.schedule();
  ASSERT_THAT(ids_of(p), ElementsAre(3, 4));
  EXPECT_EQ(p.seqs[0].first_token, 48);
  EXPECT_EQ(p.seqs[1].first_token, 0);
  EXPECT_EQ(p.seqs[1].num_tokens, 64);
  EXPECT_EQ(s.find(4)->num_cached_prompt_tokens, 0);
  const std::vector<SeqOutput> stops = {{3, 0, true}, {4, 0, true}};
  EXPECT_EQ(s.update(p, stops).size(), 2u);
  s.check_invariants();
  EXPECT_EQ(s.kv().num_free_blocks(), 32);
}

// Encoder inputs (whole_prompt) are never split: one longer than a step is refused at add();
// one that does not fit in what is left of a step waits whole for the next, and nobody behind
// it jumps the queue; a cached prefix is never reused for them.
TEST(Scheduler, WholePromptsAreNeverChunked) {
  SchedulerConfig cfg = config(/*max_batch_tokens=*/64, 32);
  Scheduler s(cfg);
  auto whole = [](SeqId id, int32_t n) {
    Request r{id, iota_tokens(static_cast<int32_t>(id) * 1000, n), 1};
    r.prefill_only = true;
    r.whole_prompt = true;
    return r;
  };
  EXPECT_EQ(s.add(whole(9, 65)).code, AdmitErrc::kContextLengthExceeded);
  ASSERT_TRUE(s.add(whole(1, 40)).ok());
  ASSERT_TRUE(s.add(whole(2, 40)).ok());  // 24 tokens left in the step: waits whole
  ASSERT_TRUE(s.add(whole(3, 8)).ok());   // would fit, but stays behind 2
  StepPlan p = s.schedule();
  ASSERT_THAT(ids_of(p), ElementsAre(1));
  EXPECT_EQ(p.seqs[0].num_tokens, 40);
  EXPECT_EQ(s.update(p, std::vector<SeqOutput>{{1, 0, true}}).size(), 1u);
  p = s.schedule();
  ASSERT_THAT(ids_of(p), ElementsAre(2, 3));
  EXPECT_EQ(p.seqs[0].num_tokens, 40);
  EXPECT_EQ(p.seqs[1].num_tokens, 8);
  EXPECT_EQ(s.update(p, std::vector<SeqOutput>{{2, 0, true}, {3, 0, true}}).size(), 2u);
  // The same 40 tokens again: their full blocks are cached, but an encoder computes them all.
  Request again = whole(1, 40);
  again.id = 4;
  ASSERT_TRUE(s.add(again).ok());
  p = s.schedule();
  ASSERT_THAT(ids_of(p), ElementsAre(4));
  EXPECT_EQ(p.seqs[0].first_token, 0);
  EXPECT_EQ(p.seqs[0].num_tokens, 40);
  s.check_invariants();
}

TEST(Scheduler, CancellationFreesBlocksAtTheNextStep) {
  Scheduler s(config(256, 32, /*max_seqs=*/2));
  FakeEngine e(&s);
  ASSERT_TRUE(e.add(1, iota_tokens(0, 40), 50).ok());
  ASSERT_TRUE(e.add(2, iota_tokens(100, 40), 50).ok());
  ASSERT_TRUE(e.add(3, iota_tokens(200, 40), 50).ok());  // waits: max_seqs
  e.step();
  EXPECT_EQ(s.kv().num_used_blocks(), 6);
  EXPECT_TRUE(s.cancel(1));
  EXPECT_TRUE(s.cancel(3));
  EXPECT_FALSE(s.cancel(99));
  EXPECT_EQ(s.kv().num_used_blocks(), 6);  // nothing happens until the next step
  StepPlan p = e.step();
  EXPECT_THAT(p.cancelled, ElementsAre(1, 3));
  EXPECT_THAT(ids_of(p), ElementsAre(2));
  EXPECT_EQ(s.find(1), nullptr);
  EXPECT_EQ(s.num_waiting(), 0);
  EXPECT_EQ(s.kv().num_used_blocks(), 3);
  // Cancelled between schedule and update: the step completes, the next one frees it.
  p = s.schedule();
  EXPECT_TRUE(s.cancel(2));
  ASSERT_TRUE(p.seqs[0].needs_logits);
  EXPECT_THAT(s.update(p, std::vector<SeqOutput>{{2, 7, false}}), IsEmpty());
  p = e.step();
  EXPECT_THAT(p.cancelled, ElementsAre(2));
  EXPECT_TRUE(p.empty());
  EXPECT_FALSE(s.has_work());
  EXPECT_EQ(s.kv().num_free_blocks(), 32);
}

TEST(Scheduler, StopFlagFinishesASequence) {
  Scheduler s(config(64, 16));
  FakeEngine e(&s);
  int32_t num_seen = 0;
  e.set_stop([&num_seen](int32_t) { return ++num_seen == 3; });
  ASSERT_TRUE(e.add(1, iota_tokens(0, 10), 50).ok());
  e.drain();
  ASSERT_EQ(e.finished().count(1), 1u);
  EXPECT_EQ(e.finished().at(1).reason, SeqFinishReason::kStop);
  EXPECT_EQ(e.finished().at(1).num_output_tokens, 3);
  EXPECT_STREQ(finish_reason_name(SeqFinishReason::kStop), "stop");
}

// Thousands of steps of random arrivals, lengths and cancellations on a small pool, with
// prompts drawn from a few shared prefixes: invariants after every step, the fake engine's
// checks on every plan, reference outputs for every finished sequence, and an empty pool at
// the end.
// A hash with collisions everywhere: 8 values. The exact hit check must make it harmless.
uint64_t colliding_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t sum = parent;
  for (int32_t t : tokens) sum += static_cast<uint32_t>(t) % 3;
  return sum % 8;
}

void soak(bool enable_prefix_cache, uint32_t seed, kv::BlockHashFn hash = kv::hash_block,
          bool state_slots = false, int32_t state_snapshots = 0) {
  SchedulerConfig cfg = config(48, 24, /*max_seqs=*/6);
  cfg.state_slots = state_slots;
  // Checkpoints every 32 tokens: the shared 96-token prefixes below hold three. Fewer
  // snapshot slots than sequences: some saves find every slot reserved, most evict.
  cfg.state_checkpoint_blocks = 2;
  cfg.state_snapshots = state_snapshots;
  cfg.max_waiting = 10;
  cfg.max_context = 300;
  cfg.enable_prefix_cache = enable_prefix_cache;
  cfg.block_hash = hash;
  cfg.step_prompt_tokens = seed % 2 == 0 ? 20 : 0;
  Scheduler s(cfg);
  FakeEngine e(&s);
  e.set_stop([](int32_t t) { return t % 50 == 0; });
  std::mt19937 rng(seed);
  auto uniform = [&rng](int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
  };
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 4; ++i) prefixes.push_back(iota_tokens(10000 * (i + 1), 96));
  SeqId next_id = 1;
  int32_t num_rejected = 0;
  for (int step = 0; step < 3000; ++step) {
    if (uniform(0, 2) == 0) {
      std::vector<int32_t> prompt;
      const int32_t kind = uniform(0, 2);
      if (kind == 0) {  // a shared prefix, cut anywhere
        const auto& p = prefixes[uniform(0, 3)];
        prompt.assign(p.begin(), p.begin() + uniform(1, 96));
      } else if (kind == 1) {  // equal blocks after different prefixes
        for (int32_t i = uniform(1, 5); i > 0; --i) {
          const int32_t first = 100 * uniform(1, 3);
          for (int32_t t = 0; t < kBlockTokens; ++t) prompt.push_back(first + t);
        }
      }
      const int32_t num_own = uniform(prompt.empty() ? 1 : 0, 60);
      for (int32_t i = 0; i < num_own; ++i) prompt.push_back(uniform(0, 999));
      const Admission a = e.add(next_id++, prompt, uniform(1, 60));
      if (!a.ok()) {
        ++num_rejected;
        EXPECT_TRUE(a.code == AdmitErrc::kQueueFull || a.code == AdmitErrc::kContextLengthExceeded);
      }
    }
    if (uniform(0, 30) == 0 && next_id > 1) s.cancel(uniform(1, static_cast<int32_t>(next_id)));
    e.step();
  }
  e.drain();
  EXPECT_GT(e.finished().size(), 300u);
  EXPECT_GT(num_rejected, 0);
  EXPECT_GT(s.stats().num_preemptions, 0);
  const bool reuse = enable_prefix_cache && (!state_slots || state_snapshots > 0);
  if (reuse) {
    EXPECT_GT(s.stats().num_cached_prompt_tokens, 0);
  } else {
    EXPECT_EQ(s.stats().num_cached_prompt_tokens, 0);
  }
  if (reuse && state_slots) {  // every reuse resumed an exact state (FakeEngine::restore_states)
    EXPECT_GT(s.stats().num_state_saves, 0);
    EXPECT_EQ(e.num_restores(), s.stats().num_state_restores);
    EXPECT_GT(e.num_restores(), 20);
  } else {
    EXPECT_EQ(s.stats().num_state_saves + s.stats().num_state_restores, 0);
  }
  e.expect_outputs_match_reference();
  EXPECT_EQ(s.kv().num_free_blocks(), cfg.num_blocks);
  EXPECT_EQ(s.kv().num_used_blocks(), 0);
  EXPECT_EQ(s.num_used_state_slots(), 0);
  EXPECT_EQ(s.snapshots().num_reserved(), 0);
  EXPECT_LE(s.snapshots().num_published(), state_snapshots);
}

TEST(Scheduler, RandomizedSoakWithPrefixCache) {
  soak(true, 1);
  soak(true, 2);
}

TEST(Scheduler, RandomizedSoakWithoutPrefixCache) {
  soak(false, 3);
}

TEST(Scheduler, RandomizedSoakWithACollidingHash) {
  soak(true, 4, colliding_hash);
}

// Hybrid models: preemptions, cancellations and finishes hand every recurrent-state slot back
// (the pool's counter back to zero), a sequence always continues its own state, and without
// snapshot slots the prefix cache stays off even when asked for.
TEST(Scheduler, RandomizedSoakWithRecurrentStateSlots) {
  soak(true, 5, kv::hash_block, /*state_slots=*/true);
  soak(false, 6, kv::hash_block, /*state_slots=*/true);
}

// With snapshots: shared prefixes hit, every hit resumes exactly the state its prefix ends in
// (checked at each restore), preempted sequences resume from their own snapshots, and no
// save is left reserved.
TEST(Scheduler, RandomizedSoakWithStateSnapshots) {
  soak(true, 7, kv::hash_block, /*state_slots=*/true, /*state_snapshots=*/4);
  soak(true, 8, kv::hash_block, /*state_slots=*/true, /*state_snapshots=*/12);
  soak(false, 9, kv::hash_block, /*state_slots=*/true, /*state_snapshots=*/4);
}

TEST(Scheduler, RandomizedSoakWithStateSnapshotsAndACollidingHash) {
  soak(true, 10, colliding_hash, /*state_slots=*/true, /*state_snapshots=*/6);
}

SchedulerConfig snapshot_config(kv::BlockHashFn hash = kv::hash_block) {
  SchedulerConfig cfg = config(48, 64, /*max_seqs=*/4);
  cfg.state_slots = true;
  cfg.state_checkpoint_blocks = 2;  // every 32 tokens
  cfg.state_snapshots = 4;          // slots 4 .. 7
  cfg.block_hash = hash;
  return cfg;
}

TEST(Scheduler, PromptChunksEndAtCheckpointsWhichSaveTheState) {
  Scheduler s(snapshot_config());
  FakeEngine e(&s);
  ASSERT_TRUE(e.add(1, iota_tokens(1000, 100), 1).ok());
  // 48-token budget: each chunk ends at the last checkpoint it reaches, then the tail.
  std::vector<std::pair<int32_t, int32_t>> slices;
  std::vector<int32_t> saved_to;
  while (s.has_work()) {
    const StepPlan p = e.step();
    ASSERT_EQ(p.num_seqs(), 1);
    slices.emplace_back(p.seqs[0].first_token, p.seqs[0].num_tokens);
    for (const StateCopy& c : p.state_saves) {
      EXPECT_EQ(c.src_slot, p.seqs[0].state_slot);
      saved_to.push_back(c.dst_slot);
    }
    EXPECT_THAT(p.state_restores, IsEmpty());
  }
  EXPECT_EQ(slices,
            (std::vector<std::pair<int32_t, int32_t>>{{0, 32}, {32, 32}, {64, 32}, {96, 4}}));
  EXPECT_THAT(saved_to, ElementsAre(4, 5, 6));
  EXPECT_EQ(s.stats().num_state_saves, 3);
  EXPECT_EQ(s.snapshots().num_published(), 3);
}

TEST(Scheduler, AdmissionResumesFromTheLongestCachedPrefixWithASnapshot) {
  Scheduler s(snapshot_config());
  FakeEngine e(&s);
  const auto a = iota_tokens(1000, 100);
  ASSERT_TRUE(e.add(1, a, 1).ok());
  e.drain();  // snapshots after 32, 64 and 96 tokens
  // The whole of a's 6 cached blocks: resumes after 96 tokens, from the last snapshot.
  ASSERT_TRUE(e.add(2, concat(a, iota_tokens(5000, 20)), 2).ok());
  StepPlan p = e.step();
  ASSERT_EQ(p.num_seqs(), 1);
  EXPECT_EQ(p.seqs[0].first_token, 96);
  ASSERT_EQ(p.state_restores.size(), 1u);
  EXPECT_EQ(p.state_restores[0].src_slot, 6);
  EXPECT_EQ(p.state_restores[0].dst_slot, p.seqs[0].state_slot);
  e.drain();
  // 80 tokens of a (5 cached blocks): the hit is cut back to the checkpoint at 64.
  ASSERT_TRUE(
      e.add(3, concat(std::vector<int32_t>(a.begin(), a.begin() + 80), iota_tokens(7000, 30)), 1)
          .ok());
  p = e.step();
  EXPECT_EQ(p.seqs[0].first_token, 64);
  ASSERT_EQ(p.state_restores.size(), 1u);
  EXPECT_EQ(p.state_restores[0].src_slot, 5);
  e.drain();
  // Less than the first checkpoint in common: a fresh start.
  ASSERT_TRUE(
      e.add(4, concat(std::vector<int32_t>(a.begin(), a.begin() + 20), iota_tokens(9000, 30)), 1)
          .ok());
  p = e.step();
  EXPECT_EQ(p.seqs[0].first_token, 0);
  EXPECT_THAT(p.state_restores, IsEmpty());
  e.drain();
  EXPECT_EQ(s.find(2), nullptr);
  EXPECT_EQ(e.finished().at(2).num_cached_prompt_tokens, 96);
  EXPECT_EQ(e.finished().at(3).num_cached_prompt_tokens, 64);
  EXPECT_EQ(e.finished().at(4).num_cached_prompt_tokens, 0);
  EXPECT_EQ(s.stats().num_state_restores, 2);
  e.expect_outputs_match_reference();
}

// One snapshot slot: a step restores from it and, its chunk ending at the next checkpoint,
// saves into it again (the LRU one). Restores before the forward, saves after it: both exact.
TEST(Scheduler, ASaveMayTakeOverTheSnapshotItsOwnStepRestores) {
  SchedulerConfig cfg = snapshot_config();
  cfg.state_snapshots = 1;
  Scheduler s(cfg);
  FakeEngine e(&s);
  const auto a = iota_tokens(1000, 40);
  ASSERT_TRUE(e.add(1, a, 1).ok());
  e.drain();
  const auto b = concat(std::vector<int32_t>(a.begin(), a.begin() + 32), iota_tokens(2000, 40));
  ASSERT_TRUE(e.add(2, b, 1).ok());
  const StepPlan p = e.step();
  ASSERT_EQ(p.num_seqs(), 1);
  EXPECT_EQ(p.seqs[0].first_token, 32);
  EXPECT_EQ(p.seqs[0].num_tokens, 32);  // cut at the checkpoint after 64 tokens
  ASSERT_EQ(p.state_restores.size(), 1u);
  ASSERT_EQ(p.state_saves.size(), 1u);
  EXPECT_EQ(p.state_restores[0].src_slot, 4);
  EXPECT_EQ(p.state_saves[0].dst_slot, 4);
  e.drain();
  ASSERT_TRUE(
      e.add(3, concat(std::vector<int32_t>(b.begin(), b.begin() + 64), iota_tokens(50, 9)), 1)
          .ok());
  EXPECT_EQ(e.step().seqs[0].first_token, 64);  // FakeEngine: the restored state is b's at 64
  e.drain();
  EXPECT_EQ(e.num_restores(), 2);
  e.expect_outputs_match_reference();
}

// Equal hashes everywhere along two prompts of different tokens: the second finds no hit
// (the prefix cache's exact check), so it never resumes from the first one's snapshot, and
// its own checkpoint block, left private by the collision, publishes none.
TEST(Scheduler, ACollidingHashNeverRestoresAnotherPrefixsSnapshot) {
  Scheduler s(snapshot_config(colliding_hash));
  FakeEngine e(&s);
  const auto x = iota_tokens(1000, 40);
  const auto y = iota_tokens(1003, 40);  // every token x + 3: the same residues mod 3
  ASSERT_EQ(colliding_hash(kv::kRootHash, std::span(x).first(16)),
            colliding_hash(kv::kRootHash, std::span(y).first(16)));
  ASSERT_TRUE(e.add(1, x, 1).ok());
  e.drain();
  EXPECT_EQ(s.stats().num_state_saves, 1);
  ASSERT_TRUE(e.add(2, y, 1).ok());
  StepPlan p = e.step();
  EXPECT_EQ(p.seqs[0].first_token, 0);
  EXPECT_THAT(p.state_restores, IsEmpty());
  e.drain();
  EXPECT_EQ(s.stats().num_state_saves, 1);
  EXPECT_EQ(s.stats().num_state_restores, 0);
  // x again: its own snapshot still serves it.
  ASSERT_TRUE(e.add(3, concat(x, iota_tokens(50, 5)), 1).ok());
  p = e.step();
  EXPECT_EQ(p.seqs[0].first_token, 32);
  EXPECT_EQ(p.state_restores.size(), 1u);
  e.drain();
  e.expect_outputs_match_reference();
}

}  // namespace
}  // namespace kiln::engine
