// POST /tokenize {"content", "add_special", "parse_special", "with_pieces"} -> {"tokens"} and
// POST /detokenize {"tokens"} -> {"content"}, in llama.cpp server's shapes.
#include "kiln/server/context.h"
#include "kiln/server/generation.h"

namespace kiln::server {

namespace {

std::optional<ApiError> read_flag(const Json& body, const char* key, bool* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean())
    return invalid_request(std::string("'") + key + "' must be a boolean", key);
  *out = it->get<bool>();
  return std::nullopt;
}

HandlerResult handle_tokenize(const ServerContext& ctx, const HttpRequest& req) {
  auto parsed = parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& body = std::get<Json>(parsed);
  auto it = body.find("content");
  if (it == body.end() || !it->is_string())
    return invalid_request("'content' must be a string", "content");
  bool add_special = false;
  bool parse_special = true;
  bool with_pieces = false;
  if (auto e = read_flag(body, "add_special", &add_special)) return *e;
  if (auto e = read_flag(body, "parse_special", &parse_special)) return *e;
  if (auto e = read_flag(body, "with_pieces", &with_pieces)) return *e;
  auto ids = ctx.tokenizer.encode(it->get<std::string>(), add_special, parse_special);
  if (!ids.ok()) return invalid_request(ids.error().message, "content");
  Json tokens = Json::array();
  for (int32_t id : *ids) {
    if (!with_pieces) {
      tokens.push_back(id);
      continue;
    }
    const int32_t one[1] = {id};
    tokens.push_back(Json{{"id", id}, {"piece", ctx.tokenizer.decode(one)}});
  }
  return json_response(Json{{"tokens", std::move(tokens)}});
}

HandlerResult handle_detokenize(const ServerContext& ctx, const HttpRequest& req) {
  auto parsed = parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& body = std::get<Json>(parsed);
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array())
    return invalid_request("'tokens' must be an array of token ids", "tokens");
  std::vector<int32_t> ids;
  for (const Json& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() >= ctx.tokenizer.num_tokens())
      return invalid_request(
          "'tokens' must hold token ids in [0, " + std::to_string(ctx.tokenizer.num_tokens()) + ")",
          "tokens");
    ids.push_back(v.get<int32_t>());
  }
  return json_response(Json{{"content", ctx.tokenizer.decode(ids)}});
}

}  // namespace

void register_tokenize_routes(Router& router, ServerContext& ctx) {
  router.add("POST", "/tokenize",
             [&ctx](const HttpRequest& req, HttpExchange&) { return handle_tokenize(ctx, req); });
  router.add("POST", "/detokenize",
             [&ctx](const HttpRequest& req, HttpExchange&) { return handle_detokenize(ctx, req); });
}

}  // namespace kiln::server
