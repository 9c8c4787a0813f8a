// GET /health: 200 {"status":"ok"} while the engine is ready and its thread alive; 503 with
// "loading", "error" (kFailed), "unresponsive" (heartbeat older than the threshold) or
// "stopped" otherwise. Public (no API key), so load balancers can probe it.
#include "kiln/server/context.h"

namespace kiln::server {

namespace {
HandlerResult health(const ServerContext& ctx) {
  const char* status = "ok";
  switch (ctx.engine.state()) {
    case engine::EngineState::kLoading:
      status = "loading";
      break;
    case engine::EngineState::kFailed:
      status = "error";
      break;
    case engine::EngineState::kStopped:
      status = "stopped";
      break;
    case engine::EngineState::kReady:
      if (ctx.engine.stats().seconds_since_heartbeat > ctx.options.heartbeat_timeout_s)
        status = "unresponsive";
      break;
  }
  const bool ok = std::string_view(status) == "ok";
  return json_response(nlohmann::json{{"status", status}}, ok ? 200 : 503);
}
}  // namespace

void register_health_routes(Router& router, ServerContext& ctx) {
  for (const char* path : {"/health", "/v1/health"})
    router.add(
        "GET", path, [&ctx](const HttpRequest&, HttpExchange&) { return health(ctx); },
        /*is_public=*/true);
}

}  // namespace kiln::server
