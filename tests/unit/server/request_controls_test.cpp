// request_controls.h: the output-length names, the server default and cap, the thinking
// budget; and the same rules through the chat, completions and Anthropic endpoints.
#include "kiln/server/request_controls.h"

#include "unit/server/test_util.h"

namespace kiln::server::testing {
namespace {

using Ordered = nlohmann::ordered_json;

MaxTokensAsked asked_ok(const json& body) {
  auto r = read_max_tokens_fields(Ordered::parse(body.dump()));
  EXPECT_TRUE(std::holds_alternative<MaxTokensAsked>(r)) << body.dump();
  return std::holds_alternative<MaxTokensAsked>(r) ? std::get<MaxTokensAsked>(r) : MaxTokensAsked{};
}

std::optional<std::string> asked_error_param(const json& body) {
  auto r = read_max_tokens_fields(Ordered::parse(body.dump()));
  if (!std::holds_alternative<ApiError>(r)) return std::nullopt;
  return std::get<ApiError>(r).param;
}

TEST(RequestControls, ThreeNamesOneControl) {
  EXPECT_FALSE(asked_ok(json::object()).value);
  for (const char* key : {"max_tokens", "max_completion_tokens", "max_output_tokens"}) {
    MaxTokensAsked a = asked_ok(json{{key, 12}});
    EXPECT_EQ(a.value, 12);
    EXPECT_EQ(a.field, key);
  }
  EXPECT_EQ(asked_ok(json{{"max_tokens", 5}, {"max_completion_tokens", 5}}).value, 5);
  EXPECT_EQ(asked_error_param(json{{"max_tokens", 5}, {"max_completion_tokens", 6}}),
            "max_completion_tokens");
  EXPECT_EQ(asked_error_param(json{{"max_output_tokens", 0}}), "max_output_tokens");
  EXPECT_EQ(asked_error_param(json{{"max_tokens", 1.5}}), "max_tokens");
  EXPECT_EQ(asked_error_param(json{{"max_tokens", "8"}}), "max_tokens");
  EXPECT_EQ(asked_error_param(json{{"max_tokens", 1e12}}), "max_tokens");
  EXPECT_EQ(asked_ok(json{{"max_tokens", 8.0}}).value, 8);
}

TEST(RequestControls, DefaultAndCap) {
  TokenLimits none;
  TokenLimits limits{100, 1000, std::nullopt};
  auto resolve = [](MaxTokensAsked a, const TokenLimits& l, std::optional<int32_t> surface) {
    return resolve_max_tokens(a, l, surface);
  };
  // Asked: as asked, a 400 above the cap naming the field.
  auto r = resolve({50, "max_tokens"}, limits, std::nullopt);
  ASSERT_TRUE(std::holds_alternative<MaxTokens>(r));
  EXPECT_EQ(std::get<MaxTokens>(r).value, 50);
  EXPECT_TRUE(std::get<MaxTokens>(r).asked);
  r = resolve({1001, "max_output_tokens"}, limits, std::nullopt);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).param, "max_output_tokens");
  EXPECT_NE(std::get<ApiError>(r).message.find("--max-tokens-cap"), std::string::npos);
  // Not asked: the server's default, else the surface's, else the cap, else unbounded.
  r = resolve({}, limits, 16);
  EXPECT_EQ(std::get<MaxTokens>(r).value, 100);
  EXPECT_FALSE(std::get<MaxTokens>(r).asked);
  r = resolve({}, none, 16);
  EXPECT_EQ(std::get<MaxTokens>(r).value, 16);
  r = resolve({}, TokenLimits{std::nullopt, 64, std::nullopt}, std::nullopt);
  EXPECT_EQ(std::get<MaxTokens>(r).value, 64);
  r = resolve({}, none, std::nullopt);
  EXPECT_FALSE(std::get<MaxTokens>(r).value);
}

TEST(RequestControls, ThinkingBudgetLeavesRoomForTheAnswer) {
  TokenLimits limits{std::nullopt, std::nullopt, 500};
  EXPECT_EQ(thinking_budget(std::nullopt, TokenLimits{}, 100), std::nullopt);
  EXPECT_EQ(thinking_budget(2048, TokenLimits{}, 4096), 2048);
  EXPECT_EQ(thinking_budget(8000, TokenLimits{}, 4096), 4095);
  EXPECT_EQ(thinking_budget(std::nullopt, limits, 4096), 500);
  EXPECT_EQ(thinking_budget(std::nullopt, limits, 100), 99);
}

TEST(RequestControls, ReasoningEffort) {
  auto read = [](const Ordered& v) { return read_reasoning_effort(v, "reasoning_effort"); };
  auto none = read(Ordered(nullptr));
  ASSERT_TRUE(std::holds_alternative<std::optional<std::string>>(none));
  EXPECT_FALSE(std::get<std::optional<std::string>>(none));
  for (const char* e : {"none", "minimal", "low", "medium", "high", "xhigh"}) {
    auto r = read(Ordered(e));
    ASSERT_TRUE(std::holds_alternative<std::optional<std::string>>(r)) << e;
    EXPECT_EQ(std::get<std::optional<std::string>>(r), e);
  }
  for (const Ordered& bad : {Ordered("extreme"), Ordered(3), Ordered::array()}) {
    auto r = read(bad);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << bad.dump();
    EXPECT_EQ(std::get<ApiError>(r).param, "reasoning_effort");
  }
}

class RequestControlsServerTest : public ServerTest {};

TEST_F(RequestControlsServerTest, ReasoningEffortReachesTheTemplate) {
  // A template that prints the variable.
  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  server_ = std::make_unique<Server>(engine_, qwen3_tokenizer(),
                                     "effort={{ reasoning_effort | default('unset') }}", o);
  auto port = server_->start();
  ASSERT_TRUE(port.ok());
  port_ = *port;
  json body = chat_body();
  body.erase("model");
  body["reasoning_effort"] = "high";
  ASSERT_EQ(post("/v1/chat/completions", body).status, 200);
  EXPECT_EQ(qwen3_tokenizer().decode(engine_.requests().back().prompt_tokens), "effort=high");
  body.erase("reasoning_effort");
  ASSERT_EQ(post("/v1/chat/completions", body).status, 200);
  EXPECT_EQ(qwen3_tokenizer().decode(engine_.requests().back().prompt_tokens), "effort=unset");
  body["reasoning_effort"] = "extreme";
  Reply r = post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.js()["error"]["param"], "reasoning_effort");
}

TEST_F(RequestControlsServerTest, SameRulesOnEverySurface) {
  ServerOptions o;
  o.token_limits = TokenLimits{20, 100, std::nullopt};
  start(o);
  // The server default reaches the engine when a request names no length.
  ASSERT_EQ(post("/v1/chat/completions", chat_body()).status, 200);
  EXPECT_EQ(engine_.requests().back().max_tokens, 20);
  ASSERT_EQ(post("/v1/completions", json{{"prompt", "Hi"}}).status, 200);
  EXPECT_EQ(engine_.requests().back().max_tokens, 20);
  // Above the cap: 400 naming the field, on each surface.
  json body = chat_body();
  body["max_completion_tokens"] = 101;
  Reply r = post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.js()["error"]["param"], "max_completion_tokens");
  r = post("/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 500}});
  EXPECT_EQ(r.status, 400);
  r = post("/v1/messages",
           json{{"max_tokens", 101}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.js()["error"]["type"], "invalid_request_error");
  // Two names with different values.
  body = chat_body();
  body["max_tokens"] = 5;
  body["max_completion_tokens"] = 6;
  r = post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.js()["error"]["param"], "max_completion_tokens");
}

TEST_F(RequestControlsServerTest, ADefaultIsBoundedByTheContextAnAskedLengthIsNot) {
  engine_.n_ctx_ = 32;
  start();
  // Completions' own default of 16 does not fail a prompt that leaves less.
  const std::string prompt = "one two three four five six seven eight nine ten eleven twelve";
  ASSERT_EQ(post("/v1/completions", json{{"prompt", prompt}}).status, 200);
  const auto req = engine_.requests().back();
  EXPECT_EQ(req.max_tokens,
            std::min<int32_t>(16, 32 - static_cast<int32_t>(req.prompt_tokens.size())));
  Reply r = post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 30}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.js()["error"]["code"], "context_length_exceeded");
}

}  // namespace
}  // namespace kiln::server::testing
