// POST /tokenize {"content", "add_special", "parse_special", "with_pieces"} -> {"tokens"}
// (ids, or {"id", "piece", "bytes"} objects with pieces; bounded by
// ServerOptions::max_tokenize_tokens / max_tokenize_pieces) and
// POST /detokenize {"tokens"} -> {"content"}, in llama.cpp server's shapes.
#include <fmt/format.h>

#include <iterator>

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
  auto ids = ctx.tokenizer.encode(it->get_ref<const std::string&>(), add_special, parse_special);
  if (!ids.ok()) return invalid_request(ids.error().message, "content");
  // The response is bounded (a piece costs ~40 bytes of JSON, an id ~7): larger texts are
  // tokenized in parts by the client.
  const size_t limit =
      with_pieces ? ctx.options.max_tokenize_pieces : ctx.options.max_tokenize_tokens;
  if (ids->size() > limit)
    return invalid_request(
        fmt::format("the content has {} tokens; /tokenize returns at most {}{} (send it in parts)",
                    ids->size(), limit, with_pieces ? " with pieces" : ""),
        "content");
  // Written directly (not through a JSON tree of a million nodes).
  std::string out = R"({"tokens":[)";
  out.reserve(ids->size() * (with_pieces ? 48 : 8) + 16);
  for (size_t i = 0; i < ids->size(); ++i) {
    const int32_t id = (*ids)[i];
    if (i > 0) out += ',';
    if (!with_pieces) {
      fmt::format_to(std::back_inserter(out), "{}", id);
      continue;
    }
    // "piece": the token's text (a partial UTF-8 sequence shows as U+FFFD); "bytes": its
    // exact bytes, so that the pieces concatenate to the text (as OpenAI's logprobs bytes).
    const int32_t one[1] = {id};
    const std::string_view raw = ctx.tokenizer.token_piece(id);
    fmt::format_to(std::back_inserter(out), R"({{"id":{},"piece":{},"bytes":[)", id,
                   dump_json(Json(ctx.tokenizer.decode(one))));
    for (size_t k = 0; k < raw.size(); ++k)
      fmt::format_to(std::back_inserter(out), "{}{}", k > 0 ? "," : "",
                     static_cast<unsigned>(static_cast<unsigned char>(raw[k])));
    out += "]}";
  }
  out += "]}";
  return Response{200, "application/json", std::move(out)};
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
