// Anthropic Messages: the request conversion and output blocks (anthropic_convert.h) as
// pure functions, and /v1/messages + /v1/messages/count_tokens over a FakeEngine: message
// shape, the named SSE events, stop reasons, tool_use, thinking, usage, errors and auth.
#include "kiln/grammar/matcher.h"
#include "kiln/server/anthropic_convert.h"
#include "unit/server/test_util.h"

namespace kiln::server::testing {
namespace {

using engine::FinishReason;
using Ordered = nlohmann::ordered_json;

anthropic::MessagesRequest parse_ok(const json& body) {
  auto r = anthropic::parse_request(Ordered::parse(body.dump()), {});
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << e->message;
    return {};
  }
  return std::get<anthropic::MessagesRequest>(std::move(r));
}

ApiError parse_error(const json& body) {
  auto r = anthropic::parse_request(Ordered::parse(body.dump()), {});
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body.dump();
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

json user(const json& content) {
  return json{{"role", "user"}, {"content", content}};
}

TEST(AnthropicConvert, SystemBlocksJoinAndVolatileLineIsRemoved) {
  json body{
      {"system",
       {{{"type", "text"}, {"text", "x-anthropic-billing-header: cc_version=2.0.1; cch=7f3a9;"}},
        {{"type", "text"},
         {"text", "You are Claude Code."},
         {"cache_control", {{"type", "ephemeral"}}}},
        {{"type", "text"}, {"text", "Be brief."}}}},
      {"messages", {user("Hi")}}};
  auto r = parse_ok(body);
  ASSERT_EQ(r.turn.messages.size(), 2u);
  EXPECT_EQ(r.turn.messages[0]["role"], "system");
  EXPECT_EQ(r.turn.messages[0]["content"], "You are Claude Code.\n\nBe brief.");
  EXPECT_EQ(r.turn.messages[1], Ordered({{"role", "user"}, {"content", "Hi"}}));
  // Without normalization the line stays.
  auto kept = anthropic::parse_request(Ordered::parse(body.dump()), {false});
  ASSERT_TRUE(std::holds_alternative<anthropic::MessagesRequest>(kept));
  EXPECT_EQ(std::get<anthropic::MessagesRequest>(kept)
                .turn.messages[0]["content"]
                .get<std::string>()
                .rfind("x-anthropic-billing-header:", 0),
            0u);
}

TEST(AnthropicConvert, NormalizeSystemPrompt) {
  EXPECT_EQ(anthropic::normalize_system_prompt(
                "x-anthropic-billing-header: cc_version=1; cch=abc;\nYou are helpful."),
            "You are helpful.");
  EXPECT_EQ(anthropic::normalize_system_prompt("No header here.\nx-anthropic-billing-header: a\n"),
            "No header here.\n");
  EXPECT_EQ(anthropic::normalize_system_prompt("plain"), "plain");
  // Two requests differing only in cch normalize to the same text.
  EXPECT_EQ(anthropic::normalize_system_prompt("x-anthropic-billing-header: cch=1;\nS"),
            anthropic::normalize_system_prompt("x-anthropic-billing-header: cch=2;\nS"));
}

TEST(AnthropicConvert, ToolUseAndToolResultRoundTrip) {
  json body{{"messages",
             {user("Weather?"),
              {{"role", "assistant"},
               {"content",
                {{{"type", "thinking"}, {"thinking", "Need a tool."}, {"signature", "s"}},
                 {{"type", "text"}, {"text", "Checking."}},
                 {{"type", "tool_use"},
                  {"id", "toolu_1"},
                  {"name", "get_weather"},
                  {"input", {{"city", "Paris"}}}}}}},
              user({{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "sunny"}},
                    {{"type", "text"}, {"text", "Thanks"}}})}}};
  auto r = parse_ok(body);
  ASSERT_EQ(r.turn.messages.size(), 4u) << r.turn.messages.dump();
  const Ordered& a = r.turn.messages[1];
  EXPECT_EQ(a["content"], "Checking.");
  EXPECT_EQ(a["reasoning_content"], "Need a tool.");
  EXPECT_EQ(a["tool_calls"][0]["id"], "toolu_1");
  EXPECT_EQ(a["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(a["tool_calls"][0]["function"]["arguments"], Ordered({{"city", "Paris"}}));
  EXPECT_EQ(r.turn.messages[2],
            Ordered({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "sunny"}}));
  EXPECT_EQ(r.turn.messages[3], Ordered({{"role", "user"}, {"content", "Thanks"}}));
}

TEST(AnthropicConvert, ToolResultBlocksRenderAsTextNeverFail) {
  json content = {
      {{"type", "text"}, {"text", "line one"}},
      {{"type", "image"},
       {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", "iVBORw0KGgo="}}}},
      {{"type", "document"},
       {"title", "README"},
       {"source", {{"type", "text"}, {"media_type", "text/plain"}, {"data", "doc body"}}}},
      {{"type", "document"},
       {"source", {{"type", "base64"}, {"media_type", "application/pdf"}, {"data", "JVBE"}}}},
      {{"type", "tool_reference"}, {"tool_name", "mcp__github__search"}},
      {{"type", "search_result"},
       {"source", "https://example.com"},
       {"title", "Example"},
       {"content", {{{"type", "text"}, {"text", "result text"}}}}},
      {{"data", "AAAA"}, {"mimeType", "image/png"}, {"type", "image"}}};
  const std::string text = anthropic::tool_result_text(Ordered::parse(content.dump()));
  for (const char* part :
       {"line one", "[image omitted", "Document: README", "doc body", "[document omitted",
        "mcp__github__search", "Example (https://example.com)", "result text"})
    EXPECT_NE(text.find(part), std::string::npos) << part << " in " << text;
  json body{{"messages",
             {user({{{"type", "tool_result"}, {"tool_use_id", "t"}, {"content", content}}})}}};
  auto r = parse_ok(body);
  EXPECT_EQ(r.turn.messages[0]["role"], "tool");
}

TEST(AnthropicConvert, TopLevelImageIsA400NamingTheBlock) {
  json body{
      {"messages",
       {user({{{"type", "text"}, {"text", "look"}},
              {{"type", "image"},
               {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", "x"}}}}})}}};
  ApiError e = parse_error(body);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "messages[0].content[1]");
  EXPECT_NE(e.message.find("image"), std::string::npos);
  EXPECT_EQ(parse_error(json{{"messages", json::array()}}).param, "messages");
  EXPECT_EQ(parse_error(json{{"messages", {{{"role", "robot"}, {"content", "x"}}}}}).param,
            "messages[0].role");
}

TEST(AnthropicConvert, ServerToolsGetSchemasAndToolChoiceCanNameThem) {
  json tools = {
      {{"type", "bash_20250124"}, {"name", "bash"}},
      {{"type", "text_editor_20250728"}, {"name", "str_replace_based_edit_tool"}},
      {{"type", "web_search_20250305"}, {"name", "web_search"}, {"max_uses", 5}},
      {{"name", "Read"},
       {"description", "Read a file"},
       {"input_schema", {{"type", "object"}, {"properties", {{"path", {{"type", "string"}}}}}}}}};
  auto r = parse_ok(json{{"messages", {user("hi")}}, {"tools", tools}});
  ASSERT_EQ(r.turn.tools.size(), 4u);
  EXPECT_TRUE(r.turn.parse_tools);
  EXPECT_EQ(r.turn.tools[0]["function"]["name"], "bash");
  EXPECT_EQ(r.turn.tools[0]["function"]["parameters"]["properties"]["command"]["type"], "string");
  EXPECT_EQ(r.turn.tools[1]["function"]["parameters"]["required"], Ordered({"command", "path"}));
  EXPECT_EQ(r.turn.tools[2]["function"]["parameters"]["required"], Ordered({"query"}));
  EXPECT_EQ(r.turn.tools[3]["function"]["parameters"]["properties"]["path"]["type"], "string");

  auto named = parse_ok(json{{"messages", {user("hi")}},
                             {"tools", tools},
                             {"tool_choice", {{"type", "tool"}, {"name", "web_search"}}}});
  ASSERT_EQ(named.turn.tools.size(), 1u);
  EXPECT_EQ(named.turn.tools[0]["function"]["name"], "web_search");

  auto none = parse_ok(
      json{{"messages", {user("hi")}}, {"tools", tools}, {"tool_choice", {{"type", "none"}}}});
  EXPECT_TRUE(none.turn.tools.is_null());
  EXPECT_FALSE(none.turn.parse_tools);

  auto single =
      parse_ok(json{{"messages", {user("hi")}},
                    {"tools", tools},
                    {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}}});
  EXPECT_TRUE(single.disable_parallel_tool_use);
  // any and tool force a call; auto and none do not.
  EXPECT_TRUE(single.turn.force_tool_call);
  EXPECT_TRUE(named.turn.force_tool_call);
  EXPECT_FALSE(r.turn.force_tool_call);
  EXPECT_FALSE(none.turn.force_tool_call);
  auto with_auto = parse_ok(
      json{{"messages", {user("hi")}}, {"tools", tools}, {"tool_choice", {{"type", "auto"}}}});
  EXPECT_FALSE(with_auto.turn.force_tool_call);
  // A forced call with thinking (which Anthropic's API refuses) is accepted: the call's grammar
  // applies after the thinking block (the reasoning exemption).
  auto forced_thinking = parse_ok(json{{"messages", {user("hi")}},
                                       {"tools", tools},
                                       {"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}},
                                       {"tool_choice", {{"type", "any"}}}});
  EXPECT_TRUE(forced_thinking.thinking);
  EXPECT_TRUE(forced_thinking.turn.force_tool_call);
  EXPECT_TRUE(parse_ok(json{{"messages", {user("hi")}},
                            {"tools", tools},
                            {"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}},
                            {"tool_choice", {{"type", "auto"}}}})
                  .thinking);
  EXPECT_EQ(parse_error(json{{"messages", {user("hi")}},
                             {"tools", tools},
                             {"tool_choice", {{"type", "tool"}, {"name", "nope"}}}})
                .param,
            "tool_choice.name");
}

TEST(AnthropicConvert, ThinkingReachesTheTemplateSwitch) {
  auto on = parse_ok(json{{"messages", {user("hi")}},
                          {"thinking", {{"type", "enabled"}, {"budget_tokens", 2048}}}});
  EXPECT_TRUE(on.thinking);
  EXPECT_EQ(on.thinking_budget, 2048);
  EXPECT_EQ(on.turn.chat_template_kwargs["enable_thinking"], true);
  auto off = parse_ok(json{{"messages", {user("hi")}}});
  EXPECT_EQ(off.turn.chat_template_kwargs["enable_thinking"], false);
  EXPECT_EQ(parse_error(json{{"messages", {user("hi")}}, {"thinking", {{"type", "maybe"}}}}).param,
            "thinking.type");
}

chat::Event ev(chat::Event::Kind kind, std::string text, int index = -1, std::string id = "",
               std::string name = "") {
  chat::Event e;
  e.kind = kind;
  e.text = std::move(text);
  e.tool_index = index;
  e.tool_id = std::move(id);
  e.tool_name = std::move(name);
  return e;
}

TEST(AnthropicBlocks, EventsBecomeBlocksInOrder) {
  using K = chat::Event::Kind;
  anthropic::BlockBuilder b;
  std::vector<anthropic::BlockBuilder::Op> ops =
      b.feed({ev(K::kReasoning, "Hmm"), ev(K::kReasoning, "."), ev(K::kContent, "Calling."),
              ev(K::kToolCallBegin, "", 0, "call_1", "f"), ev(K::kToolCallArgs, "{\"a\":1}", 0),
              ev(K::kToolCallEnd, "", 0)});
  auto more = b.finish();
  EXPECT_TRUE(more.empty());
  const json content = json::parse(b.content().dump());
  ASSERT_EQ(content.size(), 3u) << content;
  EXPECT_EQ(content[0]["type"], "thinking");
  EXPECT_EQ(content[0]["thinking"], "Hmm.");
  EXPECT_EQ(content[0]["signature"], anthropic::thinking_signature("Hmm."));
  EXPECT_EQ(content[1], (json{{"type", "text"}, {"text", "Calling."}}));
  EXPECT_EQ(content[2],
            (json{{"type", "tool_use"}, {"id", "call_1"}, {"name", "f"}, {"input", {{"a", 1}}}}));
  EXPECT_TRUE(b.saw_tool_use());
  // start, 2 thinking deltas, signature delta, stop; start, delta, stop; start, json delta, stop
  ASSERT_EQ(ops.size(), 11u);
  EXPECT_EQ(ops[3].block["type"], "signature_delta");
  EXPECT_EQ(ops[9].block, Ordered({{"type", "input_json_delta"}, {"partial_json", "{\"a\":1}"}}));
}

TEST(AnthropicBlocks, DisableParallelToolUseKeepsTheFirstCall) {
  using K = chat::Event::Kind;
  anthropic::BlockBuilder b(/*disable_parallel_tool_use=*/true);
  b.feed({ev(K::kToolCallBegin, "", 0, "c1", "f"), ev(K::kToolCallArgs, "{}", 0),
          ev(K::kToolCallEnd, "", 0), ev(K::kToolCallBegin, "", 1, "c2", "g"),
          ev(K::kToolCallArgs, "{}", 1), ev(K::kToolCallEnd, "", 1)});
  b.finish();
  ASSERT_EQ(b.content().size(), 1u);
  EXPECT_EQ(b.content()[0]["name"], "f");
}

// --- the endpoints over a FakeEngine ---------------------------------------------------

class AnthropicTest : public ServerTest {
 protected:
  static json body(const std::string& text = "Hi") {
    return json{{"model", "claude-sonnet-4-5"}, {"max_tokens", 64}, {"messages", {user(text)}}};
  }
};

struct SseEvent {
  std::string name;
  json data;
};

std::vector<SseEvent> named_events(const std::string& body) {
  std::vector<SseEvent> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos || body.compare(pos, 7, "event: ") != 0) {
      ADD_FAILURE() << "bad SSE framing at " << pos << ": " << body.substr(pos, 80);
      break;
    }
    const size_t nl = body.find('\n', pos);
    SseEvent e;
    e.name = body.substr(pos + 7, nl - pos - 7);
    EXPECT_EQ(body.compare(nl + 1, 6, "data: "), 0);
    e.data = json::parse(body.substr(nl + 7, end - nl - 7));
    EXPECT_EQ(e.data["type"], e.name);
    out.push_back(std::move(e));
    pos = end + 2;
  }
  return out;
}

TEST_F(AnthropicTest, WholeMessageShapeAndUsage) {
  engine_.set_default_script(Script{{"Hello", " world"}, FinishReason::kStop, "", 0});
  start();
  Reply r = post("/v1/messages?beta=true", body(),
                 {{"anthropic-version", "2023-06-01"}, {"anthropic-beta", "anything-2099"}});
  ASSERT_EQ(r.status, 200) << r.body;
  json m = r.js();
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(m["content"], json::parse(R"([{"type":"text","text":"Hello world"}])"));
  EXPECT_EQ(m["stop_reason"], "end_turn");
  EXPECT_TRUE(m["stop_sequence"].is_null());
  auto reqs = engine_.requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(m["usage"]["input_tokens"], reqs[0].prompt_tokens.size());
  EXPECT_EQ(m["usage"]["output_tokens"], 2);
  EXPECT_EQ(m["usage"]["cache_read_input_tokens"], 0);
  EXPECT_EQ(m["usage"]["cache_creation_input_tokens"], 0);
  EXPECT_EQ(reqs[0].max_tokens, 64);
  // Without thinking the Qwen3 template is told enable_thinking=false.
  const std::string prompt = qwen3_tokenizer().decode(reqs[0].prompt_tokens);
  EXPECT_NE(prompt.find("<think>\n\n</think>"), std::string::npos) << prompt;

  // count_tokens of the same body is the prompt's length.
  Reply c = post("/v1/messages/count_tokens", body());
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.js(), (json{{"input_tokens", reqs[0].prompt_tokens.size()}}));
}

TEST_F(AnthropicTest, CachedTokensSplitTheInput) {
  engine_.set_default_script(Script{{"ok"}, FinishReason::kStop, "", 5});
  start();
  json m = post("/v1/messages", body()).js();
  const size_t n = engine_.requests()[0].prompt_tokens.size();
  EXPECT_EQ(m["usage"]["cache_read_input_tokens"], 5);
  EXPECT_EQ(m["usage"]["input_tokens"], n - 5);
}

TEST_F(AnthropicTest, StreamEventSequence) {
  engine_.set_default_script(Script{
      {"<think>", "\nPondering", ".\n", "</think>\n\n", "Four", "."}, FinishReason::kStop, "", 2});
  start();
  json b = body();
  b["stream"] = true;
  b["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
  Reply r = post("/v1/messages", b);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.header("content-type"), "text/event-stream");
  auto events = named_events(r.body);
  std::vector<std::string> names;
  for (const auto& e : events)
    if (e.name != "ping") names.push_back(e.name);
  const std::vector<std::string> expected = {
      // thinking: two thinking deltas, then the signature delta
      "message_start", "content_block_start", "content_block_delta", "content_block_delta",
      "content_block_delta", "content_block_stop",
      // text: two text deltas
      "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
      "message_delta", "message_stop"};
  ASSERT_EQ(names, expected) << r.body;
  const json& start_msg = events[0].data["message"];
  EXPECT_EQ(start_msg["content"], json::array());
  EXPECT_TRUE(start_msg["stop_reason"].is_null());
  // The thinking block: its text, then its signature.
  std::string thinking, text;
  json signature;
  for (const auto& e : events) {
    if (e.name != "content_block_delta") continue;
    const json& d = e.data["delta"];
    if (d["type"] == "thinking_delta") thinking += d["thinking"].get<std::string>();
    if (d["type"] == "signature_delta") signature = d["signature"];
    if (d["type"] == "text_delta") {
      EXPECT_EQ(e.data["index"], 1);
      text += d["text"].get<std::string>();
    }
  }
  EXPECT_EQ(thinking, "Pondering.");
  EXPECT_EQ(signature, anthropic::thinking_signature("Pondering."));
  EXPECT_EQ(text, "Four.");
  const json& delta = events[events.size() - 2].data;
  EXPECT_EQ(delta["delta"]["stop_reason"], "end_turn");
  EXPECT_EQ(delta["usage"]["output_tokens"], 6);
  EXPECT_EQ(delta["usage"]["cache_read_input_tokens"], 2);
  // Thinking on: the template opened the think block itself (enable_thinking true).
  const std::string prompt = qwen3_tokenizer().decode(engine_.requests()[0].prompt_tokens);
  EXPECT_EQ(prompt.find("<think>\n\n</think>"), std::string::npos) << prompt;
}

TEST_F(AnthropicTest, StopReasons) {
  engine_.set_default_script(Script{{"Hello", " wor", "ld", " again"}});
  start();
  json b = body();
  b["stop_sequences"] = {"zzz", "world"};
  json m = post("/v1/messages", b).js();
  EXPECT_EQ(m["stop_reason"], "stop_sequence");
  EXPECT_EQ(m["stop_sequence"], "world");
  EXPECT_EQ(m["content"][0]["text"], "Hello ");

  b = body();
  b["max_tokens"] = 2;
  m = post("/v1/messages", b).js();
  EXPECT_EQ(m["stop_reason"], "max_tokens");
  EXPECT_TRUE(m["stop_sequence"].is_null());
}

TEST_F(AnthropicTest, ToolUseBlockWithParsedInput) {
  engine_.set_default_script(Script{{"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ",
                                     "{\"city\": \"Paris\"}}\n</tool_call>"}});
  start();
  json b = body("Weather in Paris?");
  b["tools"] = {
      {{"name", "get_weather"},
       {"description", "Weather of a city"},
       {"input_schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}};
  json m = post("/v1/messages", b).js();
  EXPECT_EQ(m["stop_reason"], "tool_use");
  ASSERT_EQ(m["content"].size(), 1u) << m;
  EXPECT_EQ(m["content"][0]["type"], "tool_use");
  EXPECT_EQ(m["content"][0]["name"], "get_weather");
  EXPECT_EQ(m["content"][0]["input"], (json{{"city", "Paris"}}));
  // The tool reached the template.
  const std::string prompt = qwen3_tokenizer().decode(engine_.requests()[0].prompt_tokens);
  EXPECT_NE(prompt.find("\"get_weather\""), std::string::npos) << prompt;

  b["stream"] = true;
  auto events = named_events(post("/v1/messages", b).body);
  std::string partial;
  for (const auto& e : events) {
    if (e.name == "content_block_start") {
      EXPECT_EQ(e.data["content_block"]["type"], "tool_use");
    }
    if (e.name == "content_block_delta")
      partial += e.data["delta"]["partial_json"].get<std::string>();
  }
  EXPECT_EQ(json::parse(partial), (json{{"city", "Paris"}}));
}

// Does the request's grammar accept `text` in full (and may end there)?
bool grammar_accepts(const engine::GenerationRequest& req, const std::string& text) {
  if (!req.grammar) return false;
  grammar::Matcher m(req.grammar);
  return m.accept_bytes(text) && m.can_end();
}

TEST_F(AnthropicTest, ToolChoiceAnyAndToolForceACallThroughTheGrammar) {
  engine_.set_default_script(
      Script{{"<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}",
              "\n</tool_call>"}});
  start();
  json b = body("What time is it?");
  b["tools"] = json::parse(R"([
    {"name": "get_weather",
     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                      "required": ["city"]}},
    {"name": "get_time",
     "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}},
                      "required": ["zone"]}}])");
  const std::string weather =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>";
  const std::string clock =
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>";

  // auto: the model chooses; a call that starts (its trigger, <tool_call>) is constrained to
  // a valid call of an offered tool (the lazy grammar).
  ASSERT_EQ(post("/v1/messages", b).status, 200);
  {
    const auto req = engine_.requests().back();
    ASSERT_NE(req.grammar, nullptr);
    ASSERT_EQ(req.grammar_start.triggers.size(), 1u);
    EXPECT_EQ(req.grammar_start.triggers[0].text, "<tool_call>");
    EXPECT_TRUE(grammar_accepts(req, weather));
    EXPECT_FALSE(grammar_accepts(
        req, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
  }

  // any: a call of either tool, with arguments valid against its schema; no plain text.
  b["tool_choice"] = {{"type", "any"}};
  Reply r = post("/v1/messages", b);
  ASSERT_EQ(r.status, 200) << r.body;
  {
    const auto req = engine_.requests().back();
    ASSERT_NE(req.grammar, nullptr);
    EXPECT_TRUE(grammar_accepts(req, weather));
    EXPECT_TRUE(grammar_accepts(req, clock));
    EXPECT_TRUE(grammar_accepts(req, clock + "\n" + weather));  // parallel calls allowed
    EXPECT_FALSE(grammar_accepts(req, "It is noon."));
    EXPECT_FALSE(grammar_accepts(
        req, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
    EXPECT_FALSE(grammar_accepts(
        req, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
  }
  json m = r.js();
  EXPECT_EQ(m["stop_reason"], "tool_use");
  ASSERT_EQ(m["content"].size(), 1u) << m;
  EXPECT_EQ(m["content"][0]["type"], "tool_use");
  EXPECT_EQ(m["content"][0]["name"], "get_time");
  EXPECT_EQ(m["content"][0]["input"], (json{{"zone", "UTC"}}));

  // With thinking, the forced call's grammar applies from the end of the thinking block.
  {
    json t = b;
    t["thinking"] = {{"type", "enabled"}, {"budget_tokens", 64}};
    t["max_tokens"] = 256;
    Reply tr = post("/v1/messages", t);
    ASSERT_EQ(tr.status, 200) << tr.body;
    const auto req = engine_.requests().back();
    ASSERT_NE(req.grammar, nullptr);
    EXPECT_TRUE(req.grammar_start.triggers.empty());  // forced, not lazy
    EXPECT_TRUE(req.grammar_start.reasoning);
    EXPECT_EQ(req.grammar_start.think_close, "</think>");
  }

  // disable_parallel_tool_use: exactly one call.
  b["tool_choice"] = {{"type", "any"}, {"disable_parallel_tool_use", true}};
  ASSERT_EQ(post("/v1/messages", b).status, 200);
  {
    const auto req = engine_.requests().back();
    EXPECT_TRUE(grammar_accepts(req, weather));
    EXPECT_FALSE(grammar_accepts(req, clock + "\n" + weather));
  }

  // tool: a call of that tool only.
  b["tool_choice"] = {{"type", "tool"}, {"name", "get_weather"}};
  ASSERT_EQ(post("/v1/messages", b).status, 200);
  {
    const auto req = engine_.requests().back();
    EXPECT_TRUE(grammar_accepts(req, weather));
    EXPECT_FALSE(grammar_accepts(req, clock));
  }

  // none: no grammar.
  b["tool_choice"] = {{"type", "none"}};
  ASSERT_EQ(post("/v1/messages", b).status, 200);
  EXPECT_EQ(engine_.requests().back().grammar, nullptr);

  // An unknown tool is a 400 naming tool_choice.name, before anything is generated.
  const size_t num_requests = engine_.requests().size();
  b["tool_choice"] = {{"type", "tool"}, {"name", "get_stock"}};
  Reply bad = post("/v1/messages", b);
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.js()["type"], "error");
  EXPECT_EQ(bad.js()["error"]["type"], "invalid_request_error");
  const std::string message = bad.js()["error"]["message"].get<std::string>();
  EXPECT_NE(message.find("tool_choice.name"), std::string::npos) << bad.body;
  EXPECT_NE(message.find("get_stock"), std::string::npos) << bad.body;
  EXPECT_EQ(engine_.requests().size(), num_requests);
}

TEST_F(AnthropicTest, ErrorsUseAnthropicsEnvelope) {
  start();
  json b = body();
  b.erase("max_tokens");
  Reply r = post("/v1/messages", b);
  EXPECT_EQ(r.status, 400);
  json e = r.js();
  EXPECT_EQ(e["type"], "error");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("max_tokens"), std::string::npos);

  r = post_raw("/v1/messages", "{not json");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.js()["type"], "error");

  engine_.refuse_next(engine::SubmitError::kQueueFull, "busy");
  r = post("/v1/messages", body());
  EXPECT_EQ(r.status, 529);
  EXPECT_EQ(r.js()["error"]["type"], "overloaded_error");

  // The OpenAI routes keep theirs.
  r = post("/v1/chat/completions", json{{"messages", "x"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_TRUE(r.js()["error"].contains("param"));
}

TEST_F(AnthropicTest, PromptTooLong) {
  engine_.n_ctx_ = 8;
  start();
  Reply r = post("/v1/messages", body("a long enough prompt for eight tokens of context"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.js()["error"]["type"], "invalid_request_error");
  EXPECT_EQ(r.js()["error"]["message"].get<std::string>().rfind("prompt is too long", 0), 0u)
      << r.body;
}

TEST_F(AnthropicTest, MaxTokensIsBoundedByTheContext) {
  engine_.n_ctx_ = 64;
  start();
  json b = body();
  b["max_tokens"] = 32000;
  ASSERT_EQ(post("/v1/messages", b).status, 200);
  auto req = engine_.requests().at(0);
  EXPECT_EQ(req.max_tokens, 64 - static_cast<int32_t>(req.prompt_tokens.size()));
}

TEST_F(AnthropicTest, AuthByApiKeyHeaderOrBearer) {
  ServerOptions o;
  o.api_key = "sekrit";
  start(o);
  Reply r = post("/v1/messages", body());
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.js()["error"]["type"], "authentication_error");
  EXPECT_EQ(post("/v1/messages", body(), {{"x-api-key", "wrong"}}).status, 401);
  EXPECT_EQ(post("/v1/messages", body(), {{"x-api-key", "sekrit"}}).status, 200);
  EXPECT_EQ(post("/v1/messages", body(), {{"authorization", "Bearer sekrit"}}).status, 200);
  EXPECT_EQ(post("/v1/messages/count_tokens", body(), {{"x-api-key", "sekrit"}}).status, 200);
}

TEST_F(AnthropicTest, ThinkingBudgetClosesTheBlockAndTheAnswerFollows) {
  // The first request thinks on and on; after 3 tokens it is cancelled and continued from
  // its tokens plus "</think>\n\n", whose request answers.
  engine_.push_script(Script{{"<think>", "\nA", " B", " C", " D", " E", " F", " G"},
                             FinishReason::kStop,
                             "",
                             4,
                             std::chrono::milliseconds(30)});
  engine_.push_script(Script{{"The", " answer."}, FinishReason::kStop, "", 40});
  start();
  json b = body();
  b["thinking"] = {{"type", "enabled"}, {"budget_tokens", 3}};
  json m = post("/v1/messages", b).js();
  ASSERT_EQ(m["content"].size(), 2u) << m;
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][0]["thinking"], "A B");
  EXPECT_EQ(m["content"][1], (json{{"type", "text"}, {"text", "The answer."}}));
  EXPECT_EQ(m["stop_reason"], "end_turn");
  auto reqs = engine_.requests();
  ASSERT_EQ(reqs.size(), 2u);
  const auto& tok = qwen3_tokenizer();
  auto close = tok.encode("</think>\n\n", false, true);
  ASSERT_TRUE(close.ok());
  std::vector<int32_t> expected = reqs[0].prompt_tokens;
  for (int32_t id : {100, 101, 102}) expected.push_back(id);
  expected.insert(expected.end(), close->begin(), close->end());
  EXPECT_EQ(reqs[1].prompt_tokens, expected);
  const int32_t num_close = static_cast<int32_t>(close->size());
  EXPECT_EQ(reqs[1].max_tokens, 64 - 3 - num_close);
  // Usage covers the whole reply, with the first request's prompt and cache hits.
  EXPECT_EQ(m["usage"]["output_tokens"], 3 + num_close + 2);
  EXPECT_EQ(m["usage"]["cache_read_input_tokens"], 4);
  EXPECT_EQ(m["usage"]["input_tokens"], reqs[0].prompt_tokens.size() - 4);
}

TEST_F(AnthropicTest, ThinkingBudgetWithoutRoomForAnAnswerLetsThinkingRunOn) {
  // max_tokens 4, budget 3: "</think>\n\n" (2 tokens) and an answer token do not fit.
  engine_.set_default_script(Script{{"<think>", "\nA", " B", " C", " D", " E"}});
  start();
  json b = body();
  b["max_tokens"] = 4;
  b["thinking"] = {{"type", "enabled"}, {"budget_tokens", 3}};
  json m = post("/v1/messages", b).js();
  EXPECT_EQ(engine_.requests().size(), 1u);
  ASSERT_EQ(m["content"].size(), 1u) << m;
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][0]["thinking"], "A B C");
  EXPECT_EQ(m["stop_reason"], "max_tokens");
  EXPECT_EQ(m["usage"]["output_tokens"], 4);
}

TEST_F(AnthropicTest, PingWhileWaitingAndErrorEventAfterStart) {
  engine_.set_default_script(
      Script{{"a", "b"}, FinishReason::kError, "boom", 0, std::chrono::milliseconds(150)});
  ServerOptions o;
  o.ping_interval = std::chrono::milliseconds(40);
  start(o);
  json b = body();
  b["stream"] = true;
  Reply r = post("/v1/messages", b);
  ASSERT_EQ(r.status, 200);
  auto events = named_events(r.body);
  int pings = 0;
  for (const auto& e : events) pings += e.name == "ping";
  EXPECT_GE(pings, 3) << r.body;
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().name, "error");
  EXPECT_EQ(events.back().data["error"]["type"], "api_error");
}

}  // namespace
}  // namespace kiln::server::testing
