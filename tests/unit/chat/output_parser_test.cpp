// Output parser: configuration from real chat templates, ids, and the streaming behaviour
// that the oracle cannot see from accumulated results alone (what is held back and for
// how long, what each event carries).
#include "kiln/chat/output_parser.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "unit/chat/output_parser_test_util.h"

namespace kiln::chat {
namespace {

using test::config;

// Real templates live beside the repository (../shared/templates), not in it.
std::optional<std::string> read_template(const std::string& file) {
  const std::filesystem::path path =
      std::filesystem::path(KILN_SOURCE_DIR) / ".." / "shared" / "templates" / file;
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct TemplateExpectation {
  const char* file;
  ToolFormat format;
  bool reasoning;
  bool open_at_start;
  const char* think_open;
};

TEST(OutputParserConfig, DetectsFamiliesInRealTemplates) {
  const TemplateExpectation rows[] = {
      {"Qwen-Qwen2.5-7B-Instruct.jinja", ToolFormat::kHermes, false, false, "<think>"},
      {"Qwen-Qwen3-0.6B.jinja", ToolFormat::kHermes, true, false, "<think>"},
      {"Qwen-QwQ-32B.jinja", ToolFormat::kHermes, true, true, "<think>"},
      {"Qwen3.5-4B.jinja", ToolFormat::kHermes, true, true, "<think>"},
      {"Qwen3-Coder.jinja", ToolFormat::kHermes, false, false, "<think>"},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ToolFormat::kHermes, false, false,
       "<think>"},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolFormat::kLlama3, false, false, "<think>"},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", ToolFormat::kLlama3, false, false, "<think>"},
      {"meta-llama-Llama-3.3-70B-Instruct.jinja", ToolFormat::kLlama3, false, false, "<think>"},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolFormat::kMistral, false, false, "<think>"},
      {"Mistral-Small-3.2-24B-Instruct-2506.jinja", ToolFormat::kMistral, false, false, "<think>"},
      {"unsloth-mistral-Devstral-Small-2507.jinja", ToolFormat::kMistral, false, false, "<think>"},
      {"mistralai-Ministral-3-14B-Reasoning-2512.jinja", ToolFormat::kMistral, true, false,
       "[THINK]"},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ToolFormat::kDeepSeek, true, true,
       "<think>"},
      {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", ToolFormat::kDeepSeek, true, true,
       "<think>"},
      {"deepseek-ai-DeepSeek-V3.1.jinja", ToolFormat::kDeepSeek, true, true, "<think>"},
      {"google-gemma-2-2b-it.jinja", ToolFormat::kNone, false, false, "<think>"},
      {"microsoft-Phi-3.5-mini-instruct.jinja", ToolFormat::kNone, false, false, "<think>"},
  };
  int num_checked = 0;
  for (const auto& row : rows) {
    auto text = read_template(row.file);
    if (!text) continue;
    ++num_checked;
    const ParserConfig c = config_for_template(*text);
    EXPECT_EQ(c.format, row.format) << row.file << " got " << tool_format_name(c.format);
    EXPECT_EQ(c.reasoning, row.reasoning) << row.file;
    EXPECT_EQ(c.reasoning_open_at_start, row.open_at_start) << row.file;
    EXPECT_EQ(c.think_open, row.think_open) << row.file;
  }
  if (num_checked == 0) GTEST_SKIP() << "../shared/templates not present";
}

TEST(OutputParserConfig, DetectsFromMarkersAlone) {
  EXPECT_EQ(config_for_template("{{ '<tool_call>' }}").format, ToolFormat::kHermes);
  EXPECT_EQ(config_for_template("{{ '[TOOL_CALLS]' }}").format, ToolFormat::kMistral);
  EXPECT_EQ(config_for_template("{{ '<｜tool▁calls▁begin｜>' }}").format, ToolFormat::kDeepSeek);
  EXPECT_EQ(config_for_template("{{ '<|python_tag|>' }}").format, ToolFormat::kLlama3);
  EXPECT_EQ(config_for_template("{{ 'hello' }}").format, ToolFormat::kNone);
  // Thinking mentioned only in history rendering: reasoning on, not open at start.
  ParserConfig c = config_for_template(
      "{{ '<think>\\n' + r + '\\n</think>' }}{% if add_generation_prompt %}{{ 'A:' }}{% endif %}");
  EXPECT_TRUE(c.reasoning);
  EXPECT_FALSE(c.reasoning_open_at_start);
  c = config_for_template(
      "{{ '<think>' + r + '</think>' }}{% if add_generation_prompt %}{{ 'A:<think>\\n' }}{% endif "
      "%}");
  EXPECT_TRUE(c.reasoning_open_at_start);
}

TEST(OutputParserConfig, AdjustForPrompt) {
  ParserConfig c = config(ToolFormat::kHermes, true);
  adjust_for_prompt(c, "<|im_start|>assistant\n<think>\n");
  EXPECT_TRUE(c.reasoning_open_at_start);
  adjust_for_prompt(c, "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_FALSE(c.reasoning_open_at_start);
  adjust_for_prompt(c, "<｜Assistant｜><think></think>");  // DeepSeek V3.1, thinking off
  EXPECT_FALSE(c.reasoning_open_at_start);
  c.reasoning_open_at_start = true;
  adjust_for_prompt(c, "<|im_start|>assistant\n");  // no tag: left as configured
  EXPECT_TRUE(c.reasoning_open_at_start);
  ParserConfig plain = config(ToolFormat::kNone);
  adjust_for_prompt(plain, "User: hi\nAssistant: <think>");
  EXPECT_TRUE(plain.reasoning);
  EXPECT_TRUE(plain.reasoning_open_at_start);
}

TEST(OutputParserConfig, FormatNamesRoundTrip) {
  for (ToolFormat f : {ToolFormat::kNone, ToolFormat::kHermes, ToolFormat::kLlama3,
                       ToolFormat::kMistral, ToolFormat::kDeepSeek}) {
    EXPECT_EQ(tool_format_from_name(tool_format_name(f)), f);
  }
  EXPECT_EQ(tool_format_from_name("qwen"), std::nullopt);
  EXPECT_EQ(tool_format_from_name(""), std::nullopt);
}

TEST(OutputParserIds, DeterministicAndWellFormed) {
  const std::string a = make_tool_call_id(ToolFormat::kHermes, 1, 0);
  EXPECT_EQ(a, make_tool_call_id(ToolFormat::kHermes, 1, 0));
  EXPECT_NE(a, make_tool_call_id(ToolFormat::kHermes, 1, 1));
  EXPECT_NE(a, make_tool_call_id(ToolFormat::kHermes, 2, 0));
  ASSERT_EQ(a.size(), 14u);
  EXPECT_EQ(a.substr(0, 5), "call_");
  // Mistral templates reject ids that are not exactly 9 alphanumerics.
  const std::string m = make_tool_call_id(ToolFormat::kMistral, 1, 0);
  ASSERT_EQ(m.size(), 9u);
  for (char ch : m) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch))) << m;
  EXPECT_EQ(a.substr(5), m);
}

// Collects what one feed() returns, by kind.
ParsedMessage fold(const std::vector<Event>& events) {
  ParsedMessage m;
  accumulate(m, events);
  return m;
}

TEST(OutputParserStreaming, ContentIsNotHeldLongerThanNeeded) {
  OutputParser p(config(ToolFormat::kHermes, true));
  EXPECT_EQ(fold(p.feed("Hel")).content, "Hel");  // not a tag start: out at once
  EXPECT_EQ(fold(p.feed("lo ")).content, "lo");   // trailing space waits for what follows
  EXPECT_EQ(fold(p.feed("<tool_")).content, "");  // may be a tag
  EXPECT_EQ(fold(p.feed("box> x")).content, " <tool_box> x");
  EXPECT_EQ(fold(p.finish()).content, "");
}

TEST(OutputParserStreaming, PartialTagHeldUntilDecided) {
  OutputParser p(config(ToolFormat::kHermes));
  EXPECT_EQ(fold(p.feed("Sure. <tool_c")).content, "Sure.");
  EXPECT_TRUE(p.feed("all>\n{\"name\": \"f\", ").empty());
  EXPECT_TRUE(p.feed("\"arguments\": {}}\n</tool_ca").empty());
  const auto events = p.feed("ll> ok");
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].kind, Event::Kind::kToolCallBegin);
  EXPECT_EQ(events[0].tool_name, "f");
  EXPECT_EQ(events[0].tool_index, 0);
  EXPECT_EQ(events[0].tool_id, make_tool_call_id(ToolFormat::kHermes, 7, 0));
  EXPECT_EQ(events[1].kind, Event::Kind::kToolCallArgs);
  EXPECT_EQ(events[1].text, "{}");
  EXPECT_EQ(events[2].kind, Event::Kind::kToolCallEnd);
  EXPECT_EQ(events[3].kind, Event::Kind::kContent);
  EXPECT_EQ(events[3].text, "ok");
}

TEST(OutputParserStreaming, ReasoningStreamsAndHoldsOnlyTheCloseTag) {
  OutputParser p(config(ToolFormat::kNone, true));
  EXPECT_TRUE(p.feed("<thi").empty());
  EXPECT_EQ(fold(p.feed("nk>\nStep 1")).reasoning, "Step 1");
  EXPECT_EQ(fold(p.feed(". </thi")).reasoning, ".");
  const ParsedMessage m = fold(p.feed("nk>\n\nAnswer"));
  EXPECT_EQ(m.reasoning, "");
  EXPECT_EQ(m.content, "Answer");
}

TEST(OutputParserStreaming, Utf8SequencesAreNeverSplit) {
  OutputParser p(config(ToolFormat::kNone));
  const std::string euro = "€";  // E2 82 AC
  EXPECT_TRUE(p.feed(euro.substr(0, 1)).empty());
  EXPECT_TRUE(p.feed(euro.substr(1, 1)).empty());
  EXPECT_EQ(fold(p.feed(euro.substr(2))).content, "€");
  // Invalid UTF-8 is not ours to fix: it passes through, nothing is lost.
  OutputParser q(config(ToolFormat::kNone));
  ParsedMessage m =
      fold(q.feed("a\xFF"
                  "b\xC3"));
  accumulate(m, q.finish());
  EXPECT_EQ(m.content,
            "a\xFF"
            "b\xC3");
}

TEST(OutputParserStreaming, LlamaDecidesOnTheFirstKey) {
  OutputParser p(config(ToolFormat::kLlama3));
  EXPECT_TRUE(p.feed("{\"na").empty());  // could still be {"name"
  OutputParser q(config(ToolFormat::kLlama3));
  EXPECT_EQ(fold(q.feed("{\"ans")).content, "{\"ans");  // first key is not a call's: content
  OutputParser r(config(ToolFormat::kLlama3));
  EXPECT_EQ(fold(r.feed("The {")).content, "The {");  // not at the start: content
}

TEST(OutputParserStreaming, DeepSeekEmitsEachCallWhenItEnds) {
  OutputParser p(config(ToolFormat::kDeepSeek));
  auto e =
      p.feed("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{}<｜tool▁call▁end｜>\n");
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].tool_name, "a");
  e = p.feed("<｜tool▁call▁begin｜>b<｜tool▁sep｜>{\"x\": 1}<｜tool▁call▁end｜>");
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].tool_name, "b");
  EXPECT_EQ(e[0].tool_index, 1);
  EXPECT_EQ(e[1].text, "{\"x\":1}");
  EXPECT_TRUE(p.feed("<｜tool▁calls▁end｜>").empty());
  EXPECT_TRUE(p.finish().empty());
}

TEST(OutputParserStreaming, FinishTwiceAndEmptyInput) {
  OutputParser p(config(ToolFormat::kMistral));
  EXPECT_TRUE(p.feed("").empty());
  EXPECT_TRUE(p.finish().empty());
  EXPECT_TRUE(p.finish().empty());
  EXPECT_EQ(parse_all(config(ToolFormat::kHermes, true, true), ""), ParsedMessage{});
}

TEST(OutputParserRobustness, DeepNestingIsTextNotACrash) {
  std::string deep = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": ";
  deep += std::string(100000, '[');
  deep += "</tool_call>";
  EXPECT_EQ(parse_all(config(ToolFormat::kHermes), deep).content, deep);
  std::string llama =
      "{\"name\": \"f\", \"parameters\": " + std::string(5000, '[') + std::string(5000, ']') + "}";
  const ParsedMessage m = parse_all(config(ToolFormat::kLlama3), llama);
  EXPECT_EQ(m.content, llama);
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(OutputParserRobustness, InvalidUtf8InArgumentsIsText) {
  const std::string text =
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"\xC3(\"}}</tool_call>";
  const ParsedMessage m = parse_all(config(ToolFormat::kHermes), text);
  EXPECT_EQ(m.content, text);
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(OutputParserRobustness, OverlongNamesAreText) {
  const std::string text = "[TOOL_CALLS]" + std::string(300, 'a') + "[ARGS]{}";
  EXPECT_EQ(parse_all(config(ToolFormat::kMistral), text).content, text);
}

}  // namespace
}  // namespace kiln::chat
