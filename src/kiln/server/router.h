// The route table: (method, path) -> handler, and what every request goes through on the way:
// X-Request-Id (echoed, or generated), the optional API key, CORS, 404/405, the mapping of
// a handler's ApiError to its HTTP response (errors.h), the access log line and the
// per-status request counter.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/server/errors.h"
#include "kiln/server/http_server.h"

namespace kiln::server {

// A complete (non-streamed) response.
struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};
// The handler wrote its response itself through the HttpExchange (a stream).
struct Streamed {};

using HandlerResult = std::variant<Response, ApiError, Streamed>;
using RouteHandler = std::function<HandlerResult(const HttpRequest&, HttpExchange&)>;

Response json_response(const nlohmann::json& body, int status = 200);
Response json_response(const nlohmann::ordered_json& body, int status = 200);

// Writes an error response (the envelope of `style`, plus Retry-After when set). The one
// place an ApiError becomes HTTP.
void write_error(HttpExchange& exchange, const ApiError& error,
                 ErrorStyle style = ErrorStyle::kOpenAI);

// Compares in time independent of where the strings differ (the API key check).
bool constant_time_equal(std::string_view a, std::string_view b);

struct RouterOptions {
  std::string api_key;  // empty: no authentication
  bool cors = false;    // Access-Control-Allow-Origin: * and OPTIONS preflights
};

class Router {
 public:
  explicit Router(RouterOptions options) : options_(std::move(options)) {}

  // `pattern` is a path whose segments may be "{name}" (matching one non-empty segment),
  // e.g. "/v1/models/{id}"; path_param() returns the matched value. Public routes skip
  // the API key (/health, /metrics). `style`: the envelope of this route's errors (also
  // of its 401 and 405).
  void add(std::string method, std::string pattern, RouteHandler handler, bool is_public = false,
           ErrorStyle style = ErrorStyle::kOpenAI);

  // Called after each request with its status (for /metrics).
  void on_complete(std::function<void(int status)> callback) { on_complete_ = std::move(callback); }

  // The HttpHandler of the server.
  void dispatch(HttpRequest& req, HttpExchange& exchange) const;

  // The value of "{name}" in `pattern` matched against `path` ("" when absent).
  static std::string path_param(std::string_view pattern, std::string_view path,
                                std::string_view name);

 private:
  struct Route {
    std::string method;
    std::string pattern;
    RouteHandler handler;
    bool is_public;
    ErrorStyle style;
  };
  static bool matches(std::string_view pattern, std::string_view path);
  bool authorized(const HttpRequest& req) const;

  RouterOptions options_;
  std::vector<Route> routes_;
  std::function<void(int)> on_complete_;
};

// A random id: prefix + `num_chars` alphanumerics ("chatcmpl-", 24).
std::string random_id(std::string_view prefix, size_t num_chars = 24);

}  // namespace kiln::server
