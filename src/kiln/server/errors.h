// API errors and the one place that maps them to HTTP. Every handler reports failure as an
// ApiError: a neutral kind (what went wrong) with a message, the request field at fault and
// a machine-readable code. Each API surface writes it in its own envelope (ErrorStyle):
//   OpenAI: {"error":{"message":"...","type":"invalid_request_error","param":"top_p","code":null}}
//   Anthropic: {"type":"error","error":{"type":"invalid_request_error","message":"..."}}
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kiln/engine/api.h"

namespace kiln::server {

// What went wrong, independent of any API's vocabulary. The HTTP status and the type string
// of each surface follow from the kind (error_status, error_envelope).
enum class ErrorKind {
  kInvalidRequest,   // 400 (404/405 for unknown routes carry their own status)
  kAuthentication,   // 401
  kNotFound,         // 404
  kPayloadTooLarge,  // 413
  kRateLimited,      // 429 (the queue is full)
  kUnavailable,      // 503 (loading, shutting down, cancelled by the server)
  kInternal,         // 500
};

// The envelope an error is written in: the surface of the route that answers.
enum class ErrorStyle { kOpenAI, kAnthropic };

struct ApiError {
  int status = 400;  // HTTP status (OpenAI's; see error_status for others)
  ErrorKind kind = ErrorKind::kInvalidRequest;
  std::optional<std::string> code;   // machine-readable code, null when absent
  std::optional<std::string> param;  // the request field at fault, null when none
  std::string message;               // for a human: what and why
  int retry_after_seconds = 0;       // > 0: a Retry-After header (429, 503)
};

// The error type string of a surface ("invalid_request_error", "overloaded_error", ...).
std::string_view error_type(const ApiError& e, ErrorStyle style = ErrorStyle::kOpenAI);
// The HTTP status in a surface: Anthropic answers 529 (overloaded) where OpenAI answers
// 429 or 503.
int error_status(const ApiError& e, ErrorStyle style = ErrorStyle::kOpenAI);
// The envelope body of an error.
nlohmann::json error_envelope(const ApiError& e, ErrorStyle style = ErrorStyle::kOpenAI);
// The same serialized (never throws: invalid UTF-8 is replaced).
std::string error_body(const ApiError& e, ErrorStyle style = ErrorStyle::kOpenAI);

// Constructors for each kind of error the server answers. The HTTP status and kind of each
// are defined here and nowhere else.
ApiError invalid_request(std::string message, std::optional<std::string> param = std::nullopt);
ApiError invalid_json(std::string_view parser_message);  // malformed JSON body -> 400
// 400, code context_length_exceeded; the one wording of the check (check_context_length).
ApiError context_length_exceeded(std::string message);
ApiError model_not_found(std::string_view model);  // 404, code model_not_found
ApiError not_found(std::string_view path);         // unknown route -> 404
// 404 for an unknown resource named in the request (a stored response's id), with its code
// ("previous_response_not_found") and the field that named it.
ApiError resource_not_found(std::string message, std::string code,
                            std::optional<std::string> param = std::nullopt);
ApiError method_not_allowed(std::string_view method, std::string_view path);  // 405
ApiError unauthorized();                                            // 401, code invalid_api_key
ApiError payload_too_large(size_t limit_bytes);                     // 413
ApiError queue_full(std::string message, int retry_after_seconds);  // 429
ApiError unavailable(std::string message);                          // 503
ApiError internal_error(std::string message);                       // 500
ApiError not_supported(std::string message, std::string param);     // 400 for a known gap

// The context check every surface makes once the prompt is tokenized: the prompt plus the
// tokens asked for (at least one) must fit in n_ctx. `max_tokens` unset: the prompt alone.
std::optional<ApiError> check_context_length(int64_t n_ctx, int64_t num_prompt_tokens,
                                             std::optional<int64_t> max_tokens);

// A refusal of EngineApi::submit -> its HTTP error.
ApiError from_refusal(const engine::SubmitRefusal& refusal, int retry_after_seconds);

// A validation message of engine/sampler.cpp or engine/stop.cpp starts with the field name
// ("top_p must be in (0, 1]", "stop: ..."): that name becomes the error's param.
ApiError from_validation(std::string message);

// Serializes JSON for the wire; never throws (invalid UTF-8 becomes U+FFFD).
std::string dump_json(const nlohmann::json& j);
std::string dump_json(const nlohmann::ordered_json& j);

}  // namespace kiln::server
