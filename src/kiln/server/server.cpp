#include "kiln/server/server.h"

#include <ctime>

#include "kiln/chat/template.h"
#include "kiln/server/context.h"
#include "kiln/server/http_server.h"
#include "kiln/server/router.h"
#include "kiln/util/log.h"

namespace kiln::server {

struct Server::Impl {
  std::unique_ptr<Router> router;
  std::unique_ptr<HttpServer> http;
};

Server::Server(engine::EngineApi& engine, tokenizer::Tokenizer tokenizer, std::string chat_template,
               ServerOptions options)
    : ctx_(new ServerContext{engine,
                             std::move(tokenizer),
                             std::move(chat_template),
                             {},
                             std::move(options),
                             {},
                             0,
                             {}}),
      impl_(std::make_unique<Impl>()) {
  ctx_->chat_template = chat::template_or_chatml(std::move(ctx_->chat_template));
  ctx_->parser_config = chat::config_for_template(ctx_->chat_template);
  ctx_->created_unix = static_cast<int64_t>(std::time(nullptr));

  impl_->router =
      std::make_unique<Router>(RouterOptions{ctx_->options.api_key, ctx_->options.cors});
  Router& router = *impl_->router;
  register_health_routes(router, *ctx_);
  register_metrics_routes(router, *ctx_);
  register_models_routes(router, *ctx_);
  register_tokenize_routes(router, *ctx_);
  register_chat_routes(router, *ctx_);
  register_completions_routes(router, *ctx_);
  register_embeddings_routes(router, *ctx_);
  register_anthropic_routes(router, *ctx_);
  register_responses_routes(router, *ctx_);
  router.on_complete([ctx = ctx_.get()](int status) { ctx->metrics.count_request(status); });

  HttpServerOptions http;
  http.host = ctx_->options.host;
  http.port = ctx_->options.port;
  http.max_body_bytes = ctx_->options.max_body_bytes;
  http.idle_timeout = ctx_->options.idle_timeout;
  http.header_timeout = ctx_->options.header_timeout;
  http.body_timeout = ctx_->options.body_timeout;
  http.write_timeout = ctx_->options.write_timeout;
  http.max_connections = ctx_->options.max_connections;
  http.max_connections_per_client = ctx_->options.max_connections_per_client;
  http.first_request_timeout = ctx_->options.first_request_timeout;
  impl_->http = std::make_unique<HttpServer>(
      http,
      [r = impl_->router.get()](HttpRequest& req, HttpExchange& ex) { r->dispatch(req, ex); });
}

Server::~Server() {
  shutdown(std::chrono::milliseconds(0));
}

Expected<uint16_t> Server::start() {
  KILN_TRY(uint16_t port, impl_->http->start());
  log::info("server: listening on {}:{} (model '{}')", ctx_->options.host, port,
            ctx_->options.model_name);
  return port;
}

void Server::shutdown(std::optional<std::chrono::milliseconds> drain) {
  impl_->http->shutdown(drain.value_or(ctx_->options.drain_timeout));
}

int Server::num_connections() const {
  return impl_->http->num_connections();
}

}  // namespace kiln::server
