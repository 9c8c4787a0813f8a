// Random output through the constraint gate on the real Qwen3 vocabulary: at each step a token
// is drawn from near-uniform logits over the whole vocabulary (with the tool-call opener, the
// thinking tags and the end token boosted now and then so that calls, blocks and ends happen),
// through ConstraintGate::sample as the engine draws. Random output is the hardest test of a
// constraint: it is noise unless the mask holds it. The output parser is the oracle:
//  - tool_choice auto (the lazy Hermes grammar): every reply parses as text and/or calls of the
//    offered tool with arguments valid against its schema, and no call is left as text;
//  - response_format on a thinking template: the reasoning block is free, and the content after
//    it is JSON valid against the schema; the output never ends inside the block.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "kiln/chat/output_parser.h"
#include "kiln/engine/constraint_gate.h"
#include "kiln/engine/sequence.h"
#include "kiln/grammar/constraint.h"
#include "kiln/grammar/json_schema.h"
#include "kiln/server/constraint.h"
#include "unit/server/test_util.h"

namespace kiln::server::testing {
namespace {

const char* kTools = R"([{"type":"function","function":{"name":"get_weather","parameters":
  {"type":"object","properties":{"city":{"type":"string","maxLength":12},
   "unit":{"enum":["celsius","fahrenheit"]}},"required":["city"]}}}])";

std::string check_args(const std::string& arguments_json) {
  const json args = json::parse(arguments_json, nullptr, false);
  if (!args.is_object()) return "not an object: " + arguments_json;
  if (!args.contains("city") || !args["city"].is_string()) return "no city: " + arguments_json;
  size_t num_chars = 0;
  for (unsigned char c : args["city"].get<std::string>()) num_chars += (c & 0xC0) != 0x80;
  if (num_chars > 12) return "city too long: " + arguments_json;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (it.key() == "unit" && *it != "celsius" && *it != "fahrenheit") return "bad unit";
    if (it.key() != "city" && it.key() != "unit") return "extra key " + it.key();
  }
  return "";
}

// Draws from softmax(logits) over the ids of `allowed` (all for an empty mask; -inf: never), as
// a sampler at temperature 1 would.
struct Drawer {
  std::mt19937_64 rng;
  std::vector<float> masked;
  engine::SampleResult operator()(std::span<const float> row, std::span<const uint64_t> allowed) {
    masked.assign(row.begin(), row.end());
    for (size_t id = 0; id < masked.size() && !allowed.empty(); ++id) {
      if (id / 64 >= allowed.size() || !((allowed[id / 64] >> (id % 64)) & 1))
        masked[id] = -std::numeric_limits<float>::infinity();
    }
    const std::span<const float> logits = masked;
    double total = 0;
    for (float l : logits) total += std::isfinite(l) ? std::exp(static_cast<double>(l)) : 0.0;
    double u = std::uniform_real_distribution<double>(0, total)(rng);
    int32_t last = -1;
    for (size_t i = 0; i < logits.size(); ++i) {
      if (!std::isfinite(logits[i])) continue;
      last = static_cast<int32_t>(i);
      u -= std::exp(static_cast<double>(logits[i]));
      if (u <= 0) break;
    }
    return engine::SampleResult{last, 0.0f, {}};
  }
};

struct Walk {
  std::string text;
  bool ended = false;  // by an end token (else the step limit)
};

// Near-uniform logits with `boosts` (token, logit, probability per step) applied at random.
Walk random_walk(engine::ConstraintGate& gate, uint64_t seed,
                 const std::vector<std::tuple<int32_t, float, double>>& boosts, int max_steps) {
  const tokenizer::Tokenizer& tok = qwen3_tokenizer();
  Drawer draw{std::mt19937_64(seed), {}};
  std::vector<float> logits(tok.num_tokens());
  const std::vector<int32_t> ends = engine::end_of_generation_ids(tok);
  Walk w;
  for (int step = 0; step < max_steps; ++step) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    for (const auto& [id, logit, p] : boosts) {
      if (std::uniform_real_distribution<double>(0, 1)(draw.rng) < p) logits[id] = logit;
    }
    auto r = gate.sample(logits, [&](std::span<const float> l, std::span<const uint64_t> allowed) {
      return draw(l, allowed);
    });
    EXPECT_TRUE(r.has_value()) << "dead end after: " << w.text;
    if (!r) break;
    if (std::find(ends.begin(), ends.end(), r->token) != ends.end()) {
      w.ended = true;
      break;
    }
    w.text += tok.token_piece(r->token);
  }
  return w;
}

TEST(LazyGrammar, RandomOutputIsTextOrValidCallsOfTheOfferedTool) {
  const tokenizer::Tokenizer& tok = qwen3_tokenizer();
  const std::vector<int32_t> ends = engine::end_of_generation_ids(tok);
  auto index = grammar::TokenIndex::create(tok, ends);
  auto format = tool_call_format(chat::ToolFormat::kHermes, "", /*parallel=*/true);
  ASSERT_TRUE(format.has_value());
  auto g = grammar::compile_tool_call_syntax(kTools, format->syntax);
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto compiled = std::make_shared<grammar::CompiledGrammar>(std::move(g).value(), index);
  engine::GrammarStart start;
  start.triggers = format->triggers;
  const auto tool_call = tok.find_token("<tool_call>");
  ASSERT_TRUE(tool_call.has_value());
  int num_calls = 0, num_ended = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    engine::ConstraintGate gate(compiled, start, [&](int32_t id) { return tok.token_piece(id); },
                                {});
    const Walk w = random_walk(gate, seed, {{*tool_call, 14.0f, 0.1}, {ends[0], 14.0f, 0.02}}, 160);
    chat::ParserConfig config;
    config.format = chat::ToolFormat::kHermes;
    const chat::ParsedMessage m = chat::parse_all(config, w.text);
    for (const chat::ToolCall& c : m.tool_calls) {
      ++num_calls;
      EXPECT_EQ(c.name, "get_weather") << w.text;
      EXPECT_EQ(check_args(c.arguments_json), "") << w.text;
    }
    if (w.ended) {
      ++num_ended;
      // Ended: a call that started was completed (the end is allowed only after it).
      EXPECT_EQ(m.content.find("<tool_call>"), std::string::npos) << w.text;
    }
  }
  EXPECT_GT(num_calls, 5);
  EXPECT_GT(num_ended, 5);
}

TEST(LazyGrammar, RandomThinkingIsFreeAndTheAnswerAfterItMatchesTheSchema) {
  const tokenizer::Tokenizer& tok = qwen3_tokenizer();
  const std::vector<int32_t> ends = engine::end_of_generation_ids(tok);
  auto index = grammar::TokenIndex::create(tok, ends);
  auto g = grammar::compile_json_schema(
      R"({"type":"object","properties":{"city":{"type":"string","maxLength":12},
          "unit":{"enum":["celsius","fahrenheit"]}},"required":["city"]})");
  ASSERT_TRUE(g.ok());
  auto compiled = std::make_shared<grammar::CompiledGrammar>(std::move(g).value(), index);
  const auto open = tok.find_token("<think>");
  const auto close = tok.find_token("</think>");
  ASSERT_TRUE(open && close);
  int num_thought = 0, num_ended = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    engine::GrammarStart start;
    start.reasoning = true;
    start.reasoning_open_at_start = seed % 3 == 0;  // DeepSeek-R1-style prompts open it
    start.think_open = "<think>";
    start.think_close = "</think>";
    engine::ConstraintGate gate(compiled, start, [&](int32_t id) { return tok.token_piece(id); },
                                {});
    const Walk w = random_walk(
        gate, seed, {{*open, 14.0f, 0.5}, {*close, 14.0f, 0.08}, {ends[0], 14.0f, 0.3}}, 200);
    chat::ParserConfig config;
    config.reasoning = true;
    config.reasoning_open_at_start = start.reasoning_open_at_start;
    const chat::ParsedMessage m = chat::parse_all(config, w.text);
    num_thought += !m.reasoning.empty();
    if (!w.ended) continue;
    ++num_ended;
    const json answer = json::parse(m.content, nullptr, false);
    ASSERT_FALSE(answer.is_discarded()) << w.text;
    EXPECT_EQ(check_args(answer.dump()), "") << w.text;
  }
  EXPECT_GT(num_thought, 5);
  EXPECT_GT(num_ended, 5);
}

// response_format beside tools under tool_choice auto: the union grammar (lazy_tool_call with
// an answer spec) from the first token. Every reply that ends is either JSON valid against the
// schema (no call) or calls of the offered tool with valid arguments (no content).
TEST(LazyGrammar, RandomOutputWithAResponseFormatIsItsJsonOrValidCalls) {
  const tokenizer::Tokenizer& tok = qwen3_tokenizer();
  const std::vector<int32_t> ends = engine::end_of_generation_ids(tok);
  grammar::GrammarCache cache(grammar::TokenIndex::create(tok, ends));
  auto format = tool_call_format(chat::ToolFormat::kHermes, "", /*parallel=*/true);
  ASSERT_TRUE(format.has_value());
  grammar::ConstraintSpec both;
  both.kind = grammar::ConstraintSpec::Kind::kJsonSchema;
  both.text = R"({"type":"object","properties":{"city":{"type":"string","maxLength":12},
                  "unit":{"enum":["celsius","fahrenheit"]}},"required":["city"]})";
  grammar::ConstraintSpec calls;
  calls.kind = grammar::ConstraintSpec::Kind::kToolCallSyntax;
  calls.syntax = format->syntax;
  calls.text = kTools;
  both.either.push_back(calls);
  auto compiled = cache.get(both);
  ASSERT_TRUE(compiled.ok()) << compiled.error().message;
  const auto tool_call = tok.find_token("<tool_call>");
  const auto brace = tok.find_token("{");
  ASSERT_TRUE(tool_call && brace);
  int num_calls = 0, num_answers = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    engine::ConstraintGate gate(*compiled, {}, [&](int32_t id) { return tok.token_piece(id); }, {});
    const Walk w = random_walk(
        gate, seed, {{*tool_call, 14.0f, 0.05}, {*brace, 14.0f, 0.05}, {ends[0], 14.0f, 0.3}}, 200);
    if (!w.ended) continue;
    chat::ParserConfig config;
    config.format = chat::ToolFormat::kHermes;
    const chat::ParsedMessage m = chat::parse_all(config, w.text);
    if (!m.tool_calls.empty()) {
      ++num_calls;
      EXPECT_EQ(m.content, "") << w.text;
      for (const chat::ToolCall& c : m.tool_calls) {
        EXPECT_EQ(c.name, "get_weather") << w.text;
        EXPECT_EQ(check_args(c.arguments_json), "") << w.text;
      }
    } else {
      ++num_answers;
      const json answer = json::parse(m.content, nullptr, false);
      ASSERT_FALSE(answer.is_discarded()) << w.text;
      EXPECT_EQ(check_args(answer.dump()), "") << w.text;
    }
  }
  EXPECT_GT(num_calls, 2);
  EXPECT_GT(num_answers, 2);
}

}  // namespace
}  // namespace kiln::server::testing
