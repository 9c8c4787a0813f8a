#include "kiln/server/request_controls.h"

#include <cmath>

#include <fmt/format.h>

namespace kiln::server {

std::variant<MaxTokensAsked, ApiError> read_max_tokens_fields(const nlohmann::ordered_json& body) {
  MaxTokensAsked out;
  for (const char* key : {"max_tokens", "max_completion_tokens", "max_output_tokens"}) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) continue;
    bool integral = it->is_number_integer();
    if (!integral && it->is_number_float()) {
      const double d = it->get<double>();
      integral = std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15;
    }
    if (!integral) return invalid_request(fmt::format("'{}' must be an integer", key), key);
    const double v =
        it->is_number_unsigned() ? static_cast<double>(it->get<uint64_t>()) : it->get<double>();
    if (v < 1 || v > INT32_MAX)
      return invalid_request(
          fmt::format("'{}' must be in [1, {}], got {}", key, INT32_MAX, it->dump()), key);
    const int32_t value = static_cast<int32_t>(v);
    if (out.value && *out.value != value)
      return invalid_request(fmt::format("'{}' ({}) and '{}' ({}) name the same limit with "
                                         "different values; send one",
                                         out.field, *out.value, key, value),
                             key);
    out.value = value;
    out.field = key;
  }
  return out;
}

std::variant<MaxTokens, ApiError> resolve_max_tokens(const MaxTokensAsked& asked,
                                                     const TokenLimits& limits,
                                                     std::optional<int32_t> surface_default) {
  if (asked.value) {
    if (limits.max_tokens_cap && *asked.value > *limits.max_tokens_cap)
      return invalid_request(
          fmt::format("'{}' is {}; this server generates at most {} tokens per request "
                      "(kiln serve --max-tokens-cap)",
                      asked.field, *asked.value, *limits.max_tokens_cap),
          asked.field);
    return MaxTokens{asked.value, true};
  }
  std::optional<int32_t> v =
      limits.default_max_tokens ? limits.default_max_tokens : surface_default;
  if (v && limits.max_tokens_cap) v = std::min(*v, *limits.max_tokens_cap);
  if (!v) v = limits.max_tokens_cap;  // the context's rest, capped
  return MaxTokens{v, false};
}

std::optional<int32_t> thinking_budget(std::optional<int32_t> asked, const TokenLimits& limits,
                                       int32_t max_tokens) {
  std::optional<int32_t> budget = asked ? asked : limits.max_thinking_tokens;
  if (!budget) return std::nullopt;
  return std::max(0, std::min(*budget, max_tokens - 1));
}

std::variant<std::optional<std::string>, ApiError> read_reasoning_effort(
    const nlohmann::ordered_json& effort, const std::string& field) {
  if (effort.is_null()) return std::optional<std::string>();
  // xhigh: OpenAI's newest level (Codex sends it).
  static constexpr const char* kEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
  if (effort.is_string())
    for (const char* e : kEfforts)
      if (effort == e) return std::optional<std::string>(e);
  return invalid_request(
      fmt::format("'{}' must be one of none, minimal, low, medium, high, xhigh", field), field);
}

}  // namespace kiln::server
