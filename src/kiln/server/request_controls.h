// Request controls: one set of rules for every API surface, as pure functions.
//  - The output length has three names: max_tokens (chat, completions, Anthropic),
//    max_completion_tokens (chat's newer name), max_output_tokens (Responses). They are one
//    control: a body may use any of them; two with different values is a 400.
//  - kiln serve --max-tokens is the default when a request names none (else the surface's
//    own default: what the context leaves for chat, 16 for completions); --max-tokens-cap
//    refuses (400 naming the field) a request asking for more, never clamping it silently.
//  - The thinking budget (Anthropic thinking.budget_tokens, or --max-thinking-tokens)
//    always leaves room for the answer: at most max_tokens - 1.
//  - The reasoning effort (chat's reasoning_effort, Responses' reasoning.effort) reaches the
//    chat template as the variable reasoning_effort (templates such as gpt-oss's read it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "kiln/server/errors.h"

namespace kiln::server {

struct TokenLimits {
  std::optional<int32_t> default_max_tokens;   // kiln serve --max-tokens
  std::optional<int32_t> max_tokens_cap;       // kiln serve --max-tokens-cap
  std::optional<int32_t> max_thinking_tokens;  // kiln serve --max-thinking-tokens
};

struct MaxTokensAsked {
  std::optional<int32_t> value;  // unset: the request names no length
  std::string field;             // the name it used ("max_completion_tokens")
};

// Reads max_tokens / max_completion_tokens / max_output_tokens (integers >= 1).
std::variant<MaxTokensAsked, ApiError> read_max_tokens_fields(const nlohmann::ordered_json& body);

struct MaxTokens {
  std::optional<int32_t> value;  // unset: whatever the context leaves
  // The request asked for `value`: a prompt + value beyond the context is a 400. A default
  // (the server's or the surface's) is bounded by the context instead.
  bool asked = false;
};

// The request's output length: what it asked (400 above the cap), else the server's
// default, else `surface_default`, either bounded by the cap.
std::variant<MaxTokens, ApiError> resolve_max_tokens(const MaxTokensAsked& asked,
                                                     const TokenLimits& limits,
                                                     std::optional<int32_t> surface_default);

// The thinking budget of a request: its own, else the server's; never more than
// max_tokens - 1, so that the answer has at least one token. nullopt: unbounded.
std::optional<int32_t> thinking_budget(std::optional<int32_t> asked, const TokenLimits& limits,
                                       int32_t max_tokens);

// `effort` (the value of `field`, absent: null) must be one of none, minimal, low, medium,
// high, xhigh; returns it, or nullopt when absent.
std::variant<std::optional<std::string>, ApiError> read_reasoning_effort(
    const nlohmann::ordered_json& effort, const std::string& field);

}  // namespace kiln::server
