// kiln's HTTP server: the OpenAI-compatible API over an EngineApi. The listener is up before
// the model finishes loading (/health answers 503 "loading" until EngineState::kReady).
//
//   Server server(engine, tokenizer, chat_template, options);
//   KILN_TRY(uint16_t port, server.start());
//   ...                       // on SIGTERM:
//   server.shutdown();        // stop accepting, drain for options.drain_timeout, cut the rest
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "kiln/engine/api.h"
#include "kiln/server/request_controls.h"
#include "kiln/tokenizer/tokenizer.h"
#include "kiln/util/status.h"

namespace kiln::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;             // 0: an ephemeral port (start() returns it)
  std::string api_key;              // empty: no authentication; else Bearer, constant-time compare
  std::string model_name = "kiln";  // the id of /v1/models; other `model` values -> 404
  size_t max_body_bytes = size_t{8} << 20;         // larger request bodies -> 413
  std::chrono::milliseconds drain_timeout{30000};  // shutdown(): in-flight requests' grace
  std::chrono::milliseconds request_timeout{0};    // per generation (engine deadline); 0: none
  std::chrono::milliseconds idle_timeout{60000};   // keep-alive wait for the next request
  std::chrono::milliseconds first_request_timeout{5000};  // a new connection's first header
  std::chrono::milliseconds header_timeout{30000};        // request header, once started
  std::chrono::milliseconds body_timeout{60000};          // request body
  std::chrono::milliseconds write_timeout{60000};  // one write to a client that does not read
  double heartbeat_timeout_s = 60;                 // engine heartbeat older than this: /health 503
  int retry_after_seconds = 1;                     // Retry-After of a 429 (queue full)
  // Connections beyond either cap may still ask GET/HEAD /health and /metrics (one request,
  // within the first-request deadline); anything else gets 503 and the connection closes.
  int max_connections = 1024;
  int max_connections_per_client = 64;  // per client IP address
  int max_n = 16;                       // the largest `n` a request may ask for
  // The most generations (prompts x n) one request may ask for; more is a 400, since the
  // engine's queue could never take them (kiln serve sets it to --max-waiting).
  int max_choices = 256;
  size_t max_tokenize_tokens = size_t{1} << 20;  // /tokenize result at most (more: 400)
  size_t max_tokenize_pieces = size_t{1} << 16;  // ... when with_pieces (more: 400)
  // false (the default): control-token text inside message content ("<|im_start|>" written
  // by a user) is tokenized as plain text; only the chat template's markup makes control
  // tokens. true: the whole rendered prompt is parsed for control tokens.
  bool parse_special_in_content = false;
  bool cors = false;  // Access-Control-Allow-Origin: *
  // Anthropic streams: a ping event whenever nothing else was sent for this long (a long
  // prefill), so that proxies and clients keep the stream.
  std::chrono::milliseconds ping_interval{5000};
  // Remove known-volatile lines (Claude Code's x-anthropic-billing-header) from system
  // prompts before templating, so that the turns of a conversation share their prefix.
  bool normalize_volatile_prompt = true;
  // The /v1/responses store (store: true, previous_response_id): at most this many
  // responses and bytes, least recently used evicted first.
  size_t responses_store_max_count = 1024;
  size_t responses_store_max_bytes = size_t{256} << 20;
  // --max-tokens (default output length), --max-tokens-cap, --max-thinking-tokens.
  TokenLimits token_limits;
};

struct ServerContext;

class Server {
 public:
  // `tokenizer` and `chat_template` come from the model file's metadata, which loads in
  // moments; the engine may still be loading its weights (state() kLoading).
  // An empty chat_template uses ChatML (chat::kChatMLTemplate).
  Server(engine::EngineApi& engine, tokenizer::Tokenizer tokenizer, std::string chat_template,
         ServerOptions options);
  ~Server();  // shutdown(0) when still running
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Listens and serves on background threads; returns the bound port.
  Expected<uint16_t> start();
  // Graceful shutdown: stop accepting, let in-flight requests finish for `drain` (default
  // options.drain_timeout), then cut them (streams end with an error frame) and return.
  void shutdown(std::optional<std::chrono::milliseconds> drain = std::nullopt);
  int num_connections() const;

 private:
  std::unique_ptr<ServerContext> ctx_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::server
