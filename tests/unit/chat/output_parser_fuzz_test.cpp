// Property tests on generated outputs: random mixes of every family's tags, partial tags,
// JSON pieces, whitespace and multi-byte characters. For each, any chunking must give the
// non-streamed result, and when no call was recognized no text may be lost.
#include <algorithm>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/chat/output_parser.h"
#include "unit/chat/output_parser_test_util.h"

namespace kiln::chat {
namespace {

using test::config;

const std::vector<std::string>& fragments() {
  static const std::vector<std::string> kFragments = {
      // reasoning tags, whole and cut
      "<think>", "</think>", "<thi", "</th", "[THINK]", "[/THINK]",
      // Hermes / Qwen3-Coder
      "<tool_call>", "</tool_call>", "<tool_", "<function=f>", "<parameter=x>", "</parameter>",
      "</function>", "\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
      // Llama 3
      "<|python_tag|>", "<|python", "{\"name\": \"g\", \"parameters\": {\"k\": \"é\"}}",
      // Mistral
      "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[TOOL_", "h[ARGS]{\"z\": [1, 2]}",
      "[{\"name\": \"m\", \"arguments\": {}}]",
      // DeepSeek
      "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
      "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool",
      "function<｜tool▁sep｜>d\n```json\n{}\n```",
      // JSON pieces
      "{", "}", "[", "]", "\"", "\\", ":", ",", "\"name\"", "\"arguments\"", "\"parameters\"",
      "{\"name\": ", "1", "null",
      // text
      " ", "\n", "\n\n", "\t", "Hello", "world", "<", ">", "a<b", ";", "é", "日本", "😀", "｜",
      "\xE2\x82", "\xAC", "\xFF", std::string(70, ' '), std::string(40, '\n')};
  return kFragments;
}

// Whole well-formed calls of each family, so that texts mix real calls with debris.
const std::vector<std::string>& whole_calls() {
  static const std::vector<std::string> kCalls = {
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"日本\"}}\n</tool_call>",
      "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
      "{\"name\": \"g\", \"parameters\": {}}",
      "<|python_tag|>{\"name\": \"g\", \"arguments\": {\"n\": null}}",
      "[TOOL_CALLS]h[ARGS]{\"z\": [1, 2]}",
      "[TOOL_CALLS]h[CALL_ID]abc123def[ARGS]{}",
      "[TOOL_CALLS][{\"name\": \"m\", \"arguments\": {\"😀\": 1}}]",
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{\"q\": 1}<｜tool▁call▁end｜>",
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>d\n```json\n{}\n```<｜tool▁call▁end｜>",
  };
  return kCalls;
}

std::string random_text(std::mt19937& rng) {
  const auto& frags = fragments();
  const auto& calls = whole_calls();
  std::string text;
  const int num_fragments = static_cast<int>(rng() % 24);
  for (int i = 0; i < num_fragments; ++i) {
    text += rng() % 4 == 0 ? calls[rng() % calls.size()] : frags[rng() % frags.size()];
  }
  return text;
}

std::string ltrim(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  return s.substr(i);
}

// Returns how many texts held at least one recognized call.
int check_config(const ParserConfig& cfg, uint32_t seed_base, int num_texts) {
  int num_with_calls = 0;
  for (int t = 0; t < num_texts; ++t) {
    std::mt19937 rng(seed_base + static_cast<uint32_t>(t));
    const std::string text = random_text(rng);
    const ParsedMessage whole = parse_all(cfg, text);
    num_with_calls += whole.tool_calls.empty() ? 0 : 1;
    EXPECT_EQ(test::stream_in_chunks(cfg, text, nullptr, 1), whole) << "text: " << text;
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(test::stream_in_chunks(cfg, text, &rng, 1 + rng() % 9), whole) << "text: " << text;
    }
    // Without reasoning and without recognized calls, the content is the text itself
    // (leading whitespace of the output aside): malformed markup is never dropped.
    if (!cfg.reasoning && whole.tool_calls.empty()) {
      EXPECT_EQ(whole.content, ltrim(text)) << "text: " << text;
    }
  }
  return num_with_calls;
}

class Fuzz : public testing::TestWithParam<ToolFormat> {};

TEST_P(Fuzz, ChunkingNeverChangesTheResult) {
  const ToolFormat format = GetParam();
  const int num_with_calls = check_config(config(format), 1000, 200);
  // The generator must exercise the format's calls, not only its failure paths.
  if (format == ToolFormat::kNone) {
    EXPECT_EQ(num_with_calls, 0);
  } else {
    EXPECT_GT(num_with_calls, 40);
  }
  std::cout << tool_format_name(format) << ": " << num_with_calls << "/200 texts with calls\n";
  check_config(config(format, /*reasoning=*/true), 2000, 100);
  check_config(config(format, true, /*open_at_start=*/true), 3000, 100);
  ParserConfig bracket = config(format, true);
  bracket.think_open = "[THINK]";
  bracket.think_close = "[/THINK]";
  check_config(bracket, 4000, 60);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, Fuzz,
                         testing::Values(ToolFormat::kNone, ToolFormat::kHermes,
                                         ToolFormat::kLlama3, ToolFormat::kMistral,
                                         ToolFormat::kDeepSeek),
                         [](const testing::TestParamInfo<ToolFormat>& info) {
                           return std::string(tool_format_name(info.param));
                         });

// Mutations of well-formed calls: fragments inserted and ranges deleted at character
// boundaries, so the text stays valid UTF-8 and every delta must too. This reaches the
// half-broken calls (a key cut, a quote lost, a tag inside JSON) that random mixes rarely do.
bool is_char_boundary(const std::string& s, size_t i) {
  return i >= s.size() || (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80;
}

std::string mutate(std::string text, std::mt19937& rng) {
  const auto& frags = fragments();
  const int num_mutations = 1 + static_cast<int>(rng() % 3);
  for (int m = 0; m < num_mutations; ++m) {
    size_t at = rng() % (text.size() + 1);
    while (!is_char_boundary(text, at)) ++at;
    if (rng() % 2 == 0) {
      std::string frag = frags[rng() % frags.size()];
      if (!test::valid_utf8(frag)) frag = "\"";
      text.insert(at, frag);
    } else {
      size_t end = std::min(text.size(), at + 1 + rng() % 6);
      while (!is_char_boundary(text, end)) ++end;
      text.erase(at, end - at);
    }
  }
  return text;
}

TEST_P(Fuzz, MutatedCallsKeepChunkIndependenceAndUtf8) {
  const ToolFormat format = GetParam();
  const auto& calls = whole_calls();
  for (uint32_t t = 0; t < 400; ++t) {
    std::mt19937 rng(5000 + t);
    std::string text = "Ok. " + calls[rng() % calls.size()] + " " + calls[rng() % calls.size()];
    if (t % 2 == 0) text = calls[rng() % calls.size()] + "\nDone 😀";
    text = mutate(std::move(text), rng);
    ASSERT_TRUE(test::valid_utf8(text));
    const ParserConfig cfg = config(format, /*reasoning=*/t % 3 == 0);
    const ParsedMessage whole = parse_all(cfg, text);
    EXPECT_EQ(test::stream_in_chunks(cfg, text, nullptr, 1), whole) << "text: " << text;
    EXPECT_EQ(test::stream_in_chunks(cfg, text, &rng, 1 + rng() % 7), whole) << "text: " << text;
    for (const ToolCall& call : whole.tool_calls) {
      EXPECT_TRUE(test::valid_utf8(call.arguments_json)) << call.arguments_json;
    }
  }
}

// A long call streamed in small pieces: the waiting block is scanned incrementally, so this
// stays linear in the output's length (a rescan per feed would take minutes here).
TEST(OutputParserLongCalls, LargeArgumentsStreamInLinearTime) {
  const std::string big(150000, 'x');
  struct Row {
    ToolFormat format;
    std::string text;
  };
  const Row rows[] = {
      {ToolFormat::kHermes,
       "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"s\": \"" + big + "\"}}\n</tool_call>"},
      {ToolFormat::kHermes, "<tool_call>\n<function=w>\n<parameter=s>\n" + big +
                                "\n</parameter>\n</function>\n</tool_call>"},
      {ToolFormat::kLlama3, "{\"name\": \"w\", \"parameters\": {\"s\": \"" + big + "\"}}"},
      {ToolFormat::kMistral, "[TOOL_CALLS]w[ARGS]{\"s\": \"" + big + "\"}"},
      {ToolFormat::kDeepSeek,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>w<｜tool▁sep｜>{\"s\": \"" + big +
           "\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
  };
  for (const Row& row : rows) {
    OutputParser p(config(row.format));
    ParsedMessage m;
    for (size_t pos = 0; pos < row.text.size(); pos += 3) {
      accumulate(m, p.feed(std::string_view(row.text).substr(pos, 3)));
    }
    accumulate(m, p.finish());
    ASSERT_EQ(m.tool_calls.size(), 1u) << tool_format_name(row.format);
    EXPECT_EQ(m.tool_calls[0].arguments_json, "{\"s\":\"" + big + "\"}");
    EXPECT_EQ(m.content, "");
  }
}

}  // namespace
}  // namespace kiln::chat

namespace kiln::chat {
namespace {

// A model stuck emitting newlines: held whitespace is bounded, so this stays linear too.
TEST(OutputParserLongCalls, LongWhitespaceRunsStreamInLinearTime) {
  const std::string run(150000, '\n');
  struct Row {
    ParserConfig config;
    std::string text;
    ParsedMessage expected;
  };
  const std::vector<Row> rows = {
      {config(ToolFormat::kHermes), "a" + run + "b", {"a" + run + "b", "", {}}},
      {config(ToolFormat::kNone, true),
       "<think>a" + run + "</think>b",
       {"b", "a" + run.substr(64), {}}},
      {config(ToolFormat::kMistral), "[TOOL_CALLS]" + run, {"[TOOL_CALLS]" + run, "", {}}},
      {config(ToolFormat::kLlama3), "{" + run + "}", {"{" + run + "}", "", {}}},
      {config(ToolFormat::kMistral),
       "[TOOL_CALLS]" + std::string(run.size(), 'a'),
       {"[TOOL_CALLS]" + std::string(run.size(), 'a'), "", {}}},
      {config(ToolFormat::kDeepSeek),
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{}<｜tool▁call▁end｜>" + run +
           "<｜tool▁calls▁end｜>",
       {"", "", {{make_tool_call_id(ToolFormat::kDeepSeek, 7, 0), "a", "{}"}}}},
  };
  for (const Row& row : rows) {
    OutputParser p(row.config);
    ParsedMessage m;
    for (size_t pos = 0; pos < row.text.size(); pos += 3) {
      accumulate(m, p.feed(std::string_view(row.text).substr(pos, 3)));
    }
    accumulate(m, p.finish());
    EXPECT_EQ(m, row.expected) << tool_format_name(row.config.format);
  }
}

}  // namespace
}  // namespace kiln::chat

namespace kiln::chat {
namespace {

// One feed() holding many blocks: the consumed prefix is not erased per block, so this is
// linear too (an erase per block would move the remaining megabytes 20,000 times).
TEST(OutputParserLongCalls, ManyCallsInOneFeedAreLinear) {
  std::string text;
  const int num_calls = 20000;
  for (int i = 0; i < num_calls; ++i) {
    text += "x<tool_call>{\"name\": \"f\", \"arguments\": {\"i\": " + std::to_string(i) +
            "}}</tool_call>";
  }
  const ParsedMessage m = parse_all(config(ToolFormat::kHermes), text);
  ASSERT_EQ(m.tool_calls.size(), static_cast<size_t>(num_calls));
  EXPECT_EQ(m.tool_calls.back().arguments_json, "{\"i\":" + std::to_string(num_calls - 1) + "}");
  EXPECT_EQ(m.content, std::string(num_calls, 'x'));
}

}  // namespace
}  // namespace kiln::chat
