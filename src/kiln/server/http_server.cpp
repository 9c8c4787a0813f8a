#include "kiln/server/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "kiln/server/websocket.h"
#include "kiln/util/log.h"

namespace kiln::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::optional<std::string_view> HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k.size() != name.size()) continue;
    bool same = true;
    for (size_t i = 0; i < k.size() && same; ++i)
      same = k[i] == std::tolower(static_cast<unsigned char>(name[i]));
    if (same) return std::string_view(v);
  }
  return std::nullopt;
}

namespace {

class Connection;

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions options;
  HttpHandler handler;
  net::io_context accept_ioc;
  std::optional<tcp::acceptor> acceptor;
  std::thread accept_thread;
  std::atomic<bool> stopping{false};  // no more accepts
  std::atomic<bool> draining{false};  // close connections once idle
  std::atomic<bool> cut{false};       // abort in-flight handlers
  bool started = false;
  bool shut_down = false;

  struct Slot {
    std::thread thread;
    std::atomic<bool> done{false};
    std::atomic<int> fd{-1};
  };
  mutable std::mutex mu;
  std::list<Slot> slots;                  // guarded by mu
  std::map<std::string, int> per_client;  // open regular connections by client IP; guarded by mu
  std::atomic<int> num_open{0};           // connection threads (what shutdown drains)

  // The overflow lane (see HttpServerOptions): one thread, asynchronous sessions.
  std::atomic<int> num_lane{0};  // before lane_ioc: sessions it destroys count down here
  net::io_context lane_ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> lane_work;
  std::thread lane_thread;

  void accept_loop();
  void reap(bool all);
  void to_lane(int fd, const tcp& protocol);
};

namespace {

class Connection final : public HttpExchange {
 public:
  Connection(HttpServer::Impl& server, std::atomic<int>* slot_fd, int fd, const tcp& protocol)
      : server_(server),
        slot_fd_(slot_fd),
        stream_(ioc_),
        first_deadline_(Clock::now() + server.options.first_request_timeout) {
    beast::error_code ec;
    stream_.socket().assign(protocol, fd, ec);
    if (ec) ::close(fd);
    // No Nagle: a stream's header and its first event (and each event after) go out as written.
    // With it, the first event waited for the client's (delayed, up to 40 ms) ACK of the
    // header: 40 ms on every streamed request's first token.
    stream_.socket().set_option(tcp::no_delay(true), ec);
    auto ep = stream_.socket().remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  void serve();

  // HttpExchange
  void add_header(std::string name, std::string value) override {
    extra_headers_.emplace_back(std::move(name), std::move(value));
  }
  bool respond(int status, std::string_view content_type, std::string body) override;
  bool begin_stream(int status, std::string_view content_type) override;
  bool write_chunk(std::string_view data) override;
  bool end_stream() override;
  AbortReason abort_reason() override;
  bool responded() const override { return status_ != 0; }
  int status() const override { return status_; }
  bool client_gone() const override { return broken_; }
  WebSocketChannel* accept_websocket(std::string_view accept_key) override;

 private:
  class WebSocket;
  bool write_raw(std::string_view bytes);
  // Runs one async operation on this thread's io_context to completion, under `timeout`
  // (the stream closes the socket when it expires and the operation fails with timeout).
  template <typename Start>
  beast::error_code run(Start&& start, milliseconds timeout, size_t* transferred = nullptr) {
    beast::error_code result = net::error::would_block;
    stream_.expires_after(timeout);
    start([&result, transferred](beast::error_code ec, size_t n) {
      result = ec;
      if (transferred) *transferred = n;
    });
    ioc_.restart();
    ioc_.run();
    stream_.expires_never();
    ioc_.restart();
    ioc_.run();  // the cancelled timer's handler
    return result;
  }
  // Waits until the client sends a byte; false on idle timeout, hang-up or server drain.
  bool wait_for_request();
  // Waits until the socket is readable (data or a hang-up); false at `deadline` or when the
  // server drains.
  bool wait_readable(Clock::time_point deadline);
  bool handle_one();  // false: close the connection
  void send_simple_error(int status, std::string_view message);
  template <typename Response>
  void set_common_headers(Response& res, int status, std::string_view content_type);

  HttpServer::Impl& server_;
  std::atomic<int>* slot_fd_;  // the fd shutdown() may cut; cleared under server_.mu
  net::io_context ioc_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::string remote_;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool broken_ = false;  // a write failed or timed out: the client is gone
  int status_ = 0;
  bool streaming_ = false;
  bool head_ = false;                 // the request is HEAD: responses carry no body
  bool first_ = true;                 // no request has been read yet on this connection
  Clock::time_point first_deadline_;  // the first request's header must be in by then
  std::vector<std::pair<std::string, std::string>> extra_headers_;
  std::unique_ptr<WebSocket> websocket_;  // after an upgrade (the connection ends with it)
};

// The WebSocket of an upgraded connection: frames over the connection's socket, with the
// same timeouts (a write to a client that does not read fails after write_timeout).
class Connection::WebSocket final : public WebSocketChannel {
 public:
  explicit WebSocket(Connection& conn)
      : conn_(conn), reader_(conn.server_.options.max_body_bytes) {}

  void feed(std::string_view bytes) { reader_.feed(bytes); }

  std::optional<Message> receive() override {
    namespace ws = websocket;
    for (;;) {
      while (auto m = reader_.next()) {
        switch (m->kind) {
          case ws::Message::Kind::kPing:
            if (!send(ws::Opcode::kPong, m->payload)) return std::nullopt;
            break;
          case ws::Message::Kind::kPong:
            break;
          case ws::Message::Kind::kClose:
            // 5.5.1: answer with a close frame (echoing the code), then the connection ends.
            if (!close_sent_) {
              close_sent_ = true;
              send_raw(
                  ws::encode_frame(ws::Opcode::kClose, m->close_code == ws::kCloseNoStatus
                                                           ? std::string()
                                                           : ws::close_payload(m->close_code, "")));
            }
            done_ = true;
            return std::nullopt;
          case ws::Message::Kind::kText:
          case ws::Message::Kind::kBinary:
            return Message{m->kind == ws::Message::Kind::kBinary, std::move(m->payload)};
        }
      }
      if (const auto& failure = reader_.failure()) {
        log::debug("websocket {}: closing with {}: {}", conn_.remote_, failure->close_code,
                   failure->reason);
        close(failure->close_code, failure->reason);
        done_ = true;
      }
      if (done_ || conn_.broken_) return std::nullopt;
      const Clock::time_point deadline =
          Clock::now() + conn_.server_.options.websocket_idle_timeout;
      if (!conn_.wait_readable(deadline)) {
        close(ws::kCloseGoingAway,
              conn_.server_.draining.load() ? "the server is shutting down" : "idle timeout");
        done_ = true;
        return std::nullopt;
      }
      char chunk[16384];
      size_t n = 0;
      beast::error_code ec = conn_.run(
          [&](auto handler) {
            conn_.stream_.async_read_some(net::buffer(chunk, sizeof chunk), std::move(handler));
          },
          conn_.server_.options.body_timeout, &n);
      if (ec) {
        conn_.broken_ = true;  // a hang-up (eof), a reset, or a stalled read
        done_ = true;
        return std::nullopt;
      }
      reader_.feed(std::string_view(chunk, n));
    }
  }
  bool send_text(std::string_view text) override { return send(websocket::Opcode::kText, text); }
  bool send_ping(std::string_view data) override {
    return send(websocket::Opcode::kPing, data.substr(0, 125));
  }
  void close(uint16_t code, std::string_view reason) override {
    if (close_sent_) return;
    close_sent_ = true;
    send_raw(
        websocket::encode_frame(websocket::Opcode::kClose, websocket::close_payload(code, reason)));
  }

 private:
  bool send(websocket::Opcode op, std::string_view payload) {
    if (close_sent_) return false;
    return send_raw(websocket::encode_frame(op, payload));
  }
  bool send_raw(const std::string& frame) { return conn_.write_raw(frame); }

  Connection& conn_;
  websocket::FrameReader reader_;
  bool close_sent_ = false;
  bool done_ = false;  // the connection is over: receive() hands out nothing more
};

WebSocketChannel* Connection::accept_websocket(std::string_view accept_key) {
  if (status_ != 0 || broken_ || head_) return nullptr;
  status_ = 101;
  std::string head =
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Accept: ";
  head += accept_key;
  head += "\r\nServer: kiln\r\n";
  for (const auto& [k, v] : extra_headers_) head += k + ": " + v + "\r\n";
  head += "\r\n";
  keep_alive_ = false;  // the connection ends with the WebSocket
  if (!write_raw(head)) return nullptr;
  websocket_ = std::make_unique<WebSocket>(*this);
  // Frames the client sent right after its handshake are already in the read buffer.
  if (buffer_.size() > 0) {
    const auto data = buffer_.data();
    websocket_->feed(std::string_view(static_cast<const char*>(data.data()), data.size()));
    buffer_.consume(buffer_.size());
  }
  return websocket_.get();
}

bool Connection::write_raw(std::string_view bytes) {
  if (broken_) return false;
  beast::error_code ec = run(
      [&](auto handler) {
        net::async_write(stream_, net::const_buffer(bytes.data(), bytes.size()),
                         std::move(handler));
      },
      server_.options.write_timeout);
  if (ec) broken_ = true;
  return !broken_;
}

bool Connection::wait_for_request() {
  if (buffer_.size() > 0) return true;  // a pipelined request is already here
  Clock::time_point deadline = Clock::now() + server_.options.idle_timeout;
  if (first_) deadline = std::min(deadline, first_deadline_);
  return wait_readable(deadline);
}

bool Connection::wait_readable(Clock::time_point deadline) {
  // Wait for readability with a ticker that checks the deadline and the server's drain.
  bool readable = false;
  bool finished = false;
  net::steady_timer ticker(ioc_);
  stream_.socket().async_wait(tcp::socket::wait_read, [&](beast::error_code ec) {
    finished = true;
    readable = !ec;
    ticker.cancel();
  });
  std::function<void()> arm = [&] {
    ticker.expires_after(milliseconds(50));
    ticker.async_wait([&](beast::error_code ec) {
      if (ec || finished) return;
      if (server_.draining.load() || Clock::now() >= deadline) {
        beast::error_code ignored;
        stream_.socket().cancel(ignored);
        return;
      }
      arm();
    });
  };
  arm();
  ioc_.restart();
  ioc_.run();
  return readable && !server_.draining.load();
}

template <typename Response>
void Connection::set_common_headers(Response& res, int status, std::string_view content_type) {
  res.version(version_);
  res.result(static_cast<unsigned>(status));
  res.set(http::field::server, "kiln");
  if (!content_type.empty()) res.set(http::field::content_type, std::string(content_type));
  for (const auto& [k, v] : extra_headers_) res.set(k, v);
  if (server_.draining.load()) keep_alive_ = false;
  res.keep_alive(keep_alive_);
}

bool Connection::respond(int status, std::string_view content_type, std::string body) {
  if (status_ != 0 || broken_) return false;
  status_ = status;
  beast::error_code ec;
  if (head_) {
    // The header GET would send, Content-Length included, and no body.
    http::response<http::empty_body> res;
    set_common_headers(res, status, content_type);
    res.content_length(body.size());
    ec = run([&](auto handler) { http::async_write(stream_, res, std::move(handler)); },
             server_.options.write_timeout);
  } else {
    http::response<http::string_body> res;
    set_common_headers(res, status, content_type);
    res.body() = std::move(body);
    res.prepare_payload();
    ec = run([&](auto handler) { http::async_write(stream_, res, std::move(handler)); },
             server_.options.write_timeout);
  }
  if (ec) broken_ = true;
  return !broken_;
}

bool Connection::begin_stream(int status, std::string_view content_type) {
  if (status_ != 0 || broken_) return false;
  status_ = status;
  streaming_ = true;
  http::response<http::empty_body> res;
  set_common_headers(res, status, content_type);
  res.set(http::field::cache_control, "no-cache");
  if (version_ < 11) keep_alive_ = false;  // HTTP/1.0: no chunking; the body ends at close
  res.keep_alive(keep_alive_);
  if (version_ >= 11) res.chunked(true);
  http::response_serializer<http::empty_body> sr{res};
  beast::error_code ec =
      run([&](auto handler) { http::async_write_header(stream_, sr, std::move(handler)); },
          server_.options.write_timeout);
  if (ec) broken_ = true;
  return !broken_;
}

bool Connection::write_chunk(std::string_view data) {
  if (!streaming_ || broken_) return false;
  if (data.empty()) return true;  // an empty chunk would end the body
  beast::error_code ec;
  if (version_ >= 11) {
    ec = run(
        [&](auto handler) {
          net::async_write(stream_, http::make_chunk(net::const_buffer(data.data(), data.size())),
                           std::move(handler));
        },
        server_.options.write_timeout);
  } else {
    ec = run(
        [&](auto handler) {
          net::async_write(stream_, net::const_buffer(data.data(), data.size()),
                           std::move(handler));
        },
        server_.options.write_timeout);
  }
  if (ec) broken_ = true;
  return !broken_;
}

bool Connection::end_stream() {
  if (!streaming_ || broken_) return false;
  streaming_ = false;
  if (version_ < 11) return true;
  beast::error_code ec = run(
      [&](auto handler) { net::async_write(stream_, http::make_chunk_last(), std::move(handler)); },
      server_.options.write_timeout);
  if (ec) broken_ = true;
  return !broken_;
}

AbortReason Connection::abort_reason() {
  if (server_.cut.load()) return AbortReason::kServerShutdown;
  if (broken_) return AbortReason::kClientGone;
  pollfd p{};
  p.fd = stream_.socket().native_handle();
  p.events = POLLRDHUP;
  if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) {
    broken_ = true;
    return AbortReason::kClientGone;
  }
  return AbortReason::kNone;
}

void Connection::send_simple_error(int status, std::string_view message) {
  // Transport-level failures (before a request exists) in the OpenAI envelope.
  keep_alive_ = false;
  std::string body = R"({"error":{"message":")" + std::string(message) +
                     R"(","type":"invalid_request_error","param":null,"code":null}})";
  respond(status, "application/json", std::move(body));
}

bool Connection::handle_one() {
  if (!wait_for_request()) return false;
  status_ = 0;
  streaming_ = false;
  head_ = false;
  extra_headers_.clear();
  http::request_parser<http::string_body> parser;
  parser.header_limit(
      static_cast<uint32_t>(std::min<size_t>(server_.options.max_header_bytes, UINT32_MAX)));
  parser.body_limit(server_.options.max_body_bytes);
  // The first request's header must arrive by the connection's first deadline; later ones
  // have header_timeout from their first byte.
  milliseconds header_timeout = server_.options.header_timeout;
  if (first_)
    header_timeout =
        std::min(header_timeout, std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(
                                                               first_deadline_ - Clock::now())));
  beast::error_code ec = run(
      [&](auto handler) { http::async_read_header(stream_, buffer_, parser, std::move(handler)); },
      header_timeout);
  first_ = false;
  if (ec == http::error::body_limit) {
    send_simple_error(413, "The request body exceeds the size limit");
    return false;
  }
  if (ec == http::error::header_limit) {
    send_simple_error(431, "The request headers are too large");
    return false;
  }
  if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::eof ||
      ec == net::error::connection_reset || ec == net::error::operation_aborted)
    return false;
  if (ec) {
    send_simple_error(400, "Malformed HTTP request");
    return false;
  }
  version_ = parser.get().version();
  auto expect = parser.get()[http::field::expect];
  if (beast::iequals(expect, "100-continue")) {
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    run(
        [&](auto handler) {
          net::async_write(stream_, net::buffer(kContinue), std::move(handler));
        },
        server_.options.write_timeout);
  }
  if (!parser.is_done()) {
    ec = run([&](auto handler) { http::async_read(stream_, buffer_, parser, std::move(handler)); },
             server_.options.body_timeout);
    if (ec == http::error::body_limit) {
      send_simple_error(413, "The request body exceeds the size limit");
      return false;
    }
    if (ec == beast::error::timeout || ec == net::error::eof ||
        ec == http::error::partial_message || ec == net::error::connection_reset)
      return false;
    if (ec) {
      send_simple_error(400, "Malformed HTTP request body");
      return false;
    }
  }
  http::request<http::string_body> msg = parser.release();
  keep_alive_ = msg.keep_alive();
  head_ = msg.method() == http::verb::head;

  HttpRequest req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  req.path = req.target.substr(0, req.target.find('?'));
  req.remote = remote_;
  for (const auto& field : msg) {
    std::string name(field.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    req.headers.emplace_back(std::move(name), std::string(field.value()));
  }
  req.body = std::move(msg.body());
  server_.handler(req, *this);
  if (!responded()) send_simple_error(500, "The handler sent no response");
  if (streaming_) end_stream();
  if (websocket_) return false;  // an upgraded connection ends with its handler
  return keep_alive_ && !broken_ && !server_.draining.load();
}

void Connection::serve() {
  while (handle_one()) {
  }
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  // Lingering close: closing with unread bytes in the receive buffer (the rest of a body or
  // header we refused with 413/431) makes the kernel send RST, which can destroy the
  // response we just wrote before the client reads it. Drain what the client still sends
  // for a moment (bounded in time and bytes), then close.
  {
    const int fd = stream_.socket().native_handle();
    char sink[4096];
    size_t drained = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (drained < (size_t{4} << 20) && std::chrono::steady_clock::now() < until) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) break;
      const ssize_t n = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
      if (n <= 0) break;
      drained += static_cast<size_t>(n);
    }
  }
  std::lock_guard<std::mutex> lock(server_.mu);  // shutdown() must not cut a reused fd
  slot_fd_->store(-1);
  stream_.socket().close(ec);
}

}  // namespace

void HttpServer::Impl::reap(bool all) {
  std::list<Slot> finished;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = slots.begin(); it != slots.end();) {
      if (all || it->done.load()) {
        auto next = std::next(it);
        finished.splice(finished.end(), slots, it);
        it = next;
      } else {
        ++it;
      }
    }
  }
  for (Slot& s : finished)
    if (s.thread.joinable()) s.thread.join();
}

namespace {

const std::string& busy_response() {
  static const std::string kBody =
      R"({"error":{"message":"Too many connections","type":"server_error","param":null,)"
      R"("code":"too_many_connections"}})";
  static const std::string kBusy =
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
      "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
      std::to_string(kBody.size()) + "\r\n\r\n" + kBody;
  return kBusy;
}

// The IP address of a peer (the per-client key), "" when unknown.
std::string peer_address(const sockaddr_storage& sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(sa).sin_addr, buf, sizeof buf);
  else if (sa.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(sa).sin6_addr, buf, sizeof buf);
  return buf;
}

// The response side of one overflow-lane request: buffered, never streamed.
class BufferedExchange final : public HttpExchange {
 public:
  void add_header(std::string name, std::string value) override {
    headers.emplace_back(std::move(name), std::move(value));
  }
  bool respond(int s, std::string_view type, std::string b) override {
    if (status_ != 0) return false;
    status_ = s;
    content_type = type;
    body = std::move(b);
    return true;
  }
  bool begin_stream(int, std::string_view) override { return false; }
  bool write_chunk(std::string_view) override { return false; }
  bool end_stream() override { return false; }
  AbortReason abort_reason() override { return AbortReason::kNone; }
  bool responded() const override { return status_ != 0; }
  int status() const override { return status_; }
  bool client_gone() const override { return false; }

  std::vector<std::pair<std::string, std::string>> headers;
  std::string content_type;
  std::string body;

 private:
  int status_ = 0;
};

// One connection of the overflow lane: read one request within the first-request deadline,
// answer it (an always-answered path through the handler, else 503), close.
class LaneSession : public std::enable_shared_from_this<LaneSession> {
 public:
  LaneSession(HttpServer::Impl& server, tcp::socket socket)
      : server_(server), stream_(std::move(socket)) {}
  ~LaneSession() { server_.num_lane.fetch_sub(1); }

  void start() {
    parser_.header_limit(
        static_cast<uint32_t>(std::min<size_t>(server_.options.max_header_bytes, UINT32_MAX)));
    parser_.body_limit(size_t{64} << 10);
    stream_.expires_after(server_.options.first_request_timeout);
    http::async_read(
        stream_, buffer_, parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec) return;  // timeout, hang-up or a malformed request: close
    http::request<http::string_body>& msg = parser_.get();
    HttpRequest req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    req.path = req.target.substr(0, req.target.find('?'));
    beast::error_code ignored;
    auto ep = stream_.socket().remote_endpoint(ignored);
    if (!ignored) req.remote = ep.address().to_string() + ":" + std::to_string(ep.port());
    for (const auto& field : msg) {
      std::string name(field.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req.headers.emplace_back(std::move(name), std::string(field.value()));
    }
    const bool head = msg.method() == http::verb::head;
    const bool allowed =
        (head || msg.method() == http::verb::get) &&
        std::find(server_.options.always_answered.begin(), server_.options.always_answered.end(),
                  req.path) != server_.options.always_answered.end();
    if (!allowed) {
      raw_ = std::make_shared<std::string>(busy_response());
      net::async_write(stream_, net::buffer(*raw_),
                       [self = shared_from_this()](beast::error_code, size_t) { self->close(); });
      return;
    }
    BufferedExchange ex;
    server_.handler(req, ex);
    res_.version(msg.version());
    res_.result(static_cast<unsigned>(ex.responded() ? ex.status() : 500));
    res_.set(http::field::server, "kiln");
    if (!ex.content_type.empty()) res_.set(http::field::content_type, ex.content_type);
    for (const auto& [k, v] : ex.headers) res_.set(k, v);
    res_.keep_alive(false);
    if (head) {
      res_.content_length(ex.body.size());
      res_.body().clear();
    } else {
      res_.body() = std::move(ex.body);
      res_.prepare_payload();
    }
    stream_.expires_after(server_.options.write_timeout);
    http::async_write(stream_, res_,
                      [self = shared_from_this()](beast::error_code, size_t) { self->close(); });
  }
  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.socket().close(ec);
  }

  HttpServer::Impl& server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request_parser<http::string_body> parser_;
  http::response<http::string_body> res_;
  std::shared_ptr<std::string> raw_;
};

}  // namespace

void HttpServer::Impl::to_lane(int fd, const tcp& protocol) {
  if (num_lane.load() >= options.max_overflow_connections) {
    [[maybe_unused]] ssize_t n =
        ::send(fd, busy_response().data(), busy_response().size(), MSG_NOSIGNAL);
    ::close(fd);
    return;
  }
  num_lane.fetch_add(1);
  net::post(lane_ioc, [this, fd, protocol] {
    tcp::socket socket(lane_ioc);
    beast::error_code ec;
    socket.assign(protocol, fd, ec);
    if (ec) {
      ::close(fd);
      num_lane.fetch_sub(1);
      return;
    }
    std::make_shared<LaneSession>(*this, std::move(socket))->start();
  });
}

void HttpServer::Impl::accept_loop() {
  const int listen_fd = acceptor->native_handle();
  const tcp protocol = acceptor->local_endpoint().protocol();
  while (!stopping.load()) {
    pollfd p{};
    p.fd = listen_fd;
    p.events = POLLIN;
    const int r = ::poll(&p, 1, 100);
    reap(false);
    if (r <= 0 || !(p.revents & POLLIN)) continue;
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof peer;
    const int fd =
        ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &peer_len, SOCK_CLOEXEC);
    if (fd < 0) continue;  // EAGAIN, ECONNABORTED, EMFILE...: try again later
    const std::string client = peer_address(peer);
    std::lock_guard<std::mutex> lock(mu);
    int& num_client = per_client[client];
    if (num_open.load() >= options.max_connections ||
        num_client >= options.max_connections_per_client) {
      if (num_client == 0) per_client.erase(client);
      to_lane(fd, protocol);
      continue;
    }
    ++num_client;
    Slot& slot = slots.emplace_back();
    slot.fd.store(fd);
    num_open.fetch_add(1);
    slot.thread = std::thread([this, &slot, fd, protocol, client] {
      {
        Connection conn(*this, &slot.fd, fd, protocol);
        conn.serve();
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        auto it = per_client.find(client);
        if (it != per_client.end() && --it->second <= 0) per_client.erase(it);
      }
      num_open.fetch_sub(1);
      slot.done.store(true);
    });
  }
}

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->handler = std::move(handler);
}

HttpServer::~HttpServer() {
  if (impl_->started && !impl_->shut_down) shutdown(milliseconds(0));
}

Expected<uint16_t> HttpServer::start() {
  if (impl_->started) return err("http server: already started");
  beast::error_code ec;
  auto address = net::ip::make_address(impl_->options.host, ec);
  if (ec) return err("http server: bad host address '{}': {}", impl_->options.host, ec.message());
  tcp::endpoint endpoint(address, impl_->options.port);
  tcp::acceptor acceptor(impl_->accept_ioc);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return err("http server: cannot listen on {}:{}: {}", impl_->options.host, impl_->options.port,
               ec.message());
  acceptor.non_blocking(true, ec);
  const uint16_t port = acceptor.local_endpoint(ec).port();
  impl_->acceptor.emplace(std::move(acceptor));
  impl_->started = true;
  impl_->lane_work.emplace(net::make_work_guard(impl_->lane_ioc));
  impl_->lane_thread = std::thread([this] { impl_->lane_ioc.run(); });
  impl_->accept_thread = std::thread([this] { impl_->accept_loop(); });
  return port;
}

void HttpServer::shutdown(milliseconds drain) {
  if (!impl_->started || impl_->shut_down) return;
  impl_->shut_down = true;
  impl_->stopping.store(true);
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
  beast::error_code ec;
  impl_->acceptor->close(ec);
  impl_->draining.store(true);  // idle connections close within one ticker period
  const Clock::time_point deadline = Clock::now() + drain;
  while (impl_->num_open.load() > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(10));
  if (impl_->num_open.load() > 0) {
    log::warn("http server: cutting {} connection(s) after the drain timeout",
              impl_->num_open.load());
    impl_->cut.store(true);  // handlers see kServerShutdown and end their responses
    const Clock::time_point grace = Clock::now() + milliseconds(2000);
    while (impl_->num_open.load() > 0 && Clock::now() < grace)
      std::this_thread::sleep_for(milliseconds(10));
    // Whatever is still blocked (a write to a client that does not read) fails now.
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (auto& slot : impl_->slots) {
      const int fd = slot.fd.load();
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    }
  }
  impl_->reap(true);
  // The overflow lane: its sessions are short (first_request_timeout); cut what is left.
  impl_->lane_work.reset();
  impl_->lane_ioc.stop();
  if (impl_->lane_thread.joinable()) impl_->lane_thread.join();
}

int HttpServer::num_connections() const {
  return impl_->num_open.load();
}

}  // namespace kiln::server
