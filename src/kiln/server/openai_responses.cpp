// POST /v1/responses, GET and DELETE /v1/responses/{id} (OpenAI Responses,
// https://platform.openai.com/docs/api-reference/responses; the Open Responses specification's
// schemas are the reference), over the chat pipeline (chat_pipeline.h).
// The body (and the stored conversation of previous_response_id) becomes a ChatTurn
// (responses_convert.h); the output text goes through the template's output parser and an
// OutputBuilder into output items: as a whole response, or as named SSE events, each with an
// increasing sequence_number: response.created, response.in_progress, the items' events
// (output_item.added, content_part.added, output_text.delta, ..., output_item.done), then
// response.completed, response.incomplete or response.failed. Responses with store (the
// default) are kept in a bounded in-memory store (responses_store.h).
#include <fmt/format.h>

#include <ctime>

#include "kiln/server/chat_pipeline.h"
#include "kiln/server/constraint.h"
#include "kiln/server/generation.h"
#include "kiln/server/request_controls.h"
#include "kiln/server/responses_convert.h"
#include "kiln/server/responses_store.h"
#include "kiln/server/thinking_budget.h"
#include "kiln/util/log.h"

namespace kiln::server {

namespace {

using engine::FinishEvent;
using engine::TokenEvent;
using responses::OutputBuilder;
using responses::ResponseStore;

struct Job {
  ServerContext& ctx;
  ResponseStore& store;
  responses::ResponseState state;
  responses::Echo echo;
  int32_t num_prompt_tokens = 0;
  chat::ParserConfig parser_config;
  std::map<std::string, responses::ToolKind> tool_kinds;
  bool parallel_tool_calls = true;
  Json conversation = Json::array();  // the previous conversation and this input

  Json response() const { return responses::response_object(state, echo); }

  // The end of a generation: status, usage and the stored entry.
  void finish(const FinishEvent& f, const OutputBuilder& out, int32_t num_reasoning) {
    state.output = out.output();
    if (f.reason == engine::FinishReason::kLength) {
      state.status = "incomplete";
      state.incomplete_details = Json{{"reason", "max_output_tokens"}};
    } else {
      state.status = "completed";
      state.completed_at = static_cast<int64_t>(std::time(nullptr));
    }
    state.usage = responses::usage(num_prompt_tokens, f.usage.cached_tokens,
                                   f.usage.completion_tokens, num_reasoning);
    ctx.metrics.add_tokens(num_prompt_tokens, f.usage.completion_tokens);
    if (!echo.store) return;
    Json items = conversation;
    for (const Json& item : state.output) items.push_back(item);
    if (!store.put(state.id, {response(), std::move(items)}) &&
        ctx.options.responses_store_max_count > 0)
      log::warn(
          "responses: {} is larger than the whole store (--responses-store-bytes); not stored",
          state.id);
  }
  void fail(const ApiError& e) {
    state.status = "failed";
    state.error = Json{{"code", "server_error"}, {"message", e.message}};
  }
};

HandlerResult respond_whole(Job& job, BudgetedGeneration& run, HttpExchange& ex) {
  chat::OutputParser parser(job.parser_config);
  OutputBuilder out(job.tool_kinds, job.parallel_tool_calls);
  responses::ReasoningCounter reasoning(job.parser_config);
  while (auto ev = run.next(ex)) {
    if (auto* t = std::get_if<TokenEvent>(&*ev)) {
      reasoning.feed(t->text);
      out.feed(parser.feed(t->text));
      continue;
    }
    const FinishEvent& f = std::get<FinishEvent>(*ev);
    if (f.reason == engine::FinishReason::kError || f.reason == engine::FinishReason::kCancelled)
      return generation_error(f);
    out.feed(parser.feed(f.text));
    out.feed(parser.finish());
    out.finish(f.reason == engine::FinishReason::kLength);
    job.finish(f, out, reasoning.num_reasoning_tokens());
  }
  if (run.abort_reason() == AbortReason::kServerShutdown)
    return unavailable("The server is shutting down");
  if (run.abort_reason() == AbortReason::kClientGone) return Streamed{};
  return json_response(job.response());
}

class Streamer {
 public:
  Streamer(Job& job, HttpExchange& ex) : job_(job), ex_(ex) {}

  // Sends one event: its type, then its sequence_number, then its fields.
  void send(const Json& event) {
    Json e = Json::object();
    e["type"] = event["type"];
    e["sequence_number"] = num_sent_++;
    for (auto it = event.begin(); it != event.end(); ++it)
      if (it.key() != "type") e[it.key()] = it.value();
    ex_.write_chunk(sse_event(e["type"].get<std::string>(), dump_json(e)));
  }
  void send_all(const std::vector<Json>& events) {
    for (const Json& e : events) send(e);
  }
  void lifecycle(const char* type) { send(Json{{"type", type}, {"response", job_.response()}}); }

 private:
  Job& job_;
  HttpExchange& ex_;
  int64_t num_sent_ = 0;
};

HandlerResult respond_stream(Job& job, BudgetedGeneration& run, HttpExchange& ex) {
  ex.begin_stream(200, "text/event-stream");
  Streamer s(job, ex);
  s.lifecycle("response.created");
  s.lifecycle("response.in_progress");
  // An SSE comment while a long prefill runs, so that proxies keep the stream.
  run.on_idle(job.ctx.options.ping_interval, [&ex] { ex.write_chunk(": keep-alive\n\n"); });
  chat::OutputParser parser(job.parser_config);
  OutputBuilder out(job.tool_kinds, job.parallel_tool_calls);
  responses::ReasoningCounter reasoning(job.parser_config);
  while (auto ev = run.next(ex)) {
    if (auto* t = std::get_if<TokenEvent>(&*ev)) {
      reasoning.feed(t->text);
      s.send_all(out.feed(parser.feed(t->text)));
      continue;
    }
    const FinishEvent& f = std::get<FinishEvent>(*ev);
    if (f.reason == engine::FinishReason::kError || f.reason == engine::FinishReason::kCancelled) {
      job.state.output = out.output();
      job.fail(generation_error(f));
      s.lifecycle("response.failed");
      return Streamed{};
    }
    s.send_all(out.feed(parser.feed(f.text)));
    s.send_all(out.feed(parser.finish()));
    s.send_all(out.finish(f.reason == engine::FinishReason::kLength));
    job.finish(f, out, reasoning.num_reasoning_tokens());
    s.lifecycle(job.state.status == "incomplete" ? "response.incomplete" : "response.completed");
  }
  if (run.abort_reason() == AbortReason::kServerShutdown) {
    job.state.output = out.output();
    job.fail(unavailable("The server is shutting down"));
    s.lifecycle("response.failed");
  }
  return Streamed{};
}

// text.format json_object / json_schema: the same grammar machinery as chat's
// response_format (server/constraint.h); errors name text.format.
std::optional<ApiError> read_text_format(const Json& body, ServerContext& ctx,
                                         engine::GenerationRequest* request) {
  if (!body.contains("text") || !body["text"].is_object()) return std::nullopt;
  const Json& text = body["text"];
  if (!text.contains("format") || !text["format"].is_object()) return std::nullopt;
  const Json& format = text["format"];
  const std::string type = format.contains("type") && format["type"].is_string()
                               ? format["type"].get<std::string>()
                               : "text";
  Json as_chat = Json::object();
  if (type == "json_object") {
    as_chat["response_format"] = Json{{"type", "json_object"}};
  } else if (type == "json_schema") {
    as_chat["response_format"] =
        Json{{"type", "json_schema"}, {"json_schema", {{"schema", format["schema"]}}}};
  } else {
    return std::nullopt;
  }
  auto e = read_constraint(as_chat, ctx, request);
  if (e) e->param = "text.format";
  return e;
}

HandlerResult handle_create(ServerContext& ctx, ResponseStore& store, const HttpRequest& req,
                            HttpExchange& ex) {
  auto parsed_body = parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed_body)) return *e;
  const Json& body = std::get<Json>(parsed_body);
  if (auto e = check_model(body, ctx)) return *e;

  // The conversation so far, when continuing a stored response.
  Json history;
  if (auto it = body.find("previous_response_id"); it != body.end() && !it->is_null()) {
    if (!it->is_string())
      return invalid_request("'previous_response_id' must be a string", "previous_response_id");
    auto previous = store.get(it->get<std::string>());
    if (!previous)
      return resource_not_found(
          fmt::format("Previous response with id '{}' not found (responses are kept in memory, "
                      "only with store: true, and not across restarts)",
                      it->get<std::string>()),
          "previous_response_not_found", "previous_response_id");
    history = previous->conversation;
  }
  auto parsed = responses::parse_request(body, history);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  responses::ResponsesRequest& r = std::get<responses::ResponsesRequest>(parsed);
  for (const std::string& w : r.warnings) log::warn("responses: {}", w);

  // Sampling and length through the generic reader (Responses has no n, stop or logprobs).
  Json sampling = Json::object();
  for (const char* key : {"temperature", "top_p", "top_k", "min_p", "presence_penalty",
                          "frequency_penalty", "seed", "max_output_tokens", "stream"})
    if (body.contains(key)) sampling[key] = body[key];
  CommonParams params;
  if (auto e = parse_common(sampling, Api::kChat, ctx, &params)) return *e;
  if (auto e = read_text_format(body, ctx, &params.request)) return *e;
  if (r.turn.force_tool_call)
    if (auto e = force_tool_call(body, r.turn.tools, ctx, &params.request)) return *e;
  if (auto e = check_ready(ctx)) return *e;

  Job job{ctx, store};
  job.echo = responses::read_echo(body);
  job.conversation = history.is_array() ? history : Json::array();
  for (const Json& item : r.input_items) job.conversation.push_back(item);
  auto prepared = prepare_chat(ctx, std::move(r.turn));
  if (auto* e = std::get_if<ApiError>(&prepared)) return *e;
  PreparedChat& chat = std::get<PreparedChat>(prepared);

  // max_output_tokens is a bound: the reply ends at the context's end (status incomplete)
  // rather than failing a request whose prompt fits.
  const int32_t num_prompt = chat.num_prompt_tokens();
  if (auto e = check_context_length(ctx.engine.context_length(), num_prompt, std::nullopt))
    return *e;
  params.max_tokens_asked = false;
  if (auto e = finalize_request(ctx, num_prompt, &params)) return *e;

  job.state.id = random_id("resp_", 32);
  job.state.created_at = static_cast<int64_t>(std::time(nullptr));
  job.state.model = ctx.options.model_name;
  job.state.warnings = r.warnings;
  job.echo.temperature = params.request.sampling.temperature;
  job.echo.top_p = params.request.sampling.top_p;
  job.echo.presence_penalty = params.request.sampling.presence_penalty;
  job.echo.frequency_penalty = params.request.sampling.frequency_penalty;
  job.num_prompt_tokens = num_prompt;
  job.parser_config = chat.parser_config;
  job.tool_kinds = r.tool_kinds;
  job.parallel_tool_calls = r.parallel_tool_calls;
  // --max-thinking-tokens bounds the reasoning block (thinking_budget.h).
  BudgetedGeneration run(
      ctx, job.parser_config,
      thinking_budget(std::nullopt, ctx.options.token_limits, params.request.max_tokens));
  if (auto e = run.submit(fan_out(chat, params.request, req.request_id, 1).front())) return *e;
  return params.stream ? respond_stream(job, run, ex) : respond_whole(job, run, ex);
}

ApiError response_not_found(const std::string& id) {
  return resource_not_found(fmt::format("Response with id '{}' not found.", id), "not_found");
}

}  // namespace

void register_responses_routes(Router& router, ServerContext& ctx) {
  auto store = std::make_shared<ResponseStore>(ctx.options.responses_store_max_count,
                                               ctx.options.responses_store_max_bytes);
  router.add("POST", "/v1/responses", [&ctx, store](const HttpRequest& req, HttpExchange& ex) {
    return handle_create(ctx, *store, req, ex);
  });
  constexpr std::string_view kById = "/v1/responses/{id}";
  router.add("GET", std::string(kById),
             [store, kById](const HttpRequest& req, HttpExchange&) -> HandlerResult {
               const std::string id = Router::path_param(kById, req.path, "id");
               auto entry = store->get(id);
               if (!entry) return response_not_found(id);
               return json_response(entry->response);
             });
  router.add("DELETE", std::string(kById),
             [store, kById](const HttpRequest& req, HttpExchange&) -> HandlerResult {
               const std::string id = Router::path_param(kById, req.path, "id");
               if (!store->erase(id)) return response_not_found(id);
               return json_response(Json{{"id", id}, {"object", "response"}, {"deleted", true}});
             });
}

}  // namespace kiln::server
