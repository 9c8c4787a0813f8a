#include "kiln/server/errors.h"

#include <fmt/format.h>

namespace kiln::server {

namespace {
ApiError make(int status, std::string type, std::optional<std::string> code,
              std::optional<std::string> param, std::string message) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.code = std::move(code);
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}
}  // namespace

nlohmann::json error_envelope(const ApiError& e) {
  nlohmann::json inner = nlohmann::json::object();
  inner["message"] = e.message;
  inner["type"] = e.type;
  inner["param"] = e.param ? nlohmann::json(*e.param) : nlohmann::json(nullptr);
  inner["code"] = e.code ? nlohmann::json(*e.code) : nlohmann::json(nullptr);
  return nlohmann::json{{"error", inner}};
}

std::string error_body(const ApiError& e) {
  return dump_json(error_envelope(e));
}

ApiError invalid_request(std::string message, std::optional<std::string> param) {
  return make(400, "invalid_request_error", std::nullopt, std::move(param), std::move(message));
}

ApiError invalid_json(std::string_view parser_message) {
  return make(400, "invalid_request_error", std::nullopt, std::nullopt,
              fmt::format("The request body is not valid JSON: {}", parser_message));
}

ApiError context_length_exceeded(std::string message) {
  return make(400, "invalid_request_error", "context_length_exceeded", "messages",
              std::move(message));
}

ApiError model_not_found(std::string_view model) {
  return make(404, "invalid_request_error", "model_not_found", "model",
              fmt::format("The model `{}` does not exist or you do not have access to it.", model));
}

ApiError not_found(std::string_view path) {
  return make(404, "invalid_request_error", "not_found", std::nullopt,
              fmt::format("Unknown path: {}", path));
}

ApiError method_not_allowed(std::string_view method, std::string_view path) {
  return make(405, "invalid_request_error", "method_not_allowed", std::nullopt,
              fmt::format("Method {} is not allowed on {}", method, path));
}

ApiError unauthorized() {
  return make(401, "invalid_request_error", "invalid_api_key", std::nullopt,
              "Incorrect API key provided. Pass it as 'Authorization: Bearer <key>'.");
}

ApiError payload_too_large(size_t limit_bytes) {
  return make(413, "invalid_request_error", "payload_too_large", std::nullopt,
              fmt::format("The request body exceeds the limit of {} bytes", limit_bytes));
}

ApiError queue_full(std::string message, int retry_after_seconds) {
  ApiError e =
      make(429, "rate_limit_error", "rate_limit_exceeded", std::nullopt, std::move(message));
  e.retry_after_seconds = retry_after_seconds;
  return e;
}

ApiError unavailable(std::string message) {
  return make(503, "service_unavailable_error", "service_unavailable", std::nullopt,
              std::move(message));
}

ApiError internal_error(std::string message) {
  return make(500, "server_error", "internal_error", std::nullopt, std::move(message));
}

ApiError not_supported(std::string message, std::string param) {
  return make(400, "invalid_request_error", "not_supported", std::move(param), std::move(message));
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
