// One /v1/responses turn over the chat pipeline, shared by its three transports: POST
// /v1/responses (a whole response or named SSE events), the WebSocket mode (the same events,
// one per text message) and POST /v1/responses/compact (a whole run whose text becomes the
// compaction summary). prepare_turn() reads the body and the conversation it continues and
// builds the engine request; run_whole() and run_stream() run it and fill the turn's
// response state (output items, status, usage), storing it when the body asked to.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "kiln/server/chat_pipeline.h"
#include "kiln/server/context.h"
#include "kiln/server/errors.h"
#include "kiln/server/http_server.h"
#include "kiln/server/responses_convert.h"
#include "kiln/server/responses_store.h"
#include "kiln/server/thinking_budget.h"

namespace kiln::server::responses {

struct Turn {
  Turn(ServerContext& c, ResponseStore& s) : ctx(c), store(s) {}

  ServerContext& ctx;
  ResponseStore& store;
  ResponseState state;
  Echo echo;
  int32_t num_prompt_tokens = 0;
  chat::ParserConfig parser_config;
  std::map<std::string, ToolKind> tool_kinds;
  bool parallel_tool_calls = true;
  Json conversation = Json::array();  // the previous conversation and this input
  engine::GenerationRequest request;  // ready to submit
  bool stream = false;

  Json response() const { return response_object(state, echo); }
  // The conversation and this turn's output: what a continuation starts from.
  Json items() const;
  // The end of a generation: status, usage, and the stored entry (with store).
  void finish(const engine::FinishEvent& f, const OutputBuilder& out, int32_t num_reasoning);
  void fail(const ApiError& e);
  // Stores the response and its items when the body asked to (store, the default).
  void keep();
};

// The items of the conversation `previous_response_id` names, or nullopt when unknown.
using HistoryLookup = std::function<std::optional<Json>(const std::string& id)>;
// The lookup of the shared store (responses kept with store: true).
HistoryLookup store_lookup(ResponseStore& store);
// The 404 previous_response_not_found of an unknown id.
ApiError previous_response_not_found(const std::string& id);

struct TurnOptions {
  // Tools are rendered into the prompt (so that it shares its prefix with the conversation's
  // turns) but the output is not parsed for calls: the reply is plain text (compaction).
  bool text_only = false;
};

// The body -> a turn ready to run (request_id names the engine request). Errors name the
// field at fault; a previous_response_id the lookup does not know is previous_response_not_found.
std::variant<std::unique_ptr<Turn>, ApiError> prepare_turn(ServerContext& ctx, ResponseStore& store,
                                                           const Json& body,
                                                           const HistoryLookup& lookup,
                                                           const std::string& request_id,
                                                           TurnOptions options = {});

// How a run ended: it finished (the turn's state holds the response, maybe failed), or the
// client hung up (nothing more to send).
enum class RunEnd { kFinished, kClientGone };

// Submits the turn's request (its thinking bounded by --max-thinking-tokens); a refusal
// (the queue is full) is an ApiError, before anything was sent.
std::variant<std::unique_ptr<BudgetedGeneration>, ApiError> submit_turn(Turn& turn);

// Runs the turn to its end. A generation error or a server shutdown is an ApiError (no
// response object was sent yet).
std::variant<RunEnd, ApiError> run_whole(Turn& turn, BudgetedGeneration& run, HttpExchange& ex);

// Where a stream's events go: each event complete (type first, then sequence_number).
struct EventSink {
  std::function<void(const std::string& type, const std::string& json)> send;
  // While a long prefill runs: something that keeps proxies and clients from timing out.
  std::function<void()> keep_alive;
};

// Streams the turn: response.created, response.in_progress, the items' events, then
// response.completed, response.incomplete or response.failed.
RunEnd run_stream(Turn& turn, BudgetedGeneration& run, HttpExchange& ex, const EventSink& sink);

// A warm-up (the WebSocket mode's generate: false): no generation; the response completes
// with no output and the prompt's usage, and is stored (with store) so that a later turn
// continues from its input. Sends response.created and response.completed.
void complete_without_generation(Turn& turn, const EventSink& sink);

// GET /v1/responses with Upgrade: websocket, the WebSocket mode (responses_websocket.cpp):
// response.create events in, the stream's events out, one turn at a time.
HandlerResult handle_websocket(ServerContext& ctx, ResponseStore& store, const HttpRequest& req,
                               HttpExchange& ex);

}  // namespace kiln::server::responses
