#include "kiln/server/router.h"

#include <chrono>
#include <exception>
#include <random>

#include "kiln/util/log.h"

namespace kiln::server {

namespace {
std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> parts;
  size_t i = 0;
  while (i < path.size()) {
    if (path[i] == '/') {
      ++i;
      continue;
    }
    const size_t j = std::min(path.find('/', i), path.size());
    parts.push_back(path.substr(i, j - i));
    i = j;
  }
  return parts;
}

bool is_param(std::string_view seg) {
  return seg.size() >= 2 && seg.front() == '{' && seg.back() == '}';
}

// X-Request-Id from the client is echoed only when short and printable (it goes in logs).
bool usable_request_id(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id)
    if (c < 0x21 || c > 0x7e) return false;
  return true;
}
}  // namespace

Response json_response(const nlohmann::json& body, int status) {
  return Response{status, "application/json", dump_json(body)};
}
Response json_response(const nlohmann::ordered_json& body, int status) {
  return Response{status, "application/json", dump_json(body)};
}

void write_error(HttpExchange& exchange, const ApiError& error, ErrorStyle style) {
  if (error.retry_after_seconds > 0)
    exchange.add_header("Retry-After", std::to_string(error.retry_after_seconds));
  if (error.status == 401) exchange.add_header("WWW-Authenticate", "Bearer");  // RFC 6750
  exchange.respond(error_status(error, style), "application/json", error_body(error, style));
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Every byte of the expected value `b` is visited whatever `a` holds.
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff = diff | (x ^ static_cast<unsigned char>(b[i]));
  }
  return diff == 0;
}

std::string random_id(std::string_view prefix, size_t num_chars) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id(prefix);
  for (size_t i = 0; i < num_chars; ++i) id.push_back(kAlphabet[rng() % (sizeof(kAlphabet) - 1)]);
  return id;
}

void Router::add(std::string method, std::string pattern, RouteHandler handler, bool is_public,
                 ErrorStyle style) {
  routes_.push_back(
      Route{std::move(method), std::move(pattern), std::move(handler), is_public, style});
}

bool Router::matches(std::string_view pattern, std::string_view path) {
  const auto p = split_path(pattern);
  const auto s = split_path(path);
  if (p.size() != s.size()) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (!is_param(p[i]) && p[i] != s[i]) return false;
  return true;
}

std::string Router::path_param(std::string_view pattern, std::string_view path,
                               std::string_view name) {
  const auto p = split_path(pattern);
  const auto s = split_path(path);
  for (size_t i = 0; i < p.size() && i < s.size(); ++i)
    if (is_param(p[i]) && p[i].substr(1, p[i].size() - 2) == name) return std::string(s[i]);
  return "";
}

bool Router::authorized(const HttpRequest& req) const {
  if (options_.api_key.empty()) return true;
  // Anthropic's clients send the key as x-api-key; any client may send either.
  if (auto key = req.header("x-api-key")) {
    std::string_view value = *key;
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    while (!value.empty() && value.back() == ' ') value.remove_suffix(1);
    if (constant_time_equal(value, options_.api_key)) return true;
  }
  auto auth = req.header("authorization");
  if (!auth) return false;
  std::string_view value = *auth;
  static constexpr std::string_view kBearer = "Bearer ";
  if (value.size() < kBearer.size()) return false;
  for (size_t i = 0; i < kBearer.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(value[i])) !=
        std::tolower(static_cast<unsigned char>(kBearer[i])))
      return false;
  value.remove_prefix(kBearer.size());
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  while (!value.empty() && value.back() == ' ') value.remove_suffix(1);
  return constant_time_equal(value, options_.api_key);
}

void Router::dispatch(HttpRequest& req, HttpExchange& exchange) const {
  const auto t0 = std::chrono::steady_clock::now();
  auto given_id = req.header("x-request-id");
  req.request_id =
      given_id && usable_request_id(*given_id) ? std::string(*given_id) : random_id("req-", 20);
  exchange.add_header("X-Request-Id", req.request_id);
  if (options_.cors) {
    exchange.add_header("Access-Control-Allow-Origin", "*");
    exchange.add_header("Access-Control-Allow-Headers",
                        "Authorization, Content-Type, X-Request-Id, X-Api-Key, "
                        "Anthropic-Version, Anthropic-Beta");
    exchange.add_header("Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS");
  }

  // HEAD is GET without the body (RFC 9110 9.3.2); the transport leaves the body out.
  const std::string_view method = req.method == "HEAD" ? std::string_view("GET") : req.method;
  const Route* route = nullptr;
  bool path_known = false;
  ErrorStyle style = ErrorStyle::kOpenAI;  // of the path's routes; OpenAI for unknown paths
  for (const Route& r : routes_) {
    if (!matches(r.pattern, req.path)) continue;
    path_known = true;
    style = r.style;
    if (r.method == method) {
      route = &r;
      break;
    }
  }

  if (options_.cors && req.method == "OPTIONS" && path_known) {
    exchange.respond(204, "", "");
  } else if (route == nullptr) {
    write_error(exchange,
                path_known ? method_not_allowed(req.method, req.path) : not_found(req.path), style);
  } else if (!route->is_public && !authorized(req)) {
    write_error(exchange, unauthorized(), style);
  } else {
    // A handler never takes the process down: anything it throws becomes a 500.
    HandlerResult result = Streamed{};
    try {
      result = route->handler(req, exchange);
    } catch (const std::exception& e) {
      result = internal_error(std::string("internal error: ") + e.what());
    } catch (...) {
      result = internal_error("internal error");
    }
    if (auto* res = std::get_if<Response>(&result)) {
      exchange.respond(res->status, res->content_type, std::move(res->body));
    } else if (auto* error = std::get_if<ApiError>(&result)) {
      if (!exchange.responded()) write_error(exchange, *error, route->style);
    }
  }

  // 499 (nginx's "client closed request"): the client left before its response was whole,
  // also when a stream had begun (its status line said 200).
  const bool client_left = exchange.responded()
                               ? exchange.client_gone()
                               : exchange.abort_reason() == AbortReason::kClientGone;
  const int status = client_left ? 499 : exchange.responded() ? exchange.status() : 500;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  log::info("[{}] {} {} {} {:.1f} ms {}", req.request_id, req.method, req.path, status, ms,
            req.remote);
  if (on_complete_) on_complete_(status);
}

}  // namespace kiln::server
