// The tool-call grammar of every chat format against the format's own output parser (chat/):
// calls written as the model would parse back to the same call, and random strings of each
// grammar (random walks over its automaton) parse as calls of offered tools whose arguments
// match the tool's schema. The parser is the oracle: a grammar that admits text the parser
// reads differently (or not as a call) fails here.
#include <gtest/gtest.h>

#include <bit>
#include <map>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "kiln/chat/output_parser.h"
#include "kiln/engine/constraint_gate.h"
#include "kiln/grammar/json_schema.h"
#include "kiln/grammar/matcher.h"
#include "kiln/server/constraint.h"
#include "unit/server/test_util.h"

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

// The text of a token marker (a token terminal) reads as that marker (step_text).
bool matches(grammar::Automaton& a, std::string_view text) {
  const int32_t s = a.step_text(a.initial(), text);
  return s != grammar::Automaton::kDead && a.accepting(s);
}

bool matches_bytes(const std::shared_ptr<grammar::CompiledGrammar>& g, std::string_view text) {
  grammar::Matcher m(g);
  return m.accept_bytes(text) && m.can_end();
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
          const auto markers = a.token_terminals(s);
          ASSERT_FALSE(bytes.empty() && markers.empty()) << text;
          // A token marker: the control token's text is what the parser reads.
          if (!markers.empty() && (bytes.empty() || rng() % 2 == 0)) {
            const int32_t t = markers[rng() % markers.size()];
            text += a.grammar().terminal_token(t);
            s = a.step_token(s, t);
            ASSERT_NE(s, grammar::Automaton::kDead);
            continue;
          }
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

// A vocabulary of Qwen3's pieces with the Mistral and DeepSeek markers and Llama 3's
// <|python_tag|> appended as control tokens (ids from the Qwen3 vocabulary's size on).
struct MarkerVocab {
  std::shared_ptr<const grammar::TokenIndex> index;
  std::map<std::string, int32_t> markers;
};
const MarkerVocab& marker_vocab() {
  static const MarkerVocab* v = [] {
    const tokenizer::Tokenizer& tok = testing::qwen3_tokenizer();
    auto* mv = new MarkerVocab;
    std::vector<std::string> pieces;
    for (int32_t id = 0; id < tok.num_tokens(); ++id) {
      const auto type = tok.token_type(id);
      const bool text = type != tokenizer::TokenType::kControl &&
                        type != tokenizer::TokenType::kUnknown &&
                        type != tokenizer::TokenType::kUnused;
      pieces.emplace_back(text ? tok.token_piece(id) : "");
    }
    std::vector<int32_t> control;
    for (const char* m :
         {"[TOOL_CALLS]", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
          "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<|python_tag|>"}) {
      mv->markers[m] = static_cast<int32_t>(pieces.size());
      control.push_back(static_cast<int32_t>(pieces.size()));
      pieces.emplace_back(m);
    }
    const int32_t eos = static_cast<int32_t>(pieces.size());
    pieces.emplace_back("</s>");
    mv->index = grammar::TokenIndex::create(std::move(pieces), {eos}, std::move(control));
    return mv;
  }();
  return *v;
}

std::vector<int32_t> allowed_tokens(grammar::Matcher& m) {
  std::vector<uint64_t> mask(m.mask_words());
  m.fill_mask(mask);
  std::vector<int32_t> ids;
  for (size_t w = 0; w < mask.size(); ++w)
    for (uint64_t b = mask[w]; b; b &= b - 1)
      ids.push_back(static_cast<int32_t>(w * 64 + std::countr_zero(b)));
  return ids;
}

// Forced calls of the formats that open with a control token: the mask allows exactly that
// token where the grammar expects a marker (not the text spelled out of text tokens), and the
// control tokens with the call's text between them make a call the format's parser reads.
TEST(ToolCallFormat, ControlMarkersAreExactlyTheControlToken) {
  const MarkerVocab& mv = marker_vocab();
  const tokenizer::Tokenizer& tok = testing::qwen3_tokenizer();
  struct Case {
    const char* label;
    chat::ToolFormat format;
    const char* chat_template;
    // The call as segments: a marker (a key of mv.markers) or text, tokenized by Qwen3.
    std::vector<std::string> parts;
    size_t num_markers;  // of the format's candidates, all in this vocabulary
  };
  const std::string sep = "<｜tool▁sep｜>";
  const Case cases[] = {
      {"mistral",
       chat::ToolFormat::kMistral,
       "",
       {"[TOOL_CALLS]", "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]"},
       1},
      {"deepseek-v3.1",
       chat::ToolFormat::kDeepSeek,
       "",
       {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "get_weather", sep,
        "{\"city\":\"Paris\"}", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"},
       5},
      {"deepseek-v3",
       chat::ToolFormat::kDeepSeek,
       "```json",
       {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "function", sep,
        "get_weather\n```json\n{\"city\":\"Paris\"}\n```", "<｜tool▁call▁end｜>",
        "<｜tool▁calls▁end｜>"},
       5},
      {"llama3 python_tag",
       chat::ToolFormat::kLlama3,
       "",
       {"<|python_tag|>", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"},
       1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    auto format = tool_call_format(c.format, c.chat_template, false);
    ASSERT_TRUE(format.has_value());
    ASSERT_EQ(format->syntax.token_markers.size(), c.num_markers);
    auto g = grammar::compile_tool_call_syntax(kTools, format->syntax);
    ASSERT_TRUE(g.ok()) << g.error().message;
    auto compiled = std::make_shared<grammar::CompiledGrammar>(std::move(g).value(), mv.index);
    grammar::Matcher m(compiled);
    std::string text;
    for (const std::string& part : c.parts) {
      auto marker = mv.markers.find(part);
      if (marker != mv.markers.end()) {
        const std::vector<int32_t> allowed = allowed_tokens(m);
        if (c.format == chat::ToolFormat::kLlama3) {
          // A call may also open with '{' (no python_tag), after whitespace: the tag is one of
          // the allowed, the others are JSON text.
          EXPECT_TRUE(std::binary_search(allowed.begin(), allowed.end(), marker->second));
          for (int32_t id : allowed) {
            if (id != marker->second) {
              EXPECT_NE(std::string_view("{ \t\n").find(mv.index->token_bytes(id).substr(0, 1)),
                        std::string_view::npos);
            }
          }
        } else {
          ASSERT_EQ(allowed, std::vector<int32_t>{marker->second}) << "before " << part;
        }
        // The spelled-out text is refused: its first text token is not allowed.
        auto spelled = tok.encode(part, false, false);
        ASSERT_TRUE(spelled.ok());
        EXPECT_FALSE(m.accept_token(spelled.value()[0])) << part;
        ASSERT_TRUE(m.accept_token(marker->second)) << part;
        text += part;
        continue;
      }
      auto ids = tok.encode(part, false, false);
      ASSERT_TRUE(ids.ok());
      for (int32_t id : ids.value()) {
        const std::vector<int32_t> allowed = allowed_tokens(m);
        ASSERT_TRUE(std::binary_search(allowed.begin(), allowed.end(), id))
            << "'" << tok.token_piece(id) << "' after: " << text;
        ASSERT_TRUE(m.accept_token(id)) << text;
        text += tok.token_piece(id);
      }
    }
    EXPECT_TRUE(m.can_end()) << text;
    EXPECT_TRUE(m.accept_token(static_cast<int32_t>(mv.index->num_tokens() - 1)));  // </s>
    chat::ParserConfig config;
    config.format = c.format;
    const chat::ParsedMessage parsed = chat::parse_all(config, text);
    ASSERT_EQ(parsed.tool_calls.size(), 1u) << text;
    EXPECT_EQ(parsed.tool_calls[0].name, "get_weather");
    EXPECT_EQ(parsed.tool_calls[0].arguments_json, R"({"city":"Paris"})");
    // The lazy path: a trigger's forced text holding the marker reads as the control token.
    grammar::Matcher lazy(compiled);
    EXPECT_TRUE(lazy.accept_bytes(text)) << text;
    EXPECT_TRUE(lazy.can_end());
  }
}

// Only markers that are control tokens of the vocabulary become token terminals.
TEST(ToolCallFormat, MarkersStayTextWhereTheVocabularyHasNoControlToken) {
  auto format = tool_call_format(chat::ToolFormat::kMistral, "", true);
  ASSERT_TRUE(format.has_value());
  keep_control_markers(testing::qwen3_tokenizer(), &format->syntax);  // no [TOOL_CALLS]
  EXPECT_TRUE(format->syntax.token_markers.empty());
  auto g = grammar::compile_tool_call_syntax(kTools, format->syntax);
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(g.value().has_token_terminals());
  grammar::Automaton a(std::move(g).value());
  EXPECT_TRUE(
      matches(a, "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}]"));  // spelled as text
}

// Qwen3-Coder writes a string parameter raw (its template renders strings with |string) and
// anything else as JSON. Raw text the parser reads back as that very string is accepted; raw
// text it would read as another JSON value, or that would end the parameter early, is not.
const char* kCoderTools = R"([{"type":"function","function":{"name":"search","parameters":{
  "type":"object","properties":{"query":{"type":"string","description":"what to look for"},
  "limit":{"type":"integer"},"filters":{"type":"object","properties":{"lang":{"type":"string"}}}},
  "required":["query"]}}}])";

std::string coder_call(const std::string& query_value, const std::string& more = "") {
  return "<tool_call>\n<function=search>\n<parameter=query>\n" + query_value + "\n</parameter>\n" +
         more + "</function>\n</tool_call>";
}

TEST(ToolCallFormat, Qwen3CoderStringsAreRawTextAsTheParserReadsThem) {
  auto format = tool_call_format(chat::ToolFormat::kHermes, "<function=", true);
  ASSERT_TRUE(format.has_value());
  auto g = grammar::compile_tool_call_syntax(kCoderTools, format->syntax);
  ASSERT_TRUE(g.ok()) << g.error().message;
  grammar::Automaton a(std::move(g).value());
  chat::ParserConfig config;
  config.format = chat::ToolFormat::kHermes;
  const std::string more = "<parameter=limit>\n5\n</parameter>\n";
  for (const std::string raw :
       {"hello world", "true story", "t", "nul", "falsey", "null;", "<b>x</b> & </param",
        "if (a < b) {\n  return \"</tool\";\n}", "été", "x\n", "\"quoted\"", "\"\\u003c/p\""}) {
    SCOPED_TRACE(raw);
    const std::string text = coder_call(raw, more);
    ASSERT_TRUE(matches(a, text));
    const chat::ParsedMessage m = chat::parse_all(config, text);
    ASSERT_EQ(m.tool_calls.size(), 1u) << m.content;
    const ordered_json args = ordered_json::parse(m.tool_calls[0].arguments_json);
    ASSERT_TRUE(args["query"].is_string()) << args.dump();
    // Raw text is the string itself; a quoted value is JSON.
    const std::string want =
        raw[0] == '"' ? ordered_json::parse(raw).get<std::string>() : std::string(raw);
    EXPECT_EQ(args["query"].get<std::string>(), want);
    EXPECT_EQ(args["limit"], 5);
  }
  // What the parser would read as something else than that string, or cut short.
  for (const std::string raw : {"true", "null  ", "false\n", "42", "-1 apple", "[1]", "{}", " x",
                                "\tx", "a</parameter>b", "a</tool_call>b",
                                "\xEF\xBB\xBF"
                                "1"}) {
    SCOPED_TRACE(raw);
    EXPECT_FALSE(matches(a, coder_call(raw)));
  }
  // Other types stay JSON: an integer raw is JSON already, a string is not an integer.
  EXPECT_FALSE(matches(a, coder_call("x", "<parameter=limit>\nfive\n</parameter>\n")));
  EXPECT_TRUE(
      matches(a, coder_call("x", "<parameter=filters>\n{\"lang\":\"en\"}\n</parameter>\n")));
  // Random strings of the grammar parse as calls whose arguments have the schema's types.
  std::mt19937 rng(7);
  int num_done = 0;
  for (int attempt = 0; attempt < 3000 && num_done < 200; ++attempt) {
    std::string text;
    int32_t s = a.initial();
    bool done = false;
    while (text.size() < 400) {
      const grammar::ByteSet& first = a.first_bytes(s);
      if (a.accepting(s) && (first.empty() || rng() % 4 == 0)) {
        done = true;
        break;
      }
      std::vector<uint8_t> bytes;
      for (int b = 0; b < 256; ++b)
        if (first.has(static_cast<uint8_t>(b))) bytes.push_back(static_cast<uint8_t>(b));
      ASSERT_FALSE(bytes.empty()) << text;
      // Now and then a closing string where the grammar takes it whole (uniform bytes would
      // rarely end a raw value), or a byte that begins one (closing words inside values).
      if (rng() % 8 == 0) {
        bool took = false;
        for (const char* closer : {"\n</parameter>\n", "</function>\n</tool_call>"}) {
          const int32_t after = a.step(s, closer);
          if (after != grammar::Automaton::kDead) {
            text += closer;
            s = after;
            took = true;
            break;
          }
        }
        if (took) continue;
      }
      uint8_t b = bytes[rng() % bytes.size()];
      for (uint8_t pick : {uint8_t('<'), uint8_t('\n'), uint8_t('/')}) {
        if (first.has(pick) && rng() % 6 == 0) b = pick;
      }
      text += static_cast<char>(b);
      s = a.step(s, b);
      ASSERT_NE(s, grammar::Automaton::kDead);
    }
    if (!done) continue;
    ++num_done;
    const chat::ParsedMessage m = chat::parse_all(config, text);
    ASSERT_FALSE(m.tool_calls.empty()) << text;  // parallel calls: one or more
    EXPECT_EQ(m.content, "") << text;
    for (const chat::ToolCall& call : m.tool_calls) {
      const ordered_json args = ordered_json::parse(call.arguments_json);
      EXPECT_TRUE(args.contains("query") && args["query"].is_string()) << text;
      if (args.contains("limit")) {
        EXPECT_TRUE(args["limit"].is_number_integer()) << text;
      }
      if (args.contains("filters")) {
        EXPECT_TRUE(args["filters"].is_object()) << text;
        if (args["filters"].contains("lang")) {
          EXPECT_TRUE(args["filters"]["lang"].is_string()) << text;
        }
      }
    }
  }
  EXPECT_GE(num_done, 50);
}

// Llama 3's lazy trigger and the grammar agree on the whitespace after '{': every run the
// trigger fires on, the grammar reads (from the trigger's first byte), and a longer run is
// neither a trigger nor a call.
TEST(ToolCallFormat, Llama3TriggerTakesTheWhitespaceTheGrammarAllows) {
  auto format = tool_call_format(chat::ToolFormat::kLlama3, "", true);
  ASSERT_TRUE(format.has_value());
  keep_control_markers(testing::qwen3_tokenizer(), &format->syntax);
  auto g = grammar::compile_tool_call_syntax(kTools, format->syntax);
  ASSERT_TRUE(g.ok());
  // A byte vocabulary: token b is byte b, 256 the end.
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  bytes.emplace_back("");
  auto compiled = std::make_shared<grammar::CompiledGrammar>(
      std::move(g).value(), grammar::TokenIndex::create(bytes, {256}));
  engine::GrammarStart start;
  start.triggers = format->triggers;
  int32_t max_space = 0;
  for (const auto& t : start.triggers) max_space = std::max(max_space, t.max_space);
  ASSERT_GE(max_space, 4);
  const std::string body = "\"name\": \"now\", \"parameters\": {}}";
  for (const std::string space : {" ", "\n", "\t", "\n  "}) {
    for (int n = 0; n <= max_space + 1; ++n) {
      std::string run;
      while (static_cast<int>(run.size()) < n) run += space;
      run.resize(n);
      SCOPED_TRACE(testing::json(run).dump());
      engine::ConstraintGate gate(compiled, start,
                                  [&](int32_t id) { return std::string_view(bytes[id]); }, {256});
      const std::string text = "{" + run + body;
      bool ok = true;
      for (char c : text) ok = ok && gate.accept(static_cast<uint8_t>(c));
      EXPECT_TRUE(ok);
      if (n <= max_space) {
        EXPECT_EQ(gate.phase(), engine::ConstraintGate::Phase::kConstrained);
        EXPECT_TRUE(gate.matcher().can_end());
        EXPECT_TRUE(matches_bytes(compiled, text));
      } else {
        EXPECT_EQ(gate.phase(), engine::ConstraintGate::Phase::kFree);
        EXPECT_FALSE(matches_bytes(compiled, text));
      }
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
