// The transport and the cross-cutting parts: health, models, errors and their envelope,
// auth, X-Request-Id, keep-alive, body limit, malformed HTTP, client disconnect, graceful
// shutdown, metrics, tokenize.
#include <random>
#include <thread>

#include "kiln/server/router.h"
#include "unit/server/test_util.h"

namespace kiln::server::testing {
namespace {

using engine::EngineState;
using engine::FinishReason;
using std::chrono::milliseconds;

class HttpTest : public ServerTest {};

void expect_envelope(const Reply& r, int status, const std::string& type) {
  EXPECT_EQ(r.status, status) << r.body;
  json j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.body;
  ASSERT_TRUE(j.contains("error")) << r.body;
  EXPECT_EQ(j["error"]["type"], type);
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"].contains("param"));
  EXPECT_TRUE(j["error"].contains("code"));
}

TEST_F(HttpTest, HealthFollowsEngineState) {
  engine_.set_state(EngineState::kLoading);
  start();
  Reply r = get("/health");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.js(), (json{{"status", "loading"}}));
  // Requests are refused with 503 while loading.
  expect_envelope(post("/v1/chat/completions", chat_body()), 503, "service_unavailable_error");
  engine_.set_state(EngineState::kReady);
  r = get("/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.js(), (json{{"status", "ok"}}));
  engine::EngineStats stuck;
  stuck.seconds_since_heartbeat = 1e6;
  engine_.set_stats(stuck);
  EXPECT_EQ(get("/health").status, 503);
  engine_.set_stats({});
  engine_.set_state(EngineState::kFailed);
  EXPECT_EQ(get("/health").status, 503);
  EXPECT_EQ(get("/health").js()["status"], "error");
}

TEST_F(HttpTest, Models) {
  start();
  json j = get("/v1/models").js();
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "test-model");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["owned_by"], "kiln");
  EXPECT_EQ(get("/v1/models/test-model").js()["id"], "test-model");
  Reply r = get("/v1/models/other");
  expect_envelope(r, 404, "invalid_request_error");
  EXPECT_EQ(r.js()["error"]["code"], "model_not_found");
}

TEST_F(HttpTest, ErrorsMapToStatusAndEnvelope) {
  start();
  Reply r = post_raw("/v1/chat/completions", "{\"messages\": [");
  expect_envelope(r, 400, "invalid_request_error");
  r = post_raw("/v1/chat/completions", std::string(100000, '['));
  expect_envelope(r, 400, "invalid_request_error");

  json body = chat_body();
  body["model"] = "gpt-4";
  r = post("/v1/chat/completions", body);
  expect_envelope(r, 404, "invalid_request_error");
  EXPECT_EQ(r.js()["error"]["code"], "model_not_found");

  for (auto [param, value] : std::vector<std::pair<std::string, json>>{{"temperature", -1},
                                                                       {"top_p", 0},
                                                                       {"top_p", "x"},
                                                                       {"n", 0},
                                                                       {"max_tokens", 0},
                                                                       {"presence_penalty", 3},
                                                                       {"min_p", 2},
                                                                       {"top_logprobs", 3},
                                                                       {"stop", 5},
                                                                       {"logit_bias", {{"abc", 1}}},
                                                                       {"messages", json::array()},
                                                                       {"tools", 1}}) {
    body = chat_body();
    body[param] = value;
    r = post("/v1/chat/completions", body);
    expect_envelope(r, 400, "invalid_request_error");
    EXPECT_EQ(r.js()["error"]["param"], param) << r.body;
  }
  body = chat_body();
  body["response_format"] = {{"type", "yaml"}};
  r = post("/v1/chat/completions", body);
  expect_envelope(r, 400, "invalid_request_error");
  EXPECT_EQ(r.js()["error"]["param"], "response_format");
  // json_object and json_schema compile to a grammar (tests/e2e/grammar_serve_test.mjs).
  body["response_format"] = {{"type", "json_object"}};
  EXPECT_EQ(post("/v1/chat/completions", body).status, 200);
  body["response_format"] = {{"type", "text"}};
  EXPECT_EQ(post("/v1/chat/completions", body).status, 200);

  // Context: a prompt plus max_tokens beyond the engine's context.
  body = chat_body();
  body["max_tokens"] = 5000;
  r = post("/v1/chat/completions", body);
  expect_envelope(r, 400, "invalid_request_error");
  EXPECT_EQ(r.js()["error"]["code"], "context_length_exceeded");
  // ... and the engine's own refusal maps the same way.
  engine_.refuse_next(engine::SubmitError::kContextLengthExceeded, "too long");
  r = post("/v1/chat/completions", chat_body());
  EXPECT_EQ(r.js()["error"]["code"], "context_length_exceeded");

  engine_.refuse_next(engine::SubmitError::kQueueFull, "queue full");
  r = post("/v1/chat/completions", chat_body());
  expect_envelope(r, 429, "rate_limit_error");
  EXPECT_EQ(r.header("retry-after"), "1");

  engine_.refuse_next(engine::SubmitError::kInvalid, "top_k must be >= 0");
  r = post("/v1/chat/completions", chat_body());
  EXPECT_EQ(r.js()["error"]["param"], "top_k");
  engine_.refuse_next(engine::SubmitError::kUnavailable, "stopping");
  EXPECT_EQ(post("/v1/chat/completions", chat_body()).status, 503);

  expect_envelope(get("/v1/nothing"), 404, "invalid_request_error");
  expect_envelope(get("/v1/chat/completions"), 405, "invalid_request_error");
}

TEST_F(HttpTest, ApiKey) {
  ServerOptions opts;
  opts.api_key = "sekret";
  start(opts);
  Reply r = post("/v1/chat/completions", chat_body());
  expect_envelope(r, 401, "invalid_request_error");
  EXPECT_EQ(r.js()["error"]["code"], "invalid_api_key");
  EXPECT_EQ(post("/v1/chat/completions", chat_body(), {{"Authorization", "Bearer wrong!"}}).status,
            401);
  EXPECT_EQ(post("/v1/chat/completions", chat_body(), {{"Authorization", "Bearer sekre"}}).status,
            401);
  EXPECT_EQ(post("/v1/chat/completions", chat_body(), {{"Authorization", "Bearer sekret"}}).status,
            200);
  EXPECT_EQ(get("/health").status, 200);  // public
  EXPECT_TRUE(constant_time_equal("abc", "abc"));
  EXPECT_FALSE(constant_time_equal("abd", "abc"));
  EXPECT_FALSE(constant_time_equal("abcd", "abc"));
  EXPECT_FALSE(constant_time_equal("", "abc"));
}

TEST_F(HttpTest, RequestIdEchoedAndGenerated) {
  start();
  Reply r = post("/v1/chat/completions", chat_body(), {{"X-Request-Id", "my-id-42"}});
  EXPECT_EQ(r.header("x-request-id"), "my-id-42");
  EXPECT_EQ(engine_.requests().at(0).request_id, "my-id-42");
  r = get("/v1/models");
  EXPECT_EQ(r.header("x-request-id").rfind("req-", 0), 0u);
  EXPECT_GT(r.header("x-request-id").size(), 10u);
}

TEST_F(HttpTest, KeepAliveServesManyRequestsOnOneConnection) {
  start();
  Client c(port_);
  for (int i = 0; i < 3; ++i) {
    Reply r = c.request("POST", "/v1/chat/completions", chat_body().dump());
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.js()["choices"][0]["message"]["content"], "Hello world");
    r = c.request("GET", "/health");
    EXPECT_EQ(r.status, 200);
  }
  EXPECT_EQ(server_->num_connections(), 1);
}

TEST_F(HttpTest, BodyTooLarge) {
  ServerOptions opts;
  opts.max_body_bytes = 1000;
  start(opts);
  Reply r = post_raw("/v1/chat/completions", std::string(5000, ' '));
  expect_envelope(r, 413, "invalid_request_error");
  EXPECT_EQ(post("/v1/chat/completions", chat_body()).status, 200);  // still serving
}

std::string raw_exchange(uint16_t port, const std::string& bytes, bool half_close) {
  net::io_context ioc;
  tcp::socket s(ioc);
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  net::write(s, net::buffer(bytes));
  if (half_close) s.shutdown(tcp::socket::shutdown_send);
  std::string out;
  beast::error_code ec;
  char buf[4096];
  for (;;) {
    size_t n = s.read_some(net::buffer(buf), ec);
    if (ec) break;
    out.append(buf, n);
  }
  return out;
}

TEST_F(HttpTest, MalformedHttpDoesNotCrash) {
  start();
  std::string out = raw_exchange(port_, "\x16\x03\x01garbage\r\n\r\n", false);
  EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << out;
  // A truncated header: closed, or a 400 when the parser saw the bad field before the EOF
  // (depends on how the bytes and the FIN arrive); never a 200, never a crash.
  out = raw_exchange(port_, "GET /health HTTP/1.1\r\nHost: x\r\nX-Trunc", true);
  EXPECT_TRUE(out.empty() || out.rfind("HTTP/1.1 400", 0) == 0) << out;
  out =
      raw_exchange(port_, "POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"pr", true);
  EXPECT_EQ(out, "");
  out = raw_exchange(port_, "GET /health HTTP/1.1\r\nContent-Length: zz\r\n\r\n", false);
  EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << out;
  std::string huge_header =
      "GET /health HTTP/1.1\r\nX-Big: " + std::string(100000, 'a') + "\r\n\r\n";
  out = raw_exchange(port_, huge_header, false);
  EXPECT_EQ(out.rfind("HTTP/1.1 431", 0), 0u) << out.substr(0, 40);
  // A chunked request body is accepted.
  out = raw_exchange(port_,
                     "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     "Connection: close\r\n\r\n"
                     "5\r\n{\"con\r\n10\r\ntent\": \"hello\"} \r\n0\r\n\r\n",
                     false);
  EXPECT_EQ(out.rfind("HTTP/1.1 200", 0), 0u) << out;
  EXPECT_EQ(get("/health").status, 200);
}

TEST_F(HttpTest, RandomGarbageDoesNotCrash) {
  start();
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) {
    std::string bytes;
    if (i % 2 == 0) bytes = "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 40\r\n";
    const size_t n = 1 + rng() % 300;
    for (size_t k = 0; k < n; ++k) bytes.push_back(static_cast<char>(rng() % 256));
    const std::string out = raw_exchange(port_, bytes, true);
    EXPECT_TRUE(out.empty() || out.rfind("HTTP/1.1 ", 0) == 0) << out.substr(0, 60);
  }
  // Valid HTTP carrying hostile JSON.
  for (const char* body : {"null", "[]", "{\"messages\": 5}", "{\"messages\": [{}]}",
                           "{\"messages\": [{\"role\": \"user\", \"content\": {}}]}",
                           "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}",
                           "{\"prompt\": [[1, 2], 3]}", "\xff\xfe"}) {
    Reply r = post_raw("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
    r = post_raw("/v1/completions", body);
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
  }
  EXPECT_EQ(get("/health").status, 200);
}

TEST_F(HttpTest, HeaderAndIdleTimeoutsClose) {
  ServerOptions opts;
  opts.header_timeout = milliseconds(200);
  opts.idle_timeout = milliseconds(200);
  start(opts);
  const auto t0 = std::chrono::steady_clock::now();
  // A header that never ends: closed after header_timeout, without a response.
  EXPECT_EQ(raw_exchange(port_, "GET /health HTTP/1.1\r\nHost: x\r\n", false), "");
  // An idle keep-alive connection: closed after idle_timeout.
  EXPECT_EQ(raw_exchange(port_, "", false), "");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(get("/health").status, 200);
}

TEST_F(HttpTest, CorsAndRequestTimeout) {
  ServerOptions opts;
  opts.cors = true;
  opts.request_timeout = std::chrono::seconds(30);
  start(opts);
  Reply r = Client(port_).request("OPTIONS", "/v1/chat/completions");
  EXPECT_EQ(r.status, 204);
  EXPECT_EQ(r.header("access-control-allow-origin"), "*");
  EXPECT_EQ(get("/v1/models").header("access-control-allow-origin"), "*");
  const auto before = std::chrono::steady_clock::now();
  ASSERT_EQ(post("/v1/chat/completions", chat_body()).status, 200);
  auto deadline = engine_.requests().at(0).deadline;
  ASSERT_TRUE(deadline.has_value());
  EXPECT_GE(*deadline, before + std::chrono::seconds(29));
  EXPECT_LE(*deadline, std::chrono::steady_clock::now() + std::chrono::seconds(30));
}

TEST_F(HttpTest, ClientDisconnectCancelsGeneration) {
  engine_.set_default_script(
      Script{std::vector<std::string>(2000, "tok "), FinishReason::kStop, "", 0, milliseconds(2)});
  start();
  {
    net::io_context ioc;
    tcp::socket s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
    json body = chat_body();
    body["stream"] = true;
    const std::string b = body.dump();
    const std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                            std::to_string(b.size()) + "\r\n\r\n" + b;
    net::write(s, net::buffer(req));
    char buf[2048];
    size_t got = 0;
    while (got < 1000) got += s.read_some(net::buffer(buf));  // the stream is flowing
  }                                                           // the client goes away
  for (int i = 0; i < 300 && engine_.num_cancelled() == 0; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(engine_.num_cancelled(), 1);
}

TEST_F(HttpTest, GracefulShutdownLetsInFlightStreamsFinish) {
  engine_.set_default_script(
      Script{std::vector<std::string>(20, "x"), FinishReason::kStop, "", 0, milliseconds(10)});
  start();
  json body = chat_body();
  body["stream"] = true;
  Reply reply;
  std::thread client([&] { reply = post("/v1/chat/completions", body); });
  while (engine_.requests().empty()) std::this_thread::sleep_for(milliseconds(5));
  Client idle(port_);  // an idle keep-alive connection is closed by the drain
  server_->shutdown(milliseconds(5000));
  client.join();
  EXPECT_EQ(reply.status, 200);
  auto events = sse_events(reply.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(engine_.num_cancelled(), 0);
  EXPECT_EQ(server_->num_connections(), 0);
  // No longer accepting.
  net::io_context ioc;
  tcp::socket s(ioc);
  beast::error_code ec;
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_), ec);
  EXPECT_TRUE(ec);
}

TEST_F(HttpTest, ShutdownCutsStreamsAfterDrainTimeout) {
  engine_.set_default_script(
      Script{std::vector<std::string>(5000, "x"), FinishReason::kStop, "", 0, milliseconds(2)});
  start();
  json body = chat_body();
  body["stream"] = true;
  Reply reply;
  std::thread client([&] { reply = post("/v1/chat/completions", body); });
  while (engine_.requests().empty()) std::this_thread::sleep_for(milliseconds(5));
  std::this_thread::sleep_for(milliseconds(50));
  server_->shutdown(milliseconds(100));
  client.join();
  auto events = sse_events(reply.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_TRUE(json::parse(events[events.size() - 2]).contains("error"));
  for (int i = 0; i < 300 && engine_.num_cancelled() == 0; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(engine_.num_cancelled(), 1);
}

TEST_F(HttpTest, MetricsText) {
  start();
  engine::EngineStats stats;
  stats.num_running = 2;
  stats.num_waiting = 5;
  stats.num_kv_blocks_used = 7;
  stats.num_kv_blocks_total = 64;
  stats.num_prefix_hit_tokens = 32;
  stats.num_prefix_queried_tokens = 48;
  stats.num_preemptions = 1;
  stats.num_state_slots_used = 3;
  stats.num_state_saves = 4;
  stats.num_state_restores = 2;
  stats.step_schedule_seconds = 0.25;
  stats.step_launch_seconds = 1.5;
  stats.step_wait_seconds = 3;
  stats.step_update_seconds = 0.75;
  stats.step_deliver_seconds = 0.125;
  engine_.set_stats(stats);
  ASSERT_EQ(post("/v1/chat/completions", chat_body()).status, 200);
  ASSERT_EQ(get("/v1/nowhere").status, 404);
  // Requests are counted once their response is complete, which the server thread records
  // just after the client has read it: poll briefly for the counts.
  Reply r = get("/metrics");
  auto counted = [](const std::string& m) {
    return m.find("kiln_http_requests_total{status=\"404\"} 1\n") != std::string::npos &&
           m.find("kiln_http_requests_total{status=\"200\"} ") != std::string::npos;
  };
  for (int i = 0; i < 100 && !counted(r.body); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    r = get("/metrics");
  }
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type").rfind("text/plain; version=0.0.4", 0), 0u);
  const std::string& m = r.body;
  for (const char* line : {"kiln_http_requests_total{status=\"404\"} 1\n",
                           "kiln_generation_tokens_total 2\n",
                           "kiln_time_to_first_token_seconds_count 1\n",
                           "kiln_inter_token_latency_seconds_count 1\n",
                           "kiln_num_requests_running 2\n",
                           "kiln_num_requests_waiting 5\n",
                           "kiln_kv_blocks_used 7\n",
                           "kiln_kv_blocks_total 64\n",
                           "kiln_prefix_cache_hit_tokens_total 32\n",
                           "kiln_prefix_cache_queried_tokens_total 48\n",
                           "kiln_preemptions_total 1\n",
                           "kiln_state_slots_used 3\n",
                           "kiln_state_snapshot_saves_total 4\n",
                           "kiln_state_snapshot_restores_total 2\n",
                           "kiln_engine_step_seconds_total{phase=\"schedule\"} 0.25\n",
                           "kiln_engine_step_seconds_total{phase=\"launch\"} 1.5\n",
                           "kiln_engine_step_seconds_total{phase=\"wait\"} 3\n",
                           "kiln_engine_step_seconds_total{phase=\"update\"} 0.75\n",
                           "kiln_engine_step_seconds_total{phase=\"deliver\"} 0.125\n",
                           "# TYPE kiln_time_to_first_token_seconds histogram\n",
                           "kiln_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1\n"})
    EXPECT_NE(m.find(line), std::string::npos) << line << "\n" << m;
  // 200s: the chat request plus the /metrics polls already recorded (1 + 0..polls).
  const std::string key = "kiln_http_requests_total{status=\"200\"} ";
  const size_t at = m.find(key);
  ASSERT_NE(at, std::string::npos) << m;
  EXPECT_GE(std::stoi(m.substr(at + key.size())), 1) << m;
}

TEST_F(HttpTest, TokenizeDetokenize) {
  start();
  const auto& tok = qwen3_tokenizer();
  Reply r = post("/tokenize", {{"content", "Hello world<|im_end|>"}});
  ASSERT_EQ(r.status, 200) << r.body;
  auto want = tok.encode("Hello world<|im_end|>", false, true);
  EXPECT_EQ(r.js()["tokens"].get<std::vector<int32_t>>(), *want);
  r = post("/tokenize", {{"content", "Hi"}, {"with_pieces", true}});
  EXPECT_EQ(r.js()["tokens"][0]["piece"], "Hi");
  r = post("/detokenize", {{"tokens", *want}});
  EXPECT_EQ(r.js()["content"], "Hello world<|im_end|>");
  EXPECT_EQ(post("/detokenize", {{"tokens", {-1}}}).js()["error"]["param"], "tokens");
  EXPECT_EQ(post("/tokenize", {{"content", 5}}).js()["error"]["param"], "content");
}

TEST(RouterTest, PathParams) {
  EXPECT_EQ(Router::path_param("/v1/models/{id}", "/v1/models/abc", "id"), "abc");
  EXPECT_EQ(Router::path_param("/v1/models/{id}", "/v1/models", "id"), "");
}

TEST(ErrorsTest, FromValidationNamesTheField) {
  EXPECT_EQ(from_validation("top_p must be in (0, 1], got 0").param, "top_p");
  EXPECT_EQ(from_validation("logit_bias: token id 5 is out of range").param, "logit_bias");
  EXPECT_FALSE(from_validation("Something else").param.has_value());
  json env = error_envelope(queue_full("busy", 3));
  EXPECT_EQ(env, (json{{"error",
                        {{"message", "busy"},
                         {"type", "rate_limit_error"},
                         {"param", nullptr},
                         {"code", "rate_limit_exceeded"}}}}));
}

}  // namespace
}  // namespace kiln::server::testing
