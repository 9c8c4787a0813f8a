// OpenAI Responses: the request conversion, output items, reasoning count and store
// (responses_convert.h, responses_store.h) as pure functions, and /v1/responses over a
// FakeEngine: the response object's required fields, the named SSE events and their
// sequence numbers, function calls, previous_response_id, GET/DELETE, text.format, errors.
#include "kiln/server/responses_convert.h"
#include "kiln/server/responses_store.h"
#include "unit/server/test_util.h"

namespace kiln::server::testing {
namespace {

using engine::FinishReason;
using Ordered = nlohmann::ordered_json;
namespace rs = responses;

rs::ResponsesRequest parse_ok(const json& body, const json& history = nullptr) {
  auto r = rs::parse_request(Ordered::parse(body.dump()), Ordered::parse(history.dump()));
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << e->message;
    return {};
  }
  return std::get<rs::ResponsesRequest>(std::move(r));
}

ApiError parse_error(const json& body) {
  auto r = rs::parse_request(Ordered::parse(body.dump()), Ordered());
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body.dump();
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

json msgs(const rs::ResponsesRequest& r) {
  return json::parse(r.turn.messages.dump());
}

TEST(ResponsesConvert, StringInputAndInstructions) {
  auto r = parse_ok(json{{"input", "Hi"}, {"instructions", "Be brief."}});
  EXPECT_EQ(msgs(r), json::parse(R"([{"role":"system","content":"Be brief."},
                                     {"role":"user","content":"Hi"}])"));
  EXPECT_EQ(json::parse(r.input_items.dump()),
            json::parse(R"([{"type":"message","role":"user","content":"Hi"}])"));
  EXPECT_TRUE(r.turn.tools.is_null());
  EXPECT_FALSE(r.turn.parse_tools);
}

TEST(ResponsesConvert, ItemsBecomeChatTurns) {
  json input = json::parse(R"([
    {"type":"message","role":"developer","content":[{"type":"input_text","text":"Use tools."}]},
    {"role":"user","content":[{"type":"input_text","text":"Weather in"},
                              {"type":"input_text","text":"Paris?"}]},
    {"type":"reasoning","id":"rs_1","summary":[],
     "content":[{"type":"reasoning_text","text":"Need the tool."}]},
    {"type":"message","role":"assistant","id":"msg_1","status":"completed",
     "content":[{"type":"output_text","text":"Checking.","annotations":[]}]},
    {"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather",
     "arguments":"{\"city\":\"Paris\"}","status":"completed"},
    {"type":"function_call_output","call_id":"call_1","output":"sunny"},
    {"type":"message","role":"user","content":"Thanks"}])");
  auto r = parse_ok(json{{"input", input}, {"instructions", "Be brief."}});
  const json m = msgs(r);
  ASSERT_EQ(m.size(), 5u) << m.dump();
  // Instructions and the leading developer message: one system message.
  EXPECT_EQ(m[0], (json{{"role", "system"}, {"content", "Be brief.\nUse tools."}}));
  EXPECT_EQ(m[1], (json{{"role", "user"}, {"content", "Weather in\nParis?"}}));
  EXPECT_EQ(m[2]["role"], "assistant");
  EXPECT_EQ(m[2]["content"], "Checking.");
  EXPECT_EQ(m[2]["reasoning_content"], "Need the tool.");
  EXPECT_EQ(m[2]["tool_calls"], json::parse(R"([{"id":"call_1","type":"function",
                             "function":{"name":"get_weather","arguments":{"city":"Paris"}}}])"));
  EXPECT_EQ(m[3], (json{{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}}));
  EXPECT_EQ(m[4], (json{{"role", "user"}, {"content", "Thanks"}}));
  EXPECT_EQ(r.input_items.size(), input.size());
}

TEST(ResponsesConvert, HistoryComesBeforeInputAndInstructionsFirst) {
  json history = json::parse(R"([{"type":"message","role":"user","content":"One"},
    {"type":"message","role":"assistant","id":"m","status":"completed",
     "content":[{"type":"output_text","text":"Two","annotations":[]}]}])");
  auto r = parse_ok(json{{"input", "Three"}, {"instructions", "Count."}}, history);
  EXPECT_EQ(msgs(r), json::parse(R"([{"role":"system","content":"Count."},
    {"role":"user","content":"One"},{"role":"assistant","content":"Two"},
    {"role":"user","content":"Three"}])"));
  // Only this request's input is the new input.
  EXPECT_EQ(r.input_items.size(), 1u);
}

TEST(ResponsesConvert, CustomAndLocalShellCallsRoundTrip) {
  json input = json::parse(R"([
    {"type":"message","role":"user","content":"Patch it and list."},
    {"type":"custom_tool_call","id":"ctc_1","call_id":"call_a","name":"apply_patch",
     "input":"*** Begin Patch\n*** End Patch"},
    {"type":"custom_tool_call_output","call_id":"call_a","output":"Done"},
    {"type":"local_shell_call","id":"lsh_1","call_id":"call_b","status":"completed",
     "action":{"type":"exec","command":["ls","-l"],"env":{},"working_directory":"/tmp"}},
    {"type":"local_shell_call_output","id":"call_b","output":"a.txt"}])");
  const json m = msgs(parse_ok(json{{"input", input}}));
  ASSERT_EQ(m.size(), 5u) << m.dump();
  EXPECT_EQ(m[1]["tool_calls"][0]["function"],
            (json{{"name", "apply_patch"},
                  {"arguments", {{"input", "*** Begin Patch\n*** End Patch"}}}}));
  EXPECT_EQ(m[2], (json{{"role", "tool"}, {"tool_call_id", "call_a"}, {"content", "Done"}}));
  EXPECT_EQ(m[3]["tool_calls"][0]["function"],
            (json{{"name", "local_shell"},
                  {"arguments", {{"command", {"ls", "-l"}}, {"workdir", "/tmp"}}}}));
  EXPECT_EQ(m[4], (json{{"role", "tool"}, {"tool_call_id", "call_b"}, {"content", "a.txt"}}));
}

TEST(ResponsesConvert, ImagesAreA400NamingThePartButNotInToolOutput) {
  json input = {{{"role", "user"},
                 {"content",
                  {{{"type", "input_text"}, {"text", "look"}},
                   {{"type", "input_image"}, {"image_url", "data:image/png;base64,iVBO"}}}}}};
  ApiError e = parse_error(json{{"input", input}});
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "input[0].content[1]");
  EXPECT_NE(e.message.find("input_image"), std::string::npos) << e.message;
  // Inside a tool's output an image is a placeholder.
  json out = json::parse(R"([{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},
    {"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"shot:"},
     {"type":"input_image","image_url":"data:image/png;base64,iVBO"}]}])");
  const json m = msgs(parse_ok(json{{"input", out}}));
  EXPECT_EQ(m[1]["content"], "shot:\n[image omitted: this model reads text only]");
}

TEST(ResponsesConvert, BadInputIsA400NamingTheField) {
  EXPECT_EQ(parse_error(json::object()).param, "input");
  EXPECT_EQ(parse_error(json{{"input", 3}}).param, "input");
  EXPECT_EQ(parse_error(json{{"input", {{{"type", 7}}}}}).param, "input[0].type");
  EXPECT_EQ(parse_error(json{{"input", {{{"type", "item_reference"}, {"id", "msg_1"}}}}}).param,
            "input[0]");
  EXPECT_EQ(
      parse_error(json{{"input", {{{"type", "message"}, {"role", "robot"}, {"content", "x"}}}}})
          .param,
      "input[0].role");
  EXPECT_EQ(parse_error(json{{"input", {{{"type", "function_call"}, {"name", "f"}}}}}).param,
            "input[0].call_id");
  EXPECT_EQ(parse_error(json{{"input", "x"}, {"reasoning", {{"effort", "extreme"}}}}).param,
            "reasoning.effort");
  EXPECT_EQ(parse_error(json{{"input", "x"}, {"text", {{"format", {{"type", "yaml"}}}}}}).param,
            "text.format.type");
  EXPECT_EQ(parse_error(json{{"input", "x"}, {"tools", {{{"type", "function"}}}}}).param,
            "tools[0].name");
  EXPECT_EQ(parse_error(json{{"input", "x"}, {"parallel_tool_calls", "yes"}}).param,
            "parallel_tool_calls");
  // Hosted tools' items, and unknown kinds, are left out with a warning, not refused.
  auto r = parse_ok(json{{"input",
                          {{{"type", "web_search_call"}, {"id", "ws_1"}, {"status", "completed"}},
                           {{"type", "telepathy"}},
                           {{"role", "user"}, {"content", "hi"}}}}});
  ASSERT_EQ(r.warnings.size(), 2u);
  EXPECT_NE(r.warnings[0].find("input[0]: 'web_search_call'"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[1].find("input[1]: 'telepathy'"), std::string::npos) << r.warnings[1];
  EXPECT_EQ(msgs(r), json::parse(R"([{"role":"user","content":"hi"}])"));
}

TEST(ResponsesConvert, ToolsFunctionCustomLocalShellAndHostedWarn) {
  json tools = json::parse(R"([
    {"type":"function","name":"get_weather","description":"Weather of a city",
     "parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true},
    {"type":"custom","name":"apply_patch","description":"Apply a patch.",
     "format":{"type":"grammar","syntax":"lark","definition":"start: \"*** Begin Patch\""}},
    {"type":"local_shell"},
    {"type":"web_search"},{"type":"file_search","vector_store_ids":["vs_1"]},
    {"type":"mcp","server_label":"gh","server_url":"https://example.com"}])");
  auto r = parse_ok(json{{"input", "x"}, {"tools", tools}});
  const json t = json::parse(r.turn.tools.dump());
  ASSERT_EQ(t.size(), 3u) << t.dump();
  EXPECT_EQ(t[0]["function"]["name"], "get_weather");
  EXPECT_EQ(t[0]["function"]["parameters"]["properties"]["city"]["type"], "string");
  EXPECT_EQ(t[1]["function"]["name"], "apply_patch");
  EXPECT_EQ(t[1]["function"]["parameters"]["required"], json::array({"input"}));
  EXPECT_NE(t[1]["function"]["description"].get<std::string>().find("lark grammar"),
            std::string::npos);
  EXPECT_EQ(t[2]["function"]["name"], "local_shell");
  EXPECT_EQ(t[2]["function"]["parameters"]["properties"]["command"]["type"], "array");
  EXPECT_TRUE(r.turn.parse_tools);
  EXPECT_FALSE(r.turn.force_tool_call);
  EXPECT_EQ(r.tool_kinds.at("get_weather"), rs::ToolKind::kFunction);
  EXPECT_EQ(r.tool_kinds.at("apply_patch"), rs::ToolKind::kCustom);
  EXPECT_EQ(r.tool_kinds.at("local_shell"), rs::ToolKind::kLocalShell);
  ASSERT_EQ(r.warnings.size(), 3u);
  EXPECT_NE(r.warnings[0].find("tools[3]: 'web_search'"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[2].find("'mcp'"), std::string::npos);
}

TEST(ResponsesConvert, ToolChoice) {
  json tools = json::parse(R"([{"type":"function","name":"f","parameters":{}},
    {"type":"function","name":"g"},{"type":"custom","name":"c"},{"type":"web_search"}])");
  auto base = [&](json choice) {
    return json{{"input", "x"}, {"tools", tools}, {"tool_choice", choice}};
  };
  auto none = parse_ok(base("none"));
  EXPECT_TRUE(none.turn.tools.is_null());
  EXPECT_FALSE(none.turn.parse_tools);
  auto required = parse_ok(base("required"));
  EXPECT_TRUE(required.turn.force_tool_call);
  EXPECT_EQ(required.turn.tools.size(), 3u);
  auto named = parse_ok(base({{"type", "function"}, {"name", "g"}}));
  ASSERT_EQ(named.turn.tools.size(), 1u);
  EXPECT_EQ(named.turn.tools[0]["function"]["name"], "g");
  EXPECT_TRUE(named.turn.force_tool_call);
  auto custom = parse_ok(base({{"type", "custom"}, {"name", "c"}}));
  EXPECT_EQ(custom.turn.tools[0]["function"]["name"], "c");
  auto allowed = parse_ok(base({{"type", "allowed_tools"},
                                {"mode", "auto"},
                                {"tools", {{{"type", "function"}, {"name", "f"}}}}}));
  ASSERT_EQ(allowed.turn.tools.size(), 1u);
  EXPECT_FALSE(allowed.turn.force_tool_call);
  auto hosted = parse_ok(base({{"type", "web_search_preview"}}));
  EXPECT_EQ(hosted.turn.tools.size(), 3u);
  EXPECT_FALSE(hosted.turn.force_tool_call);
  EXPECT_EQ(hosted.warnings.size(), 2u);  // the tool and the choice
  EXPECT_EQ(parse_error(base({{"type", "function"}, {"name", "zzz"}})).param, "tool_choice");
  EXPECT_EQ(parse_error(base("sometimes")).param, "tool_choice");
  EXPECT_EQ(parse_error(json{{"input", "x"}, {"tool_choice", "required"}}).param, "tool_choice");
}

TEST(ResponsesConvert, ReasoningEffortReachesTheTemplate) {
  auto high = parse_ok(json{{"input", "x"}, {"reasoning", {{"effort", "high"}}}});
  EXPECT_EQ(high.turn.chat_template_kwargs["reasoning_effort"], "high");
  EXPECT_FALSE(high.turn.chat_template_kwargs.contains("enable_thinking"));
  auto off = parse_ok(json{{"input", "x"}, {"reasoning", {{"effort", "none"}}}});
  EXPECT_EQ(off.turn.chat_template_kwargs["enable_thinking"], false);
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

std::vector<std::string> types(const std::vector<Ordered>& events) {
  std::vector<std::string> out;
  for (const Ordered& e : events) out.push_back(e["type"].get<std::string>());
  return out;
}

TEST(ResponsesOutput, EventsBecomeItemsInOrder) {
  using K = chat::Event::Kind;
  rs::OutputBuilder b({{"f", rs::ToolKind::kFunction}}, true);
  auto events = b.feed({ev(K::kReasoning, "Hmm"), ev(K::kReasoning, "."), ev(K::kContent, "Call"),
                        ev(K::kContent, "ing."), ev(K::kToolCallBegin, "", 0, "call_1", "f"),
                        ev(K::kToolCallArgs, "{\"a\":1}", 0), ev(K::kToolCallEnd, "", 0)});
  auto more = b.finish(false);
  EXPECT_TRUE(more.empty());
  const std::vector<std::string> expected = {"response.output_item.added",
                                             "response.content_part.added",
                                             "response.reasoning_text.delta",
                                             "response.reasoning_text.delta",
                                             "response.reasoning_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.output_text.delta",
                                             "response.output_text.delta",
                                             "response.output_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.function_call_arguments.delta",
                                             "response.function_call_arguments.done",
                                             "response.output_item.done"};
  EXPECT_EQ(types(events), expected);
  const json out = json::parse(b.output().dump());
  ASSERT_EQ(out.size(), 3u) << out.dump();
  EXPECT_EQ(out[0]["type"], "reasoning");
  EXPECT_EQ(out[0]["id"].get<std::string>().rfind("rs_", 0), 0u);
  EXPECT_EQ(out[0]["summary"], json::array());
  EXPECT_EQ(out[0]["content"], json::parse(R"([{"type":"reasoning_text","text":"Hmm."}])"));
  EXPECT_EQ(out[1]["type"], "message");
  EXPECT_EQ(out[1]["status"], "completed");
  EXPECT_EQ(out[1]["role"], "assistant");
  EXPECT_EQ(
      out[1]["content"],
      json::parse(R"([{"type":"output_text","text":"Calling.","annotations":[],"logprobs":[]}])"));
  EXPECT_EQ(out[2]["type"], "function_call");
  EXPECT_EQ(out[2]["call_id"], "call_1");
  EXPECT_EQ(out[2]["name"], "f");
  EXPECT_EQ(out[2]["arguments"], "{\"a\":1}");
  EXPECT_EQ(out[2]["status"], "completed");
  EXPECT_TRUE(b.saw_tool_call());
  // Indices and ids tie the events to their items.
  EXPECT_EQ(events[0]["output_index"], 0);
  EXPECT_EQ(events[0]["item"]["content"], Ordered::array());  // the item as added
  EXPECT_EQ(events[9]["item_id"], out[1]["id"]);
  EXPECT_EQ(events[9]["output_index"], 1);
  EXPECT_EQ(events[9]["delta"], "Call");
  EXPECT_EQ(events[11]["text"], "Calling.");
  EXPECT_EQ(events[16]["arguments"], "{\"a\":1}");
  EXPECT_EQ(events[16]["name"], "f");
  EXPECT_EQ(json::parse(events[17]["item"].dump()), out[2]);
}

TEST(ResponsesOutput, CustomAndLocalShellCallsAndSingleTool) {
  using K = chat::Event::Kind;
  rs::OutputBuilder b(
      {{"apply_patch", rs::ToolKind::kCustom}, {"local_shell", rs::ToolKind::kLocalShell}}, true);
  auto events = b.feed(
      {ev(K::kToolCallBegin, "", 0, "call_a", "apply_patch"),
       ev(K::kToolCallArgs, R"({"input":"*** Begin Patch\n*** End Patch"})", 0),
       ev(K::kToolCallEnd, "", 0), ev(K::kToolCallBegin, "", 1, "call_b", "local_shell"),
       ev(K::kToolCallArgs, R"({"command":["ls","-l"],"workdir":"/tmp","timeout_ms":500})", 1),
       ev(K::kToolCallEnd, "", 1)});
  EXPECT_EQ(types(events),
            (std::vector<std::string>{
                "response.output_item.added", "response.custom_tool_call_input.delta",
                "response.custom_tool_call_input.done", "response.output_item.done",
                "response.output_item.added", "response.output_item.done"}));
  const json out = json::parse(b.output().dump());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0]["type"], "custom_tool_call");
  EXPECT_EQ(out[0]["call_id"], "call_a");
  EXPECT_EQ(out[0]["input"], "*** Begin Patch\n*** End Patch");
  EXPECT_EQ(out[1]["type"], "local_shell_call");
  EXPECT_EQ(out[1]["status"], "completed");
  EXPECT_EQ(out[1]["action"], json::parse(R"({"type":"exec","command":["ls","-l"],"env":{},
      "timeout_ms":500,"user":null,"working_directory":"/tmp"})"));

  // parallel_tool_calls false: only the first call.
  rs::OutputBuilder single({}, false);
  single.feed({ev(K::kToolCallBegin, "", 0, "c1", "f"), ev(K::kToolCallArgs, "{}", 0),
               ev(K::kToolCallEnd, "", 0), ev(K::kToolCallBegin, "", 1, "c2", "g"),
               ev(K::kToolCallArgs, "{}", 1), ev(K::kToolCallEnd, "", 1)});
  ASSERT_EQ(single.output().size(), 1u);
  EXPECT_EQ(single.output()[0]["name"], "f");
}

TEST(ResponsesOutput, CutMessageIsIncomplete) {
  rs::OutputBuilder b({}, true);
  b.feed({ev(chat::Event::Kind::kContent, "Half")});
  auto events = b.finish(true);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[2]["type"], "response.output_item.done");
  EXPECT_EQ(events[2]["item"]["status"], "incomplete");
  EXPECT_EQ(b.output()[0]["status"], "incomplete");
}

TEST(ResponsesOutput, ReasoningCounter) {
  chat::ParserConfig config;
  config.reasoning = true;
  auto count = [&](std::vector<std::string> tokens) {
    rs::ReasoningCounter c(config);
    for (const auto& t : tokens) c.feed(t);
    return c.num_reasoning_tokens();
  };
  EXPECT_EQ(count({"<th", "ink>", "Hmm", ".", "</think>", "\n\n", "Four"}), 5);
  EXPECT_EQ(count({"Four", "<think>", "x"}), 0);  // content first: no block
  EXPECT_EQ(count({"<", "b>"}), 0);
  config.reasoning_open_at_start = true;
  EXPECT_EQ(count({"Hmm", "</thi", "nk>", "Four", "."}), 3);
  config.reasoning = false;
  EXPECT_EQ(count({"<think>", "x", "</think>"}), 0);
}

TEST(ResponsesStore, BoundedByCountAndBytes) {
  auto entry = [](size_t n) {
    return rs::StoredResponse{Ordered{{"pad", std::string(n, 'x')}}, Ordered::array()};
  };
  rs::ResponseStore byCount(2, 1 << 20);
  byCount.put("a", entry(10));
  byCount.put("b", entry(10));
  ASSERT_NE(byCount.get("a"), nullptr);  // a is now the most recently used
  byCount.put("c", entry(10));
  EXPECT_EQ(byCount.size(), 2u);
  EXPECT_EQ(byCount.get("b"), nullptr);  // the least recently used went
  EXPECT_NE(byCount.get("a"), nullptr);
  EXPECT_TRUE(byCount.erase("a"));
  EXPECT_FALSE(byCount.erase("a"));
  EXPECT_EQ(byCount.size(), 1u);

  rs::ResponseStore byBytes(100, 300);
  EXPECT_TRUE(byBytes.put("a", entry(100)));
  EXPECT_TRUE(byBytes.put("b", entry(100)));
  EXPECT_TRUE(byBytes.put("c", entry(100)));  // over 300 bytes: a goes
  EXPECT_EQ(byBytes.get("a"), nullptr);
  EXPECT_NE(byBytes.get("c"), nullptr);
  EXPECT_LE(byBytes.num_bytes(), 300u);
  EXPECT_FALSE(byBytes.put("huge", entry(1000)));  // alone larger than the store
  EXPECT_EQ(byBytes.get("huge"), nullptr);
}

TEST(ResponsesCompaction, OutputKeepsUserMessagesThenOneCompactionItem) {
  const Ordered conversation = Ordered::parse(R"([
    {"type":"message","role":"user","content":"Fix the build."},
    {"type":"message","role":"assistant","id":"msg_a","status":"completed",
     "content":[{"type":"output_text","text":"Done.","annotations":[]}]},
    {"type":"function_call","call_id":"c1","name":"sh","arguments":"{}"},
    {"type":"function_call_output","call_id":"c1","output":"ok"},
    {"type":"compaction","id":"cmp_old","encrypted_content":"kiln-compaction-v1:b2xk"},
    {"type":"message","role":"developer","content":"Be careful."},
    {"role":"user","id":"msg_u2","content":[{"type":"input_text","text":"And the tests."}]}])");
  const json out = json::parse(rs::compacted_output(conversation, "We fixed it.").dump());
  ASSERT_EQ(out.size(), 3u) << out.dump();
  EXPECT_EQ(out[0]["type"], "message");
  EXPECT_EQ(out[0]["role"], "user");
  EXPECT_EQ(out[0]["status"], "completed");
  EXPECT_EQ(out[0]["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(out[0]["content"], json::parse(R"([{"type":"input_text","text":"Fix the build."}])"));
  EXPECT_EQ(out[1]["id"], "msg_u2");  // a client's id is kept
  EXPECT_EQ(out[1]["content"][0]["text"], "And the tests.");
  EXPECT_EQ(out[2]["type"], "compaction");
  EXPECT_EQ(out[2]["id"].get<std::string>().rfind("cmp_", 0), 0u);
  bool is_kiln = false;
  auto summary = rs::decode_compaction(out[2]["encrypted_content"].get<std::string>(), &is_kiln);
  EXPECT_TRUE(is_kiln);
  ASSERT_TRUE(summary.has_value());
  EXPECT_EQ(*summary, "We fixed it.");
}

TEST(ResponsesCompaction, ACompactionItemInInputBecomesItsSummary) {
  const std::string content = rs::encode_compaction("The user wants a landing page.");
  json input = json::array();
  input.push_back({{"type", "message"}, {"role", "user"}, {"content", "Build a page."}});
  input.push_back({{"type", "compaction"}, {"id", "cmp_1"}, {"encrypted_content", content}});
  input.push_back({{"type", "message"}, {"role", "user"}, {"content", "Now add a footer."}});
  auto r = parse_ok(json{{"input", input}});
  EXPECT_TRUE(r.warnings.empty());
  const json m = msgs(r);
  ASSERT_EQ(m.size(), 3u) << m.dump();
  EXPECT_EQ(m[1]["role"], "user");
  EXPECT_EQ(m[1]["content"],
            std::string(rs::kCompactionSummaryHeading) + "The user wants a landing page.");
  EXPECT_EQ(m[2]["content"], "Now add a footer.");

  // Another server's compaction (encrypted with its key): left out with a warning.
  input[1]["encrypted_content"] = "gAAAAABpM0Yj-opaque";
  auto foreign = parse_ok(json{{"input", input}});
  EXPECT_EQ(msgs(foreign).size(), 2u);
  ASSERT_EQ(foreign.warnings.size(), 1u);
  EXPECT_NE(foreign.warnings[0].find("input[1]"), std::string::npos) << foreign.warnings[0];

  // Ours but corrupt, or no content at all: a 400 naming the field.
  input[1]["encrypted_content"] = "kiln-compaction-v1:not base64!";
  EXPECT_EQ(parse_error(json{{"input", input}}).param, "input[1].encrypted_content");
  input[1].erase("encrypted_content");
  EXPECT_EQ(parse_error(json{{"input", input}}).param, "input[1].encrypted_content");
}

// --- the endpoints over a FakeEngine ---------------------------------------------------

class ResponsesTest : public ServerTest {
 protected:
  static json body(const std::string& text = "Hi") {
    return json{{"model", "test-model"}, {"input", text}};
  }
  std::string prompt(size_t i = 0) {
    return qwen3_tokenizer().decode(engine_.requests().at(i).prompt_tokens);
  }
};

struct SseEvent {
  std::string name;
  json data;
};

// Named events; checks the framing, that each data's type is its name and that sequence
// numbers count up from 0. SSE comments (": keep-alive") are skipped.
std::vector<SseEvent> named_events(const std::string& body) {
  std::vector<SseEvent> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) {
      ADD_FAILURE() << "unterminated SSE event at " << pos;
      break;
    }
    if (body[pos] == ':') {
      pos = end + 2;
      continue;
    }
    if (body.compare(pos, 7, "event: ") != 0) {
      ADD_FAILURE() << "bad SSE framing at " << pos << ": " << body.substr(pos, 80);
      break;
    }
    const size_t nl = body.find('\n', pos);
    SseEvent e;
    e.name = body.substr(pos + 7, nl - pos - 7);
    EXPECT_EQ(body.compare(nl + 1, 6, "data: "), 0);
    e.data = json::parse(body.substr(nl + 7, end - nl - 7));
    EXPECT_EQ(e.data["type"], e.name);
    EXPECT_EQ(e.data["sequence_number"], out.size()) << e.name;
    out.push_back(std::move(e));
    pos = end + 2;
  }
  return out;
}

// The Open Responses ResponseResource's required fields, with their types.
void expect_response_shape(const json& r) {
  const std::vector<std::pair<const char*, const char*>> fields = {
      {"id", "string"},
      {"object", "string"},
      {"created_at", "integer"},
      {"completed_at", "integer|null"},
      {"status", "string"},
      {"incomplete_details", "object|null"},
      {"model", "string"},
      {"previous_response_id", "string|null"},
      {"instructions", "string|array|null"},
      {"output", "array"},
      {"error", "object|null"},
      {"tools", "array"},
      {"tool_choice", "string|object"},
      {"truncation", "string"},
      {"parallel_tool_calls", "boolean"},
      {"text", "object"},
      {"top_p", "number"},
      {"presence_penalty", "number"},
      {"frequency_penalty", "number"},
      {"top_logprobs", "integer"},
      {"temperature", "number"},
      {"reasoning", "object|null"},
      {"user", "string|null"},
      {"usage", "object|null"},
      {"max_output_tokens", "integer|null"},
      {"max_tool_calls", "integer|null"},
      {"store", "boolean"},
      {"background", "boolean"},
      {"service_tier", "string"},
      {"metadata", "object"},
      {"safety_identifier", "string|null"},
      {"prompt_cache_key", "string|null"}};
  for (const auto& [name, type] : fields) {
    ASSERT_TRUE(r.contains(name)) << name << " missing in " << r.dump();
    const json& v = r[name];
    const std::string t = v.is_null()             ? "null"
                          : v.is_number_integer() ? "integer"
                          : v.is_number()         ? "number"
                          : v.is_string()         ? "string"
                          : v.is_boolean()        ? "boolean"
                          : v.is_array()          ? "array"
                                                  : "object";
    const std::string allowed = std::string("|") + type + "|";
    const bool ok = allowed.find("|" + t + "|") != std::string::npos ||
                    (t == "integer" && allowed.find("|number|") != std::string::npos);
    EXPECT_TRUE(ok) << name << " is " << t << ", expected " << type;
  }
  EXPECT_EQ(r["object"], "response");
}

TEST_F(ResponsesTest, WholeResponseShapeAndUsage) {
  engine_.set_default_script(Script{{"Hello", " world"}, FinishReason::kStop, "", 3});
  start();
  json b = body();
  b["instructions"] = "Be brief.";
  b["metadata"] = {{"session", "s1"}};
  b["temperature"] = 0.5;
  b["reasoning"] = {{"effort", "none"}};
  Reply r = post("/v1/responses", b);
  ASSERT_EQ(r.status, 200) << r.body;
  const json resp = r.js();
  expect_response_shape(resp);
  EXPECT_EQ(resp["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(resp["status"], "completed");
  EXPECT_TRUE(resp["completed_at"].is_number_integer());
  EXPECT_EQ(resp["model"], "test-model");
  EXPECT_EQ(resp["instructions"], "Be brief.");
  EXPECT_EQ(resp["metadata"], (json{{"session", "s1"}}));
  EXPECT_DOUBLE_EQ(resp["temperature"].get<double>(), 0.5);
  EXPECT_EQ(resp["reasoning"]["effort"], "none");
  ASSERT_EQ(resp["output"].size(), 1u) << resp.dump();
  const json& m = resp["output"][0];
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["status"], "completed");
  EXPECT_EQ(m["content"][0]["text"], "Hello world");
  const size_t n = engine_.requests()[0].prompt_tokens.size();
  EXPECT_EQ(resp["usage"]["input_tokens"], n);
  EXPECT_EQ(resp["usage"]["input_tokens_details"]["cached_tokens"], 3);
  EXPECT_EQ(resp["usage"]["output_tokens"], 2);
  EXPECT_EQ(resp["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
  EXPECT_EQ(resp["usage"]["total_tokens"], n + 2);
  // Instructions reached the prompt as the system message; effort none turned thinking off.
  EXPECT_NE(prompt().find("<|im_start|>system\nBe brief."), std::string::npos) << prompt();
  EXPECT_NE(prompt().find("<think>\n\n</think>"), std::string::npos) << prompt();
  // Stored by default: GET returns the same object.
  Reply g = get("/v1/responses/" + resp["id"].get<std::string>());
  ASSERT_EQ(g.status, 200) << g.body;
  EXPECT_EQ(g.js(), resp);
}

TEST_F(ResponsesTest, StreamEventSequenceAccumulatesToTheStoredResponse) {
  engine_.set_default_script(Script{
      {"<think>", "\nPondering", ".\n", "</think>\n\n", "Four", "."}, FinishReason::kStop, "", 2});
  start();
  json b = body("2+2?");
  b["stream"] = true;
  Reply r = post("/v1/responses", b);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.header("content-type"), "text/event-stream");
  auto events = named_events(r.body);
  std::vector<std::string> names;
  for (const auto& e : events) names.push_back(e.name);
  const std::vector<std::string> expected = {
      "response.created", "response.in_progress",
      // reasoning: "Pondering", "." (the parser holds back text that could be a tag)
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
      "response.output_item.done",
      // the message: "Four", "."
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done", "response.completed"};
  ASSERT_EQ(names, expected) << r.body;
  EXPECT_EQ(events[0].data["response"]["status"], "in_progress");
  EXPECT_TRUE(events[0].data["response"]["usage"].is_null());
  EXPECT_EQ(events[0].data["response"]["output"], json::array());
  expect_response_shape(events[0].data["response"]);
  std::string reasoning, text;
  for (const auto& e : events) {
    if (e.name == "response.reasoning_text.delta") reasoning += e.data["delta"].get<std::string>();
    if (e.name == "response.output_text.delta") {
      EXPECT_EQ(e.data["output_index"], 1);
      EXPECT_EQ(e.data["content_index"], 0);
      text += e.data["delta"].get<std::string>();
    }
  }
  EXPECT_EQ(reasoning, "Pondering.");
  EXPECT_EQ(text, "Four.");
  const json& done = events.back().data["response"];
  expect_response_shape(done);
  EXPECT_EQ(done["status"], "completed");
  ASSERT_EQ(done["output"].size(), 2u);
  EXPECT_EQ(done["output"][0]["content"][0],
            (json{{"type", "reasoning_text"}, {"text", "Pondering."}}));
  EXPECT_EQ(done["output"][1]["content"][0]["text"], "Four.");
  EXPECT_EQ(done["usage"]["output_tokens"], 6);
  EXPECT_EQ(done["usage"]["output_tokens_details"]["reasoning_tokens"], 4);
  EXPECT_EQ(done["usage"]["input_tokens_details"]["cached_tokens"], 2);
  // Each item's done event holds the item as the final response does.
  EXPECT_EQ(events[8].data["item"], done["output"][0]);
  EXPECT_EQ(events[15].data["item"], done["output"][1]);
  EXPECT_EQ(get("/v1/responses/" + done["id"].get<std::string>()).js(), done);
}

TEST_F(ResponsesTest, FunctionCallRoundTripThroughPreviousResponseId) {
  engine_.push_script(Script{{"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ",
                              "{\"city\": \"Paris\"}}\n</tool_call>"}});
  engine_.push_script(Script{{"Sunny", " in Paris."}});
  start();
  json b = body("Weather in Paris?");
  b["instructions"] = "Use tools.";
  b["tools"] = {
      {{"type", "function"},
       {"name", "get_weather"},
       {"description", "Weather of a city"},
       {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}},
      {{"type", "web_search"}}};
  Reply r1 = post("/v1/responses", b);
  ASSERT_EQ(r1.status, 200) << r1.body;
  const json first = r1.js();
  ASSERT_EQ(first["output"].size(), 1u) << first.dump();
  const json call = first["output"][0];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(json::parse(call["arguments"].get<std::string>()), (json{{"city", "Paris"}}));
  EXPECT_EQ(call["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(first["tools"].size(), 2u);  // echoed as given
  ASSERT_EQ(first["warnings"].size(), 1u);
  EXPECT_NE(prompt(0).find("\"get_weather\""), std::string::npos) << prompt(0);
  EXPECT_EQ(prompt(0).find("web_search"), std::string::npos) << prompt(0);

  json b2{{"model", "test-model"},
          {"previous_response_id", first["id"]},
          {"input",
           {{{"type", "function_call_output"},
             {"call_id", call["call_id"]},
             {"output", "sunny, 24C"}}}},
          {"tools", b["tools"]}};
  Reply r2 = post("/v1/responses", b2);
  ASSERT_EQ(r2.status, 200) << r2.body;
  EXPECT_EQ(r2.js()["previous_response_id"], first["id"]);
  EXPECT_EQ(r2.js()["output"][0]["content"][0]["text"], "Sunny in Paris.");
  const std::string p = prompt(1);
  // The history (question, the call) and the tool's output reached the template; the
  // instructions of the first response were not carried over.
  EXPECT_NE(p.find("Weather in Paris?"), std::string::npos) << p;
  EXPECT_NE(p.find("<tool_call>"), std::string::npos) << p;
  EXPECT_NE(p.find("sunny, 24C"), std::string::npos) << p;
  EXPECT_EQ(p.find("Use tools."), std::string::npos) << p;
  EXPECT_LT(p.find("Weather in Paris?"), p.find("sunny, 24C"));
}

TEST_F(ResponsesTest, StreamedFunctionCallEvents) {
  engine_.set_default_script(Script{{"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ",
                                     "{\"city\": \"Paris\"}}\n</tool_call>"}});
  start();
  json b = body("Weather?");
  b["stream"] = true;
  b["tools"] = {
      {{"type", "function"}, {"name", "get_weather"}, {"parameters", {{"type", "object"}}}}};
  auto events = named_events(post("/v1/responses", b).body);
  std::vector<std::string> names;
  for (const auto& e : events) names.push_back(e.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{
                "response.created", "response.in_progress", "response.output_item.added",
                "response.function_call_arguments.delta", "response.function_call_arguments.done",
                "response.output_item.done", "response.completed"}));
  ASSERT_EQ(events.size(), 7u);
  EXPECT_EQ(events[2].data["item"]["status"], "in_progress");
  EXPECT_EQ(json::parse(events[4].data["arguments"].get<std::string>()), (json{{"city", "Paris"}}));
  EXPECT_EQ(events[5].data["item"]["status"], "completed");
}

TEST_F(ResponsesTest, PreviousResponseIdMissStoreFalseAndDelete) {
  start();
  json b = body();
  b["previous_response_id"] = "resp_doesnotexist";
  Reply miss = post("/v1/responses", b);
  EXPECT_EQ(miss.status, 404) << miss.body;
  EXPECT_EQ(miss.js()["error"]["code"], "previous_response_not_found");
  EXPECT_EQ(miss.js()["error"]["param"], "previous_response_id");
  EXPECT_EQ(miss.js()["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(engine_.requests().empty());

  json unstored = body();
  unstored["store"] = false;
  const json r = post("/v1/responses", unstored).js();
  EXPECT_EQ(r["store"], false);
  EXPECT_EQ(get("/v1/responses/" + r["id"].get<std::string>()).status, 404);
  json cont = body();
  cont["previous_response_id"] = r["id"];
  EXPECT_EQ(post("/v1/responses", cont).js()["error"]["code"], "previous_response_not_found");

  const json stored = post("/v1/responses", body()).js();
  const std::string id = stored["id"].get<std::string>();
  EXPECT_EQ(get("/v1/responses/" + id).status, 200);
  Reply del = Client(port_).request("DELETE", "/v1/responses/" + id);
  EXPECT_EQ(del.status, 200);
  EXPECT_EQ(del.js(), (json{{"id", id}, {"object", "response"}, {"deleted", true}}));
  EXPECT_EQ(get("/v1/responses/" + id).status, 404);
  EXPECT_EQ(Client(port_).request("DELETE", "/v1/responses/" + id).status, 404);
}

TEST_F(ResponsesTest, StoreBoundEvictsTheOldest) {
  ServerOptions o;
  o.responses_store_max_count = 1;
  start(o);
  const std::string a = post("/v1/responses", body()).js()["id"];
  const std::string b = post("/v1/responses", body()).js()["id"];
  EXPECT_EQ(get("/v1/responses/" + a).status, 404);
  EXPECT_EQ(get("/v1/responses/" + b).status, 200);
}

TEST_F(ResponsesTest, MaxOutputTokensMakesItIncomplete) {
  engine_.set_default_script(Script{{"a", "b", "c", "d"}});
  start();
  json b = body();
  b["max_output_tokens"] = 2;
  const json r = post("/v1/responses", b).js();
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"], (json{{"reason", "max_output_tokens"}}));
  EXPECT_TRUE(r["completed_at"].is_null());
  EXPECT_EQ(r["max_output_tokens"], 2);
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
  EXPECT_EQ(engine_.requests()[0].max_tokens, 2);
  b["stream"] = true;
  auto events = named_events(post("/v1/responses", b).body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().name, "response.incomplete");
  EXPECT_EQ(events.back().data["response"]["status"], "incomplete");
}

TEST_F(ResponsesTest, TextFormatJsonSchemaIsEnforcedByAGrammar) {
  start();
  json b = body();
  b["text"] = {{"format",
                {{"type", "json_schema"},
                 {"name", "answer"},
                 {"schema",
                  {{"type", "object"},
                   {"properties", {{"n", {{"type", "integer"}}}}},
                   {"required", {"n"}}}}}}};
  Reply r = post("/v1/responses", b);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.js()["text"]["format"]["name"], "answer");
  ASSERT_EQ(engine_.requests().size(), 1u);
  EXPECT_NE(engine_.requests()[0].grammar, nullptr);
  // A plain request has none.
  post("/v1/responses", body());
  EXPECT_EQ(engine_.requests()[1].grammar, nullptr);
  b["text"]["format"]["schema"] = {{"type", "object"},
                                   {"properties", {{"n", {{"type", "frobnicate"}}}}}};
  Reply bad = post("/v1/responses", b);
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(bad.js()["error"]["param"], "text.format");
}

TEST_F(ResponsesTest, ErrorsAreOpenAIEnvelopesNeverCrashes) {
  start();
  for (const std::string& raw :
       {std::string("{not json"), std::string("[]"), std::string("{\"input\": 5}"),
        std::string("{\"input\": [{\"role\":\"user\",\"content\":[{\"type\":\"input_image\","
                    "\"image_url\":\"x\"}]}]}"),
        std::string("{\"input\": \"x\", \"tools\": 7}"),
        std::string("{\"input\": \"x\", \"background\": true}"),
        std::string("{\"input\": \"x\", \"max_output_tokens\": 0}"),
        std::string("{\"input\": \"x\", \"temperature\": \"hot\"}"),
        std::string("{\"input\": \"x\", \"previous_response_id\": 12}")}) {
    Reply r = post_raw("/v1/responses", raw);
    EXPECT_EQ(r.status, 400) << raw << " -> " << r.body;
    EXPECT_TRUE(r.js()["error"]["message"].is_string()) << r.body;
  }
  Reply model = post("/v1/responses", json{{"model", "other"}, {"input", "x"}});
  EXPECT_EQ(model.status, 404);
  EXPECT_EQ(get("/v1/responses/resp_nope").js()["error"]["type"], "invalid_request_error");
}

TEST_F(ResponsesTest, FailedGenerationStreamsResponseFailed) {
  engine_.set_default_script(Script{{"a"}, FinishReason::kError, "boom", 0});
  start();
  json b = body();
  b["stream"] = true;
  auto events = named_events(post("/v1/responses", b).body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().name, "response.failed");
  EXPECT_EQ(events.back().data["response"]["status"], "failed");
  EXPECT_EQ(events.back().data["response"]["error"]["code"], "server_error");
  EXPECT_NE(events.back().data["response"]["error"]["message"].get<std::string>().find("boom"),
            std::string::npos);
  b["stream"] = false;
  EXPECT_EQ(post("/v1/responses", b).status, 500);
}

TEST_F(ResponsesTest, RequiredToolChoiceForcesACallGrammar) {
  start();
  json b = body("Weather?");
  b["tools"] = {
      {{"type", "function"},
       {"name", "get_weather"},
       {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}};
  b["tool_choice"] = "required";
  Reply r = post("/v1/responses", b);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(engine_.requests()[0].grammar, nullptr);
  EXPECT_EQ(r.js()["tool_choice"], "required");
}

TEST_F(ResponsesTest, CompactSummarisesTheConversationIntoACompactionItem) {
  engine_.set_default_script(Script{{"The user", " asked about rivers."}, FinishReason::kStop});
  start();
  json b = body();
  b["instructions"] = "Be brief.";
  b["tools"] = {{{"type", "function"},
                 {"name", "dictionary"},
                 {"parameters", {{"type", "object"}, {"properties", json::object()}}}}};
  b["input"] = json::parse(R"([
    {"role":"user","content":"What is a river?"},
    {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Water."}]},
    {"role":"user","content":"And a creek?"}])");
  Reply r = post("/v1/responses/compact", b);
  ASSERT_EQ(r.status, 200) << r.body;
  const json c = r.js();
  // The Open Responses CompactResource: id, object, output, created_at, usage.
  EXPECT_EQ(c["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(c["object"], "response.compaction");
  EXPECT_TRUE(c["created_at"].is_number_integer());
  const size_t n = engine_.requests()[0].prompt_tokens.size();
  EXPECT_EQ(c["usage"]["input_tokens"], n);
  EXPECT_EQ(c["usage"]["output_tokens"], 2);
  EXPECT_EQ(c["usage"]["total_tokens"], n + 2);
  ASSERT_EQ(c["output"].size(), 3u) << c.dump();
  EXPECT_EQ(c["output"][0]["content"][0]["text"], "What is a river?");
  EXPECT_EQ(c["output"][1]["content"][0]["text"], "And a creek?");
  EXPECT_EQ(c["output"][2]["type"], "compaction");
  // The prompt: instructions and tools as a turn renders them, the conversation, then the
  // compaction instruction as the last user message.
  const std::string p = prompt(0);
  EXPECT_NE(p.find("<|im_start|>system\nBe brief."), std::string::npos) << p;
  EXPECT_NE(p.find("\"dictionary\""), std::string::npos) << p;
  EXPECT_NE(p.find(std::string("<|im_start|>user\n") + rs::kCompactionPrompt + "<|im_end|>"),
            std::string::npos)
      << p;
  EXPECT_LT(p.find("And a creek?"), p.find(rs::kCompactionPrompt));
  // Nothing is stored.
  EXPECT_EQ(get("/v1/responses/" + c["id"].get<std::string>()).status, 404);

  // The next turn sends the compacted output back: the summary reaches the prompt.
  json next = body();
  next["input"] = c["output"];
  next["input"].push_back({{"role", "user"}, {"content", "Thanks."}});
  Reply t = post("/v1/responses", next);
  ASSERT_EQ(t.status, 200) << t.body;
  const std::string p2 = prompt(1);
  EXPECT_NE(p2.find(std::string(rs::kCompactionSummaryHeading) + "The user asked about rivers."),
            std::string::npos)
      << p2;
  EXPECT_EQ(p2.find("Water."), std::string::npos) << p2;  // the assistant turn is gone
  EXPECT_NE(p2.find("Thanks."), std::string::npos);
}

TEST_F(ResponsesTest, CompactAPreviousResponseAndItsErrors) {
  start();
  Reply first = post("/v1/responses", body("Remember the word heron."));
  ASSERT_EQ(first.status, 200) << first.body;
  json b = json{{"model", "test-model"}, {"previous_response_id", first.js()["id"]}};
  Reply r = post("/v1/responses/compact", b);
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.js()["output"].size(), 2u) << r.body;
  EXPECT_EQ(r.js()["output"][0]["content"][0]["text"], "Remember the word heron.");
  EXPECT_NE(prompt(1).find("Hello world"), std::string::npos);  // the stored reply

  // Neither input nor previous_response_id; an unknown id; a bad input.
  Reply none = post("/v1/responses/compact", json{{"model", "test-model"}});
  EXPECT_EQ(none.status, 400);
  EXPECT_EQ(none.js()["error"]["param"], "input");
  Reply miss = post("/v1/responses/compact",
                    json{{"model", "test-model"}, {"previous_response_id", "resp_gone"}});
  EXPECT_EQ(miss.status, 404);
  EXPECT_EQ(miss.js()["error"]["code"], "previous_response_not_found");
  EXPECT_EQ(post("/v1/responses/compact", json{{"input", 3}}).status, 400);
  EXPECT_EQ(post("/v1/responses/compact", json{{"input", "x"}, {"model", "other"}}).status, 404);

  // A reply with no text (only reasoning, cut) is no summary: a 500, not an empty item.
  engine_.push_script(Script{{"<think>", "hmm"}, FinishReason::kLength});
  Reply empty = post("/v1/responses/compact", json{{"input", "Hi"}});
  EXPECT_EQ(empty.status, 500) << empty.body;
}

}  // namespace
}  // namespace kiln::server::testing
