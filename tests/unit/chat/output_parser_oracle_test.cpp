// The output parser's oracle: for each format, realistic model outputs with hand-written
// expected results. parse_all() must give the expected message, and streaming the same text
// in random chunkings (chunk sizes 1..N, cuts inside tags and inside UTF-8 sequences) must
// accumulate to exactly the same message, with well-formed events along the way.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/chat/output_parser.h"
#include "unit/chat/output_parser_test_util.h"

namespace kiln::chat {
namespace {

using test::Case;
using test::config;

// ---------------------------------------------------------------------------------------
// Reasoning only (no tool format)
// ---------------------------------------------------------------------------------------
std::vector<Case> reasoning_cases() {
  const ParserConfig plain = config(ToolFormat::kNone);
  const ParserConfig think = config(ToolFormat::kNone, /*reasoning=*/true);
  const ParserConfig open = config(ToolFormat::kNone, true, /*open_at_start=*/true);
  ParserConfig mistral_think = think;
  mistral_think.think_open = "[THINK]";
  mistral_think.think_close = "[/THINK]";
  return {
      {"plain", plain, "Hello, world! 2 < 3 and <b>bold</b>.",
       "Hello, world! 2 < 3 and <b>bold</b>."},
      {"reasoning_disabled_keeps_tags", plain, "<think>x</think>y", "<think>x</think>y"},
      {"think_block", think, "<think>\nLet me think: 2+2.\n</think>\n\nThe answer is 4.",
       "The answer is 4.", "Let me think: 2+2."},
      {"think_no_block", think, "  Just an answer.\n", "Just an answer.\n"},
      {"think_empty_block", think, "<think>\n\n</think>\n\nHi", "Hi"},
      {"think_unclosed", think, "<think>still thinking about 😀 and ", "",
       "still thinking about 😀 and"},
      {"think_unclosed_partial_close", think, "<think>abc</thi", "", "abc</thi"},
      {"think_lookalike_tag", think, "<thinking>hmm</thinking> ok", "<thinking>hmm</thinking> ok"},
      {"think_tag_not_at_start", think, "Hi <think>no</think>", "Hi <think>no</think>"},
      {"think_content_ends_partial", think, "<think>r</think>answer <", "answer <", "r"},
      {"think_lt_inside", think, "<think>a<b </thin </think>done", "done", "a<b </thin"},
      {"think_whitespace_only", think, " \n\t", ""},
      {"open_at_start", open, "Okay, so 2+2 is 4.\n</think>\n\n**4**", "**4**",
       "Okay, so 2+2 is 4."},
      {"open_at_start_repeated_open", open, "<think>\nhm\n</think>ok", "ok", "hm"},
      {"open_at_start_unclosed", open, "thinking 日本語", "", "thinking 日本語"},
      {"open_at_start_second_close_is_content", open, "a</think>b</think>c", "b</think>c", "a"},
      {"mistral_think_tags", mistral_think, "[THINK]plan: 😀[/THINK]Result", "Result", "plan: 😀"},
      {"long_space_run_before_close", think, "<think>r" + std::string(100, ' ') + "</think>ok",
       "ok", "r" + std::string(36, ' ')},
      {"utf8_content", plain, "Ünïcödé — 中文 — العربية — 👩‍👩‍👧",
       "Ünïcödé — 中文 — العربية — 👩‍👩‍👧"},
  };
}

// ---------------------------------------------------------------------------------------
// Hermes / Qwen (JSON and Qwen3-Coder XML bodies)
// ---------------------------------------------------------------------------------------
std::vector<Case> hermes_cases() {
  const ParserConfig h = config(ToolFormat::kHermes);
  const ParserConfig qwen3 = config(ToolFormat::kHermes, true);
  const std::string weather =
      R"J(<tool_call>
{"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}
</tool_call>)J";
  const std::string time = R"J(<tool_call>
{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}
</tool_call>)J";
  return {
      {"single",
       h,
       weather,
       "",
       "",
       {{"get_weather", R"J({"location":"Paris","unit":"celsius"})J"}}},
      {"content_before",
       h,
       "Let me check the weather.\n\n" + weather,
       "Let me check the weather.",
       "",
       {{"get_weather", R"J({"location":"Paris","unit":"celsius"})J"}}},
      {"two_calls",
       h,
       weather + "\n" + time + "\n",
       "",
       "",
       {{"get_weather", R"J({"location":"Paris","unit":"celsius"})J"},
        {"get_time", R"J({"tz":"Europe/Paris"})J"}}},
      {"content_between",
       h,
       "A " + weather + "\nB\n" + time,
       "AB",
       "",
       {{"get_weather", R"J({"location":"Paris","unit":"celsius"})J"},
        {"get_time", R"J({"tz":"Europe/Paris"})J"}}},
      {"qwen3_reasoning_then_call",
       qwen3,
       "<think>\nI should call the tool.\n</think>\n\n" + weather,
       "",
       "I should call the tool.",
       {{"get_weather", R"J({"location":"Paris","unit":"celsius"})J"}}},
      {"unicode_args",
       h,
       R"J(<tool_call>{"name": "translate", "arguments": {"city": "München", "text": "日本語 😀", "esc": "\u00e9\n", "n": [1, 2.5, null, true]}}</tool_call>)J",
       "",
       "",
       {{"translate",
         R"J({"city":"München","text":"日本語 😀","esc":"é\n","n":[1,2.5,null,true]})J"}}},
      {"braces_in_strings",
       h,
       R"J(<tool_call>{"name": "f", "arguments": {"s": "}{\"]["}}</tool_call>)J",
       "",
       "",
       {{"f", R"J({"s":"}{\"]["})J"}}},
      {"arguments_as_string",
       h,
       R"J(<tool_call>{"name": "f", "arguments": "{\"x\": 1}"}</tool_call>)J",
       "",
       "",
       {{"f", R"J({"x":1})J"}}},
      {"no_arguments_key",
       h,
       R"J(<tool_call>{"name": "ping"}</tool_call>)J",
       "",
       "",
       {{"ping", "{}"}}},
      {"missing_close_tag_complete_json",
       h,
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n",
       "",
       "",
       {{"f", R"J({"a":1})J"}}},
      {"malformed_json", h,
       "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call> after",
       "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call> after"},
      {"malformed_then_good",
       h,
       "<tool_call>{oops}</tool_call>" + time,
       "<tool_call>{oops}</tool_call>",
       "",
       {{"get_time", R"J({"tz":"Europe/Paris"})J"}}},
      {"missing_name", h, R"J(<tool_call>{"arguments": {}}</tool_call>)J",
       R"J(<tool_call>{"arguments": {}}</tool_call>)J"},
      {"arguments_not_object", h, R"J(<tool_call>{"name": "f", "arguments": 3}</tool_call>)J",
       R"J(<tool_call>{"name": "f", "arguments": 3}</tool_call>)J"},
      {"close_tag_inside_argument",
       h,
       R"J(<tool_call>{"name": "f", "arguments": {"s": "</tool_call> x"}}</tool_call>)J",
       "",
       "",
       {{"f", R"J({"s":"</tool_call> x"})J"}}},
      {"missing_brace_then_good",
       h,
       R"J(<tool_call>{"name": "f", "arguments": {"a": 1}</tool_call>)J" + time,
       R"J(<tool_call>{"name": "f", "arguments": {"a": 1}</tool_call>)J",
       "",
       {{"get_time", R"J({"tz":"Europe/Paris"})J"}}},
      {"junk_after_json", h, R"J(<tool_call>{"name": "f", "arguments": {}} junk</tool_call>)J",
       R"J(<tool_call>{"name": "f", "arguments": {}} junk</tool_call>)J"},
      {"unterminated", h, "Sure.\n<tool_call>\n{\"name\": \"f\", \"argu",
       "Sure.\n<tool_call>\n{\"name\": \"f\", \"argu"},
      {"lt_not_a_tag", h, "if a <b then <tool> and <tool_calls",
       "if a <b then <tool> and <tool_calls"},
      {"ends_mid_tag", h, "Done.\n<tool_ca", "Done.\n<tool_ca"},
      {"close_tag_alone", h, "x </tool_call> y", "x </tool_call> y"},
      {"long_space_run_before_call",
       h,
       "Text" + std::string(100, '\n') + weather,
       "Text" + std::string(36, '\n'),
       "",
       {{"get_weather", R"J({"location":"Paris","unit":"celsius"})J"}}},
      {"qwen3_coder_xml",
       h,
       "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nNew "
       "York\n</parameter>\n"
       "<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"metric\": true}\n</parameter>\n"
       "</function>\n</tool_call>",
       "I'll check.",
       "",
       {{"get_weather", R"J({"location":"New York","days":3,"opts":{"metric":true}})J"}}},
      {"qwen3_coder_multiline_value",
       h,
       "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n</parameter>\n"
       "<parameter=content>\ndef f():\n    return \"é\"\n\n</parameter>\n</function>\n</tool_call>",
       "",
       "",
       {{"write_file", R"J({"path":"/tmp/a.py","content":"def f():\n    return \"é\"\n"})J"}}},
      {"qwen3_coder_no_params",
       h,
       "<tool_call>\n<function=now>\n</function>\n</tool_call>",
       "",
       "",
       {{"now", "{}"}}},
      {"qwen3_coder_malformed", h,
       "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>",
       "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>"},
  };
}

// ---------------------------------------------------------------------------------------
// Llama 3.x JSON
// ---------------------------------------------------------------------------------------
std::vector<Case> llama_cases() {
  const ParserConfig l = config(ToolFormat::kLlama3);
  return {
      {"call",
       l,
       R"J({"name": "get_weather", "parameters": {"city": "Paris"}})J",
       "",
       "",
       {{"get_weather", R"J({"city":"Paris"})J"}}},
      {"arguments_key",
       l,
       R"J({"name": "f", "arguments": {"x": 1}})J",
       "",
       "",
       {{"f", R"J({"x":1})J"}}},
      {"python_tag",
       l,
       R"J(<|python_tag|>{"name": "f", "parameters": {}})J",
       "",
       "",
       {{"f", "{}"}}},
      {"leading_whitespace",
       l,
       "\n\n  {\"name\": \"f\", \"parameters\": {\"q\": \"日本\"}}",
       "",
       "",
       {{"f", R"J({"q":"日本"})J"}}},
      {"type_first",
       l,
       R"J({"type": "function", "name": "f", "parameters": {"x": 1}})J",
       "",
       "",
       {{"f", R"J({"x":1})J"}}},
      {"two_calls",
       l,
       R"J({"name": "a", "parameters": {}}; {"name": "b", "parameters": {"k": "v"}})J",
       "",
       "",
       {{"a", "{}"}, {"b", R"J({"k":"v"})J"}}},
      {"text_after_call",
       l,
       "{\"name\": \"f\", \"parameters\": {}}\nDone.",
       "Done.",
       "",
       {{"f", "{}"}}},
      {"content_then_python_tag",
       l,
       R"J(Calling now. <|python_tag|>{"name": "f", "parameters": {"a": [1]}})J",
       "Calling now.",
       "",
       {{"f", R"J({"a":[1]})J"}}},
      {"plain_text", l, "The weather is nice; {braces} too.", "The weather is nice; {braces} too."},
      {"json_answer_not_call", l, R"J({"answer": 42})J", R"J({"answer": 42})J"},
      {"name_without_parameters", l, R"J({"name": "Bob", "age": 3})J",
       R"J({"name": "Bob", "age": 3})J"},
      {"name_key_prefix", l, R"J({"nam": 1})J", R"J({"nam": 1})J"},
      {"unterminated", l, R"J({"name": "f", "parameters": {"x": )J",
       R"J({"name": "f", "parameters": {"x": )J"},
      {"brace_alone", l, "{", "{"},
      {"space_before_key_over_limit", l,
       "{" + std::string(65, ' ') + R"J("name": "f", "parameters": {}})J",
       "{" + std::string(65, ' ') + R"J("name": "f", "parameters": {}})J"},
      {"partial_key", l, "{ \"na", "{ \"na"},
      {"invalid_json_balanced", l, R"J({"name": "f", "parameters": {x}} tail)J",
       R"J({"name": "f", "parameters": {x}} tail)J"},
      {"non_json_multibyte_after_key", l, R"J({"name": "f", "parameters": {é: 1}} ok)J",
       R"J({"name": "f", "parameters": {é: 1}} ok)J"},
      {"python_tag_builtin", l, R"J(<|python_tag|>brave_search.call(query="kiln"))J",
       R"J(<|python_tag|>brave_search.call(query="kiln"))J"},
      {"python_tag_at_end", l, "Let me search.<|python_tag|>", "Let me search.<|python_tag|>"},
      {"ends_mid_python_tag", l, "Hmm <|python_t", "Hmm <|python_t"},
      {"call_not_at_start", l, R"J(Here: {"name": "f", "parameters": {}})J",
       R"J(Here: {"name": "f", "parameters": {}})J"},
  };
}

// ---------------------------------------------------------------------------------------
// Mistral
// ---------------------------------------------------------------------------------------
std::vector<Case> mistral_cases() {
  const ParserConfig m = config(ToolFormat::kMistral);
  ParserConfig magistral = config(ToolFormat::kMistral, true);
  magistral.think_open = "[THINK]";
  magistral.think_close = "[/THINK]";
  return {
      {"array_call",
       m,
       R"J([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}])J",
       "",
       "",
       {{"get_weather", R"J({"city":"Paris"})J"}}},
      {"array_two_calls",
       m,
       R"J([TOOL_CALLS] [{"name": "a", "arguments": {"x": "ü"}}, {"name": "b", "arguments": {}}])J",
       "",
       "",
       {{"a", R"J({"x":"ü"})J"}, {"b", "{}"}}},
      {"named",
       m,
       R"J([TOOL_CALLS]get_weather[ARGS]{"city": "Paris"})J",
       "",
       "",
       {{"get_weather", R"J({"city":"Paris"})J"}}},
      {"named_call_id",
       m,
       R"J([TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"})J",
       "",
       "",
       {{"get_weather", R"J({"city":"Paris"})J"}}},
      {"named_two",
       m,
       R"J([TOOL_CALLS]a[ARGS]{}[TOOL_CALLS]b[ARGS]{"x": [1, 2]})J",
       "",
       "",
       {{"a", "{}"}, {"b", R"J({"x":[1,2]})J"}}},
      {"content_before",
       m,
       "Let me look.\n[TOOL_CALLS]search[ARGS]{\"q\": \"🦀 crab\"}",
       "Let me look.",
       "",
       {{"search", R"J({"q":"🦀 crab"})J"}}},
      {"reasoning_then_call",
       magistral,
       "[THINK]Need data.[/THINK]\n[TOOL_CALLS]f[ARGS]{}",
       "",
       "Need data.",
       {{"f", "{}"}}},
      {"malformed_args", m, R"J([TOOL_CALLS]f[ARGS]{"x": } and more)J",
       R"J([TOOL_CALLS]f[ARGS]{"x": } and more)J"},
      {"bad_name", m, "[TOOL_CALLS]hello world", "[TOOL_CALLS]hello world"},
      {"missing_args_tag", m, "[TOOL_CALLS]f[OOPS]{}", "[TOOL_CALLS]f[OOPS]{}"},
      {"unterminated_array", m, R"J(Ok [TOOL_CALLS][{"name": "f", "arguments": {)J",
       R"J(Ok [TOOL_CALLS][{"name": "f", "arguments": {)J"},
      {"array_bad_item", m, R"J([TOOL_CALLS][{"name": "f", "arguments": {}}, 3])J",
       R"J([TOOL_CALLS][{"name": "f", "arguments": {}}, 3])J"},
      {"brackets_not_tags", m, "Use [TOOLS] or [TOOL_CALL] here [TOOL",
       "Use [TOOLS] or [TOOL_CALL] here [TOOL"},
      {"marker_at_end", m, "x [TOOL_CALLS]", "x [TOOL_CALLS]"},
      {"space_after_marker_within_limit",
       m,
       "[TOOL_CALLS]" + std::string(64, ' ') + "f[ARGS]{}",
       "",
       "",
       {{"f", "{}"}}},
      {"space_after_marker_over_limit", m, "[TOOL_CALLS]" + std::string(65, ' ') + "f[ARGS]{}",
       "[TOOL_CALLS]" + std::string(65, ' ') + "f[ARGS]{}"},
      {"malformed_then_good",
       m,
       R"J([TOOL_CALLS]1 2[TOOL_CALLS]g[ARGS]{"k": 1})J",
       "[TOOL_CALLS]1 2",
       "",
       {{"g", R"J({"k":1})J"}}},
  };
}

// ---------------------------------------------------------------------------------------
// DeepSeek V3 / R1 / V3.1
// ---------------------------------------------------------------------------------------
std::vector<Case> deepseek_cases() {
  const ParserConfig d = config(ToolFormat::kDeepSeek);
  const ParserConfig r1 = config(ToolFormat::kDeepSeek, true, true);
  const std::string r1_call =
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"location\": "
      "\"Paris\"}\n```"
      "<｜tool▁call▁end｜>";
  const std::string r1_call2 =
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"tz\": \"東京\"}\n```"
      "<｜tool▁call▁end｜>";
  const std::string v31_call =
      "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"location\": \"東京\"}<｜tool▁call▁end｜>";
  const std::string bad_call =
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": \n```<｜tool▁call▁end｜>";
  const std::string begin = "<｜tool▁calls▁begin｜>";
  const std::string end = "<｜tool▁calls▁end｜>";
  return {
      {"r1_call", d, begin + r1_call + end, "", "", {{"get_weather", R"J({"location":"Paris"})J"}}},
      {"r1_reasoning_two_calls",
       r1,
       "Need weather and time.\n</think>\n\nChecking." + begin + r1_call + "\n" + r1_call2 + end,
       "Checking.",
       "Need weather and time.",
       {{"get_weather", R"J({"location":"Paris"})J"}, {"get_time", R"J({"tz":"東京"})J"}}},
      {"v31_call",
       d,
       begin + v31_call + end,
       "",
       "",
       {{"get_weather", R"J({"location":"東京"})J"}}},
      {"missing_calls_end",
       d,
       begin + v31_call,
       "",
       "",
       {{"get_weather", R"J({"location":"東京"})J"}}},
      {"text_after_block",
       d,
       begin + v31_call + end + "\nDone.",
       "Done.",
       "",
       {{"get_weather", R"J({"location":"東京"})J"}}},
      {"malformed_first", d, begin + bad_call + end, begin + bad_call + end},
      {"malformed_second",
       d,
       begin + r1_call + "\n" + bad_call + end,
       bad_call + end,
       "",
       {{"get_weather", R"J({"location":"Paris"})J"}}},
      {"unterminated", d,
       "Let me." + begin + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\":",
       "Let me." + begin + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\":"},
      {"long_space_between_calls",
       d,
       begin + v31_call + std::string(1000, '\n') + v31_call + end,
       "",
       "",
       {{"get_weather", R"J({"location":"東京"})J"}, {"get_weather", R"J({"location":"東京"})J"}}},
      {"begin_without_call", d, begin + "oops", begin + "oops"},
      {"ends_mid_token", d, "Answer <｜tool▁ca", "Answer <｜tool▁ca"},
      {"fullwidth_bar_not_token", d, "a ｜ b <｜User｜> <｜tool", "a ｜ b <｜User｜> <｜tool"},
      {"no_separator", d, begin + "<｜tool▁call▁begin｜>f{}<｜tool▁call▁end｜>",
       begin + "<｜tool▁call▁begin｜>f{}<｜tool▁call▁end｜>"},
  };
}

class Oracle : public testing::TestWithParam<Case> {};

TEST_P(Oracle, ParseAllMatchesExpected) {
  const Case& c = GetParam();
  EXPECT_EQ(parse_all(c.config, c.text), test::expected_message(c));
}

TEST_P(Oracle, RandomChunkingsMatchParseAll) {
  const Case& c = GetParam();
  const ParsedMessage whole = parse_all(c.config, c.text);
  // Byte at a time: every cut inside every tag and every UTF-8 sequence.
  EXPECT_EQ(test::stream_in_chunks(c.config, c.text, nullptr, 1), whole) << "byte by byte";
  for (uint32_t seed = 0; seed < 60; ++seed) {
    std::mt19937 rng(seed);
    const size_t max_chunk = 1 + seed % 17;
    EXPECT_EQ(test::stream_in_chunks(c.config, c.text, &rng, max_chunk), whole)
        << "seed " << seed << " max chunk " << max_chunk;
  }
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return std::string(tool_format_name(info.param.config.format)) + "_" + info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Reasoning, Oracle, testing::ValuesIn(reasoning_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Hermes, Oracle, testing::ValuesIn(hermes_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Llama3, Oracle, testing::ValuesIn(llama_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Mistral, Oracle, testing::ValuesIn(mistral_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(DeepSeek, Oracle, testing::ValuesIn(deepseek_cases()), case_name);

}  // namespace
}  // namespace kiln::chat
