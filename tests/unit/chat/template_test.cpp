// render_chat: the variables a chat template sees (as Hugging Face's apply_chat_template
// passes them) and the ChatML fallback.
#include "kiln/chat/template.h"

#include <gtest/gtest.h>

namespace {

using kiln::chat::ChatOptions;
using kiln::chat::render_chat;
using nlohmann::ordered_json;

ordered_json conversation() {
  return ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "image"},
                                 {"type": "text", "text": "there"}]},
    {"role": "assistant", "content": "Hello."}
  ])");
}

TEST(ChatTemplate, ChatMLFallbackExactText) {
  ChatOptions opts;
  auto out = render_chat(kiln::chat::kChatMLTemplate, conversation(), opts);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out,
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>assistant\n");
  opts.add_generation_prompt = false;
  out = render_chat(kiln::chat::kChatMLTemplate, conversation(), opts);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->substr(out->size() - 17), "Hello.<|im_end|>\n");
}

TEST(ChatTemplate, VariablesLikeHuggingFace) {
  ChatOptions opts;
  opts.bos_token = "<s>";
  opts.eos_token = "</s>";
  opts.add_generation_prompt = false;
  opts.chat_template_kwargs = ordered_json{{"enable_thinking", false}, {"reasoning_effort", "low"}};
  const char* tmpl =
      "{{ bos_token }}|{{ eos_token }}|{{ tools is none }}|{{ documents is none }}|"
      "{{ add_generation_prompt }}|{{ enable_thinking }}|{{ reasoning_effort }}|"
      "{{ messages|length }}|{{ messages[1].content[1].type }}";
  auto out = render_chat(tmpl, conversation(), opts);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, "<s>|</s>|True|True|False|False|low|3|image");
}

TEST(ChatTemplate, KwargsOverrideAndExtraContext) {
  ChatOptions opts;
  opts.bos_token = "<s>";
  opts.extra_context = ordered_json{{"unk_token", "<unk>"}};
  opts.chat_template_kwargs = ordered_json{{"bos_token", "[BOS]"}};
  auto out = render_chat("{{ bos_token }}{{ unk_token }}", ordered_json::array(), opts);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "[BOS]<unk>");
}

TEST(ChatTemplate, ToolsKeepClientKeyOrderInToJson) {
  ChatOptions opts;
  opts.tools = ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}])");
  auto out = render_chat("{{ tools[0]|tojson }}", ordered_json::array(), opts);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out,
            R"({"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}})");
}

TEST(ChatTemplate, StrftimeNowUsesInjectedDate) {
  ChatOptions opts;
  std::tm now{};
  now.tm_year = 2024 - 1900;
  now.tm_mon = 11;
  now.tm_mday = 3;
  opts.now = now;
  auto out = render_chat("{{ strftime_now('%d %b %Y') }}", ordered_json::array(), opts);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "03 Dec 2024");
}

TEST(ChatTemplate, Errors) {
  ChatOptions opts;
  auto out = render_chat("x", ordered_json::object(), opts);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("array"), std::string::npos);
  out = render_chat(
      "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
      "{% endif %}",
      conversation(), opts);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("System role not supported"), std::string::npos);
  opts.chat_template_kwargs = ordered_json::array();
  out = render_chat("x", conversation(), opts);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("chat_template_kwargs"), std::string::npos);
}

}  // namespace

namespace {

TEST(ChatTemplate, ParsedOnceRenderedTwice) {
  auto parsed = kiln::chat::jinja::Template::parse(kiln::chat::kChatMLTemplate);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  kiln::chat::ChatOptions opts;
  auto a = kiln::chat::render_chat(*parsed,
                                   ordered_json::parse(R"([{"role":"user","content":"a"}])"), opts);
  auto b = kiln::chat::render_chat(*parsed,
                                   ordered_json::parse(R"([{"role":"user","content":"b"}])"), opts);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(*b, "<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n");
}

}  // namespace

namespace {

TEST(ChatTemplate, DeeplyNestedRequestJsonRefused) {
  ordered_json deep = "leaf";
  for (int i = 0; i < 1000; ++i) deep = ordered_json::array({deep});
  ordered_json messages = ordered_json::array({{{"role", "user"}, {"content", deep}}});
  auto out = kiln::chat::render_chat("{{ messages|length }}", messages, ChatOptions{});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("nested deeper"), std::string::npos);
}

}  // namespace
