// ConstraintGate on scripted token streams over a small vocabulary: the lazy grammar of tool
// calls (free text, then after the format's trigger only what the call grammar allows, the end
// only after a complete call) and the reasoning exemption (free inside the thinking block,
// constrained after it, the end masked before the constraint starts).
#include "kiln/engine/constraint_gate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/grammar/json_schema.h"

namespace kiln::engine {
namespace {

// id 0 is the end token.
const std::vector<std::string> kVocab = {
    "",                            // 0 end
    "Hello",                       // 1
    " world",                      // 2
    "<tool_call>",                 // 3
    "\n",                          // 4
    "{\"name\": \"",               // 5
    "get_weather",                 // 6
    "dictionary",                  // 7
    "\", \"arguments\": {",        // 8
    "\"city\": \"",                // 9
    "Paris",                       // 10
    "\"}}",                        // 11
    "\n</tool_call>",              // 12
    "<think>",                     // 13
    "</think>",                    // 14
    "x",                           // 15
    " ",                           // 16
    "<tool",                       // 17
    "_call>",                      // 18
    "{",                           // 19
    "}",                           // 20
    "\"",                          // 21
    "\n\n",                        // 22
    "</think>{",                   // 23
    "</think>x",                   // 24
    "<tool_call>x",                // 25
    "<tool_call>\n{\"name\": \"",  // 26
    "\", \"parameters\": {",       // 27
    "{\"type\": \"",               // 28
    "\"city\":\"",                 // 29
    "\"}",                         // 30
    "<th",                         // 31
    "ink>",                        // 32
};

constexpr int32_t kEnd = 0;

const char* kTools = R"([{"type":"function","function":{"name":"get_weather","parameters":
  {"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])";

std::shared_ptr<const grammar::TokenIndex> vocab() {
  static auto v = grammar::TokenIndex::create(kVocab, {kEnd});
  return v;
}

std::shared_ptr<grammar::CompiledGrammar> hermes_calls() {
  grammar::ToolCallSyntax syn;
  syn.call_open = "<tool_call>\n";
  syn.call_close = "\n</tool_call>";
  syn.separator = "\n";
  syn.max_calls = 2;
  auto g = grammar::compile_tool_call_syntax(kTools, syn);
  KILN_ASSERT(g.ok());
  return std::make_shared<grammar::CompiledGrammar>(std::move(g).value(), vocab());
}

std::shared_ptr<grammar::CompiledGrammar> llama_calls() {
  grammar::ToolCallSyntax syn;
  syn.arguments_key = "parameters";
  syn.opens = {"", "<|python_tag|>"};
  auto g = grammar::compile_tool_call_syntax(kTools, syn);
  KILN_ASSERT(g.ok());
  return std::make_shared<grammar::CompiledGrammar>(std::move(g).value(), vocab());
}

std::shared_ptr<grammar::CompiledGrammar> city_schema() {
  auto g = grammar::compile_json_schema(
      R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})");
  KILN_ASSERT(g.ok());
  return std::make_shared<grammar::CompiledGrammar>(std::move(g).value(), vocab());
}

ConstraintGate make_gate(std::shared_ptr<grammar::CompiledGrammar> g, GrammarStart start) {
  return ConstraintGate(std::move(g), std::move(start),
                        [](int32_t id) { return std::string_view(kVocab[id]); }, {});
}

GrammarStart hermes_lazy() {
  GrammarStart s;
  s.triggers = {{"<tool_call>", false}};
  return s;
}

GrammarStart thinking(bool open_at_start) {
  GrammarStart s;
  s.reasoning = true;
  s.reasoning_open_at_start = open_at_start;
  s.think_open = "<think>";
  s.think_close = "</think>";
  return s;
}

// The ids the gate's mask allows (every id when it has no mask).
std::vector<int32_t> allowed(ConstraintGate& gate) {
  std::vector<uint64_t> mask;
  const bool masked = gate.fill_mask(&mask);
  std::vector<int32_t> out;
  for (int32_t id = 0; id < static_cast<int32_t>(kVocab.size()); ++id) {
    if (!masked || ((mask[id / 64] >> (id % 64)) & 1)) out.push_back(id);
  }
  return out;
}

bool allows(ConstraintGate& gate, int32_t id) {
  const auto a = allowed(gate);
  return std::find(a.begin(), a.end(), id) != a.end();
}

// The mask never leaves out a token accept() takes; under the grammar it allows exactly those
// (before it, a token that crosses into the grammar with text it rejects is in the mask and
// refused by accept(): the engine samples again).
void expect_mask_agrees(ConstraintGate& gate) {
  std::vector<uint64_t> mask;
  if (!gate.fill_mask(&mask)) return;
  for (int32_t id = 0; id < static_cast<int32_t>(kVocab.size()); ++id) {
    const bool in_mask = (mask[id / 64] >> (id % 64)) & 1;
    if (gate.phase() == ConstraintGate::Phase::kConstrained) {
      EXPECT_EQ(in_mask, gate.probe(id)) << "token " << id << " '" << kVocab[id] << "'";
    } else if (!in_mask) {
      EXPECT_FALSE(gate.probe(id)) << "token " << id << " '" << kVocab[id] << "'";
    }
  }
}

void feed(ConstraintGate& gate, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    expect_mask_agrees(gate);
    ASSERT_TRUE(gate.accept(id)) << "token " << id << " '" << kVocab[id] << "'";
  }
}

TEST(ConstraintGateLazy, FreeTextThenOnlyTheCallAfterTheTrigger) {
  ConstraintGate gate = make_gate(hermes_calls(), hermes_lazy());
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kFree);
  EXPECT_EQ(allowed(gate).size(), kVocab.size());  // free text: no mask
  EXPECT_TRUE(gate.probe(kEnd));                   // and it may end
  feed(gate, {1, 2, 16, 7, 15});                   // "Hello world dictionaryx"
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kFree);
  feed(gate, {3});  // <tool_call>
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kConstrained);
  EXPECT_FALSE(allows(gate, kEnd));
  EXPECT_FALSE(allows(gate, 1));
  EXPECT_TRUE(allows(gate, 4));
  feed(gate, {4, 5});
  EXPECT_FALSE(allows(gate, 7));  // dictionary is not offered
  EXPECT_FALSE(gate.accept(7));
  EXPECT_TRUE(allows(gate, 6));
  feed(gate, {6, 8, 9, 10, 11});
  EXPECT_FALSE(allows(gate, kEnd));  // inside the call
  feed(gate, {12});
  EXPECT_TRUE(allows(gate, kEnd));  // exactly at the end of a complete call
  EXPECT_FALSE(allows(gate, 1));    // no free text after the calls
  EXPECT_TRUE(allows(gate, 4));     // a second call may follow
  feed(gate, {kEnd});
}

TEST(ConstraintGateLazy, TriggerSplitAcrossTokensAndWithTextInTheSameToken) {
  ConstraintGate split = make_gate(hermes_calls(), hermes_lazy());
  feed(split, {1, 17});
  EXPECT_EQ(split.phase(), ConstraintGate::Phase::kFree);
  feed(split, {18});
  EXPECT_EQ(split.phase(), ConstraintGate::Phase::kConstrained);
  EXPECT_TRUE(allows(split, 4));
  EXPECT_FALSE(allows(split, 1));

  // A token that completes the trigger is taken only with text the grammar accepts after it.
  ConstraintGate gate = make_gate(hermes_calls(), hermes_lazy());
  feed(gate, {1});
  EXPECT_FALSE(gate.probe(25));  // "<tool_call>x"
  EXPECT_FALSE(gate.accept(25));
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kFree);  // unchanged
  EXPECT_TRUE(gate.accept(26));                           // "<tool_call>\n{\"name\": \""
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kConstrained);
  EXPECT_TRUE(allows(gate, 6));
  EXPECT_FALSE(allows(gate, 7));
  feed(gate, {6, 8, 9, 10, 11, 12, kEnd});
}

TEST(ConstraintGateLazy, Llama3CallsOnlyAtTheStartOfTheAnswer) {
  GrammarStart start;
  start.triggers = {{"<|python_tag|>", false}, {"{\"name\"", true}, {"{\"type\"", true}};
  ConstraintGate gate = make_gate(llama_calls(), start);
  feed(gate, {4, 5});  // "\n{\"name\": \""
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kConstrained);
  EXPECT_FALSE(allows(gate, 7));
  feed(gate, {6, 27, 9, 10, 11, kEnd});

  // {"type" would be read as a call by the parser and is not one the grammar has: refused.
  ConstraintGate typed = make_gate(llama_calls(), start);
  EXPECT_FALSE(typed.accept(28));
  EXPECT_EQ(typed.phase(), ConstraintGate::Phase::kFree);

  // The same object after text is content, not a call.
  ConstraintGate later = make_gate(llama_calls(), start);
  feed(later, {1, 16, 5, 7, 21, kEnd});
  EXPECT_EQ(later.phase(), ConstraintGate::Phase::kFree);
}

TEST(ConstraintGateThinking, FreeInsideConstrainedAfterEndMaskedBefore) {
  ConstraintGate gate = make_gate(city_schema(), thinking(false));
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kUndecided);
  // Before the model says whether it thinks: the open tag or the grammar's first tokens.
  EXPECT_TRUE(allows(gate, 13));
  EXPECT_TRUE(allows(gate, 31));  // "<th", the start of the open tag
  EXPECT_TRUE(allows(gate, 19));
  EXPECT_FALSE(allows(gate, 1));
  EXPECT_FALSE(allows(gate, kEnd));
  feed(gate, {31});
  EXPECT_FALSE(allows(gate, 19));  // committed to the open tag
  feed(gate, {32});
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kThinking);
  // Inside: anything, even tool-call or JSON-looking text, but not the end.
  for (int32_t id : {1, 2, 3, 15, 19, 20, 22}) EXPECT_TRUE(allows(gate, id)) << id;
  EXPECT_FALSE(allows(gate, kEnd));
  feed(gate, {1, 2, 3, 19, 15, 22});
  // A close tag with text the grammar rejects in the same token is refused.
  EXPECT_FALSE(gate.accept(24));
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kThinking);
  feed(gate, {14, 22});  // "</think>" and leading whitespace of the answer
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kConstrained);
  EXPECT_FALSE(allows(gate, 1));
  EXPECT_FALSE(allows(gate, kEnd));
  EXPECT_TRUE(allows(gate, 19));
  feed(gate, {19, 29, 10, 30});
  EXPECT_TRUE(allows(gate, kEnd));
  feed(gate, {kEnd});
}

TEST(ConstraintGateThinking, CloseTagCarryingTheAnswersFirstBytes) {
  ConstraintGate gate = make_gate(city_schema(), thinking(true));
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kThinking);
  feed(gate, {1, 23});  // "Hello", "</think>{"
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kConstrained);
  EXPECT_FALSE(allows(gate, 19));
  feed(gate, {29, 10, 30, kEnd});
}

TEST(ConstraintGateThinking, NoThinkingBlockConstrainsFromTheFirstToken) {
  ConstraintGate gate = make_gate(city_schema(), thinking(false));
  feed(gate, {19});
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kConstrained);
  feed(gate, {29, 10, 30, kEnd});
  // The answer after a thinking budget closed the block (thinking_budget.h submits it with the
  // exemption off): constrained at once.
  ConstraintGate after_budget = make_gate(city_schema(), GrammarStart{});
  EXPECT_EQ(after_budget.phase(), ConstraintGate::Phase::kConstrained);
  EXPECT_FALSE(allows(after_budget, 13));
  EXPECT_FALSE(allows(after_budget, 1));
}

TEST(ConstraintGateThinking, LazyTriggersWaitForTheEndOfThinking) {
  GrammarStart start = thinking(true);
  start.triggers = {{"<tool_call>", false}};
  ConstraintGate gate = make_gate(hermes_calls(), start);
  EXPECT_EQ(allowed(gate).size(), kVocab.size());  // free, and a lazy output may end anywhere
  feed(gate, {1, 3, 7, 15});                       // a <tool_call> inside thinking is not a call
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kThinking);
  feed(gate, {14, 22, 1});
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kFree);
  feed(gate, {3});
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kConstrained);
  feed(gate, {4, 5, 6, 8, 9, 10, 11, 12, kEnd});
}

// The first largest logit among the allowed ids (every id for an empty mask).
int32_t argmax_allowed(std::span<const float> l, std::span<const uint64_t> allowed) {
  int32_t best = -1;
  for (size_t id = 0; id < l.size(); ++id) {
    const bool in =
        allowed.empty() || (id / 64 < allowed.size() && ((allowed[id / 64] >> (id % 64)) & 1));
    if (in && (best < 0 || l[id] > l[best])) best = static_cast<int32_t>(id);
  }
  return best;
}

// sample(): a drawn token the gate refuses is removed and drawn again; nothing left: nullopt.
TEST(ConstraintGateSample, RedrawsRefusedTokensAndReportsADeadEnd) {
  auto argmax = [](std::span<const float> l, std::span<const uint64_t> allowed) {
    return SampleResult{argmax_allowed(l, allowed), 0.0f, {}};
  };
  std::vector<float> logits(kVocab.size(), 0.0f);
  logits[25] = 9.0f;  // "<tool_call>x": opens a call with text the grammar rejects
  logits[3] = 8.0f;   // "<tool_call>"
  ConstraintGate gate = make_gate(hermes_calls(), hermes_lazy());
  auto r = gate.sample(logits, argmax);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->token, 3);
  EXPECT_EQ(gate.phase(), ConstraintGate::Phase::kConstrained);
  // Under the grammar: the mask, then the call's next token.
  logits.assign(kVocab.size(), 0.0f);
  logits[1] = 9.0f;  // "Hello": not allowed after the trigger
  r = gate.sample(logits, argmax);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->token, 4);  // "\n", the only token the grammar allows here

  ConstraintGate dead = make_gate(hermes_calls(), hermes_lazy());
  const float ninf = -std::numeric_limits<float>::infinity();
  logits.assign(kVocab.size(), ninf);
  logits[25] = 1.0f;  // the only candidate, and refused
  EXPECT_FALSE(dead.sample(logits, argmax).has_value());
  EXPECT_EQ(dead.phase(), ConstraintGate::Phase::kFree);
}

// A mask prefetched while the step runs (the engine's order: prefetch_mask, then sample)
// gives the draws sample() gives alone, through free text, the trigger and the call, and a
// stale one is never used: accept() drops it.
TEST(ConstraintGateSample, PrefetchedMaskDrawsAsSampleAlone) {
  auto argmax = [](std::span<const float> l, std::span<const uint64_t> allowed) {
    return SampleResult{argmax_allowed(l, allowed), 0.0f, {}};
  };
  // Per step, the logits' favourite: free text, the trigger, then tokens the call must mask.
  const std::vector<std::vector<int32_t>> favourites = {{1}, {2}, {3},  {1, 4}, {5},  {7, 6},
                                                        {8}, {9}, {10}, {11},   {12}, {0}};
  ConstraintGate plain = make_gate(hermes_calls(), hermes_lazy());
  ConstraintGate ahead = make_gate(hermes_calls(), hermes_lazy());
  for (size_t step = 0; step < favourites.size(); ++step) {
    std::vector<float> logits(kVocab.size(), 0.0f);
    float v = 9.0f;
    for (int32_t id : favourites[step]) logits[id] = v--;
    ahead.prefetch_mask();
    const auto a = plain.sample(logits, argmax);
    const auto b = ahead.sample(logits, argmax);
    ASSERT_EQ(a.has_value(), b.has_value()) << "step " << step;
    if (!a) break;
    EXPECT_EQ(a->token, b->token) << "step " << step;
    EXPECT_EQ(plain.phase(), ahead.phase()) << "step " << step;
  }
  EXPECT_EQ(ahead.phase(), ConstraintGate::Phase::kConstrained);
  // Prefetched, then the state moves on by accept(): sample() must not use the old mask.
  ConstraintGate gate = make_gate(hermes_calls(), hermes_lazy());
  ASSERT_TRUE(gate.accept(3));  // "<tool_call>": under the grammar, "\n" comes next
  gate.prefetch_mask();
  ASSERT_TRUE(gate.accept(4));  // "\n": now only the call's opening brace
  std::vector<float> logits(kVocab.size(), 0.0f);
  logits[4] = 9.0f;  // allowed by the stale mask, not now
  logits[5] = 1.0f;
  const auto r = gate.sample(logits, argmax);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->token, 5);
}

// The gate's sample() before the sampler took the mask: a masked copy of the row (-inf at every
// id the mask leaves out, padding ids past the vocabulary included) drawn from without a mask,
// then the same redraws. Written on the gate's public calls.
std::optional<SampleResult> reference_sample(ConstraintGate& gate, std::span<const float> logits,
                                             Sampler& sampler,
                                             const std::vector<int32_t>& history) {
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<uint64_t> mask;
  std::vector<float> masked(logits.begin(), logits.end());
  if (gate.fill_mask(&mask)) {
    bool any = false;
    for (size_t id = 0; id < masked.size(); ++id) {
      const bool in = id / 64 < mask.size() && ((mask[id / 64] >> (id % 64)) & 1);
      if (!in) masked[id] = ninf;
      any = any || in;
    }
    if (!any) return std::nullopt;
  }
  SampleResult r = sampler.sample(masked, history);
  for (int num_refused = 0; !gate.accept(r.token);) {
    masked[r.token] = ninf;
    if (++num_refused == ConstraintGate::kMaxRedraws) {
      for (size_t id = 0; id < masked.size(); ++id) {
        if (masked[id] != ninf && !gate.probe(static_cast<int32_t>(id))) masked[id] = ninf;
      }
    }
    if (std::all_of(masked.begin(), masked.end(), [&](float x) { return x == ninf; }))
      return std::nullopt;
    r = sampler.sample(masked, history);
  }
  return r;
}

// The gate drawing through the sampler's allowed-id mask gives the reference's tokens and
// logprobs, bit for bit, over random rows (with padding ids past the vocabulary) through free
// text, refused tokens and their redraws, thinking blocks and the grammar, for greedy and
// sampled draws with truncation, penalties, bans and logprobs, and many seeds.
TEST(ConstraintGateSample, MaskedDrawEqualsTheMaskedCopyReference) {
  constexpr int32_t kRowSize = 40;  // 33 tokens + padding
  struct Case {
    std::shared_ptr<grammar::CompiledGrammar> (*grammar)();
    GrammarStart start;
  };
  const std::vector<Case> cases = {{hermes_calls, hermes_lazy()},
                                   {llama_calls, GrammarStart{}},
                                   {city_schema, GrammarStart{}},
                                   {city_schema, thinking(false)},
                                   {hermes_calls, thinking(true)}};
  std::vector<SamplingParams> params(6);
  params[0].temperature = 0.0f;
  params[0].logprobs = true;
  params[1].temperature = 1.0f;
  params[2].temperature = 0.7f;
  params[2].top_k = 4;
  params[2].logprobs = true;
  params[2].top_logprobs = 3;
  params[3].top_p = 0.8f;
  params[3].min_p = 0.05f;
  params[3].repetition_penalty = 1.2f;
  params[3].presence_penalty = 0.3f;
  params[4].temperature = 1.5f;
  params[4].logit_bias = {{3, 4.0f}, {25, 6.0f}, {1, -100.0f}};
  params[4].logprobs = true;
  params[5].min_p = 0.2f;
  params[5].frequency_penalty = -0.5f;
  params[5].logprobs = true;
  params[5].top_logprobs = 5;
  int num_draws = 0, num_outputs_ended = 0;
  for (size_t c = 0; c < cases.size(); ++c) {
    for (size_t pi = 0; pi < params.size(); ++pi) {
      for (uint64_t seed = 1; seed <= 25; ++seed) {
        SamplingParams p = params[pi];
        p.seed = seed;
        Sampler fused(p, kRowSize), reference(p, kRowSize);
        // Padding ids have no text (free text may draw them, as the engine's rows allow).
        const auto piece = [](int32_t id) {
          return id < static_cast<int32_t>(kVocab.size()) ? std::string_view(kVocab[id])
                                                          : std::string_view();
        };
        ConstraintGate gate(cases[c].grammar(), cases[c].start, piece, {});
        ConstraintGate ref_gate(cases[c].grammar(), cases[c].start, piece, {});
        std::vector<int32_t> history;
        Rng row_rng(seed * 131 + c * 17 + pi);
        for (int step = 0; step < 40; ++step) {
          std::vector<float> logits(kRowSize);
          for (float& x : logits) x = static_cast<float>(4.0 * row_rng.uniform() - 2.0);
          if (step % 2 == 0) gate.prefetch_mask();  // the engine's order, half of the time
          const auto a =
              gate.sample(logits, [&](std::span<const float> l, std::span<const uint64_t> allowed) {
                return fused.sample(l, history, allowed);
              });
          const auto b = reference_sample(ref_gate, logits, reference, history);
          ASSERT_EQ(a.has_value(), b.has_value()) << "case " << c << " params " << pi;
          if (!a) break;
          ASSERT_EQ(a->token, b->token) << "case " << c << " params " << pi << " seed " << seed;
          ASSERT_EQ(std::bit_cast<uint32_t>(a->logprob), std::bit_cast<uint32_t>(b->logprob));
          ASSERT_EQ(a->top.size(), b->top.size());
          for (size_t i = 0; i < a->top.size(); ++i) {
            ASSERT_EQ(a->top[i].first, b->top[i].first);
            ASSERT_EQ(std::bit_cast<uint32_t>(a->top[i].second),
                      std::bit_cast<uint32_t>(b->top[i].second));
          }
          ASSERT_EQ(gate.phase(), ref_gate.phase());
          ++num_draws;
          history.push_back(a->token);
          if (a->token == kEnd) {
            ++num_outputs_ended;
            break;
          }
        }
        ASSERT_EQ(fused.rng().state(), reference.rng().state());
      }
    }
  }
  EXPECT_GT(num_draws, 1000);
  EXPECT_GT(num_outputs_ended, 0);
}

}  // namespace
}  // namespace kiln::engine
