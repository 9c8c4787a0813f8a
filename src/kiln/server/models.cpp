// GET /v1/models and GET /v1/models/{id}: the one served model.
#include "kiln/server/context.h"

namespace kiln::server {

namespace {
nlohmann::json model_object(const ServerContext& ctx) {
  return nlohmann::json{{"id", ctx.options.model_name},
                        {"object", "model"},
                        {"created", ctx.created_unix},
                        {"owned_by", "kiln"},
                        {"max_model_len", ctx.engine.context_length()}};
}
}  // namespace

void register_models_routes(Router& router, ServerContext& ctx) {
  router.add("GET", "/v1/models", [&ctx](const HttpRequest&, HttpExchange&) -> HandlerResult {
    return json_response(
        nlohmann::json{{"object", "list"}, {"data", nlohmann::json::array({model_object(ctx)})}});
  });
  router.add("GET", "/v1/models/{id}",
             [&ctx](const HttpRequest& req, HttpExchange&) -> HandlerResult {
               const std::string id = Router::path_param("/v1/models/{id}", req.path, "id");
               if (id != ctx.options.model_name) return model_not_found(id);
               return json_response(model_object(ctx));
             });
}

}  // namespace kiln::server
