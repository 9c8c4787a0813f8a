// The routes of the OpenAI Responses surface (https://platform.openai.com/docs/api-reference/
// responses; the Open Responses specification's schemas are the reference), over the chat
// pipeline through one turn module (responses_turn.h):
//   POST /v1/responses: a whole response, or named SSE events each with an increasing
//     sequence_number (response.created, response.in_progress, the items' events, then
//     response.completed, response.incomplete or response.failed);
//   GET /v1/responses with Upgrade: websocket: the WebSocket mode (responses_websocket.cpp);
//   POST /v1/responses/compact: context compaction (the model summarises the conversation);
//   GET and DELETE /v1/responses/{id}.
// Responses with store (the default) are kept in a bounded in-memory store
// (responses_store.h), which previous_response_id continues from.
#include <fmt/format.h>

#include "kiln/server/generation.h"
#include "kiln/server/responses_store.h"
#include "kiln/server/responses_turn.h"
#include "kiln/util/log.h"

namespace kiln::server {

namespace {

using responses::ResponseStore;

HandlerResult handle_create(ServerContext& ctx, ResponseStore& store, const HttpRequest& req,
                            HttpExchange& ex) {
  auto parsed_body = parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed_body)) return *e;
  auto prepared = responses::prepare_turn(ctx, store, std::get<Json>(parsed_body),
                                          responses::store_lookup(store), req.request_id);
  if (auto* e = std::get_if<ApiError>(&prepared)) return *e;
  responses::Turn& turn = *std::get<std::unique_ptr<responses::Turn>>(prepared);
  auto submitted = responses::submit_turn(turn);
  if (auto* e = std::get_if<ApiError>(&submitted)) return *e;
  BudgetedGeneration& run = *std::get<std::unique_ptr<BudgetedGeneration>>(submitted);
  if (turn.stream) {
    ex.begin_stream(200, "text/event-stream");
    responses::EventSink sink;
    sink.send = [&ex](const std::string& type, const std::string& json) {
      ex.write_chunk(sse_event(type, json));
    };
    // An SSE comment while a long prefill runs, so that proxies keep the stream.
    sink.keep_alive = [&ex] { ex.write_chunk(": keep-alive\n\n"); };
    responses::run_stream(turn, run, ex, sink);
    return Streamed{};
  }
  auto ended = responses::run_whole(turn, run, ex);
  if (auto* e = std::get_if<ApiError>(&ended)) return *e;
  if (std::get<responses::RunEnd>(ended) == responses::RunEnd::kClientGone) return Streamed{};
  return json_response(turn.response());
}

// POST /v1/responses/compact: the conversation (previous_response_id's and/or input), with the
// request's instructions and tools as a turn would render them (so the prompt shares the
// conversation's cached prefix), then kCompactionPrompt as a last user message; the model's
// text is the summary. Nothing is stored; the result is never streamed.
HandlerResult handle_compact(ServerContext& ctx, ResponseStore& store, const HttpRequest& req,
                             HttpExchange& ex) {
  auto parsed_body = parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed_body)) return *e;
  Json body = std::get<Json>(std::move(parsed_body));
  const bool has_input = body.contains("input") && !body["input"].is_null();
  const bool has_previous =
      body.contains("previous_response_id") && !body["previous_response_id"].is_null();
  if (!has_input && !has_previous)
    return invalid_request(
        "'input' or 'previous_response_id' is required: the conversation "
        "to compact",
        "input");
  Json input = Json::array();
  if (has_input) {
    if (body["input"].is_string())
      input.push_back(Json{{"type", "message"}, {"role", "user"}, {"content", body["input"]}});
    else if (body["input"].is_array())
      input = body["input"];
    else
      return invalid_request("'input' must be a string or an array of items", "input");
  }
  input.push_back(
      Json{{"type", "message"}, {"role", "user"}, {"content", responses::kCompactionPrompt}});
  body["input"] = std::move(input);
  body["store"] = false;
  body.erase("stream");
  body.erase("background");

  responses::TurnOptions options;
  options.text_only = true;
  auto prepared = responses::prepare_turn(ctx, store, body, responses::store_lookup(store),
                                          req.request_id, options);
  if (auto* e = std::get_if<ApiError>(&prepared)) return *e;
  responses::Turn& turn = *std::get<std::unique_ptr<responses::Turn>>(prepared);
  auto submitted = responses::submit_turn(turn);
  if (auto* e = std::get_if<ApiError>(&submitted)) return *e;
  auto ended =
      responses::run_whole(turn, *std::get<std::unique_ptr<BudgetedGeneration>>(submitted), ex);
  if (auto* e = std::get_if<ApiError>(&ended)) return *e;
  if (std::get<responses::RunEnd>(ended) == responses::RunEnd::kClientGone) return Streamed{};

  std::string summary;
  for (const Json& item : turn.state.output)
    if (item["type"] == "message")
      for (const Json& part : item["content"]) summary += part["text"].get<std::string>();
  if (summary.empty())
    return internal_error(
        "The model wrote no summary (its reply held no text, or max_output_tokens cut it "
        "inside its reasoning)");
  if (turn.state.status == "incomplete")
    log::warn("responses/compact: the summary was cut at max_output_tokens ({} tokens)",
              turn.request.max_tokens);
  Json conversation = turn.conversation;
  conversation.erase(conversation.size() - 1);  // the compaction prompt
  Json out = Json::object();
  out["id"] = random_id("resp_", 32);
  out["object"] = "response.compaction";
  out["created_at"] = turn.state.created_at;
  out["output"] = responses::compacted_output(conversation, summary);
  out["usage"] = turn.state.usage;
  return json_response(out);
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
  router.add("GET", "/v1/responses", [&ctx, store](const HttpRequest& req, HttpExchange& ex) {
    return responses::handle_websocket(ctx, *store, req, ex);
  });
  router.add("POST", "/v1/responses/compact",
             [&ctx, store](const HttpRequest& req, HttpExchange& ex) {
               return handle_compact(ctx, *store, req, ex);
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
