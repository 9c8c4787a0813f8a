// kiln bench http: a load generator for any OpenAI-compatible server (kiln serve,
// llama-server, vLLM). For each concurrency level of a sweep it keeps that many streaming
// requests in flight until --requests have completed, and reports time to first token,
// inter-token latency, aggregate output tokens/s and requests/s.
//
// Fairness rules: every prompt starts with a random nonce, so no server's prefix cache can
// serve it (beyond what a chat template itself puts in front of the user's text); every
// request asks for exactly --max-tokens tokens with `ignore_eos: true` (an extension kiln
// and llama-server both accept), so every server generates the same amount of work. The
// token count is taken from the stream's usage chunk (`stream_options.include_usage`) when
// the server sends one, else from the number of content chunks.
//
// Transport: HTTP/1.1 over plain TCP (Boost.Beast), one keep-alive connection and one
// thread per concurrent client; each thread blocks on its socket, so the client costs the
// server (sharing the machine's cores) next to nothing. Each socket operation has a timeout.
// A response with `Connection: close` closes the client's connection; a kept-alive connection
// that the server closed meanwhile (llama-server closes after each streamed response without
// saying so) fails the next request before any byte of its response arrives: that request was
// never processed, so the client reconnects and sends it again (counted as `resent`, never as
// a failure), as HTTP clients do for a stale pooled connection.
//
// Failures are reported by cause, so a reader can tell the server's faults from the client's:
// an HTTP status other than 200, an error frame in the stream, a malformed stream (not JSON,
// no [DONE], no output), or a transport failure (connect, write, read, timeout).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>  // before asio: boost 1.74's awaitable.hpp needs std::exchange
#include <vector>

#include <fmt/format.h>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "kiln/cli/commands.h"
#include "kiln/util/status.h"

namespace kiln::cli {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

struct HttpBenchOptions {
  std::string url = "http://127.0.0.1:8080";
  std::string api_key;
  std::string model;  // empty: the field is left out (kiln and llama-server serve their one)
  std::vector<int> concurrency{1, 2, 4, 8};
  int requests = 16;       // per concurrency level
  int prompt_words = 128;  // approximate prompt length (words; roughly tokens)
  int max_tokens = 64;
  std::string endpoint = "chat";  // chat | completions
  double temperature = 0.0;
  int timeout_s = 600;  // one socket operation (connect, write, one read)
  bool warmup = true;
  bool json = false;
  // kiln serve's /metrics read before and after each level: the engine thread's time per
  // step by phase (kiln_engine_step_seconds_total), so the host's share of a step shows.
  bool server_metrics = false;
};

struct Target {
  std::string host;
  std::string port;
  std::string prefix;  // path before /v1 ("" usually)
};

Expected<Target> parse_url(const std::string& url) {
  constexpr std::string_view kScheme = "http://";
  if (url.rfind("https://", 0) == 0) return err("--url: https is not supported (plain TCP only)");
  if (url.rfind(kScheme, 0) != 0) return err("--url must start with http://, got '{}'", url);
  std::string rest = url.substr(kScheme.size());
  Target t;
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    t.prefix = rest.substr(slash);
    rest.resize(slash);
  }
  while (!t.prefix.empty() && t.prefix.back() == '/') t.prefix.pop_back();
  if (t.prefix.size() >= 3 && t.prefix.compare(t.prefix.size() - 3, 3, "/v1") == 0)
    t.prefix.resize(t.prefix.size() - 3);  // accept a base URL ending in /v1
  const size_t colon = rest.rfind(':');
  if (colon != std::string::npos && rest.find(']') == std::string::npos) {
    t.host = rest.substr(0, colon);
    t.port = rest.substr(colon + 1);
  } else {
    t.host = rest;
    t.port = "80";
  }
  if (t.host.empty() || t.port.empty()) return err("--url: no host or port in '{}'", url);
  return t;
}

// Splits a text/event-stream body into the data payloads of its events.
class SseParser {
 public:
  void feed(std::string_view bytes, std::vector<std::string>* out) {
    pending_.append(bytes);
    for (;;) {
      size_t end = pending_.find("\n\n");
      size_t sep = 2;
      const size_t crlf = pending_.find("\r\n\r\n");
      if (crlf != std::string::npos && (end == std::string::npos || crlf < end)) {
        end = crlf;
        sep = 4;
      }
      if (end == std::string::npos) return;
      std::string data;
      size_t pos = 0;
      while (pos < end) {
        size_t eol = pending_.find('\n', pos);
        if (eol == std::string::npos || eol > end) eol = end;
        std::string_view line(pending_.data() + pos, eol - pos);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.rfind("data:", 0) == 0) {
          line.remove_prefix(5);
          if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
          if (!data.empty()) data += '\n';
          data.append(line);
        }
        pos = eol + 1;
      }
      pending_.erase(0, end + sep);
      if (!data.empty()) out->push_back(std::move(data));
    }
  }

 private:
  std::string pending_;
};

// Why a request failed. The JSON report names them as kCauseNames does.
enum class FailureCause { kNone, kHttpStatus, kErrorFrame, kStream, kTransport };
constexpr const char* kCauseNames[] = {"none", "http_status", "error_frame", "stream", "transport"};

struct RequestResult {
  bool ok = false;
  int status = 0;
  std::string error;
  FailureCause cause = FailureCause::kNone;
  // The connection failed before any byte of the response (the request was not processed).
  bool no_response = false;
  int32_t num_resent = 0;  // sends again on a fresh connection after a stale kept-alive one
  double ttft_s = -1;      // to the first chunk with output text
  double total_s = 0;
  int32_t num_chunks = 0;         // chunks with output text
  int32_t num_usage_tokens = -1;  // usage.completion_tokens, when sent
  int32_t num_prompt_tokens = -1;
  std::vector<double> gaps_s;  // between consecutive output chunks
  int32_t num_output_tokens() const {
    return num_usage_tokens >= 0 ? num_usage_tokens : num_chunks;
  }
};

// Pulls the output text out of one chunk (chat delta content/reasoning/tool calls, or
// completions text); notes usage; an error frame fails the request.
void on_event(const std::string& data, Clock::time_point t0, Clock::time_point now,
              Clock::time_point* last, RequestResult* r, bool* done) {
  if (data == "[DONE]") {
    *done = true;
    return;
  }
  const Json j = Json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    if (r->error.empty()) {
      r->error = "a stream event is not JSON: " + data.substr(0, 120);
      r->cause = FailureCause::kStream;
    }
    return;
  }
  if (j.contains("error")) {
    if (r->error.empty()) {
      r->error = "error frame: " +
                 j["error"].dump(-1, ' ', false, Json::error_handler_t::replace).substr(0, 200);
      r->cause = FailureCause::kErrorFrame;
    }
    return;
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const Json& u = j["usage"];
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
      r->num_usage_tokens = u["completion_tokens"].get<int32_t>();
    if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer())
      r->num_prompt_tokens = u["prompt_tokens"].get<int32_t>();
  }
  bool has_output = false;
  if (j.contains("choices") && j["choices"].is_array()) {
    for (const Json& c : j["choices"]) {
      auto nonempty = [](const Json& o, const char* key) {
        return o.is_object() && o.contains(key) &&
               ((o[key].is_string() && !o[key].get<std::string>().empty()) || o[key].is_array());
      };
      if (nonempty(c, "text")) has_output = true;
      if (c.contains("delta") &&
          (nonempty(c["delta"], "content") || nonempty(c["delta"], "reasoning_content") ||
           nonempty(c["delta"], "tool_calls")))
        has_output = true;
    }
  }
  if (!has_output) return;
  if (r->num_chunks == 0)
    r->ttft_s = std::chrono::duration<double>(now - t0).count();
  else
    r->gaps_s.push_back(std::chrono::duration<double>(now - *last).count());
  *last = now;
  ++r->num_chunks;
}

// The peer had closed the connection: the failure of a write or a first read on a kept-alive
// connection the server closed meanwhile. A timeout is not one (the server may be working on
// the request), nor is any other error.
bool peer_closed(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof ||
         ec == net::error::connection_reset || ec == net::error::broken_pipe ||
         ec == net::error::connection_aborted;
}

// One client: a keep-alive connection of its own, with a timeout on every operation.
class Client {
 public:
  Client(const Target& target, const HttpBenchOptions& o) : target_(target), o_(o), stream_(ioc_) {}

  // GET path: the body of a 200 answer, else an error.
  Expected<std::string> get(const std::string& path) {
    if (const std::string why = connect(); !why.empty()) return err("{}", why);
    beast::error_code ec;
    http::request<http::empty_body> req{http::verb::get, target_.prefix + path, 11};
    req.set(http::field::host, target_.host);
    if (!o_.api_key.empty()) req.set(http::field::authorization, "Bearer " + o_.api_key);
    req.keep_alive(false);
    ec = run([&](auto h) { http::async_write(stream_, req, std::move(h)); });
    http::response<http::string_body> res;
    if (!ec) ec = run([&](auto h) { http::async_read(stream_, buffer_, res, std::move(h)); });
    close();
    if (ec) return err("GET {}: {}", path, ec.message());
    if (res.result_int() != 200) return err("GET {}: HTTP {}", path, res.result_int());
    return res.body();
  }

  // Sends one request and reads its stream. A request that failed on a reused connection
  // before any byte of its response is sent once more on a fresh connection.
  RequestResult request(const std::string& path, const std::string& body) {
    const bool reused = connected_;
    RequestResult r = attempt(path, body);
    if (reused && r.no_response) {
      r = attempt(path, body);
      r.num_resent = 1;
    }
    return r;
  }

 private:
  RequestResult attempt(const std::string& path, const std::string& body) {
    RequestResult r;
    const Clock::time_point t0 = Clock::now();
    if (std::string why = connect(); !why.empty()) return fail(&r, std::move(why));
    beast::error_code ec;
    http::request<http::string_body> req{http::verb::post, target_.prefix + path, 11};
    req.set(http::field::host, target_.host);
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "text/event-stream");
    if (!o_.api_key.empty()) req.set(http::field::authorization, "Bearer " + o_.api_key);
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    ec = run([&](auto h) { http::async_write(stream_, req, std::move(h)); });
    if (ec) {
      r.no_response = peer_closed(ec);
      return fail(&r, "write: " + ec.message());
    }

    http::response_parser<http::buffer_body> parser;
    parser.body_limit(std::numeric_limits<uint64_t>::max());
    ec = run([&](auto h) { http::async_read_header(stream_, buffer_, parser, std::move(h)); });
    if (ec) {
      r.no_response = peer_closed(ec) && !parser.got_some() && buffer_.size() == 0;
      return fail(&r, "read header: " + ec.message());
    }
    r.status = static_cast<int>(parser.get().result_int());
    SseParser sse;
    std::string error_body;
    std::vector<std::string> events;
    Clock::time_point last = t0;
    bool done = false;
    char chunk[16384];
    while (!parser.is_done()) {
      parser.get().body().data = chunk;
      parser.get().body().size = sizeof(chunk);
      ec = run([&](auto h) { http::async_read_some(stream_, buffer_, parser, std::move(h)); });
      if (ec == http::error::need_buffer) ec = {};
      if (ec) return fail(&r, "read body: " + ec.message());
      const size_t n = sizeof(chunk) - parser.get().body().size;
      const Clock::time_point now = Clock::now();
      if (r.status != 200) {
        error_body.append(chunk, n);
        continue;
      }
      events.clear();
      sse.feed(std::string_view(chunk, n), &events);
      for (const std::string& e : events) on_event(e, t0, now, &last, &r, &done);
    }
    r.total_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!parser.keep_alive()) close();  // Connection: close (or HTTP/1.0)
    if (r.status != 200) {
      r.error = fmt::format("HTTP {}: {}", r.status, error_body.substr(0, 200));
      r.cause = FailureCause::kHttpStatus;
      return r;
    }
    if (r.error.empty() && !done) r.error = "the stream ended without [DONE]";
    if (r.error.empty() && r.num_chunks == 0) r.error = "no output";
    if (!r.error.empty() && r.cause == FailureCause::kNone) r.cause = FailureCause::kStream;
    r.ok = r.error.empty();
    return r;
  }

  // Connects unless the kept-alive connection is still open; why it could not, else "".
  std::string connect() {
    if (connected_) return {};
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    const auto endpoints = resolver.resolve(target_.host, target_.port, ec);
    if (ec) return "resolve: " + ec.message();
    ec = run([&](auto h) { stream_.async_connect(endpoints, std::move(h)); });
    if (ec) return "connect: " + ec.message();
    // As clients of streaming APIs do: a request goes out as written (no Nagle delay).
    stream_.socket().set_option(tcp::no_delay(true), ec);
    connected_ = true;
    return {};
  }

  // Runs one async operation on this thread's io_context with the operation timeout (the
  // stream closes the socket when it expires and the operation fails with timeout).
  template <typename Start>
  beast::error_code run(Start&& start) {
    beast::error_code result = net::error::would_block;
    stream_.expires_after(std::chrono::seconds(o_.timeout_s));
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    ioc_.restart();
    ioc_.run();
    stream_.expires_never();
    ioc_.restart();
    ioc_.run();  // the cancelled timer's handler
    return result;
  }
  // A transport failure, unless the stream had already failed for a cause of its own (an
  // error frame before the connection dropped is the error frame's fault).
  RequestResult fail(RequestResult* r, std::string why) {
    if (r->cause == FailureCause::kNone) {
      r->error = std::move(why);
      r->cause = FailureCause::kTransport;
    }
    close();
    return std::move(*r);
  }
  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    buffer_.clear();
    connected_ = false;
  }

  const Target& target_;
  const HttpBenchOptions& o_;
  net::io_context ioc_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  bool connected_ = false;
};

// "<nonce> w w w ...": the nonce first, so no two prompts share a cacheable prefix.
std::string make_prompt(std::mt19937_64& rng, int num_words) {
  static constexpr const char* kWords[] = {
      "the",   "river", "morning", "stone",  "light", "garden", "quiet",  "market", "window",
      "story", "north", "bright",  "letter", "field", "silver", "winter", "road",   "music",
      "table", "cloud", "harbor",  "green",  "paper", "forest", "simple", "travel", "house",
      "early", "voice", "orange",  "bridge", "ocean", "gentle", "summer", "number", "animal"};
  constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);
  std::string p = fmt::format("{:016x}.", rng());
  for (int i = 0; i < num_words; ++i) {
    p += ' ';
    p += kWords[rng() % kNumWords];
  }
  return p;
}

std::string make_body(const HttpBenchOptions& o, const std::string& prompt) {
  Json j = Json::object();
  if (!o.model.empty()) j["model"] = o.model;
  if (o.endpoint == "chat") {
    j["messages"] = Json::array({Json{{"role", "user"}, {"content", prompt}}});
  } else {
    j["prompt"] = prompt;
  }
  j["max_tokens"] = o.max_tokens;
  j["temperature"] = o.temperature;
  j["ignore_eos"] = true;
  j["stream"] = true;
  j["stream_options"] = Json{{"include_usage", true}};
  return j.dump();
}

// Linear interpolation between closest ranks; 0 for no samples.
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// kiln's engine phases (kiln_engine_step_seconds_total{phase}): kWait is the device's, kDeliver
// the events' hand-over (on a GPU while the next step runs).
constexpr const char* kPhases[] = {"schedule", "launch", "wait", "update", "deliver"};
constexpr int kNumPhases = static_cast<int>(std::size(kPhases));
constexpr int kWait = 2, kDeliver = 4;

// The engine's step count and seconds by phase from kiln's /metrics text; false when absent.
bool engine_metrics(const std::string& text, double* steps, double* phase_s) {
  auto value = [&](const std::string& series, double* out) {
    const size_t at = text.find("\n" + series + " ");
    if (at == std::string::npos) return false;
    *out = std::strtod(text.c_str() + at + series.size() + 2, nullptr);
    return true;
  };
  bool ok = value("kiln_engine_steps_total", steps);
  for (int i = 0; i < kNumPhases; ++i)
    ok = ok && value(fmt::format("kiln_engine_step_seconds_total{{phase=\"{}\"}}", kPhases[i]),
                     &phase_s[i]);
  return ok;
}

struct Level {
  int concurrency = 0;
  int num_requests = 0;
  int num_ok = 0;
  double wall_s = 0;
  int64_t num_output_tokens = 0;
  int64_t num_prompt_tokens = 0;
  int num_count_mismatch = 0;  // ok requests whose output count != max_tokens
  int num_chunk_mismatch = 0;  // ok requests whose usage count != their chunk count
  int num_resent = 0;          // requests sent again after a stale kept-alive connection
  int num_errors_by_cause[std::size(kCauseNames)] = {};
  std::map<int, int> num_by_http_status;  // failed requests by HTTP status
  std::vector<double> ttft_s, itl_s, latency_s, tpot_s;
  std::vector<std::string> errors;  // the first few
  // --server-metrics: the engine's steps in this level and its thread's seconds by phase
  // (kPhases); steps < 0 when not read.
  double steps = -1;
  double phase_s[kNumPhases] = {};

  int num_errors(FailureCause c) const { return num_errors_by_cause[static_cast<int>(c)]; }

  Json to_json() const {
    auto ms = [](const std::vector<double>& v) {
      return Json{{"p50", percentile(v, 50) * 1e3},
                  {"p90", percentile(v, 90) * 1e3},
                  {"p99", percentile(v, 99) * 1e3},
                  {"mean", mean(v) * 1e3}};
    };
    Json j = Json::object();
    j["concurrency"] = concurrency;
    j["num_requests"] = num_requests;
    j["num_ok"] = num_ok;
    j["num_errors"] = num_requests - num_ok;
    Json by_cause = Json::object();
    for (size_t c = 1; c < std::size(kCauseNames); ++c)
      by_cause[kCauseNames[c]] = num_errors_by_cause[c];
    j["errors_by_cause"] = by_cause;
    Json by_status = Json::object();
    for (const auto& [status, n] : num_by_http_status) by_status[std::to_string(status)] = n;
    j["errors_by_http_status"] = by_status;
    j["num_resent"] = num_resent;
    j["errors"] = errors;
    j["wall_s"] = wall_s;
    j["num_output_tokens"] = num_output_tokens;
    j["num_prompt_tokens"] = num_prompt_tokens;
    j["output_tok_per_s"] = wall_s > 0 ? static_cast<double>(num_output_tokens) / wall_s : 0.0;
    j["requests_per_s"] = wall_s > 0 ? num_ok / wall_s : 0.0;
    j["ttft_ms"] = ms(ttft_s);
    j["itl_ms"] = ms(itl_s);
    j["tpot_ms"] = ms(tpot_s);
    j["latency_ms"] = ms(latency_s);
    j["num_token_count_mismatch"] = num_count_mismatch;
    j["num_chunk_count_mismatch"] = num_chunk_mismatch;
    if (steps >= 0) {
      j["engine_steps"] = steps;
      Json per = Json::object();
      for (int i = 0; i < kNumPhases; ++i)
        per[kPhases[i]] = steps > 0 ? phase_s[i] / steps * 1e3 : 0.0;
      j["engine_ms_per_step"] = per;
    }
    return j;
  }
};

Level run_level(const Target& target, const HttpBenchOptions& o, int concurrency, uint64_t seed) {
  const std::string path = o.endpoint == "chat" ? "/v1/chat/completions" : "/v1/completions";
  std::vector<std::string> bodies;
  std::mt19937_64 rng(seed);
  for (int i = 0; i < o.requests; ++i)
    bodies.push_back(make_body(o, make_prompt(rng, o.prompt_words)));
  std::vector<RequestResult> results(static_cast<size_t>(o.requests));
  std::atomic<int> next{0};
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&] {
      Client client(target, o);
      for (int i = next++; i < o.requests; i = next++)
        results[static_cast<size_t>(i)] = client.request(path, bodies[static_cast<size_t>(i)]);
    });
  }
  for (std::thread& t : threads) t.join();
  Level l;
  l.concurrency = concurrency;
  l.num_requests = o.requests;
  l.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const RequestResult& r : results) {
    l.num_resent += r.num_resent;
    if (!r.ok) {
      ++l.num_errors_by_cause[static_cast<int>(r.cause)];
      if (r.cause == FailureCause::kHttpStatus) ++l.num_by_http_status[r.status];
      if (l.errors.size() < 5) l.errors.push_back(r.error);
      continue;
    }
    ++l.num_ok;
    const int32_t n = r.num_output_tokens();
    l.num_output_tokens += n;
    if (r.num_prompt_tokens > 0) l.num_prompt_tokens += r.num_prompt_tokens;
    if (n != o.max_tokens) ++l.num_count_mismatch;
    if (r.num_usage_tokens >= 0 && r.num_usage_tokens != r.num_chunks) ++l.num_chunk_mismatch;
    l.ttft_s.push_back(r.ttft_s);
    l.latency_s.push_back(r.total_s);
    l.itl_s.insert(l.itl_s.end(), r.gaps_s.begin(), r.gaps_s.end());
    if (n > 1) l.tpot_s.push_back((r.total_s - r.ttft_s) / (n - 1));
  }
  return l;
}

void print_table(const HttpBenchOptions& o, const std::vector<Level>& levels) {
  fmt::print("kiln bench http: {} /v1/{} | ~{} prompt words, {} output tokens, {} requests/level\n",
             o.url, o.endpoint == "chat" ? "chat/completions" : "completions", o.prompt_words,
             o.max_tokens, o.requests);
  fmt::print(
      "| {:>4} | {:>4} | {:>4} | {:>5} | {:>6} | {:>5} | {:>6} | {:>9} | {:>9} | {:>8} | {:>8} "
      "| {:>10} | {:>7} |\n",
      "conc", "ok", "http", "frame", "stream", "net", "resent", "TTFT p50", "TTFT p99", "ITL p50",
      "ITL p99", "out tok/s", "req/s");
  fmt::print(
      "| {:->4} | {:->4} | {:->4} | {:->5} | {:->6} | {:->5} | {:->6} | {:->9} | {:->9} | {:->8} "
      "| {:->8} | {:->10} | {:->7} |\n",
      "", "", "", "", "", "", "", "", "", "", "", "", "");
  for (const Level& l : levels) {
    fmt::print(
        "| {:>4} | {:>4} | {:>4} | {:>5} | {:>6} | {:>5} | {:>6} | {:>6.0f} ms | {:>6.0f} ms "
        "| {:>5.1f} ms | {:>5.1f} ms | {:>10.1f} | {:>7.2f} |\n",
        l.concurrency, l.num_ok, l.num_errors(FailureCause::kHttpStatus),
        l.num_errors(FailureCause::kErrorFrame), l.num_errors(FailureCause::kStream),
        l.num_errors(FailureCause::kTransport), l.num_resent, percentile(l.ttft_s, 50) * 1e3,
        percentile(l.ttft_s, 99) * 1e3, percentile(l.itl_s, 50) * 1e3,
        percentile(l.itl_s, 99) * 1e3, l.wall_s > 0 ? l.num_output_tokens / l.wall_s : 0.0,
        l.wall_s > 0 ? l.num_ok / l.wall_s : 0.0);
  }
  fmt::print(
      "failures by cause: http = an HTTP status other than 200, frame = an error frame in the "
      "stream,\nstream = a malformed stream (not JSON, no [DONE], no output), net = transport "
      "(connect,\nwrite, read, timeout); resent = sent again on a fresh connection after the "
      "server had closed\na kept-alive one (not failures)\n");
  for (const Level& l : levels) {
    for (const auto& [status, n] : l.num_by_http_status)
      fmt::print("  conc {}: {} requests answered HTTP {}\n", l.concurrency, n, status);
    for (const std::string& e : l.errors) fmt::print("  conc {}: {}\n", l.concurrency, e);
    if (l.steps > 0) {
      // The host's share: what keeps the device waiting (not the wait itself, nor the events'
      // hand-over, which a GPU step overlaps).
      double host = 0, total = 0;
      for (int i = 0; i < kNumPhases; ++i) {
        total += l.phase_s[i];
        if (i != kWait && i != kDeliver) host += l.phase_s[i];
      }
      const double ms = 1e3 / l.steps;
      fmt::print(
          "  conc {}: engine, {:.0f} steps: ms per step schedule {:.2f}, launch {:.2f}, wait "
          "{:.2f}, update {:.2f}, deliver {:.2f} (host {:.2f} of {:.2f})\n",
          l.concurrency, l.steps, l.phase_s[0] * ms, l.phase_s[1] * ms, l.phase_s[2] * ms,
          l.phase_s[3] * ms, l.phase_s[4] * ms, host * ms, total * ms);
    }
    if (l.num_count_mismatch > 0)
      fmt::print(
          "  conc {}: {} requests did not generate exactly {} tokens (ignore_eos unhonoured?)\n",
          l.concurrency, l.num_count_mismatch, o.max_tokens);
  }
}

int run_bench_http(const HttpBenchOptions& o) {
  auto target = parse_url(o.url);
  if (!target.ok()) {
    fmt::print(stderr, "kiln bench http: {}\n", target.error().message);
    return 2;
  }
  if (o.endpoint != "chat" && o.endpoint != "completions") {
    fmt::print(stderr, "kiln bench http: --endpoint must be chat or completions\n");
    return 2;
  }
  std::mt19937_64 seeds(std::random_device{}());
  if (o.warmup) {  // loads pages, warms the server's caches and threads; not reported
    HttpBenchOptions w = o;
    w.requests = 1;
    w.max_tokens = std::min(o.max_tokens, 4);
    const Level l = run_level(*target, w, 1, seeds());
    if (l.num_ok == 0) {
      fmt::print(stderr, "kiln bench http: the warm-up request failed: {}\n",
                 l.errors.empty() ? "?" : l.errors[0]);
      return 1;
    }
  }
  std::vector<Level> levels;
  for (int c : o.concurrency) {
    double steps0 = 0, phase0[kNumPhases] = {};
    bool before = false;
    if (o.server_metrics) {
      auto m = Client(*target, o).get("/metrics");
      before = m.ok() && engine_metrics(*m, &steps0, phase0);
    }
    levels.push_back(run_level(*target, o, c, seeds()));
    if (!before) continue;
    Level& l = levels.back();
    auto m = Client(*target, o).get("/metrics");
    double steps1 = 0, phase1[kNumPhases] = {};
    if (!m.ok() || !engine_metrics(*m, &steps1, phase1)) continue;
    l.steps = steps1 - steps0;
    for (int i = 0; i < kNumPhases; ++i) l.phase_s[i] = phase1[i] - phase0[i];
  }
  if (o.json) {
    Json j = Json::object();
    j["url"] = o.url;
    j["endpoint"] = o.endpoint;
    j["model"] = o.model;
    j["prompt_words"] = o.prompt_words;
    j["max_tokens"] = o.max_tokens;
    j["requests_per_level"] = o.requests;
    j["levels"] = Json::array();
    for (const Level& l : levels) j["levels"].push_back(l.to_json());
    // Error texts quote server output cut at a byte count, which may split a UTF-8 sequence:
    // replace invalid bytes rather than throw.
    fmt::print("{}\n", j.dump(2, ' ', false, Json::error_handler_t::replace));
  } else {
    print_table(o, levels);
  }
  for (const Level& l : levels)
    if (l.num_ok < l.num_requests) return 1;
  return 0;
}

}  // namespace

void add_bench_http(CLI::App& bench, std::function<bool()>* chosen, RunFn* run) {
  auto* cmd = bench.add_subcommand(
      "http", "Load-test a running OpenAI-compatible server (kiln serve, llama-server)");
  auto o = std::make_shared<HttpBenchOptions>();
  cmd->add_option("--url", o->url, "server base URL (http://host:port)")->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "sent as 'Authorization: Bearer KEY'");
  cmd->add_option("--model", o->model, "model name to send (default: none)");
  cmd->add_option("--concurrency", o->concurrency, "concurrency levels to sweep, e.g. 1,2,4,8")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--requests", o->requests, "requests per concurrency level")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", o->prompt_words,
                  "prompt length in words (about as many tokens), after a unique nonce")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens, "tokens generated per request (ignore_eos)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--endpoint", o->endpoint, "chat (/v1/chat/completions) or completions")
      ->check(CLI::IsMember({"chat", "completions"}))
      ->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "sampling temperature")->capture_default_str();
  cmd->add_option("--timeout", o->timeout_s, "seconds one socket operation may take")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  cmd->add_flag("!--no-warmup", o->warmup, "skip the unreported warm-up request");
  cmd->add_flag("--json", o->json, "JSON output");
  cmd->add_flag("--server-metrics", o->server_metrics,
                "read kiln serve's /metrics around each level: the engine's time per step by "
                "phase (the host's share of a step)");
  *chosen = [cmd]() { return cmd->parsed(); };
  *run = [o]() { return run_bench_http(*o); };
}

}  // namespace kiln::cli
