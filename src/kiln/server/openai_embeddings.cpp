// POST /v1/embeddings (OpenAI). See embeddings.h.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <iterator>

#include "kiln/model/pooling.h"
#include "kiln/server/context.h"
#include "kiln/server/embeddings.h"
#include "kiln/server/generation.h"
#include "kiln/util/base64.h"

namespace kiln::server {

namespace {

constexpr const char* kInputShape =
    "'input' must be a string, a list of strings, a list of token ids, or a list of lists of "
    "token ids";

}  // namespace

std::variant<EmbeddingsRequest, ApiError> parse_embeddings_request(
    const nlohmann::ordered_json& body, const tokenizer::Tokenizer& tok, int32_t width) {
  EmbeddingsRequest out;
  auto it = body.find("input");
  if (it == body.end() || it->is_null()) return invalid_request("'input' is required", "input");
  auto from_text = [&](const std::string& text) -> std::optional<ApiError> {
    if (text.empty()) return invalid_request("'input' has an empty string", "input");
    auto ids = tok.encode(text, /*add_special=*/true, /*parse_special=*/true);
    if (!ids.ok()) return invalid_request(ids.error().message, "input");
    out.inputs.push_back(std::move(ids).value());
    return std::nullopt;
  };
  auto from_ids = [&](const nlohmann::ordered_json& arr) -> std::optional<ApiError> {
    if (arr.empty()) return invalid_request("'input' has an empty list of token ids", "input");
    std::vector<int32_t> ids;
    for (const auto& v : arr) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= tok.num_tokens())
        return invalid_request(
            fmt::format("'input' token ids must be integers in [0, {})", tok.num_tokens()),
            "input");
      ids.push_back(v.get<int32_t>());
    }
    out.inputs.push_back(std::move(ids));
    return std::nullopt;
  };
  if (it->is_string()) {
    if (auto e = from_text(it->get<std::string>())) return *e;
  } else if (it->is_array() && it->empty()) {
    return invalid_request("'input' is an empty list", "input");
  } else if (it->is_array() && (*it)[0].is_number()) {
    if (auto e = from_ids(*it)) return *e;
  } else if (it->is_array()) {
    for (const auto& v : *it) {
      std::optional<ApiError> e;
      if (v.is_string())
        e = from_text(v.get<std::string>());
      else if (v.is_array())
        e = from_ids(v);
      else
        return invalid_request(kInputShape, "input");
      if (e) return *e;
    }
  } else {
    return invalid_request(kInputShape, "input");
  }
  if (auto d = body.find("dimensions"); d != body.end() && !d->is_null()) {
    if (!d->is_number_integer())
      return invalid_request("'dimensions' must be an integer", "dimensions");
    const int64_t v = d->get<int64_t>();
    if (v < 1 || v > width)
      return invalid_request(
          fmt::format("'dimensions' must be in [1, {}] (the model's embedding width), got {}",
                      width, v),
          "dimensions");
    out.dimensions = static_cast<int32_t>(v);
  }
  if (auto f = body.find("encoding_format"); f != body.end() && !f->is_null()) {
    if (!f->is_string() || (*f != "float" && *f != "base64"))
      return invalid_request("'encoding_format' must be \"float\" or \"base64\"",
                             "encoding_format");
    out.base64 = *f == "base64";
  }
  return out;
}

std::vector<float> finish_embedding(std::vector<float> pooled, std::optional<int32_t> dimensions) {
  if (dimensions && static_cast<size_t>(*dimensions) < pooled.size())
    pooled.resize(static_cast<size_t>(*dimensions));
  model::l2_normalize(pooled);
  return pooled;
}

std::string embedding_base64(std::span<const float> values) {
  std::string bytes(values.size() * 4, '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(values[i]);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + b] = static_cast<char>((u >> (8 * b)) & 0xff);
  }
  return base64::encode(bytes);
}

std::string embeddings_response(const std::vector<std::vector<float>>& embeddings, bool base64,
                                const std::string& model, int64_t num_prompt_tokens) {
  std::string out = R"({"object":"list","data":[)";
  for (size_t i = 0; i < embeddings.size(); ++i) {
    fmt::format_to(std::back_inserter(out), R"({}{{"object":"embedding","index":{},"embedding":)",
                   i > 0 ? "," : "", i);
    if (base64) {
      out += '"' + embedding_base64(embeddings[i]) + '"';
    } else {
      out += '[';
      for (size_t k = 0; k < embeddings[i].size(); ++k) {
        const float v = embeddings[i][k];
        // Shortest form that reads back as the same float; JSON has no NaN or infinity.
        fmt::format_to(std::back_inserter(out), "{}{}", k > 0 ? "," : "",
                       std::isfinite(v) ? v : 0.0f);
      }
      out += ']';
    }
    out += '}';
  }
  fmt::format_to(
      std::back_inserter(out), R"(],"model":{},"usage":{{"prompt_tokens":{},"total_tokens":{}}}}})",
      nlohmann::json(model).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
      num_prompt_tokens, num_prompt_tokens);
  return out;
}

namespace {

HandlerResult handle_embeddings(ServerContext& ctx, const HttpRequest& req, HttpExchange& ex) {
  auto parsed = parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& body = std::get<Json>(parsed);
  if (auto e = check_model(body, ctx)) return *e;
  if (auto e = check_ready(ctx)) return *e;
  if (ctx.engine.pooling() == model::Pooling::kNone)
    return invalid_request(
        "this model serves no embeddings: it has no pooling type (an embedding GGUF has "
        "<arch>.pooling_type; start kiln serve with --pooling mean, cls or last to pool this "
        "one)",
        "model");
  auto read = parse_embeddings_request(body, ctx.tokenizer, ctx.engine.embedding_width());
  if (auto* e = std::get_if<ApiError>(&read)) return *e;
  EmbeddingsRequest& er = std::get<EmbeddingsRequest>(read);
  const size_t max_inputs = static_cast<size_t>(std::max(ctx.options.max_choices, 1));
  if (er.inputs.size() > max_inputs)
    return invalid_request(fmt::format("'input' has {} inputs; this server takes at most {} per "
                                       "request (kiln serve --max-waiting)",
                                       er.inputs.size(), max_inputs),
                           "input");
  const int64_t n_ctx = ctx.engine.context_length();
  int64_t num_prompt_tokens = 0;
  std::vector<engine::GenerationRequest> requests;
  for (size_t i = 0; i < er.inputs.size(); ++i) {
    const int64_t n = static_cast<int64_t>(er.inputs[i].size());
    if (n > n_ctx)
      return context_length_exceeded(
          fmt::format("This model's maximum context length is {} tokens. However, input {} has "
                      "{} tokens. Please reduce the length of the input.",
                      n_ctx, i, n));
    num_prompt_tokens += n;
    engine::GenerationRequest r;
    r.request_id = er.inputs.size() == 1 ? req.request_id : fmt::format("{}-{}", req.request_id, i);
    r.prompt_tokens = std::move(er.inputs[i]);
    r.embed = true;
    if (ctx.options.request_timeout.count() > 0)
      r.deadline = Clock::now() + ctx.options.request_timeout;
    requests.push_back(std::move(r));
  }
  MultiRun run(ctx);
  if (auto e = run.submit(std::move(requests))) return *e;
  std::vector<std::vector<float>> embeddings(run.size());
  while (auto ev = run.next(ex)) {
    auto* fin = std::get_if<engine::FinishEvent>(&ev->second);
    if (fin == nullptr) continue;
    if (fin->reason != engine::FinishReason::kStop || fin->embedding.empty())
      return generation_error(*fin);
    embeddings[static_cast<size_t>(ev->first)] =
        finish_embedding(std::move(fin->embedding), er.dimensions);
  }
  if (run.abort_reason() == AbortReason::kServerShutdown)
    return unavailable("The server is shutting down");
  if (run.abort_reason() == AbortReason::kClientGone) return Streamed{};
  ctx.metrics.add_tokens(num_prompt_tokens, 0);
  return Response{
      200, "application/json",
      embeddings_response(embeddings, er.base64, ctx.options.model_name, num_prompt_tokens)};
}

}  // namespace

void register_embeddings_routes(Router& router, ServerContext& ctx) {
  router.add("POST", "/v1/embeddings", [&ctx](const HttpRequest& req, HttpExchange& ex) {
    return handle_embeddings(ctx, req, ex);
  });
}

}  // namespace kiln::server
