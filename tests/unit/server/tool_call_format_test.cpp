// The tool-call grammar of every chat format against the format's own output parser (chat/):
// calls written as the model would parse back to the same call, and random strings of each
// grammar (random walks over its automaton) parse as calls of offered tools whose arguments
// match the tool's schema. The parser is the oracle: a grammar that admits text the parser
// reads differently (or not as a call) fails here.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "kiln/chat/output_parser.h"
#include "kiln/grammar/json_schema.h"
#include "kiln/grammar/matcher.h"
#include "kiln/server/constraint.h"

namespace kiln::server {
namespace {

using nlohmann::ordered_json;

const char* kTools = R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
    "properties":{"city":{"type":"string","maxLength":20},
                  "unit":{"enum":["celsius","fahrenheit"]}},"required":["city"]}}},
  {"type":"function","function":{"name":"now","parameters":{"type":"object","properties":{}}}}])";

struct Format {
  const char* label;
  chat::ToolFormat format;
  const char* chat_template;  // only what tool_call_format looks for
  const char* example;        // a call the grammar accepts
};

const Format kFormats[] = {
    {"hermes", chat::ToolFormat::kHermes, "",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
     "\"Paris\"}}\n</tool_call>"},
    {"qwen3-coder", chat::ToolFormat::kHermes, "<function=",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\n\"Paris\"\n</parameter>\n"
     "</function>\n</tool_call>"},
    {"llama3", chat::ToolFormat::kLlama3, "",
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"},
    {"mistral", chat::ToolFormat::kMistral, "",
     "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]"},
    {"deepseek-v3", chat::ToolFormat::kDeepSeek, "```json",
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
     "{\"city\":\"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
    {"deepseek-v3.1", chat::ToolFormat::kDeepSeek, "",
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\":\"Paris\"}"
     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
};

grammar::Grammar compile(const Format& f, bool parallel) {
  auto format = tool_call_format(f.format, f.chat_template, parallel);
  KILN_ASSERT(format.has_value());
  auto g = grammar::compile_tool_call_syntax(kTools, format->syntax);
  KILN_ASSERT(g.ok());
  return std::move(g).value();
}

bool matches(grammar::Automaton& a, std::string_view text) {
  const int32_t s = a.step(a.initial(), text);
  return s != grammar::Automaton::kDead && a.accepting(s);
}

// The schema of kTools, checked by hand: "" when `call` is a valid call of an offered tool.
std::string check_call(const chat::ToolCall& call) {
  const ordered_json args = ordered_json::parse(call.arguments_json, nullptr, false);
  if (!args.is_object()) return "arguments not an object: " + call.arguments_json;
  if (call.name == "now") return args.empty() ? "" : "now takes no arguments";
  if (call.name != "get_weather") return "not an offered tool: " + call.name;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (it.key() == "city") {
      if (!it->is_string()) return "city not a string";
      size_t num_chars = 0;
      for (unsigned char c : it->get<std::string>()) num_chars += (c & 0xC0) != 0x80;
      if (num_chars > 20) return "city longer than 20";
    } else if (it.key() == "unit") {
      if (*it != "celsius" && *it != "fahrenheit") return "unit not in the enum";
    } else {
      return "unknown argument " + it.key();
    }
  }
  return args.contains("city") ? "" : "city missing";
}

TEST(ToolCallFormat, ExamplesParseBackToTheirCall) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.label);
    grammar::Automaton a(compile(f, true));
    EXPECT_TRUE(matches(a, f.example));
    chat::ParserConfig config;
    config.format = f.format;
    const chat::ParsedMessage m = chat::parse_all(config, f.example);
    ASSERT_EQ(m.tool_calls.size(), 1u) << m.content;
    EXPECT_EQ(m.tool_calls[0].name, "get_weather");
    EXPECT_EQ(m.tool_calls[0].arguments_json, R"({"city":"Paris"})");
    EXPECT_EQ(m.content, "");
    // Another tool's name is not in the grammar.
    std::string other = f.example;
    other.replace(other.find("get_weather"), 11, "dictionary");
    EXPECT_FALSE(matches(a, other));
  }
}

// Formats whose parser ends a call at the first closing tag however it is quoted: strings hold
// no raw '<', and the escaped form reads back as the text.
TEST(ToolCallFormat, StringsCannotCloseTheCallEarly) {
  for (const Format& f : kFormats) {
    const std::string label = f.label;
    if (label != "qwen3-coder" && label != "deepseek-v3" && label != "deepseek-v3.1") continue;
    SCOPED_TRACE(label);
    grammar::Automaton a(compile(f, true));
    std::string raw = f.example;
    raw.replace(raw.find("Paris"), 5, "a</parameter>b");
    EXPECT_FALSE(matches(a, raw));
    std::string escaped = f.example;
    escaped.replace(escaped.find("Paris"), 5, "a\\u003c/parameter>b");
    ASSERT_TRUE(matches(a, escaped));
    chat::ParserConfig config;
    config.format = f.format;
    const chat::ParsedMessage m = chat::parse_all(config, escaped);
    ASSERT_EQ(m.tool_calls.size(), 1u) << m.content;
    EXPECT_EQ(ordered_json::parse(m.tool_calls[0].arguments_json)["city"], "a</parameter>b");
  }
}

TEST(ToolCallFormat, TriggersOpenWhatTheGrammarReads) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.label);
    auto format = tool_call_format(f.format, f.chat_template, true);
    ASSERT_TRUE(format.has_value());
    ASSERT_FALSE(format->triggers.empty());
    // The example starts with one of the triggers the grammar accepts (the lazy grammar reads
    // the output from the trigger's first byte).
    bool found = false;
    for (const auto& t : format->triggers)
      found |= std::string_view(f.example).substr(0, t.text.size()) == t.text;
    EXPECT_TRUE(found);
  }
  EXPECT_FALSE(tool_call_format(chat::ToolFormat::kNone, "", true).has_value());
}

// Random strings of each grammar: every one parses as calls of offered tools with valid
// arguments, nothing left over as content.
TEST(ToolCallFormat, RandomStringsOfTheGrammarParseAsValidCalls) {
  std::mt19937 rng(15);
  for (const Format& f : kFormats) {
    for (bool parallel : {false, true}) {
      SCOPED_TRACE(std::string(f.label) + (parallel ? " parallel" : " single"));
      grammar::Automaton a(compile(f, parallel));
      int num_done = 0;
      for (int attempt = 0; attempt < 2000 && num_done < 150; ++attempt) {
        std::string text;
        int32_t s = a.initial();
        bool done = false;
        while (text.size() < 600) {
          const grammar::ByteSet& first = a.first_bytes(s);
          if (a.accepting(s) && (first.empty() || rng() % 4 == 0)) {
            done = true;
            break;
          }
          std::vector<uint8_t> bytes;
          for (int b = 0; b < 256; ++b)
            if (first.has(static_cast<uint8_t>(b))) bytes.push_back(static_cast<uint8_t>(b));
          ASSERT_FALSE(bytes.empty()) << text;
          const uint8_t b = bytes[rng() % bytes.size()];
          text += static_cast<char>(b);
          s = a.step(s, b);
          ASSERT_NE(s, grammar::Automaton::kDead);
        }
        if (!done) continue;
        ++num_done;
        chat::ParserConfig config;
        config.format = f.format;
        const chat::ParsedMessage m = chat::parse_all(config, text);
        ASSERT_FALSE(m.tool_calls.empty()) << text;
        EXPECT_EQ(m.content, "") << text;
        if (!parallel) {
          EXPECT_EQ(m.tool_calls.size(), 1u) << text;
        }
        for (const chat::ToolCall& c : m.tool_calls) EXPECT_EQ(check_call(c), "") << text;
      }
      EXPECT_GE(num_done, 50);
    }
  }
}

TEST(ToolCallFormat, XmlBodyRefusesParametersItCannotWrite) {
  grammar::ToolCallSyntax syn;
  syn.body = grammar::ToolCallSyntax::Body::kXml;
  auto g = grammar::compile_tool_call_syntax(
      R"([{"type":"function","function":{"name":"f","parameters":{"anyOf":[{"type":"object"}]}}}])",
      syn);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("tools[0] ('f')"), std::string::npos) << g.error().message;
  EXPECT_NE(g.error().message.find("'anyOf'"), std::string::npos) << g.error().message;
}

}  // namespace
}  // namespace kiln::server
