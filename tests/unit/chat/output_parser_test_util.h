// Helpers for the output parser tests: expected-result cases and a streaming driver that
// checks the event stream's shape as it goes.
#pragma once

#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/chat/output_parser.h"

namespace kiln::chat {

// Readable failure messages.
inline void PrintTo(const ParsedMessage& m, std::ostream* os) {
  *os << "{content=" << testing::PrintToString(m.content)
      << ", reasoning=" << testing::PrintToString(m.reasoning) << ", calls=[";
  for (const auto& c : m.tool_calls)
    *os << c.id << " " << c.name << " " << c.arguments_json << "; ";
  *os << "]}";
}

}  // namespace kiln::chat

namespace kiln::chat::test {

struct ExpectedCall {
  std::string name;
  std::string arguments_json;
};

struct Case {
  std::string name;
  ParserConfig config;
  std::string text;
  std::string content;
  std::string reasoning;
  std::vector<ExpectedCall> calls;
};

inline void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

inline ParserConfig config(ToolFormat format, bool reasoning = false, bool open_at_start = false) {
  ParserConfig c;
  c.format = format;
  c.reasoning = reasoning;
  c.reasoning_open_at_start = open_at_start;
  c.id_seed = 7;
  return c;
}

inline ParsedMessage expected_message(const Case& c) {
  ParsedMessage m{c.content, c.reasoning, {}};
  for (size_t i = 0; i < c.calls.size(); ++i) {
    m.tool_calls.push_back({make_tool_call_id(c.config.format, c.config.id_seed, int(i)),
                            c.calls[i].name, c.calls[i].arguments_json});
  }
  return m;
}

// Whether s is complete, valid UTF-8 (no truncated sequence at either end).
inline bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xE  ? 3
                 : (c >> 3) == 0x1E ? 4
                                    : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

// Checks one batch of events: non-empty text deltas, complete UTF-8 when the input is; each call as
// Begin(index n, the deterministic id) -> Args -> End, indices counting from 0.
inline void check_events(const ParserConfig& config, const std::vector<Event>& events,
                         int& num_calls, bool input_valid_utf8) {
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    switch (e.kind) {
      case Event::Kind::kContent:
      case Event::Kind::kReasoning:
        EXPECT_FALSE(e.text.empty()) << "empty delta";
        if (input_valid_utf8) {
          EXPECT_TRUE(valid_utf8(e.text)) << "delta splits UTF-8: " << e.text;
        }
        break;
      case Event::Kind::kToolCallBegin:
        EXPECT_EQ(e.tool_index, num_calls);
        EXPECT_EQ(e.tool_id, make_tool_call_id(config.format, config.id_seed, num_calls));
        EXPECT_FALSE(e.tool_name.empty());
        ASSERT_LT(i + 2, events.size()) << "call events cut";
        EXPECT_EQ(events[i + 1].kind, Event::Kind::kToolCallArgs);
        EXPECT_EQ(events[i + 1].tool_index, num_calls);
        EXPECT_EQ(events[i + 2].kind, Event::Kind::kToolCallEnd);
        EXPECT_EQ(events[i + 2].tool_index, num_calls);
        i += 2;
        ++num_calls;
        break;
      default:
        ADD_FAILURE() << "args/end event outside a call";
    }
  }
}

// Whether got[from..] equals full[from..got.size()) (got[0, from) was checked before).
inline bool extends_prefix(std::string_view full, std::string_view got, size_t from) {
  return got.size() <= full.size() && full.substr(from, got.size() - from) == got.substr(from);
}

// Feeds text in chunks of 1..max_chunk bytes (rng == nullptr: exactly max_chunk) and
// returns the accumulated message. After every feed the accumulated content and reasoning
// must be prefixes of the non-streamed parse's: nothing emitted is ever taken back, so no
// partial tag that later turns out to be a tag ever reaches a delta.
inline ParsedMessage stream_in_chunks(const ParserConfig& config, std::string_view text,
                                      std::mt19937* rng, size_t max_chunk) {
  const ParsedMessage whole = parse_all(config, text);
  const bool input_valid_utf8 = valid_utf8(text);  // else deltas may carry its bad bytes
  OutputParser parser(config);
  ParsedMessage m;
  int num_calls = 0;
  size_t num_content_bytes = 0;
  size_t num_reasoning_bytes = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t n = rng ? 1 + (*rng)() % max_chunk : max_chunk;
    auto events = parser.feed(text.substr(pos, n));
    check_events(config, events, num_calls, input_valid_utf8);
    accumulate(m, events);
    // Deltas only append, so checking each feed's new part covers the whole prefix.
    EXPECT_TRUE(extends_prefix(whole.content, m.content, num_content_bytes)) << "content retracted";
    EXPECT_TRUE(extends_prefix(whole.reasoning, m.reasoning, num_reasoning_bytes))
        << "reasoning retracted";
    num_content_bytes = m.content.size();
    num_reasoning_bytes = m.reasoning.size();
    pos += n;
  }
  auto events = parser.finish();
  check_events(config, events, num_calls, input_valid_utf8);
  accumulate(m, events);
  EXPECT_TRUE(parser.feed("late").empty()) << "feed after finish must be ignored";
  return m;
}

}  // namespace kiln::chat::test
