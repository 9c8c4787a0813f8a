// The HTTP/1.1 transport: a listener on host:port and one thread per client connection.
//
// Why a thread per connection rather than an async reactor: a request's handler blocks on
// its engine channel for the whole generation (seconds to minutes), and the engine, not the
// HTTP layer, is the bottleneck; clients number in the tens to hundreds. A thread per
// connection keeps each exchange straight-line code (read, handle, stream, repeat) that is
// easy to reason about under cancellation and shutdown, and a stuck client only ever holds
// its own thread. Each connection thread owns a private io_context, so every socket
// operation still runs with a Beast timeout (header, body, write) and the idle wait between
// keep-alive requests can notice a shutdown.
//
// What it guarantees: keep-alive; the WebSocket upgrade (the handler accepts it, then owns
// the connection until it returns); a request body limit (413, then close); header and body
// read timeouts (the connection is closed); chunked streaming responses; hang-up detection
// while a handler waits (HttpExchange::abort_reason); graceful shutdown (stop accepting,
// close idle connections, let busy ones finish, cut them after the drain timeout).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/util/status.h"

namespace kiln::server {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: "/v1/models?x=1"
  std::string path;    // target without the query: "/v1/models"
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  std::string remote;      // peer address, for logs
  std::string request_id;  // set by the router (X-Request-Id or generated)

  // The first header of that name (case-insensitive), if any.
  std::optional<std::string_view> header(std::string_view name) const;
};

enum class AbortReason { kNone, kClientGone, kServerShutdown };

// A connection switched to the WebSocket protocol (RFC 6455, server/websocket.h), used from
// the handler's thread only. Pings are answered while receive() waits; a protocol violation
// closes the connection with its status code (1002, 1007, 1009).
class WebSocketChannel {
 public:
  virtual ~WebSocketChannel() = default;
  struct Message {
    bool binary = false;
    std::string data;
  };
  // The next data message, or nullopt once the connection is over: the client closed it
  // (its close frame answered), broke the protocol, went idle past the timeout, hung up, or
  // the server drains (a close frame 1001 is sent).
  virtual std::optional<Message> receive() = 0;
  virtual bool send_text(std::string_view text) = 0;
  virtual bool send_ping(std::string_view data) = 0;
  // Sends a close frame (at most once); the connection ends when the handler returns.
  virtual void close(uint16_t code, std::string_view reason) = 0;
};

// The response side of one request. A handler sends exactly one response: respond(), or
// begin_stream() + write_chunk()* + end_stream(). Writes return false once the client is
// gone (further writes are no-ops).
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  // A header added to whichever response is sent next (X-Request-Id, CORS, Retry-After).
  virtual void add_header(std::string name, std::string value) = 0;
  virtual bool respond(int status, std::string_view content_type, std::string body) = 0;
  // A chunked (Transfer-Encoding: chunked) response; each write_chunk is one chunk.
  virtual bool begin_stream(int status, std::string_view content_type) = 0;
  virtual bool write_chunk(std::string_view data) = 0;
  virtual bool end_stream() = 0;
  // Polled by handlers while they wait: the client hung up, or the server's drain timeout
  // passed during shutdown. Either way the handler should cancel its work and return.
  virtual AbortReason abort_reason() = 0;
  virtual bool responded() const = 0;
  // The client hung up or a write to it failed (as last seen; does not poll the socket).
  virtual bool client_gone() const = 0;
  virtual int status() const = 0;  // of the response sent (0 before)
  // Answers the request with 101 Switching Protocols (Sec-WebSocket-Accept: `accept_key`,
  // server/websocket.h) and returns the connection's WebSocket, valid until the handler
  // returns; null when this exchange cannot switch (a response was sent already, the client
  // is gone, or the transport has no WebSocket support). The request must have been checked
  // (websocket::upgrade_error).
  virtual WebSocketChannel* accept_websocket(std::string_view accept_key) {
    (void)accept_key;
    return nullptr;
  }
};

using HttpHandler = std::function<void(HttpRequest&, HttpExchange&)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;  // 0: an ephemeral port (start() returns it)
  size_t max_body_bytes = size_t{8} << 20;
  size_t max_header_bytes = size_t{64} << 10;
  // A keep-alive connection may wait this long for its next request.
  std::chrono::milliseconds idle_timeout{60000};
  // Once a request's first byte arrived: its header, then its body, must arrive in time.
  std::chrono::milliseconds header_timeout{30000};
  std::chrono::milliseconds body_timeout{60000};
  // One write (a response, or one chunk) to a client that does not read.
  std::chrono::milliseconds write_timeout{60000};
  // A WebSocket connection may wait this long for its client's next message (an agent runs
  // its tools between turns). Its messages are bounded by max_body_bytes.
  std::chrono::milliseconds websocket_idle_timeout{std::chrono::minutes(15)};
  // A new connection must deliver its first request's header within this (a connection
  // that sends nothing holds a slot no longer than this).
  std::chrono::milliseconds first_request_timeout{5000};
  // Connections beyond either cap go to the overflow lane: one thread serving them all
  // asynchronously, one request each, within first_request_timeout; it answers GET/HEAD of
  // `always_answered` paths through the handler and 503 to anything else. Beyond
  // max_overflow_connections a connection gets 503 at once.
  int max_connections = 1024;
  int max_connections_per_client = 64;  // per client IP address
  int max_overflow_connections = 4096;
  std::vector<std::string> always_answered = {"/health", "/v1/health", "/metrics"};
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();  // shutdown(0) if still running
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens, then accepts on a background thread. Returns the bound port.
  Expected<uint16_t> start();
  // Stops accepting, closes idle connections, waits up to `drain` for busy ones to finish,
  // then cuts the rest (their handlers see kServerShutdown) and joins every thread.
  void shutdown(std::chrono::milliseconds drain);
  // Connections currently open.
  int num_connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::server
