// POST /v1/chat/completions (OpenAI Chat Completions).
//
// The request's messages and tools are rendered with the model's chat template, tokenized and
// submitted n times (seeds engine::choice_seed(seed, i)). The output text goes through the
// streaming output parser of the template's family (chat/output_parser.h), which separates
// reasoning_content and tool calls from the content; a choice whose output holds tool calls
// finishes with "tool_calls".
#include <fmt/format.h>

#include <ctime>

#include "kiln/chat/output_parser.h"
#include "kiln/chat/template.h"
#include "kiln/engine/sampler.h"
#include "kiln/server/chat_pipeline.h"
#include "kiln/server/constraint.h"
#include "kiln/server/generation.h"
#include "kiln/server/openai_common.h"
#include "kiln/server/request_controls.h"

namespace kiln::server {

namespace {

using chat::Event;
using engine::FinishEvent;
using engine::TokenEvent;

// What a chat body becomes before tokenization (chat_pipeline.h).
using ChatInput = ChatTurn;

std::variant<std::string, ApiError> content_text(const Json& content, const std::string& where) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    return invalid_request(where + " must be a string or an array of content parts", where);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string part_where = fmt::format("{}[{}]", where, i);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      return invalid_request(part_where + " must be an object with a 'type'", part_where);
    const std::string type = part["type"].get<std::string>();
    if (type != "text")
      return not_supported(fmt::format("content parts of type '{}' are not supported (this "
                                       "server serves a text-only model)",
                                       type),
                           part_where);
    if (!part.contains("text") || !part["text"].is_string())
      return invalid_request(part_where + ".text must be a string", part_where + ".text");
    if (!text.empty()) text += "\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

// Assistant tool calls as templates expect them: arguments as an object when the client sent
// a JSON string (what OpenAI clients send back).
std::variant<Json, ApiError> normalize_tool_calls(const Json& calls, const std::string& where) {
  if (!calls.is_array()) return invalid_request(where + " must be an array", where);
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string w = fmt::format("{}[{}]", where, i);
    const Json& call = calls[i];
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
        !call["function"].contains("name") || !call["function"]["name"].is_string())
      return invalid_request(w + " must have function.name", w);
    Json c = call;
    Json& args = c["function"]["arguments"];
    if (args.is_string()) {
      Json parsed = Json::parse(args.get<std::string>(), nullptr, false);
      if (!parsed.is_discarded() && parsed.is_object()) args = std::move(parsed);
    } else if (args.is_null()) {
      args = Json::object();
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::optional<ApiError> read_messages(const Json& body, ChatInput* in) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty())
    return invalid_request("'messages' must be a non-empty array", "messages");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& m = (*it)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return invalid_request(where + " must be an object", where);
    auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string())
      return invalid_request(where + ".role must be a string", where + ".role");
    std::string role = role_it->get<std::string>();
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" &&
        role != "tool")
      return invalid_request(fmt::format("{}.role '{}' is not one of system, developer, user, "
                                         "assistant, tool",
                                         where, role),
                             where + ".role");
    Json out = m;
    if (role == "developer") out["role"] = "system";  // templates know system only
    const Json content = m.contains("content") ? m["content"] : Json(nullptr);
    if (content.is_null() && role != "assistant")
      return invalid_request(where + ".content is required", where + ".content");
    auto text = content_text(content, where + ".content");
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    out["content"] = std::get<std::string>(text);
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      auto calls = normalize_tool_calls(m["tool_calls"], where + ".tool_calls");
      if (auto* e = std::get_if<ApiError>(&calls)) return *e;
      out["tool_calls"] = std::get<Json>(std::move(calls));
    } else {
      out.erase("tool_calls");
    }
    in->messages.push_back(std::move(out));
  }
  return std::nullopt;
}

std::optional<ApiError> read_tools(const Json& body, ChatInput* in) {
  Json tools = body.contains("tools") ? body["tools"] : Json(nullptr);
  if (!tools.is_null()) {
    if (!tools.is_array()) return invalid_request("'tools' must be an array", "tools");
    for (size_t i = 0; i < tools.size(); ++i) {
      const Json& t = tools[i];
      const std::string where = fmt::format("tools[{}]", i);
      // (json::value() throws when the key holds another type: compare instead)
      if (!t.is_object() || !t.contains("type") || t["type"] != "function" ||
          !t.contains("function") || !t["function"].is_object() ||
          !t["function"].contains("name") || !t["function"]["name"].is_string())
        return invalid_request(
            where + " must be {\"type\":\"function\",\"function\":{\"name\":..}}", where);
    }
  }
  const bool has_tools = tools.is_array() && !tools.empty();
  std::string choice = has_tools ? "auto" : "none";
  const Json tc = body.contains("tool_choice") ? body["tool_choice"] : Json(nullptr);
  if (tc.is_string()) {
    choice = tc.get<std::string>();
    if (choice != "none" && choice != "auto" && choice != "required")
      return invalid_request("'tool_choice' must be none, auto, required or a named function",
                             "tool_choice");
    if (choice != "none" && !has_tools)
      return invalid_request(fmt::format("'tool_choice' {} needs 'tools'", choice), "tool_choice");
  } else if (tc.is_object()) {
    if (!tc.contains("function") || !tc["function"].is_object() ||
        !tc["function"].contains("name") || !tc["function"]["name"].is_string())
      return invalid_request(
          "'tool_choice' must name a function: "
          "{\"type\":\"function\",\"function\":{\"name\":..}}",
          "tool_choice");
    const std::string name = tc["function"]["name"].get<std::string>();
    Json named = Json::array();
    for (const Json& t : has_tools ? tools : Json::array())
      if (t["function"]["name"] == name) named.push_back(t);
    if (named.empty())
      return invalid_request(fmt::format("'tool_choice' names '{}', which is not in 'tools'", name),
                             "tool_choice");
    tools = std::move(named);  // only the named function is offered to the model
    choice = "named";
  } else if (!tc.is_null()) {
    return invalid_request("'tool_choice' must be a string or an object", "tool_choice");
  }
  // With tool_choice none the template does not see the tools, and output is all content.
  if (choice != "none" && has_tools) {
    in->tools = std::move(tools);
    in->parse_tools = true;
    in->force_tool_call = choice == "required" || choice == "named";
  }
  return std::nullopt;
}

std::optional<ApiError> read_chat_options(const Json& body, ChatInput* in) {
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    const std::string type = it->is_object() && it->contains("type") && it->at("type").is_string()
                                 ? it->at("type").get<std::string>()
                                 : "";
    // json_object and json_schema: read_constraint (server/constraint.cpp) compiles them.
    if (type != "text" && type != "json_object" && type != "json_schema")
      return invalid_request("'response_format.type' must be text, json_object or json_schema",
                             "response_format");
  }
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    if (!it->is_object())
      return invalid_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    for (auto kw = it->begin(); kw != it->end(); ++kw)
      if (chat::is_reserved_template_variable(kw.key()))
        return invalid_request(
            fmt::format("chat_template_kwargs: '{}' is set by the server (from the request's own "
                        "fields) and cannot be given here",
                        kw.key()),
            "chat_template_kwargs." + kw.key());
    in->chat_template_kwargs = *it;
  }
  // request_controls.h: the effort reaches the template as reasoning_effort.
  auto effort = read_reasoning_effort(
      body.contains("reasoning_effort") ? body["reasoning_effort"] : Json(nullptr),
      "reasoning_effort");
  if (auto* e = std::get_if<ApiError>(&effort)) return *e;
  if (const auto& value = std::get<std::optional<std::string>>(effort))
    in->chat_template_kwargs["reasoning_effort"] = *value;
  return std::nullopt;
}

Json logprob_content(const tokenizer::Tokenizer& tok, const TokenEvent& t, bool with_top) {
  auto entry = [&](int32_t id, float lp) {
    const std::string_view piece = tok.token_piece(id);
    Json bytes = Json::array();
    for (unsigned char b : piece) bytes.push_back(static_cast<int>(b));
    const int32_t ids[1] = {id};
    Json e = Json::object();
    e["token"] = tok.decode(ids);
    e["logprob"] = std::isfinite(lp) ? lp : -9999.0f;  // OpenAI's floor for -inf
    e["bytes"] = std::move(bytes);
    return e;
  };
  Json e = entry(t.token, t.logprob);
  Json top = Json::array();
  if (with_top)
    for (const auto& [id, lp] : t.top) top.push_back(entry(id, lp));
  e["top_logprobs"] = std::move(top);
  return e;
}

struct ChatJob {
  ServerContext& ctx;
  std::string id;
  int64_t created = 0;
  int32_t num_prompt_tokens = 0;
  chat::ParserConfig parser_config;
  bool logprobs = false;
  bool include_usage = false;

  Json base(const char* object) const {
    return openai_base(id, object, created, ctx.options.model_name);
  }
};

struct ChoiceResult {
  std::string text;
  Json logprobs = Json::array();
  FinishEvent finish;
};

HandlerResult respond_whole(ChatJob& job, MultiRun& run, HttpExchange& ex) {
  std::vector<ChoiceResult> results(run.size());
  while (auto ev = run.next(ex)) {
    ChoiceResult& r = results[static_cast<size_t>(ev->first)];
    if (auto* t = std::get_if<TokenEvent>(&ev->second)) {
      r.text += t->text;
      if (job.logprobs) r.logprobs.push_back(logprob_content(job.ctx.tokenizer, *t, true));
    } else {
      r.finish = std::get<FinishEvent>(std::move(ev->second));
      r.text += r.finish.text;
      if (r.finish.reason == engine::FinishReason::kError ||
          r.finish.reason == engine::FinishReason::kCancelled)
        return generation_error(r.finish);
    }
  }
  if (run.abort_reason() == AbortReason::kServerShutdown)
    return unavailable("The server is shutting down");
  if (run.abort_reason() == AbortReason::kClientGone) return Streamed{};  // nobody to answer

  Json body = job.base("chat.completion");
  Json choices = Json::array();
  int32_t num_completion = 0;
  int32_t num_cached = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const ChoiceResult& r = results[i];
    const chat::ParsedMessage msg = chat::parse_all(job.parser_config, r.text);
    Json message = Json::object();
    message["role"] = "assistant";
    message["content"] =
        msg.content.empty() && !msg.tool_calls.empty() ? Json(nullptr) : Json(msg.content);
    if (!msg.reasoning.empty()) message["reasoning_content"] = msg.reasoning;
    if (!msg.tool_calls.empty()) {
      Json calls = Json::array();
      for (const chat::ToolCall& c : msg.tool_calls)
        calls.push_back(Json{{"id", c.id},
                             {"type", "function"},
                             {"function", {{"name", c.name}, {"arguments", c.arguments_json}}}});
      message["tool_calls"] = std::move(calls);
    }
    message["refusal"] = nullptr;
    Json choice = Json::object();
    choice["index"] = i;
    choice["message"] = std::move(message);
    choice["logprobs"] = job.logprobs ? Json{{"content", r.logprobs}} : Json(nullptr);
    choice["finish_reason"] =
        !msg.tool_calls.empty() && r.finish.reason == engine::FinishReason::kStop
            ? "tool_calls"
            : finish_reason_name(r.finish.reason);
    choices.push_back(std::move(choice));
    num_completion += r.finish.usage.completion_tokens;
    num_cached = std::max(num_cached, r.finish.usage.cached_tokens);
  }
  body["choices"] = std::move(choices);
  body["usage"] = openai_usage(job.num_prompt_tokens, num_completion, num_cached);
  job.ctx.metrics.add_tokens(job.num_prompt_tokens, num_completion);
  return json_response(body);
}

// One choice's streaming state.
struct StreamChoice {
  explicit StreamChoice(const chat::ParserConfig& config) : parser(config) {}
  chat::OutputParser parser;
  Json pending_logprobs = Json::array();
  bool saw_tool_call = false;
};

class ChatStreamer {
 public:
  ChatStreamer(ChatJob& job, HttpExchange& ex, size_t num_choices) : job_(job), ex_(ex) {
    for (size_t i = 0; i < num_choices; ++i) choices_.emplace_back(job.parser_config);
  }

  bool send_chunk(size_t index, Json delta, const char* finish_reason) {
    StreamChoice& c = choices_[index];
    Json choice = Json::object();
    choice["index"] = index;
    choice["delta"] = std::move(delta);
    if (job_.logprobs && (!c.pending_logprobs.empty() || finish_reason != nullptr)) {
      choice["logprobs"] = Json{{"content", std::move(c.pending_logprobs)}};
      c.pending_logprobs = Json::array();
    } else {
      choice["logprobs"] = nullptr;
    }
    choice["finish_reason"] = finish_reason ? Json(finish_reason) : Json(nullptr);
    Json chunk = job_.base("chat.completion.chunk");
    chunk["choices"] = Json::array({std::move(choice)});
    if (job_.include_usage) chunk["usage"] = nullptr;
    return ex_.write_chunk(sse_data(dump_json(chunk)));
  }

  void send_events(size_t index, const std::vector<Event>& events) {
    for (const Event& e : events) {
      Json delta = Json::object();
      switch (e.kind) {
        case Event::Kind::kContent:
          delta["content"] = e.text;
          break;
        case Event::Kind::kReasoning:
          delta["reasoning_content"] = e.text;
          break;
        case Event::Kind::kToolCallBegin:
          choices_[index].saw_tool_call = true;
          delta["tool_calls"] =
              Json::array({Json{{"index", e.tool_index},
                                {"id", e.tool_id},
                                {"type", "function"},
                                {"function", {{"name", e.tool_name}, {"arguments", ""}}}}});
          break;
        case Event::Kind::kToolCallArgs:
          delta["tool_calls"] =
              Json::array({Json{{"index", e.tool_index}, {"function", {{"arguments", e.text}}}}});
          break;
        case Event::Kind::kToolCallEnd:
          continue;
      }
      send_chunk(index, std::move(delta), nullptr);
    }
  }

  void on_token(size_t index, const TokenEvent& t) {
    StreamChoice& c = choices_[index];
    if (job_.logprobs) c.pending_logprobs.push_back(logprob_content(job_.ctx.tokenizer, t, true));
    send_events(index, c.parser.feed(t.text));
  }

  void on_finish(size_t index, const FinishEvent& f) {
    StreamChoice& c = choices_[index];
    send_events(index, c.parser.feed(f.text));
    send_events(index, c.parser.finish());
    const char* reason = c.saw_tool_call && f.reason == engine::FinishReason::kStop
                             ? "tool_calls"
                             : finish_reason_name(f.reason);
    send_chunk(index, Json::object(), reason);
  }

  ChatJob& job_;
  HttpExchange& ex_;
  std::vector<StreamChoice> choices_;
};

HandlerResult respond_stream(ChatJob& job, MultiRun& run, HttpExchange& ex) {
  ex.begin_stream(200, "text/event-stream");
  ChatStreamer streamer(job, ex, run.size());
  for (size_t i = 0; i < run.size(); ++i)
    streamer.send_chunk(i, Json{{"role", "assistant"}, {"content", ""}}, nullptr);
  int32_t num_completion = 0;
  int32_t num_cached = 0;
  while (auto ev = run.next(ex)) {
    const size_t index = static_cast<size_t>(ev->first);
    if (auto* t = std::get_if<TokenEvent>(&ev->second)) {
      streamer.on_token(index, *t);
      continue;
    }
    const FinishEvent& f = std::get<FinishEvent>(ev->second);
    if (f.reason == engine::FinishReason::kError || f.reason == engine::FinishReason::kCancelled) {
      write_openai_stream_error(ex, generation_error(f));
      return Streamed{};
    }
    streamer.on_finish(index, f);
    num_completion += f.usage.completion_tokens;
    num_cached = std::max(num_cached, f.usage.cached_tokens);
  }
  if (run.abort_reason() == AbortReason::kServerShutdown) {
    write_openai_stream_error(ex, unavailable("The server is shutting down"));
    return Streamed{};
  }
  if (run.abort_reason() == AbortReason::kClientGone) return Streamed{};
  if (job.include_usage) {
    Json chunk = job.base("chat.completion.chunk");
    chunk["choices"] = Json::array();
    chunk["usage"] = openai_usage(job.num_prompt_tokens, num_completion, num_cached);
    ex.write_chunk(sse_data(dump_json(chunk)));
  }
  ex.write_chunk(kSseDone);
  job.ctx.metrics.add_tokens(job.num_prompt_tokens, num_completion);
  return Streamed{};
}

HandlerResult handle_chat(ServerContext& ctx, const HttpRequest& req, HttpExchange& ex) {
  auto parsed = parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& body = std::get<Json>(parsed);
  if (auto e = check_model(body, ctx)) return *e;
  ChatInput in;
  if (auto e = read_messages(body, &in)) return *e;
  if (auto e = read_tools(body, &in)) return *e;
  if (auto e = read_chat_options(body, &in)) return *e;
  CommonParams params;
  if (auto e = parse_common(body, Api::kChat, ctx, &params)) return *e;
  grammar::ConstraintSpec answer;
  if (auto e = read_constraint(body, ctx, &params.request, &answer)) return *e;
  if (in.force_tool_call) {
    if (auto e = force_tool_call(body, in.tools, ctx, &params.request)) return *e;
  } else if (in.parse_tools) {
    const auto parallel = body.find("parallel_tool_calls");
    lazy_tool_call(in.tools, parallel == body.end() || *parallel != false, ctx, &params.request,
                   &answer);
  }
  if (auto e = check_num_choices(ctx, 1, params.n)) return *e;
  if (auto e = check_ready(ctx)) return *e;

  auto prepared = prepare_chat(ctx, std::move(in));
  if (auto* e = std::get_if<ApiError>(&prepared)) return *e;
  PreparedChat& chat = std::get<PreparedChat>(prepared);
  const int32_t num_prompt = chat.num_prompt_tokens();
  if (auto e = finalize_request(ctx, num_prompt, &params)) return *e;

  ChatJob job{ctx};
  job.id = random_id("chatcmpl-");
  job.created = static_cast<int64_t>(std::time(nullptr));
  job.num_prompt_tokens = num_prompt;
  job.logprobs = params.request.sampling.logprobs;
  job.include_usage = params.include_usage;
  job.parser_config = chat.parser_config;
  std::vector<engine::GenerationRequest> requests =
      fan_out(chat, params.request, req.request_id, params.n);
  MultiRun run(ctx);
  if (auto e = run.submit(std::move(requests))) return *e;
  return params.stream ? respond_stream(job, run, ex) : respond_whole(job, run, ex);
}

}  // namespace

void register_chat_routes(Router& router, ServerContext& ctx) {
  router.add("POST", "/v1/chat/completions", [&ctx](const HttpRequest& req, HttpExchange& ex) {
    return handle_chat(ctx, req, ex);
  });
}

}  // namespace kiln::server
