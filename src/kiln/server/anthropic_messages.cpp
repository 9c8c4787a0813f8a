// POST /v1/messages and /v1/messages/count_tokens (Anthropic Messages,
// https://docs.anthropic.com/en/api/messages), over the chat pipeline (chat_pipeline.h).
// The body becomes a ChatTurn (anthropic_convert.h); the output text goes through the
// template's output parser and a BlockBuilder into content blocks: as a whole message, or
// as the named SSE events message_start, content_block_start/delta/stop, message_delta,
// message_stop (with ping while nothing else is sent and event: error after a failure).
// Errors use Anthropic's envelope (the routes are registered with ErrorStyle::kAnthropic).
#include <fmt/format.h>

#include "kiln/engine/stop.h"
#include "kiln/server/anthropic_convert.h"
#include "kiln/server/chat_pipeline.h"
#include "kiln/server/constraint.h"
#include "kiln/server/generation.h"
#include "kiln/server/request_controls.h"
#include "kiln/server/thinking_budget.h"

namespace kiln::server {

namespace {

using anthropic::BlockBuilder;
using engine::FinishEvent;
using engine::TokenEvent;

constexpr ErrorStyle kStyle = ErrorStyle::kAnthropic;

struct Prepared {
  anthropic::MessagesRequest request;
  PreparedChat chat;
};

// Parse + render: what /v1/messages and count_tokens share, so that their counts agree.
std::variant<Prepared, ApiError> prepare(ServerContext& ctx, const Json& body) {
  if (auto it = body.find("model"); it != body.end() && !it->is_null() && !it->is_string())
    return invalid_request("'model' must be a string", "model");
  // Any model name is served: Claude Code asks for several (a main and a small model).
  anthropic::ConvertOptions opts;
  opts.normalize_volatile_system = ctx.options.normalize_volatile_prompt;
  auto parsed = anthropic::parse_request(body, opts);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  Prepared p;
  p.request = std::get<anthropic::MessagesRequest>(std::move(parsed));
  auto chat = prepare_chat(ctx, p.request.turn);
  if (auto* e = std::get_if<ApiError>(&chat)) return *e;
  p.chat = std::get<PreparedChat>(std::move(chat));
  return p;
}

Json message_skeleton(const std::string& id, const std::string& model) {
  Json m = Json::object();
  m["id"] = id;
  m["type"] = "message";
  m["role"] = "assistant";
  m["model"] = model;
  m["content"] = Json::array();
  m["stop_reason"] = nullptr;
  m["stop_sequence"] = nullptr;
  return m;
}

struct Job {
  ServerContext& ctx;
  std::string id;
  int32_t num_prompt_tokens = 0;
  chat::ParserConfig parser_config;
  bool single_tool = false;
  std::vector<std::string> stops;  // the request's stop strings (stop_index -> text)

  Json stop_sequence(const FinishEvent& f) const {
    if (f.stop_index < 0 || static_cast<size_t>(f.stop_index) >= stops.size()) return nullptr;
    return stops[static_cast<size_t>(f.stop_index)];
  }
};

HandlerResult respond_whole(Job& job, BudgetedGeneration& run, HttpExchange& ex) {
  chat::OutputParser parser(job.parser_config);
  BlockBuilder blocks(job.single_tool);
  FinishEvent finish;
  while (auto ev = run.next(ex)) {
    if (auto* t = std::get_if<TokenEvent>(&*ev)) {
      blocks.feed(parser.feed(t->text));
      continue;
    }
    finish = std::get<FinishEvent>(std::move(*ev));
    if (finish.reason == engine::FinishReason::kError ||
        finish.reason == engine::FinishReason::kCancelled)
      return generation_error(finish);
    blocks.feed(parser.feed(finish.text));
    blocks.feed(parser.finish());
    blocks.finish();
  }
  if (run.abort_reason() == AbortReason::kServerShutdown)
    return unavailable("The server is shutting down");
  if (run.abort_reason() == AbortReason::kClientGone) return Streamed{};
  Json m = message_skeleton(job.id, job.ctx.options.model_name);
  m["content"] = blocks.content();
  m["stop_reason"] = anthropic::stop_reason(finish, blocks.saw_tool_use());
  m["stop_sequence"] = job.stop_sequence(finish);
  m["usage"] = anthropic::usage(job.num_prompt_tokens, finish.usage.cached_tokens,
                                finish.usage.completion_tokens);
  job.ctx.metrics.add_tokens(job.num_prompt_tokens, finish.usage.completion_tokens);
  return json_response(m);
}

class Streamer {
 public:
  Streamer(Job& job, HttpExchange& ex) : job_(job), ex_(ex), blocks_(job.single_tool) {}

  bool send(std::string_view event, const Json& data) {
    return ex_.write_chunk(sse_event(event, dump_json(data)));
  }
  void write_ops(const std::vector<BlockBuilder::Op>& ops) {
    for (const BlockBuilder::Op& op : ops) {
      switch (op.kind) {
        case BlockBuilder::Op::Kind::kStart:
          send("content_block_start", Json{{"type", "content_block_start"},
                                           {"index", op.index},
                                           {"content_block", op.block}});
          break;
        case BlockBuilder::Op::Kind::kDelta:
          send("content_block_delta",
               Json{{"type", "content_block_delta"}, {"index", op.index}, {"delta", op.block}});
          break;
        case BlockBuilder::Op::Kind::kStop:
          send("content_block_stop", Json{{"type", "content_block_stop"}, {"index", op.index}});
          break;
      }
    }
  }
  void feed(std::string_view text, chat::OutputParser& parser) {
    write_ops(blocks_.feed(parser.feed(text)));
  }
  void finish(const FinishEvent& f, chat::OutputParser& parser) {
    write_ops(blocks_.feed(parser.feed(f.text)));
    write_ops(blocks_.feed(parser.finish()));
    write_ops(blocks_.finish());
    Json delta{{"stop_reason", anthropic::stop_reason(f, blocks_.saw_tool_use())},
               {"stop_sequence", job_.stop_sequence(f)}};
    send("message_delta",
         Json{{"type", "message_delta"},
              {"delta", std::move(delta)},
              {"usage", anthropic::usage(job_.num_prompt_tokens, f.usage.cached_tokens,
                                         f.usage.completion_tokens)}});
    send("message_stop", Json{{"type", "message_stop"}});
  }
  void error(const ApiError& e) { send("error", error_envelope(e, kStyle)); }

 private:
  Job& job_;
  HttpExchange& ex_;
  BlockBuilder blocks_;
};

HandlerResult respond_stream(Job& job, BudgetedGeneration& run, HttpExchange& ex) {
  ex.begin_stream(200, "text/event-stream");
  Streamer s(job, ex);
  Json start = message_skeleton(job.id, job.ctx.options.model_name);
  // The cached part is known at the end: message_delta's usage gives the final split.
  start["usage"] = anthropic::usage(job.num_prompt_tokens, 0, 0);
  s.send("message_start", Json{{"type", "message_start"}, {"message", std::move(start)}});
  s.send("ping", Json{{"type", "ping"}});
  run.on_idle(job.ctx.options.ping_interval, [&s] { s.send("ping", Json{{"type", "ping"}}); });
  chat::OutputParser parser(job.parser_config);
  while (auto ev = run.next(ex)) {
    if (auto* t = std::get_if<TokenEvent>(&*ev)) {
      s.feed(t->text, parser);
      continue;
    }
    const FinishEvent& f = std::get<FinishEvent>(*ev);
    if (f.reason == engine::FinishReason::kError || f.reason == engine::FinishReason::kCancelled) {
      s.error(generation_error(f));
      return Streamed{};
    }
    s.finish(f, parser);
    job.ctx.metrics.add_tokens(job.num_prompt_tokens, f.usage.completion_tokens);
  }
  if (run.abort_reason() == AbortReason::kServerShutdown)
    s.error(unavailable("The server is shutting down"));
  return Streamed{};
}

// max_tokens is required (Anthropic's rule); the cap of request_controls.h applies.
std::optional<ApiError> read_max_tokens(const Json& body, const TokenLimits& limits, int32_t* out) {
  auto asked = read_max_tokens_fields(body);
  if (auto* e = std::get_if<ApiError>(&asked)) return *e;
  if (!std::get<MaxTokensAsked>(asked).value)
    return invalid_request("max_tokens: Field required", "max_tokens");
  auto resolved = resolve_max_tokens(std::get<MaxTokensAsked>(asked), limits, std::nullopt);
  if (auto* e = std::get_if<ApiError>(&resolved)) return *e;
  *out = *std::get<MaxTokens>(resolved).value;
  return std::nullopt;
}

HandlerResult handle_messages(ServerContext& ctx, const HttpRequest& req, HttpExchange& ex) {
  auto parsed_body = parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed_body)) return *e;
  const Json& body = std::get<Json>(parsed_body);
  int32_t max_tokens = 0;
  if (auto e = read_max_tokens(body, ctx.options.token_limits, &max_tokens)) return *e;
  // Sampling (temperature, top_p, top_k) and stream through the generic reader; Anthropic
  // has no n, logprobs or stop.
  Json sampling = Json::object();
  for (const char* key : {"temperature", "top_p", "top_k", "stream"})
    if (body.contains(key)) sampling[key] = body[key];
  CommonParams params;
  if (auto e = parse_common(sampling, Api::kChat, ctx, &params)) return *e;
  auto prepared = prepare(ctx, body);
  if (auto* e = std::get_if<ApiError>(&prepared)) return *e;
  Prepared& p = std::get<Prepared>(prepared);
  params.request.stop = p.request.stop_sequences;
  // tool_choice any / tool: the reply is a call (one when disable_parallel_tool_use).
  // auto: free text, and any call that starts is a valid call of an offered tool.
  if (p.request.turn.force_tool_call) {
    if (auto e = force_tool_call(p.request.turn.tools, !p.request.disable_parallel_tool_use, ctx,
                                 &params.request))
      return *e;
  } else if (p.request.turn.parse_tools) {
    lazy_tool_call(p.request.turn.tools, !p.request.disable_parallel_tool_use, ctx,
                   &params.request);
  }
  if (Status st = engine::validate_stops(params.request.stop); !st.ok())
    return invalid_request(st.error().message, "stop_sequences");
  if (auto e = check_ready(ctx)) return *e;

  // max_tokens is a bound: the reply ends at the context's end (stop_reason max_tokens)
  // rather than failing a request whose prompt fits. Agents ask for 32k as a matter of course.
  const int32_t num_prompt = p.chat.num_prompt_tokens();
  const int64_t n_ctx = ctx.engine.context_length();
  if (auto e = check_context_length(n_ctx, num_prompt, std::nullopt)) return *e;
  params.max_tokens = static_cast<int32_t>(std::min<int64_t>(max_tokens, n_ctx - num_prompt));
  if (auto e = finalize_request(ctx, num_prompt, &params)) return *e;

  Job job{ctx};
  job.id = random_id("msg_");
  job.num_prompt_tokens = num_prompt;
  job.parser_config = p.chat.parser_config;
  job.single_tool = p.request.disable_parallel_tool_use;
  job.stops = params.request.stop;
  // The thinking budget closes the reasoning block when spent (thinking_budget.h).
  std::optional<int32_t> budget;
  if (p.request.thinking)
    budget = thinking_budget(p.request.thinking_budget, ctx.options.token_limits,
                             params.request.max_tokens);
  BudgetedGeneration run(ctx, job.parser_config, budget);
  if (auto e = run.submit(fan_out(p.chat, params.request, req.request_id, 1).front())) return *e;
  return params.stream ? respond_stream(job, run, ex) : respond_whole(job, run, ex);
}

HandlerResult handle_count_tokens(ServerContext& ctx, const HttpRequest& req) {
  auto parsed_body = parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed_body)) return *e;
  auto prepared = prepare(ctx, std::get<Json>(parsed_body));
  if (auto* e = std::get_if<ApiError>(&prepared)) return *e;
  return json_response(
      Json{{"input_tokens", std::get<Prepared>(prepared).chat.num_prompt_tokens()}});
}

}  // namespace

void register_anthropic_routes(Router& router, ServerContext& ctx) {
  router.add(
      "POST", "/v1/messages",
      [&ctx](const HttpRequest& req, HttpExchange& ex) { return handle_messages(ctx, req, ex); },
      false, kStyle);
  router.add(
      "POST", "/v1/messages/count_tokens",
      [&ctx](const HttpRequest& req, HttpExchange&) { return handle_count_tokens(ctx, req); },
      false, kStyle);
}

}  // namespace kiln::server
