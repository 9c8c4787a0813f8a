// /v1/chat/completions and /v1/completions over a FakeEngine: response shapes, SSE framing,
// finish reasons, tool calls, reasoning, logprobs, n, and what reaches the engine.
#include <thread>

#include "kiln/chat/template.h"
#include "kiln/engine/sampler.h"
#include "kiln/grammar/matcher.h"
#include "unit/server/test_util.h"

namespace kiln::server::testing {
namespace {

using engine::FinishReason;

class OpenAiTest : public ServerTest {};

TEST_F(OpenAiTest, ChatNonStreamShapeAndPrompt) {
  start();
  Reply r = post("/v1/chat/completions", chat_body("Hi"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.header("content-type"), "application/json");
  json j = r.js();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["model"], "test-model");
  EXPECT_TRUE(j["created"].is_number_integer());
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello world");
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());

  // The engine got the Qwen3 template's prompt, tokenized.
  auto reqs = engine_.requests();
  ASSERT_EQ(reqs.size(), 1u);
  const auto& tok = qwen3_tokenizer();
  const std::string prompt = tok.decode(reqs[0].prompt_tokens);
  EXPECT_EQ(prompt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(j["usage"]["prompt_tokens"], reqs[0].prompt_tokens.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  EXPECT_EQ(j["usage"]["total_tokens"], reqs[0].prompt_tokens.size() + 2);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  // No max_tokens: whatever the context leaves.
  EXPECT_EQ(reqs[0].max_tokens, 4096 - static_cast<int32_t>(reqs[0].prompt_tokens.size()));
}

TEST_F(OpenAiTest, ChatSamplingParamsReachEngine) {
  start();
  json body = chat_body();
  body["temperature"] = 0.5;
  body["top_p"] = 0.9;
  body["top_k"] = 40;
  body["min_p"] = 0.05;
  body["presence_penalty"] = 0.5;
  body["frequency_penalty"] = 0.25;
  body["repetition_penalty"] = 1.1;
  body["seed"] = 1234;
  body["max_completion_tokens"] = 7;
  body["max_tokens"] = 7;  // the same control under two names (request_controls.h)
  body["stop"] = "xyz";
  body["logit_bias"] = {{"15", -100}, {"42", 5}};
  ASSERT_EQ(post("/v1/chat/completions", body).status, 200);
  auto req = engine_.requests().at(0);
  EXPECT_FLOAT_EQ(req.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(req.sampling.top_p, 0.9f);
  EXPECT_EQ(req.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(req.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(req.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(req.sampling.frequency_penalty, 0.25f);
  EXPECT_FLOAT_EQ(req.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(req.sampling.seed, 1234u);
  EXPECT_EQ(req.max_tokens, 7);
  EXPECT_EQ(req.stop, std::vector<std::string>{"xyz"});
  ASSERT_EQ(req.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(req.sampling.logit_bias[0], (std::pair<int32_t, float>{15, -100.0f}));
  EXPECT_EQ(req.sampling.logit_bias[1], (std::pair<int32_t, float>{42, 5.0f}));
}

TEST_F(OpenAiTest, ChatStreamFramingAndUsage) {
  engine_.set_default_script(Script{{"Hel", "lo", " there"}, FinishReason::kStop, "", 3});
  start();
  json body = chat_body();
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Reply r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type"), "text/event-stream");
  EXPECT_EQ(r.header("transfer-encoding"), "chunked");
  auto events = sse_events(r.body);
  ASSERT_GE(events.size(), 6u);
  EXPECT_EQ(events.back(), "[DONE]");
  // role chunk, 3 content chunks, finish chunk, usage chunk, [DONE]
  ASSERT_EQ(events.size(), 7u) << r.body;
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(first.contains("usage") && first["usage"].is_null());
  std::string content;
  for (size_t i = 1; i <= 3; ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["id"], first["id"]);
    EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
    content += c["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(content, "Hello there");
  json fin = json::parse(events[4]);
  EXPECT_EQ(fin["choices"][0]["delta"], json::object());
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "stop");
  json usage = json::parse(events[5]);
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
}

TEST_F(OpenAiTest, StopAndLengthFinishReasons) {
  engine_.set_default_script(Script{{"Hello", " wor", "ld", " again"}});
  start();
  json body = chat_body();
  body["stop"] = json::array({"world", "zzz"});
  json j = post("/v1/chat/completions", body).js();
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");

  body = chat_body();
  body["max_tokens"] = 2;
  j = post("/v1/chat/completions", body).js();
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello wor");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
}

json weather_tools() {
  return json::array(
      {{{"type", "function"},
        {"function",
         {{"name", "get_weather"},
          {"description", "Weather of a city"},
          {"parameters",
           {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}});
}

const std::vector<std::string> kToolPieces = {
    "<tool", "_call>\n{\"name\": \"get_",
    "weather\", \"arguments\": {\"city\": ", "\"Paris\"}}\n</tool_call>"};

TEST_F(OpenAiTest, ToolCallParsedNonStream) {
  engine_.set_default_script(Script{kToolPieces});
  start();
  json body = chat_body("Weather in Paris?");
  body["tools"] = weather_tools();
  Reply r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  json choice = r.js()["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  json call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(call["function"]["arguments"], "{\"city\":\"Paris\"}");
  // The template saw the tools.
  const std::string prompt = qwen3_tokenizer().decode(engine_.requests().at(0).prompt_tokens);
  EXPECT_NE(prompt.find("\"name\": \"get_weather\""), std::string::npos) << prompt;
}

TEST_F(OpenAiTest, ToolCallStreamDeltas) {
  engine_.set_default_script(Script{kToolPieces});
  start();
  json body = chat_body("Weather in Paris?");
  body["tools"] = weather_tools();
  body["stream"] = true;
  auto events = sse_events(post("/v1/chat/completions", body).body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  std::string name, args, id, finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    json d = c["choices"][0]["delta"];
    if (c["choices"][0]["finish_reason"].is_string())
      finish = c["choices"][0]["finish_reason"].get<std::string>();
    if (!d.contains("tool_calls")) continue;
    json tc = d["tool_calls"][0];
    EXPECT_EQ(tc["index"], 0);
    if (tc.contains("id")) id = tc["id"].get<std::string>();
    if (tc["function"].contains("name")) name += tc["function"]["name"].get<std::string>();
    args += tc["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(args, "{\"city\":\"Paris\"}");
  EXPECT_EQ(id.rfind("call_", 0), 0u);
  EXPECT_EQ(finish, "tool_calls");
}

TEST_F(OpenAiTest, ToolChoiceNoneHidesToolsAndKeepsText) {
  engine_.set_default_script(Script{kToolPieces});
  start();
  json body = chat_body("Weather in Paris?");
  body["tools"] = weather_tools();
  body["tool_choice"] = "none";
  json j = post("/v1/chat/completions", body).js();
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
  EXPECT_NE(j["choices"][0]["message"]["content"].get<std::string>().find("<tool_call>"),
            std::string::npos);
  const std::string prompt = qwen3_tokenizer().decode(engine_.requests().at(0).prompt_tokens);
  EXPECT_EQ(prompt.find("get_weather"), std::string::npos) << prompt;

  // A named tool_choice that is not among the tools is a 400 naming tool_choice.
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  Reply r = post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.js()["error"]["param"], "tool_choice");
}

TEST_F(OpenAiTest, AssistantToolCallHistoryRenders) {
  start();
  json body = chat_body("Weather in Paris?");
  body["tools"] = weather_tools();
  body["messages"].push_back(
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", "call_1"},
          {"type", "function"},
          {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}}}});
  body["messages"].push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}});
  Reply r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string prompt = qwen3_tokenizer().decode(engine_.requests().at(0).prompt_tokens);
  EXPECT_NE(prompt.find("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<tool_response>\nsunny\n</tool_response>"), std::string::npos) << prompt;
}

TEST_F(OpenAiTest, ReasoningContent) {
  engine_.set_default_script(Script{{"<think>", "\nLet me", " think.\n", "</think>\n\n", "Four."}});
  start();
  json j = post("/v1/chat/completions", chat_body("2+2?")).js();
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "Let me think.");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Four.");

  json body = chat_body("2+2?");
  body["stream"] = true;
  std::string reasoning, content;
  for (const auto& e : sse_events(post("/v1/chat/completions", body).body)) {
    if (e == "[DONE]") continue;
    json d = json::parse(e)["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "Let me think.");
  EXPECT_EQ(content, "Four.");

  // enable_thinking=false reaches the template (Qwen3 writes an empty think block).
  body = chat_body("2+2?");
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  ASSERT_EQ(post("/v1/chat/completions", body).status, 200);
  const std::string prompt = qwen3_tokenizer().decode(engine_.requests().back().prompt_tokens);
  EXPECT_NE(prompt.find("<think>\n\n</think>"), std::string::npos) << prompt;
}

// What reaches the engine with a constraint on a reasoning template (Qwen3's): the grammar
// applies from the end of the thinking block; tool_choice auto sets a lazy tool-call grammar
// (its trigger, one call when parallel_tool_calls is false); response_format wins over it.
TEST_F(OpenAiTest, ConstraintsStartAfterThinkingAndAutoToolCallsAreLazy) {
  start();
  auto accepts = [](const engine::GenerationRequest& req, const std::string& text) {
    grammar::Matcher m(req.grammar);
    return m.accept_bytes(text) && m.can_end();
  };
  json body = chat_body("A city?");
  body["response_format"] = {{"type", "json_schema"},
                             {"json_schema",
                              {{"name", "c"},
                               {"schema",
                                {{"type", "object"},
                                 {"properties", {{"city", {{"type", "string"}}}}},
                                 {"required", {"city"}}}}}}};
  ASSERT_EQ(post("/v1/chat/completions", body).status, 200);
  {
    const auto req = engine_.requests().back();
    ASSERT_NE(req.grammar, nullptr);
    EXPECT_TRUE(req.grammar_start.triggers.empty());
    EXPECT_TRUE(req.grammar_start.reasoning);
    EXPECT_FALSE(req.grammar_start.reasoning_open_at_start);
    EXPECT_EQ(req.grammar_start.think_open, "<think>");
    EXPECT_EQ(req.grammar_start.think_close, "</think>");
  }

  // Thinking switched off (Qwen3 writes an empty closed block in the prompt): no exemption.
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  ASSERT_EQ(post("/v1/chat/completions", body).status, 200);
  EXPECT_FALSE(engine_.requests().back().grammar_start.reasoning);

  const std::string call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>";
  body = chat_body("Weather in Paris?");
  body["tools"] = weather_tools();
  ASSERT_EQ(post("/v1/chat/completions", body).status, 200);
  {
    const auto req = engine_.requests().back();
    ASSERT_NE(req.grammar, nullptr);
    ASSERT_EQ(req.grammar_start.triggers.size(), 1u);
    EXPECT_EQ(req.grammar_start.triggers[0].text, "<tool_call>");
    EXPECT_TRUE(accepts(req, call));
    EXPECT_TRUE(accepts(req, call + "\n" + call));
    EXPECT_FALSE(
        accepts(req, "<tool_call>\n{\"name\": \"dictionary\", \"arguments\": {}}\n</tool_call>"));
  }
  body["parallel_tool_calls"] = false;
  ASSERT_EQ(post("/v1/chat/completions", body).status, 200);
  {
    const auto req = engine_.requests().back();
    EXPECT_TRUE(accepts(req, call));
    EXPECT_FALSE(accepts(req, call + "\n" + call));
  }

  // response_format with tools auto: an answer of the format or tool calls, from the start of
  // the answer (no trigger: the grammar is the union of the two).
  body["response_format"] = {{"type", "json_object"}};
  ASSERT_EQ(post("/v1/chat/completions", body).status, 200);
  {
    const auto req = engine_.requests().back();
    EXPECT_TRUE(req.grammar_start.triggers.empty());
    EXPECT_TRUE(accepts(req, "{}"));
    EXPECT_TRUE(accepts(req, "{\"a\":[1,2]}"));
    EXPECT_TRUE(accepts(req, call));
    EXPECT_FALSE(accepts(req, call + "\n" + call));  // parallel_tool_calls is false
    EXPECT_FALSE(accepts(req, "Sure: {}"));          // neither
    EXPECT_FALSE(accepts(req, "[1]"));
    EXPECT_FALSE(
        accepts(req, "<tool_call>\n{\"name\": \"dictionary\", \"arguments\": {}}\n</tool_call>"));
  }
  body["response_format"] = {{"type", "json_schema"},
                             {"json_schema",
                              {{"name", "n"},
                               {"schema",
                                {{"type", "object"},
                                 {"properties", {{"n", {{"type", "integer"}}}}},
                                 {"required", {"n"}}}}}}};
  body.erase("parallel_tool_calls");
  ASSERT_EQ(post("/v1/chat/completions", body).status, 200);
  {
    const auto req = engine_.requests().back();
    EXPECT_TRUE(req.grammar_start.triggers.empty());
    EXPECT_TRUE(req.grammar_start.reasoning);  // the thinking block stays free
    EXPECT_TRUE(accepts(req, "{\"n\":3}"));
    EXPECT_FALSE(accepts(req, "{\"n\":\"3\"}"));
    EXPECT_TRUE(accepts(req, call));
    EXPECT_TRUE(accepts(req, call + "\n" + call));
  }

  // tool_choice none: no grammar at all.
  body.erase("response_format");
  body["tool_choice"] = "none";
  ASSERT_EQ(post("/v1/chat/completions", body).status, 200);
  EXPECT_EQ(engine_.requests().back().grammar, nullptr);
}

TEST_F(OpenAiTest, ChatLogprobsShape) {
  start();
  json body = chat_body();
  body["logprobs"] = true;
  body["top_logprobs"] = 2;
  Reply r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  json lp = r.js()["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 2u);
  const auto& tok = qwen3_tokenizer();
  const int32_t id100[1] = {100};
  EXPECT_EQ(lp[0]["token"], tok.decode(id100));
  EXPECT_FLOAT_EQ(lp[0]["logprob"].get<float>(), -0.25f);
  EXPECT_FLOAT_EQ(lp[1]["logprob"].get<float>(), -0.5f);
  EXPECT_TRUE(lp[0]["bytes"].is_array());
  ASSERT_EQ(lp[0]["top_logprobs"].size(), 2u);
  const int32_t id201[1] = {201};
  EXPECT_EQ(lp[0]["top_logprobs"][1]["token"], tok.decode(id201));
  EXPECT_FLOAT_EQ(lp[0]["top_logprobs"][1]["logprob"].get<float>(), -1.0f);
  auto req = engine_.requests().at(0);
  EXPECT_TRUE(req.sampling.logprobs);
  EXPECT_EQ(req.sampling.top_logprobs, 2);
}

TEST_F(OpenAiTest, ChatNChoicesUseChoiceSeeds) {
  start();
  json body = chat_body();
  body["n"] = 3;
  body["seed"] = 77;
  json j = post("/v1/chat/completions", body).js();
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["message"]["content"], "Hello world");
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
  auto reqs = engine_.requests();
  ASSERT_EQ(reqs.size(), 3u);
  std::vector<uint64_t> seeds;
  for (const auto& r : reqs) seeds.push_back(r.sampling.seed);
  std::sort(seeds.begin(), seeds.end());
  std::vector<uint64_t> want = {engine::choice_seed(77, 0), engine::choice_seed(77, 1),
                                engine::choice_seed(77, 2)};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(seeds, want);
}

TEST_F(OpenAiTest, ChatStreamWithNChoicesAndConcurrentClients) {
  engine_.set_default_script(
      Script{{"a", "b", "c"}, FinishReason::kStop, "", 0, std::chrono::milliseconds(1)});
  start();
  json body = chat_body();
  body["stream"] = true;
  body["n"] = 2;
  std::vector<Reply> replies(8);
  std::vector<std::thread> clients;
  for (auto& reply : replies)
    clients.emplace_back([&] { reply = post("/v1/chat/completions", body); });
  for (auto& t : clients) t.join();
  for (const Reply& r : replies) {
    ASSERT_EQ(r.status, 200);
    auto events = sse_events(r.body);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back(), "[DONE]");
    std::string content[2];
    int num_finished = 0;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      json c = json::parse(events[i])["choices"][0];
      const int index = c["index"].get<int>();
      ASSERT_TRUE(index == 0 || index == 1);
      if (c["delta"].contains("content"))
        content[index] += c["delta"]["content"].get<std::string>();
      num_finished += c["finish_reason"].is_string();
    }
    EXPECT_EQ(content[0], "abc");
    EXPECT_EQ(content[1], "abc");
    EXPECT_EQ(num_finished, 2);
  }
  EXPECT_EQ(engine_.requests().size(), 16u);
}

TEST_F(OpenAiTest, ErrorAfterStreamStartedIsAnErrorFrame) {
  engine_.set_default_script(Script{{"a", "b"}, FinishReason::kError, "step failed"});
  start();
  json body = chat_body();
  body["stream"] = true;
  Reply r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200);
  auto events = sse_events(r.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  json err = json::parse(events[events.size() - 2]);
  ASSERT_TRUE(err.contains("error")) << r.body;
  EXPECT_NE(err["error"]["message"].get<std::string>().find("step failed"), std::string::npos);
  // Non-stream: a 500 with the envelope.
  Reply whole = post("/v1/chat/completions", chat_body());
  EXPECT_EQ(whole.status, 500);
  EXPECT_EQ(whole.js()["error"]["type"], "server_error");
}

TEST_F(OpenAiTest, ContentPartsAndDeveloperRole) {
  start();
  json body = {
      {"messages",
       {{{"role", "developer"}, {"content", "Be brief."}},
        {{"role", "user"},
         {"content",
          {{{"type", "text"}, {"text", "Hello"}}, {{"type", "text"}, {"text", "there"}}}}}}}};
  ASSERT_EQ(post("/v1/chat/completions", body).status, 200);
  const std::string prompt = qwen3_tokenizer().decode(engine_.requests().at(0).prompt_tokens);
  EXPECT_EQ(prompt,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello\nthere<|im_end|>\n"
            "<|im_start|>assistant\n");
  body["messages"][1]["content"] = {{{"type", "image_url"}, {"image_url", {{"url", "x"}}}}};
  Reply r = post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.js()["error"]["param"], "messages[1].content[0]");
}

TEST_F(OpenAiTest, CompletionsPromptForms) {
  start();
  Reply r = post("/v1/completions", {{"model", "test-model"}, {"prompt", "Once upon"}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.js();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["text"], "Hello world");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const auto& tok = qwen3_tokenizer();
  auto ids = tok.encode("Once upon", true, true);
  EXPECT_EQ(engine_.requests().at(0).prompt_tokens, *ids);
  EXPECT_EQ(engine_.requests().at(0).max_tokens, 16);  // OpenAI's default for completions

  // A token array, and a list of prompts (one choice each), with echo.
  json body = {{"prompt", {{1, 2, 3}, "abc"}}, {"echo", true}, {"max_tokens", 5}};
  j = post("/v1/completions", body).js();
  ASSERT_EQ(j["choices"].size(), 2u);
  const std::vector<int32_t> first = {1, 2, 3};
  EXPECT_EQ(j["choices"][0]["text"], tok.decode(first) + "Hello world");
  EXPECT_EQ(j["choices"][1]["text"], "abcHello world");
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(engine_.requests().at(1).prompt_tokens, first);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3 + tok.encode("abc", true, true)->size());

  EXPECT_EQ(post("/v1/completions", {{"prompt", {1, -5}}}).status, 400);
  EXPECT_EQ(post("/v1/completions", {{"prompt", json::array()}}).status, 400);
}

TEST_F(OpenAiTest, CompletionsLegacyLogprobs) {
  start();
  json j = post("/v1/completions", {{"prompt", "x"}, {"logprobs", 2}}).js();
  json lp = j["choices"][0]["logprobs"];
  const auto& tok = qwen3_tokenizer();
  const int32_t id100[1] = {100}, id200[1] = {200}, id201[1] = {201};
  ASSERT_EQ(lp["tokens"].size(), 2u);
  EXPECT_EQ(lp["tokens"][0], tok.decode(id100));
  EXPECT_FLOAT_EQ(lp["token_logprobs"][1].get<float>(), -0.5f);
  EXPECT_EQ(lp["text_offset"], json::array({0, 5}));  // "Hello" then " world"
  ASSERT_TRUE(lp["top_logprobs"][0].is_object());
  EXPECT_FLOAT_EQ(lp["top_logprobs"][0][tok.decode(id200)].get<float>(), -0.5f);
  EXPECT_FLOAT_EQ(lp["top_logprobs"][0][tok.decode(id201)].get<float>(), -1.0f);
  EXPECT_EQ(post("/v1/completions", {{"prompt", "x"}, {"logprobs", 9}}).js()["error"]["param"],
            "logprobs");
}

TEST_F(OpenAiTest, CompletionsStream) {
  start();
  json body = {{"prompt", "x"}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  auto events = sse_events(post("/v1/completions", body).body);
  ASSERT_EQ(events.size(), 5u);  // 2 texts, finish, usage, [DONE]
  EXPECT_EQ(json::parse(events[0])["choices"][0]["text"], "Hello");
  EXPECT_EQ(json::parse(events[0])["object"], "text_completion");
  EXPECT_EQ(json::parse(events[2])["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(json::parse(events[3])["usage"]["completion_tokens"], 2);
  EXPECT_EQ(events[4], "[DONE]");
}

}  // namespace
}  // namespace kiln::server::testing
