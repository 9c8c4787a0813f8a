// A hybrid model (the qwen35 fixture: Gated DeltaNet and gated attention layers) through the
// engine: greedy tokens equal transformers' with chunked prefill, alone and among concurrent
// requests in other state slots; finished and cancelled requests give every recurrent-state
// slot and KV block back; a growing conversation resumes from recurrent-state snapshots with
// exactly the tokens it gets without the prefix cache.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/engine/engine.h"
#include "unit/engine/fixture_engine.h"
#include "unit/model/forward_util.h"

namespace kiln::engine {
namespace {

const std::string kFixture = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/qwen35";

// The fixture converted by kiln convert (with a byte vocabulary for the detokenizer).
std::unique_ptr<Engine> start_engine(const std::function<void(EngineOptions*)>& tweak = {}) {
  EngineOptions o;
  o.device = model::test_device();
  o.threads = 2;
  o.n_ctx = 256;
  o.max_seqs = 4;
  o.max_batch_tokens = 16;  // prompts prefill in chunks, beside other sequences' decodes
  o.max_waiting = 64;
  o.kv_type = quant::Type::F32;
  o.kv_memory_bytes = uint64_t{16} << 20;
  if (tweak) tweak(&o);
  return start_fixture_engine(kFixture, o);
}

std::shared_ptr<RequestChannel> submit(Engine& e, std::vector<int32_t> prompt, int32_t n) {
  GenerationRequest r;
  r.prompt_tokens = std::move(prompt);
  r.max_tokens = n;
  r.sampling.temperature = 0;
  r.ignore_eos = true;  // every request runs to max_tokens, as transformers' greedy loop
  auto res = e.submit(std::move(r));
  if (auto* refusal = std::get_if<SubmitRefusal>(&res)) {
    ADD_FAILURE() << refusal->message;
    return nullptr;
  }
  return std::get<std::shared_ptr<RequestChannel>>(res);
}

std::vector<int32_t> drain(const std::shared_ptr<RequestChannel>& ch, FinishReason* why,
                           Usage* usage = nullptr) {
  std::vector<int32_t> tokens;
  for (;;) {
    auto ev = ch->pop(std::chrono::milliseconds(60000));
    if (!ev) {
      ADD_FAILURE() << "timed out";
      return tokens;
    }
    if (auto* t = std::get_if<TokenEvent>(&*ev)) {
      tokens.push_back(t->token);
      continue;
    }
    *why = std::get<FinishEvent>(*ev).reason;
    if (usage != nullptr) *usage = std::get<FinishEvent>(*ev).usage;
    return tokens;
  }
}

TEST(HybridEngine, GreedyEqualsTransformersAmongOthersAndSlotsComeBack) {
  std::ifstream gf(kFixture + "/goldens.json");
  ASSERT_TRUE(gf);
  const nlohmann::json g = nlohmann::json::parse(gf);
  const std::vector<int32_t> prompt = g["greedy_prompt"], want = g["greedy_ids"];
  auto e = start_engine();
  ASSERT_NE(e, nullptr);
  FinishReason why{};
  EXPECT_EQ(drain(submit(*e, prompt, 64), &why), want);
  // The same request among others (more than max_seqs: some wait, take freed slots), a few of
  // which are cancelled after their first token.
  std::vector<std::shared_ptr<RequestChannel>> others;
  for (const auto& s : g["sequences"]) others.push_back(submit(*e, s, 24));
  auto again = submit(*e, prompt, 64);
  for (const auto& s : g["sequences"]) others.push_back(submit(*e, s, 100));
  for (size_t i = others.size() / 2; i < others.size(); ++i) {
    ASSERT_TRUE(others[i]->pop(std::chrono::milliseconds(60000)).has_value());
    others[i]->cancel();
  }
  EXPECT_EQ(drain(again, &why), want);
  for (auto& c : others) drain(c, &why);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const EngineStats st = e->stats();
  EXPECT_EQ(st.num_running, 0);
  EXPECT_EQ(st.num_state_slots_used, 0);
  EXPECT_EQ(st.num_kv_blocks_used, 0);
}

struct Turn {
  std::vector<int32_t> answer;
  Usage usage;
};

// An agent's chat: each turn's prompt is the previous prompt, its answer and a new message.
std::vector<Turn> converse(Engine& e, int32_t num_turns) {
  std::mt19937 rng(17);
  auto message = [&rng](int32_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& id : t) id = std::uniform_int_distribution<int32_t>(3, 255)(rng);
    return t;
  };
  std::vector<Turn> turns;
  std::vector<int32_t> prompt = message(70);
  for (int32_t i = 0; i < num_turns; ++i) {
    FinishReason why{};
    Turn t;
    t.answer = drain(submit(e, prompt, 16), &why, &t.usage);
    EXPECT_EQ(why, FinishReason::kLength);
    prompt.insert(prompt.end(), t.answer.begin(), t.answer.end());
    const std::vector<int32_t> more = message(45);
    prompt.insert(prompt.end(), more.begin(), more.end());
    turns.push_back(std::move(t));
  }
  return turns;
}

// Checkpoints every 32 tokens, so each turn's prompt passes a few: turn k + 1 resumes from
// the last checkpoint of turn k's prompt and gives exactly the tokens it gives with no cache.
// --deterministic through the engine: a request's tokens and logprobs (its top 5 too) are the
// same bits alone with its 100-token prompt prefilled in one step (the delta rule's chunked form
// in the default mode) and among three other requests with the prompt in 16-token chunks.
TEST(HybridEngine, DeterministicLogprobsDoNotDependOnTheLoadOrTheChunking) {
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 100; ++i) prompt.push_back(1 + (i * 7) % 200);
  auto run = [&](int32_t chunk, int32_t others) {
    auto e = start_engine([chunk](EngineOptions* o) {
      o->deterministic = true;
      o->max_batch_tokens = chunk;
      o->step_prompt_tokens = 0;
    });
    std::vector<TokenEvent> got;
    if (e == nullptr) return got;
    std::vector<std::shared_ptr<RequestChannel>> side;
    for (int32_t k = 0; k < others; ++k) {
      std::vector<int32_t> p(static_cast<size_t>(20 + 9 * k), 3 + k);
      side.push_back(submit(*e, p, 12));
    }
    GenerationRequest r;
    r.prompt_tokens = prompt;
    r.max_tokens = 12;
    r.sampling.temperature = 0;
    r.sampling.logprobs = true;
    r.sampling.top_logprobs = 5;
    r.ignore_eos = true;
    auto res = e->submit(std::move(r));
    EXPECT_TRUE(std::holds_alternative<std::shared_ptr<RequestChannel>>(res));
    if (!std::holds_alternative<std::shared_ptr<RequestChannel>>(res)) return got;
    auto ch = std::get<std::shared_ptr<RequestChannel>>(res);
    for (;;) {
      auto ev = ch->pop(std::chrono::milliseconds(60000));
      if (!ev || !std::holds_alternative<TokenEvent>(*ev)) break;
      got.push_back(std::get<TokenEvent>(*ev));
    }
    FinishReason why{};
    for (auto& c : side)
      if (c != nullptr) drain(c, &why);
    return got;
  };
  const std::vector<TokenEvent> alone = run(256, 0);
  const std::vector<TokenEvent> loaded = run(16, 3);
  ASSERT_EQ(alone.size(), 12u);
  ASSERT_EQ(loaded.size(), alone.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "token " << i);
    EXPECT_EQ(loaded[i].token, alone[i].token);
    EXPECT_EQ(loaded[i].logprob, alone[i].logprob);  // bitwise
    EXPECT_EQ(loaded[i].top, alone[i].top);
  }
}

TEST(HybridEngine, AGrowingConversationResumesFromSnapshotsWithTheSameTokens) {
  constexpr int32_t kTurns = 4;
  auto options = [](bool cache) {
    return [cache](EngineOptions* o) {
      o->n_ctx = 512;
      o->max_batch_tokens = 48;
      o->state_checkpoint_blocks = 2;
      o->enable_prefix_cache = cache;
    };
  };
  auto off = start_engine(options(false));
  ASSERT_NE(off, nullptr);
  const std::vector<Turn> want = converse(*off, kTurns);
  EXPECT_EQ(off->stats().num_prefix_hit_tokens, 0);
  off.reset();
  auto on = start_engine(options(true));
  ASSERT_NE(on, nullptr);
  const std::vector<Turn> got = converse(*on, kTurns);
  ASSERT_EQ(got.size(), want.size());
  int64_t num_prompt = 0, num_cached = 0;
  for (int32_t i = 0; i < kTurns; ++i) {
    EXPECT_EQ(got[i].answer, want[i].answer) << "turn " << i;
    EXPECT_EQ(got[i].usage.prompt_tokens, want[i].usage.prompt_tokens);
    if (i > 0) {
      EXPECT_GT(got[i].usage.cached_tokens, 0) << "turn " << i;
    }
    EXPECT_EQ(got[i].usage.cached_tokens % 32, 0);
    num_prompt += got[i].usage.prompt_tokens;
    num_cached += got[i].usage.cached_tokens;
    fmt::print("turn {}: {} prompt tokens, {} cached\n", i, got[i].usage.prompt_tokens,
               got[i].usage.cached_tokens);
  }
  fmt::print("{}-turn chat: {} of {} prompt tokens cached ({:.0f}%)\n", kTurns, num_cached,
             num_prompt, 100.0 * static_cast<double>(num_cached) / static_cast<double>(num_prompt));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const EngineStats st = on->stats();
  EXPECT_EQ(st.num_prefix_hit_tokens, num_cached);
  EXPECT_GE(st.num_state_restores, 3);  // turns 1-3 each resumed from a snapshot
  EXPECT_GT(st.num_state_saves, 0);
  EXPECT_EQ(st.num_state_slots_used, 0);
  EXPECT_EQ(st.num_kv_blocks_used, 0);
}

// Requests sharing a system prompt, more of them than run at once, in a KV pool of 16 blocks
// (preemptions) and with 3 snapshot slots for 4 running sequences (evictions): each gives
// exactly the tokens it gives with no cache.
TEST(HybridEngine, SharedPrefixesUnderPreemptionGiveTheSameTokens) {
  auto options = [](bool cache) {
    return [cache](EngineOptions* o) {
      o->max_batch_tokens = 48;
      o->state_checkpoint_blocks = 2;
      o->state_snapshots = 3;
      o->kv_memory_bytes = 16 * kv::kBlockTokens * 1024;  // 1 KiB a token: 16 blocks
      o->enable_prefix_cache = cache;
    };
  };
  std::mt19937 rng(5);
  auto message = [&rng](int32_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& id : t) id = std::uniform_int_distribution<int32_t>(3, 255)(rng);
    return t;
  };
  const std::vector<int32_t> system = message(100);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p = system;
    const std::vector<int32_t> own = message(10 + 5 * i);
    p.insert(p.end(), own.begin(), own.end());
    prompts.push_back(std::move(p));
  }
  auto run = [&prompts](Engine& e) {
    std::vector<std::shared_ptr<RequestChannel>> chs;
    for (const auto& p : prompts) chs.push_back(submit(e, p, 16));
    std::vector<std::vector<int32_t>> out;
    FinishReason why{};
    for (auto& ch : chs) out.push_back(drain(ch, &why));
    return out;
  };
  auto off = start_engine(options(false));
  ASSERT_NE(off, nullptr);
  const auto want = run(*off);
  off.reset();
  auto on = start_engine(options(true));
  ASSERT_NE(on, nullptr);
  EXPECT_EQ(run(*on), want);
  // A second round finds the system prompt's snapshots (the first one's requests overlapped).
  EXPECT_EQ(run(*on), want);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const EngineStats st = on->stats();
  EXPECT_GT(st.num_prefix_hit_tokens, 0);
  EXPECT_GT(st.num_preemptions, 0);
  EXPECT_EQ(st.num_state_slots_used, 0);
  EXPECT_EQ(st.num_kv_blocks_used, 0);
}

}  // namespace
}  // namespace kiln::engine
