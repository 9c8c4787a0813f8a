#include "kiln/server/errors.h"

#include <fmt/format.h>

namespace kiln::server {

namespace {
ApiError make(int status, ErrorKind kind, std::optional<std::string> code,
              std::optional<std::string> param, std::string message) {
  ApiError e;
  e.status = status;
  e.kind = kind;
  e.code = std::move(code);
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}
}  // namespace

std::string_view error_type(const ApiError& e, ErrorStyle style) {
  if (style == ErrorStyle::kAnthropic) {
    // https://docs.anthropic.com/en/api/errors
    switch (e.kind) {
      case ErrorKind::kInvalidRequest:
        return "invalid_request_error";
      case ErrorKind::kAuthentication:
        return "authentication_error";
      case ErrorKind::kNotFound:
        return "not_found_error";
      case ErrorKind::kPayloadTooLarge:
        return "request_too_large";
      case ErrorKind::kRateLimited:
      case ErrorKind::kUnavailable:
        return "overloaded_error";
      case ErrorKind::kInternal:
        return "api_error";
    }
    return "api_error";
  }
  // OpenAI files authentication, unknown models and routes under invalid_request_error.
  switch (e.kind) {
    case ErrorKind::kInvalidRequest:
    case ErrorKind::kAuthentication:
    case ErrorKind::kNotFound:
    case ErrorKind::kPayloadTooLarge:
      return "invalid_request_error";
    case ErrorKind::kRateLimited:
      return "rate_limit_error";
    case ErrorKind::kUnavailable:
      return "service_unavailable_error";
    case ErrorKind::kInternal:
      return "server_error";
  }
  return "server_error";
}

int error_status(const ApiError& e, ErrorStyle style) {
  if (style == ErrorStyle::kAnthropic &&
      (e.kind == ErrorKind::kRateLimited || e.kind == ErrorKind::kUnavailable))
    return 529;  // Anthropic's "overloaded": clients retry it with backoff
  return e.status;
}

nlohmann::json error_envelope(const ApiError& e, ErrorStyle style) {
  if (style == ErrorStyle::kAnthropic) {
    nlohmann::json inner = nlohmann::json::object();
    inner["type"] = error_type(e, style);
    // Claude Code compacts the conversation when the message says "prompt is too long".
    inner["message"] =
        e.code == "context_length_exceeded" ? "prompt is too long: " + e.message : e.message;
    return nlohmann::json{{"type", "error"}, {"error", inner}};
  }
  nlohmann::json inner = nlohmann::json::object();
  inner["message"] = e.message;
  inner["type"] = error_type(e, style);
  inner["param"] = e.param ? nlohmann::json(*e.param) : nlohmann::json(nullptr);
  inner["code"] = e.code ? nlohmann::json(*e.code) : nlohmann::json(nullptr);
  return nlohmann::json{{"error", inner}};
}

std::string error_body(const ApiError& e, ErrorStyle style) {
  return dump_json(error_envelope(e, style));
}

ApiError invalid_request(std::string message, std::optional<std::string> param) {
  return make(400, ErrorKind::kInvalidRequest, std::nullopt, std::move(param), std::move(message));
}

ApiError invalid_json(std::string_view parser_message) {
  return make(400, ErrorKind::kInvalidRequest, std::nullopt, std::nullopt,
              fmt::format("The request body is not valid JSON: {}", parser_message));
}

ApiError context_length_exceeded(std::string message) {
  return make(400, ErrorKind::kInvalidRequest, "context_length_exceeded", "messages",
              std::move(message));
}

ApiError model_not_found(std::string_view model) {
  return make(404, ErrorKind::kNotFound, "model_not_found", "model",
              fmt::format("The model `{}` does not exist or you do not have access to it.", model));
}

ApiError not_found(std::string_view path) {
  return make(404, ErrorKind::kNotFound, "not_found", std::nullopt,
              fmt::format("Unknown path: {}", path));
}

ApiError resource_not_found(std::string message, std::string code,
                            std::optional<std::string> param) {
  return make(404, ErrorKind::kNotFound, std::move(code), std::move(param), std::move(message));
}

ApiError method_not_allowed(std::string_view method, std::string_view path) {
  return make(405, ErrorKind::kInvalidRequest, "method_not_allowed", std::nullopt,
              fmt::format("Method {} is not allowed on {}", method, path));
}

ApiError unauthorized() {
  return make(401, ErrorKind::kAuthentication, "invalid_api_key", std::nullopt,
              "Incorrect API key provided. Pass it as 'Authorization: Bearer <key>' (or "
              "'x-api-key: <key>').");
}

ApiError payload_too_large(size_t limit_bytes) {
  return make(413, ErrorKind::kPayloadTooLarge, "payload_too_large", std::nullopt,
              fmt::format("The request body exceeds the limit of {} bytes", limit_bytes));
}

ApiError queue_full(std::string message, int retry_after_seconds) {
  ApiError e =
      make(429, ErrorKind::kRateLimited, "rate_limit_exceeded", std::nullopt, std::move(message));
  e.retry_after_seconds = retry_after_seconds;
  return e;
}

ApiError unavailable(std::string message) {
  return make(503, ErrorKind::kUnavailable, "service_unavailable", std::nullopt,
              std::move(message));
}

ApiError internal_error(std::string message) {
  return make(500, ErrorKind::kInternal, "internal_error", std::nullopt, std::move(message));
}

ApiError not_supported(std::string message, std::string param) {
  return make(400, ErrorKind::kInvalidRequest, "not_supported", std::move(param),
              std::move(message));
}

std::optional<ApiError> check_context_length(int64_t n_ctx, int64_t num_prompt_tokens,
                                             std::optional<int64_t> max_tokens) {
  const int64_t asked = max_tokens ? std::max<int64_t>(*max_tokens, 1) : 1;
  if (num_prompt_tokens + asked <= n_ctx) return std::nullopt;
  if (max_tokens)
    return context_length_exceeded(fmt::format(
        "This model's maximum context length is {} tokens. However, you requested {} tokens "
        "({} in the prompt, {} for the completion). Please reduce the length of the prompt "
        "or the completion.",
        n_ctx, num_prompt_tokens + *max_tokens, num_prompt_tokens, *max_tokens));
  return context_length_exceeded(fmt::format(
      "This model's maximum context length is {} tokens. However, your prompt has {} tokens. "
      "Please reduce the length of the prompt.",
      n_ctx, num_prompt_tokens));
}

ApiError from_refusal(const engine::SubmitRefusal& refusal, int retry_after_seconds) {
  switch (refusal.error) {
    case engine::SubmitError::kInvalid:
      return from_validation(refusal.message);
    case engine::SubmitError::kContextLengthExceeded:
      return context_length_exceeded(refusal.message);
    case engine::SubmitError::kQueueFull:
      return queue_full(
          refusal.message.empty() ? "The server is busy; retry later" : refusal.message,
          retry_after_seconds);
    case engine::SubmitError::kUnavailable:
      return unavailable(refusal.message.empty() ? "The model is not available" : refusal.message);
  }
  return internal_error("unknown submit refusal");
}

ApiError from_validation(std::string message) {
  // The field name: the leading run of [a-z_] when followed by ' ' or ':'.
  size_t n = 0;
  while (n < message.size() && ((message[n] >= 'a' && message[n] <= 'z') || message[n] == '_')) ++n;
  std::optional<std::string> param;
  if (n > 0 && n < message.size() && (message[n] == ' ' || message[n] == ':'))
    param = message.substr(0, n);
  return invalid_request(std::move(message), std::move(param));
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}
std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace kiln::server
