// The WebSocket mode of /v1/responses (OpenAI's "WebSocket mode" guide; the events of the
// Open Responses specification). A client opens one WebSocket to /v1/responses and sends
// `response.create` events: the body of POST /v1/responses with a "type" and without
// `stream` (a turn is always streamed). Each turn's events are the stream's events, each
// one WebSocket text message, the same JSON as the SSE `data:`. Turns run one at a time, in
// the order they came; a client may send the next one while a turn runs (it waits).
//
// Continuation: the connection keeps its latest response (its conversation and output) in
// memory, so previous_response_id naming it continues even with store: false, and the
// client sends only the new items (tool outputs, the next user message). Any other id is
// looked up in the shared store (store: true responses). Nothing of a connection outlives it:
// after a reconnect, a store: false id is a previous_response_not_found error.
//
// `generate: false` warms up: the body is checked and rendered, and the response completes at
// once with no output (response.created, response.completed), so that the next turn continues
// from its input (tools, instructions, messages) by previous_response_id.
//
// Errors of an event (bad JSON, an unknown type, a 400 of the body, a miss) come as one
// message {"type":"error","status":<the HTTP status the same error has>,"error":{type, code,
// message, param}} and the connection stays open; a generation that fails after its
// response.created ends with response.failed, as in the SSE stream.
#include <fmt/format.h>

#include "kiln/server/generation.h"
#include "kiln/server/responses_turn.h"
#include "kiln/server/websocket.h"
#include "kiln/util/log.h"

namespace kiln::server::responses {

namespace {

class Session {
 public:
  Session(ServerContext& ctx, ResponseStore& store, WebSocketChannel& ws, HttpExchange& ex,
          std::string request_id)
      : ctx_(ctx), store_(store), ws_(ws), ex_(ex), request_id_(std::move(request_id)) {}

  void serve() {
    while (auto message = ws_.receive()) {
      if (message->binary) {
        send_error(invalid_request("Send events as text messages holding JSON"));
        continue;
      }
      bool client_gone = false;
      try {
        client_gone = on_event(message->data);
      } catch (const std::exception& e) {
        send_error(internal_error(std::string("internal error: ") + e.what()));
      }
      if (client_gone || ex_.client_gone()) return;
    }
  }

 private:
  // One event; true when the client left during its turn.
  bool on_event(const std::string& text) {
    // The body rules of HTTP: no NUL byte, bounded nesting, an object.
    auto parsed = parse_body(text);
    if (auto* e = std::get_if<ApiError>(&parsed)) {
      send_error(*e);
      return false;
    }
    Json event = std::get<Json>(std::move(parsed));
    const Json type = event.contains("type") ? event["type"] : Json(nullptr);
    if (type != "response.create") {
      send_error(
          invalid_request(fmt::format("Unknown event type {}: this server accepts response.create",
                                      type.is_null() ? std::string("(none)") : type.dump()),
                          "type"));
      return false;
    }
    event.erase("type");
    event.erase("stream");  // implicit over a WebSocket
    if (event.contains("background") && event["background"] == true) {
      send_error(not_supported("'background' is not supported over a WebSocket", "background"));
      return false;
    }
    // generate: false warms up: the turn is checked and completes with no output.
    bool generate = true;
    if (auto it = event.find("generate"); it != event.end()) {
      if (!it->is_boolean()) {
        send_error(invalid_request("'generate' must be a boolean", "generate"));
        return false;
      }
      generate = it->get<bool>();
      event.erase(it);
    }
    const std::string request_id = fmt::format("{}-{}", request_id_, num_turns_++);
    HistoryLookup lookup = [this](const std::string& id) -> std::optional<Json> {
      if (!last_id_.empty() && id == last_id_) return last_items_;
      return store_lookup(store_)(id);
    };
    auto prepared = prepare_turn(ctx_, store_, event, lookup, request_id);
    if (auto* e = std::get_if<ApiError>(&prepared)) {
      send_error(*e);
      return false;
    }
    Turn& turn = *std::get<std::unique_ptr<Turn>>(prepared);
    EventSink sink;
    sink.send = [this](const std::string&, const std::string& json) { ws_.send_text(json); };
    // A ping frame while a long prefill runs, so that proxies keep the connection.
    sink.keep_alive = [this] { ws_.send_ping(""); };
    if (!generate) {
      complete_without_generation(turn, sink);
      remember(turn);
      return false;
    }
    auto submitted = submit_turn(turn);
    if (auto* e = std::get_if<ApiError>(&submitted)) {
      send_error(*e);
      return false;
    }
    const RunEnd end =
        run_stream(turn, *std::get<std::unique_ptr<BudgetedGeneration>>(submitted), ex_, sink);
    if (end == RunEnd::kClientGone) return true;
    if (turn.state.status != "failed") remember(turn);
    return false;
  }

  void remember(const Turn& turn) {
    last_id_ = turn.state.id;
    last_items_ = turn.items();
  }

  void send_error(const ApiError& e) {
    Json event = Json::object();
    event["type"] = "error";
    event["status"] = error_status(e);
    event["error"] = Json::parse(dump_json(error_envelope(e)["error"]));
    ws_.send_text(dump_json(event));
  }

  ServerContext& ctx_;
  ResponseStore& store_;
  WebSocketChannel& ws_;
  HttpExchange& ex_;
  const std::string request_id_;
  int num_turns_ = 0;
  // The latest response of this connection: what previous_response_id continues from, also
  // with store: false.
  std::string last_id_;
  Json last_items_;
};

}  // namespace

HandlerResult handle_websocket(ServerContext& ctx, ResponseStore& store, const HttpRequest& req,
                               HttpExchange& ex) {
  if (!websocket::is_upgrade_request(req))
    return invalid_request(
        "GET /v1/responses is the WebSocket mode of the Responses API: connect with a "
        "WebSocket client (Upgrade: websocket) and send response.create events, or create a "
        "response with POST /v1/responses");
  if (auto why = websocket::upgrade_error(req)) {
    ex.add_header("Sec-WebSocket-Version", "13");
    return invalid_request("WebSocket handshake: " + *why);
  }
  WebSocketChannel* ws =
      ex.accept_websocket(websocket::accept_key(*req.header("sec-websocket-key")));
  if (ws == nullptr) {
    if (ex.client_gone()) return Streamed{};
    return invalid_request("This request cannot switch to the WebSocket protocol (send a GET)");
  }
  log::debug("[{}] /v1/responses: WebSocket open", req.request_id);
  Session(ctx, store, *ws, ex, req.request_id).serve();
  return Streamed{};
}

}  // namespace kiln::server::responses
