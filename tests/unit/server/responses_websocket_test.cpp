// The WebSocket mode of /v1/responses over a FakeEngine, through a real socket: the
// handshake (101 and Sec-WebSocket-Accept, or a 400 that says why), response.create turns
// whose events are the SSE stream's objects one per text message, continuation by
// previous_response_id with store: false on the same connection and its miss after a
// reconnect, error events that leave the connection open, ping/pong, the close handshake,
// and protocol violations answered with a close frame of the right code.
#include "kiln/server/responses_convert.h"
#include "kiln/server/websocket.h"
#include "unit/server/test_util.h"

namespace kiln::server::testing {
namespace {

using engine::FinishReason;
namespace ws = websocket;

// A WebSocket client on a plain socket: masked frames out (our codec), frames in decoded here.
class WsClient {
 public:
  explicit WsClient(uint16_t port, const std::string& key = "dGhlIHNhbXBsZSBub25jZQ==")
      : socket_(ioc_) {
    socket_.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    const std::string req =
        "GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " +
        key + "\r\n\r\n";
    net::write(socket_, net::buffer(req));
    net::read_until(socket_, net::dynamic_buffer(in_), "\r\n\r\n");
    const size_t end = in_.find("\r\n\r\n") + 4;
    head = in_.substr(0, end);
    in_.erase(0, end);
  }
  void send_raw(const std::string& bytes) { net::write(socket_, net::buffer(bytes)); }
  void send(ws::Opcode op, const std::string& payload, bool fin = true) {
    send_raw(ws::encode_frame(op, payload, fin, next_mask_ += 0x01020304));
  }
  void send_json(const json& j) { send(ws::Opcode::kText, j.dump()); }

  struct Frame {
    uint8_t opcode = 0;
    std::string payload;
  };
  // The next frame from the server (unmasked, unfragmented); opcode 0xFF when the server
  // closed the TCP connection.
  Frame read_frame() {
    if (!fill(2)) return {0xFF, ""};
    const uint8_t b0 = static_cast<uint8_t>(in_[0]), b1 = static_cast<uint8_t>(in_[1]);
    EXPECT_EQ(b1 & 0x80, 0) << "a server frame must not be masked";
    EXPECT_TRUE(b0 & 0x80) << "this server does not fragment";
    uint64_t n = b1 & 0x7F;
    size_t header = 2;
    if (n == 126) {
      if (!fill(4)) return {0xFF, ""};
      n = (static_cast<uint8_t>(in_[2]) << 8) | static_cast<uint8_t>(in_[3]);
      header = 4;
    } else if (n == 127) {
      if (!fill(10)) return {0xFF, ""};
      n = 0;
      for (int i = 0; i < 8; ++i) n = n << 8 | static_cast<uint8_t>(in_[2 + i]);
      header = 10;
    }
    if (!fill(header + n)) return {0xFF, ""};
    Frame f{static_cast<uint8_t>(b0 & 0x0F), in_.substr(header, n)};
    in_.erase(0, header + n);
    return f;
  }
  json read_json() {
    Frame f = read_frame();
    EXPECT_EQ(f.opcode, 0x1) << f.payload;
    return f.opcode == 0x1 ? json::parse(f.payload) : json();
  }
  // The events of one turn, up to its terminal event; checks the sequence numbers.
  std::vector<json> read_turn() {
    std::vector<json> events;
    for (;;) {
      json e = read_json();
      if (e.is_null()) break;
      events.push_back(e);
      if (e["type"] == "error") break;
      EXPECT_EQ(e["sequence_number"], events.size() - 1) << e.dump();
      const std::string t = e["type"];
      if (t == "response.completed" || t == "response.incomplete" || t == "response.failed") break;
    }
    return events;
  }
  // The close code of the server's close frame.
  int read_close() {
    Frame f = read_frame();
    EXPECT_EQ(f.opcode, 0x8) << f.payload;
    if (f.opcode != 0x8 || f.payload.size() < 2) return -1;
    return (static_cast<uint8_t>(f.payload[0]) << 8) | static_cast<uint8_t>(f.payload[1]);
  }
  bool closed_by_server() {
    beast::error_code ec;
    char c;
    socket_.read_some(net::buffer(&c, 1), ec);
    return ec == net::error::eof || ec == net::error::connection_reset;
  }

  std::string head;

 private:
  bool fill(size_t n) {
    while (in_.size() < n) {
      char chunk[4096];
      beast::error_code ec;
      const size_t got = socket_.read_some(net::buffer(chunk), ec);
      if (ec) return false;
      in_.append(chunk, got);
    }
    return true;
  }

  net::io_context ioc_;
  tcp::socket socket_;
  std::string in_;
  uint32_t next_mask_ = 0x11223344;
};

class ResponsesWebSocketTest : public ServerTest {
 protected:
  std::string prompt(size_t i) {
    return qwen3_tokenizer().decode(engine_.requests().at(i).prompt_tokens);
  }
  static json create(const std::string& text, json extra = json::object()) {
    json e{{"type", "response.create"}, {"model", "test-model"}, {"input", text}};
    for (auto& [k, v] : extra.items()) e[k] = v;
    return e;
  }
};

TEST_F(ResponsesWebSocketTest, HandshakeAnswersTheAcceptKey) {
  start();
  WsClient c(port_);
  EXPECT_EQ(c.head.rfind("HTTP/1.1 101 ", 0), 0u) << c.head;
  EXPECT_NE(c.head.find("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"),
            std::string::npos)
      << c.head;
  EXPECT_NE(c.head.find("Upgrade: websocket"), std::string::npos);
  EXPECT_NE(c.head.find("X-Request-Id: "), std::string::npos);
}

TEST_F(ResponsesWebSocketTest, GetWithoutUpgradeOrWithABadHandshakeIsA400) {
  start();
  Reply plain = get("/v1/responses");
  EXPECT_EQ(plain.status, 400);
  EXPECT_NE(plain.js()["error"]["message"].get<std::string>().find("WebSocket"), std::string::npos);
  Reply v8 = get("/v1/responses", {{"Upgrade", "websocket"},
                                   {"Connection", "Upgrade"},
                                   {"Sec-WebSocket-Version", "8"},
                                   {"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}});
  EXPECT_EQ(v8.status, 400);
  EXPECT_EQ(v8.header("sec-websocket-version"), "13");
  // HEAD is GET without a body: it cannot switch protocols (read raw: the 400 has no body).
  {
    Client raw(port_);
    net::write(raw.socket(), net::buffer(std::string(
                                 "HEAD /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                                 "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")));
    std::string head;
    net::read_until(raw.socket(), net::dynamic_buffer(head), "\r\n\r\n");
    EXPECT_EQ(head.rfind("HTTP/1.1 400 ", 0), 0u) << head;
  }
  // Authentication applies to the handshake.
  server_->shutdown(std::chrono::milliseconds(0));
  ServerOptions o;
  o.api_key = "sekret";
  start(o);
  Reply unauth = get("/v1/responses", {{"Upgrade", "websocket"},
                                       {"Connection", "Upgrade"},
                                       {"Sec-WebSocket-Version", "13"},
                                       {"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}});
  EXPECT_EQ(unauth.status, 401);
}

TEST_F(ResponsesWebSocketTest, TwoTurnsContinueWithStoreFalseThenMissAfterReconnect) {
  engine_.push_script(Script{{"Heron", " is a bird."}, FinishReason::kStop});
  engine_.push_script(Script{{"It", " wades."}, FinishReason::kStop});
  start();
  std::string first_id;
  {
    WsClient c(port_);
    c.send_json(create("What is a heron?", {{"store", false}}));
    std::vector<json> t1 = c.read_turn();
    ASSERT_GE(t1.size(), 4u);
    EXPECT_EQ(t1.front()["type"], "response.created");
    EXPECT_EQ(t1[1]["type"], "response.in_progress");
    EXPECT_EQ(t1.back()["type"], "response.completed");
    // The same objects as the SSE stream: deltas that add up to the output text.
    std::string text;
    for (const json& e : t1)
      if (e["type"] == "response.output_text.delta") text += e["delta"].get<std::string>();
    EXPECT_EQ(text, "Heron is a bird.");
    const json& done = t1.back()["response"];
    EXPECT_EQ(done["store"], false);
    EXPECT_EQ(done["output"][0]["content"][0]["text"], "Heron is a bird.");
    first_id = done["id"];
    EXPECT_EQ(get("/v1/responses/" + first_id).status, 404);  // not in the shared store

    // The second turn sends only the new input; the connection supplies the rest.
    c.send_json(create("What does it do?", {{"store", false}, {"previous_response_id", first_id}}));
    std::vector<json> t2 = c.read_turn();
    ASSERT_FALSE(t2.empty());
    EXPECT_EQ(t2.front()["sequence_number"], 0);  // each turn counts from 0
    EXPECT_EQ(t2.back()["type"], "response.completed") << t2.back().dump();
    EXPECT_EQ(t2.back()["response"]["previous_response_id"], first_id);
    const std::string p = prompt(1);
    EXPECT_NE(p.find("What is a heron?"), std::string::npos) << p;
    EXPECT_NE(p.find("Heron is a bird."), std::string::npos) << p;
    EXPECT_LT(p.find("Heron is a bird."), p.find("What does it do?")) << p;
  }
  // A new connection does not know the first connection's store: false responses.
  WsClient c2(port_);
  c2.send_json(create("Again?", {{"previous_response_id", first_id}}));
  json miss = c2.read_json();
  EXPECT_EQ(miss["type"], "error");
  EXPECT_EQ(miss["status"], 404);
  EXPECT_EQ(miss["error"]["code"], "previous_response_not_found");
  EXPECT_EQ(miss["error"]["param"], "previous_response_id");
  EXPECT_EQ(miss["error"]["type"], "invalid_request_error");
  EXPECT_EQ(engine_.requests().size(), 2u);  // nothing ran
  // The connection stays usable.
  c2.send_json(create("Fresh start."));
  EXPECT_EQ(c2.read_turn().back()["type"], "response.completed");
}

TEST_F(ResponsesWebSocketTest, StoredResponsesContinueAcrossConnections) {
  start();
  std::string id;
  {
    WsClient c(port_);
    c.send_json(create("Remember heron."));
    id = c.read_turn().back()["response"]["id"];
  }
  WsClient c2(port_);
  c2.send_json(create("Which word?", {{"previous_response_id", id}}));
  EXPECT_EQ(c2.read_turn().back()["type"], "response.completed");
  EXPECT_NE(prompt(1).find("Remember heron."), std::string::npos);
}

TEST_F(ResponsesWebSocketTest, GenerateFalseWarmsUpWithoutGenerating) {
  start();
  WsClient c(port_);
  c.send_json(create("Context: herons wade.", {{"generate", false}, {"store", false}}));
  std::vector<json> warm = c.read_turn();
  ASSERT_EQ(warm.size(), 2u);
  EXPECT_EQ(warm[0]["type"], "response.created");
  EXPECT_EQ(warm[1]["type"], "response.completed");
  const json& r = warm[1]["response"];
  EXPECT_EQ(r["output"], json::array());
  EXPECT_GT(r["usage"]["input_tokens"].get<int>(), 0);
  EXPECT_EQ(r["usage"]["output_tokens"], 0);
  EXPECT_TRUE(engine_.requests().empty());
  c.send_json(create("What do herons do?", {{"previous_response_id", r["id"]}}));
  EXPECT_EQ(c.read_turn().back()["type"], "response.completed");
  ASSERT_EQ(engine_.requests().size(), 1u);
  EXPECT_NE(prompt(0).find("Context: herons wade."), std::string::npos) << prompt(0);
  c.send_json(create("x", {{"generate", "no"}}));
  EXPECT_EQ(c.read_json()["error"]["param"], "generate");
}

TEST_F(ResponsesWebSocketTest, BadEventsAreErrorEventsAndTheConnectionStays) {
  start();
  WsClient c(port_);
  c.send(ws::Opcode::kText, "{not json");
  json e1 = c.read_json();
  EXPECT_EQ(e1["type"], "error");
  EXPECT_EQ(e1["status"], 400);
  // As HTTP bodies: deep nesting is refused before parsing (no deep recursion), so is a NUL.
  c.send(ws::Opcode::kText, std::string(200000, '['));
  EXPECT_EQ(c.read_json()["status"], 400);
  c.send(ws::Opcode::kText, std::string("{\"type\":\"response.create\"}\0", 27));
  EXPECT_EQ(c.read_json()["status"], 400);
  c.send(ws::Opcode::kText, "[1]");
  EXPECT_EQ(c.read_json()["error"]["type"], "invalid_request_error");
  c.send_json(json{{"type", "response.cancel"}});
  json e2 = c.read_json();
  EXPECT_EQ(e2["error"]["param"], "type");
  EXPECT_NE(e2["error"]["message"].get<std::string>().find("response.cancel"), std::string::npos);
  c.send(ws::Opcode::kBinary, "\x01\x02");
  EXPECT_EQ(c.read_json()["type"], "error");
  c.send_json(create("x", {{"temperature", -1}}));
  json e3 = c.read_json();
  EXPECT_EQ(e3["error"]["param"], "temperature");
  c.send_json(create("x", {{"background", true}}));
  EXPECT_EQ(c.read_json()["error"]["param"], "background");
  EXPECT_TRUE(engine_.requests().empty());
  // `stream` is implicit and ignored; the turn runs.
  c.send_json(create("Hi", {{"stream", false}}));
  EXPECT_EQ(c.read_turn().back()["type"], "response.completed");
}

TEST_F(ResponsesWebSocketTest, PingPongFragmentsAndTheCloseHandshake) {
  start();
  WsClient c(port_);
  c.send(ws::Opcode::kPing, "are you there");
  WsClient::Frame pong = c.read_frame();
  EXPECT_EQ(pong.opcode, 0xA);
  EXPECT_EQ(pong.payload, "are you there");
  // A response.create in three fragments, a ping between them.
  const std::string msg = create("Hi").dump();
  c.send(ws::Opcode::kText, msg.substr(0, 10), false);
  c.send(ws::Opcode::kPing, "mid");
  c.send(ws::Opcode::kContinuation, msg.substr(10, 10), false);
  c.send(ws::Opcode::kContinuation, msg.substr(20), true);
  EXPECT_EQ(c.read_frame().payload, "mid");
  EXPECT_EQ(c.read_turn().back()["type"], "response.completed");
  // The client closes: the server answers with the same code and ends the connection.
  c.send(ws::Opcode::kClose, ws::close_payload(1000, "done"));
  EXPECT_EQ(c.read_close(), 1000);
  EXPECT_TRUE(c.closed_by_server());
}

TEST_F(ResponsesWebSocketTest, ProtocolViolationsCloseWithTheirCode) {
  ServerOptions o;
  o.max_body_bytes = 4096;
  start(o);
  {
    WsClient c(port_);
    c.send_raw(ws::encode_frame(ws::Opcode::kText, "{}"));  // not masked
    EXPECT_EQ(c.read_close(), ws::kCloseProtocolError);
    EXPECT_TRUE(c.closed_by_server());
  }
  {
    WsClient c(port_);
    c.send(ws::Opcode::kText, std::string(5000, ' '));  // over max_body_bytes
    EXPECT_EQ(c.read_close(), ws::kCloseMessageTooBig);
  }
  {
    WsClient c(port_);
    c.send(ws::Opcode::kText, "\"\xFF\"");
    EXPECT_EQ(c.read_close(), ws::kCloseInvalidPayload);
  }
  // The server is unharmed.
  WsClient ok(port_);
  ok.send_json(create("Hi"));
  EXPECT_EQ(ok.read_turn().back()["type"], "response.completed");
}

TEST_F(ResponsesWebSocketTest, ShutdownClosesAnIdleConnectionWithGoingAway) {
  start();
  WsClient c(port_);
  c.send_json(create("Hi"));
  EXPECT_EQ(c.read_turn().back()["type"], "response.completed");
  std::thread stopper([this] { server_->shutdown(std::chrono::milliseconds(2000)); });
  EXPECT_EQ(c.read_close(), ws::kCloseGoingAway);
  stopper.join();
  server_.reset();
}

}  // namespace
}  // namespace kiln::server::testing
