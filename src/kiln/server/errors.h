// API errors and the one place that maps them to HTTP. Every handler reports failure as an
// ApiError; the router writes it in OpenAI's envelope:
//   {"error":{"message":"...","type":"invalid_request_error","param":"top_p","code":null}}
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kiln/engine/api.h"

namespace kiln::server {

struct ApiError {
  int status = 400;                  // HTTP status
  std::string type;                  // OpenAI error type ("invalid_request_error", ...)
  std::optional<std::string> code;   // machine-readable code, null when absent
  std::optional<std::string> param;  // the request field at fault, null when none
  std::string message;               // for a human: what and why
  int retry_after_seconds = 0;       // > 0: a Retry-After header (429, 503)
};

// The envelope body of an error.
nlohmann::json error_envelope(const ApiError& e);
// The same serialized (never throws: invalid UTF-8 is replaced).
std::string error_body(const ApiError& e);

// Constructors for each kind of error the server answers. The HTTP status and type of each
// kind are defined here and nowhere else.
ApiError invalid_request(std::string message, std::optional<std::string> param = std::nullopt);
ApiError invalid_json(std::string_view parser_message);  // malformed JSON body -> 400
ApiError context_length_exceeded(std::string message);   // 400, code context_length_exceeded
ApiError model_not_found(std::string_view model);        // 404, code model_not_found
ApiError not_found(std::string_view path);               // unknown route -> 404
ApiError method_not_allowed(std::string_view method, std::string_view path);  // 405
ApiError unauthorized();                                            // 401, code invalid_api_key
ApiError payload_too_large(size_t limit_bytes);                     // 413
ApiError queue_full(std::string message, int retry_after_seconds);  // 429
ApiError unavailable(std::string message);                          // 503
ApiError internal_error(std::string message);                       // 500
ApiError not_supported(std::string message, std::string param);     // 400 for a known gap

// A refusal of EngineApi::submit -> its HTTP error.
ApiError from_refusal(const engine::SubmitRefusal& refusal, int retry_after_seconds);

// A validation message of engine/sampler.cpp or engine/stop.cpp starts with the field name
// ("top_p must be in (0, 1]", "stop: ..."): that name becomes the error's param.
ApiError from_validation(std::string message);

// Serializes JSON for the wire; never throws (invalid UTF-8 becomes U+FFFD).
std::string dump_json(const nlohmann::json& j);
std::string dump_json(const nlohmann::ordered_json& j);

}  // namespace kiln::server
