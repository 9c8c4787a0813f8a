#include "kiln/server/responses_turn.h"

#include <fmt/format.h>

#include <ctime>

#include "kiln/server/constraint.h"
#include "kiln/server/generation.h"
#include "kiln/server/request_controls.h"
#include "kiln/server/thinking_budget.h"
#include "kiln/util/log.h"

namespace kiln::server::responses {

using engine::FinishEvent;
using engine::TokenEvent;

Json Turn::items() const {
  Json all = conversation;
  for (const Json& item : state.output) all.push_back(item);
  return all;
}

void Turn::finish(const FinishEvent& f, const OutputBuilder& out, int32_t num_reasoning) {
  state.output = out.output();
  if (f.reason == engine::FinishReason::kLength) {
    state.status = "incomplete";
    state.incomplete_details = Json{{"reason", "max_output_tokens"}};
  } else {
    state.status = "completed";
    state.completed_at = static_cast<int64_t>(std::time(nullptr));
  }
  state.usage =
      usage(num_prompt_tokens, f.usage.cached_tokens, f.usage.completion_tokens, num_reasoning);
  ctx.metrics.add_tokens(num_prompt_tokens, f.usage.completion_tokens);
  keep();
}

void Turn::keep() {
  if (!echo.store) return;
  if (!store.put(state.id, {response(), items()}) && ctx.options.responses_store_max_count > 0)
    log::warn("responses: {} is larger than the whole store (--responses-store-bytes); not stored",
              state.id);
}

void Turn::fail(const ApiError& e) {
  state.status = "failed";
  state.error = Json{{"code", "server_error"}, {"message", e.message}};
}

HistoryLookup store_lookup(ResponseStore& store) {
  return [&store](const std::string& id) -> std::optional<Json> {
    auto entry = store.get(id);
    if (!entry) return std::nullopt;
    return entry->conversation;
  };
}

ApiError previous_response_not_found(const std::string& id) {
  return resource_not_found(
      fmt::format("Previous response with id '{}' not found (responses are kept in memory, "
                  "only with store: true, and not across restarts; a WebSocket connection also "
                  "keeps its latest response, until it closes)",
                  id),
      "previous_response_not_found", "previous_response_id");
}

namespace {

// text.format json_object / json_schema: the same grammar machinery as chat's
// response_format (server/constraint.h); errors name text.format.
std::optional<ApiError> read_text_format(const Json& body, ServerContext& ctx,
                                         engine::GenerationRequest* request,
                                         grammar::ConstraintSpec* spec) {
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
  auto e = read_constraint(as_chat, ctx, request, spec);
  if (e) e->param = "text.format";
  return e;
}

class Streamer {
 public:
  Streamer(Turn& turn, const EventSink& sink) : turn_(turn), sink_(sink) {}

  // Sends one event: its type, then its sequence_number, then its fields.
  void send(const Json& event) {
    Json e = Json::object();
    e["type"] = event["type"];
    e["sequence_number"] = num_sent_++;
    for (auto it = event.begin(); it != event.end(); ++it)
      if (it.key() != "type") e[it.key()] = it.value();
    sink_.send(e["type"].get<std::string>(), dump_json(e));
  }
  void send_all(const std::vector<Json>& events) {
    for (const Json& e : events) send(e);
  }
  void lifecycle(const char* type) { send(Json{{"type", type}, {"response", turn_.response()}}); }

 private:
  Turn& turn_;
  const EventSink& sink_;
  int64_t num_sent_ = 0;
};

}  // namespace

std::variant<std::unique_ptr<Turn>, ApiError> prepare_turn(ServerContext& ctx, ResponseStore& store,
                                                           const Json& body,
                                                           const HistoryLookup& lookup,
                                                           const std::string& request_id,
                                                           TurnOptions options) {
  if (auto e = check_model(body, ctx)) return *e;

  // The conversation so far, when continuing an earlier response.
  Json history;
  if (auto it = body.find("previous_response_id"); it != body.end() && !it->is_null()) {
    if (!it->is_string())
      return invalid_request("'previous_response_id' must be a string", "previous_response_id");
    auto previous = lookup(it->get<std::string>());
    if (!previous) return previous_response_not_found(it->get<std::string>());
    history = std::move(*previous);
  }
  auto parsed = parse_request(body, history);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  ResponsesRequest& r = std::get<ResponsesRequest>(parsed);
  for (const std::string& w : r.warnings) log::warn("responses: {}", w);
  if (options.text_only) {
    r.turn.parse_tools = false;
    r.turn.force_tool_call = false;
  }

  // Sampling and length through the generic reader (Responses has no n, stop or logprobs).
  Json sampling = Json::object();
  for (const char* key : {"temperature", "top_p", "top_k", "min_p", "presence_penalty",
                          "frequency_penalty", "seed", "max_output_tokens", "stream"})
    if (body.contains(key)) sampling[key] = body[key];
  CommonParams params;
  if (auto e = parse_common(sampling, Api::kChat, ctx, &params)) return *e;
  if (!options.text_only) {
    grammar::ConstraintSpec answer;
    if (auto e = read_text_format(body, ctx, &params.request, &answer)) return *e;
    if (r.turn.force_tool_call) {
      if (auto e = force_tool_call(body, r.turn.tools, ctx, &params.request)) return *e;
    } else if (r.turn.parse_tools) {
      const auto parallel = body.find("parallel_tool_calls");
      lazy_tool_call(r.turn.tools, parallel == body.end() || *parallel != false, ctx,
                     &params.request, &answer);
    }
  }
  if (auto e = check_ready(ctx)) return *e;

  auto turn = std::make_unique<Turn>(ctx, store);
  turn->echo = read_echo(body);
  turn->conversation = history.is_array() ? history : Json::array();
  for (const Json& item : r.input_items) turn->conversation.push_back(item);
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

  turn->state.id = random_id("resp_", 32);
  turn->state.created_at = static_cast<int64_t>(std::time(nullptr));
  turn->state.model = ctx.options.model_name;
  turn->state.warnings = r.warnings;
  turn->echo.temperature = params.request.sampling.temperature;
  turn->echo.top_p = params.request.sampling.top_p;
  turn->echo.presence_penalty = params.request.sampling.presence_penalty;
  turn->echo.frequency_penalty = params.request.sampling.frequency_penalty;
  turn->num_prompt_tokens = num_prompt;
  turn->parser_config = chat.parser_config;
  turn->tool_kinds = options.text_only ? std::map<std::string, ToolKind>{} : r.tool_kinds;
  turn->parallel_tool_calls = r.parallel_tool_calls;
  turn->stream = params.stream;
  turn->request = fan_out(chat, params.request, request_id, 1).front();
  return turn;
}

std::variant<std::unique_ptr<BudgetedGeneration>, ApiError> submit_turn(Turn& turn) {
  auto run = std::make_unique<BudgetedGeneration>(
      turn.ctx, turn.parser_config,
      thinking_budget(std::nullopt, turn.ctx.options.token_limits, turn.request.max_tokens));
  if (auto e = run->submit(turn.request)) return *e;
  return run;
}

std::variant<RunEnd, ApiError> run_whole(Turn& turn, BudgetedGeneration& run, HttpExchange& ex) {
  chat::OutputParser parser(turn.parser_config);
  OutputBuilder out(turn.tool_kinds, turn.parallel_tool_calls);
  ReasoningCounter reasoning(turn.parser_config);
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
    turn.finish(f, out, reasoning.num_reasoning_tokens());
  }
  if (run.abort_reason() == AbortReason::kServerShutdown)
    return unavailable("The server is shutting down");
  if (run.abort_reason() == AbortReason::kClientGone) return RunEnd::kClientGone;
  return RunEnd::kFinished;
}

RunEnd run_stream(Turn& turn, BudgetedGeneration& run, HttpExchange& ex, const EventSink& sink) {
  Streamer s(turn, sink);
  s.lifecycle("response.created");
  s.lifecycle("response.in_progress");
  if (sink.keep_alive) run.on_idle(turn.ctx.options.ping_interval, sink.keep_alive);
  chat::OutputParser parser(turn.parser_config);
  OutputBuilder out(turn.tool_kinds, turn.parallel_tool_calls);
  ReasoningCounter reasoning(turn.parser_config);
  while (auto ev = run.next(ex)) {
    if (auto* t = std::get_if<TokenEvent>(&*ev)) {
      reasoning.feed(t->text);
      s.send_all(out.feed(parser.feed(t->text)));
      continue;
    }
    const FinishEvent& f = std::get<FinishEvent>(*ev);
    if (f.reason == engine::FinishReason::kError || f.reason == engine::FinishReason::kCancelled) {
      turn.state.output = out.output();
      turn.fail(generation_error(f));
      s.lifecycle("response.failed");
      return RunEnd::kFinished;
    }
    s.send_all(out.feed(parser.feed(f.text)));
    s.send_all(out.feed(parser.finish()));
    s.send_all(out.finish(f.reason == engine::FinishReason::kLength));
    turn.finish(f, out, reasoning.num_reasoning_tokens());
    s.lifecycle(turn.state.status == "incomplete" ? "response.incomplete" : "response.completed");
  }
  if (run.abort_reason() == AbortReason::kServerShutdown) {
    turn.state.output = out.output();
    turn.fail(unavailable("The server is shutting down"));
    s.lifecycle("response.failed");
  }
  return run.abort_reason() == AbortReason::kClientGone ? RunEnd::kClientGone : RunEnd::kFinished;
}

void complete_without_generation(Turn& turn, const EventSink& sink) {
  Streamer s(turn, sink);
  s.lifecycle("response.created");
  turn.state.status = "completed";
  turn.state.completed_at = static_cast<int64_t>(std::time(nullptr));
  turn.state.usage = usage(turn.num_prompt_tokens, 0, 0, 0);
  turn.keep();
  s.lifecycle("response.completed");
}

}  // namespace kiln::server::responses
