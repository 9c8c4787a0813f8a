#include "kiln/server/generation.h"

#include <cmath>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "kiln/engine/sampler.h"
#include "kiln/engine/stop.h"
#include "kiln/server/request_controls.h"

namespace kiln::server {

namespace {

// Type-checked field readers: a wrong type is a 400 naming the field.
std::optional<ApiError> read_float(const Json& body, const char* key, float* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return invalid_request(fmt::format("'{}' must be a number", key), key);
  const double v = it->get<double>();
  if (!std::isfinite(v)) return invalid_request(fmt::format("'{}' must be finite", key), key);
  *out = static_cast<float>(v);
  return std::nullopt;
}

std::optional<ApiError> read_int(const Json& body, const char* key, int64_t lo, int64_t hi,
                                 std::optional<int64_t>* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  bool integral = it->is_number_integer();
  if (!integral && it->is_number_float()) {
    const double d = it->get<double>();
    integral = std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15;
  }
  if (!integral) return invalid_request(fmt::format("'{}' must be an integer", key), key);
  const int64_t v = it->is_number_float() ? static_cast<int64_t>(it->get<double>())
                    : it->is_number_unsigned()
                        ? static_cast<int64_t>(std::min<uint64_t>(it->get<uint64_t>(), INT64_MAX))
                        : it->get<int64_t>();
  if (v < lo || v > hi)
    return invalid_request(fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v), key);
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> read_bool(const Json& body, const char* key, bool* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return invalid_request(fmt::format("'{}' must be a boolean", key), key);
  *out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> read_stop(const Json& body, std::vector<std::string>* out) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    out->push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (const auto& s : *it) {
      if (!s.is_string())
        return invalid_request("'stop' must be a string or an array of strings", "stop");
      out->push_back(s.get<std::string>());
    }
  } else {
    return invalid_request("'stop' must be a string or an array of strings", "stop");
  }
  if (Status st = engine::validate_stops(*out); !st.ok())
    return invalid_request(st.error().message, "stop");
  return std::nullopt;
}

std::optional<ApiError> read_logit_bias(const Json& body, int32_t n_vocab,
                                        engine::SamplingParams* sp) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object())
    return invalid_request("'logit_bias' must be an object of token id -> bias", "logit_bias");
  for (const auto& [key, value] : it->items()) {
    // Keys are token ids written as strings ("50256").
    int64_t id = -1;
    bool digits = !key.empty() && key.size() <= 10;
    for (char c : key) digits = digits && c >= '0' && c <= '9';
    if (digits) id = std::stoll(key);
    if (!digits || id >= n_vocab)
      return invalid_request(
          fmt::format("logit_bias: key '{}' is not a token id of this model (0..{})", key,
                      n_vocab - 1),
          "logit_bias");
    if (!value.is_number())
      return invalid_request(fmt::format("logit_bias: the bias of token {} must be a number", key),
                             "logit_bias");
    sp->logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
  }
  return std::nullopt;
}

#define KILN_CHECK(expr)             \
  do {                               \
    if (auto e_ = (expr)) return e_; \
  } while (0)

}  // namespace

std::variant<Json, ApiError> parse_body(const std::string& body) {
  // nlohmann's lexer takes a NUL byte for the end of the input: a NUL anywhere (JSON allows
  // none, not even inside a string) is refused, so the whole body is what gets parsed.
  if (const size_t nul = body.find('\0'); nul != std::string::npos)
    return invalid_json(fmt::format("a NUL byte at offset {}", nul));
  // Nesting is bounded before parsing: a body of 8 MiB of '[' must not recurse that deep.
  constexpr int kMaxDepth = 256;
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth)
        return invalid_json(fmt::format("nesting deeper than {} levels", kMaxDepth));
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  // The path of the value being parsed ("messages[0].content"), so that an error nlohmann
  // raises inside a value (a number too large for a double) can name the field.
  struct Frame {
    bool is_array = false;
    std::string key;        // in an object: the key of the value being parsed
    int64_t num_items = 0;  // in an array: the values already parsed
  };
  std::vector<Frame> frames;
  auto where = [&] {
    std::string w;
    for (const Frame& f : frames)
      w += f.is_array ? fmt::format("[{}]", f.num_items) : (w.empty() ? "" : ".") + f.key;
    return w;
  };
  auto track = [&](int, Json::parse_event_t event, Json& parsed) {
    using E = Json::parse_event_t;
    if (event == E::object_start || event == E::array_start) {
      frames.push_back(Frame{event == E::array_start, "", 0});
    } else if (event == E::key) {
      if (!frames.empty() && parsed.is_string()) frames.back().key = parsed.get<std::string>();
    } else {
      // A value ended: a scalar (value), or a nested container (object_end, array_end).
      if (event != E::value && !frames.empty()) frames.pop_back();
      if (!frames.empty() && frames.back().is_array) ++frames.back().num_items;
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(body, track);
  } catch (const Json::out_of_range&) {
    // 1e309: the number does not fit a double.
    const std::string field = where();
    if (field.empty()) return invalid_json("a number is too large");
    return invalid_request(fmt::format("'{}': the number is too large (beyond a double)", field),
                           field);
  } catch (const Json::exception& e) {
    return invalid_json(e.what());
  }
  if (!j.is_object()) return invalid_request("The request body must be a JSON object");
  return j;
}

std::optional<ApiError> check_model(const Json& body, const ServerContext& ctx) {
  auto it = body.find("model");
  if (it == body.end() || it->is_null()) return std::nullopt;  // lenient: the served model
  if (!it->is_string()) return invalid_request("'model' must be a string", "model");
  const std::string model = it->get<std::string>();
  if (model != ctx.options.model_name) return model_not_found(model);
  return std::nullopt;
}

std::optional<ApiError> check_ready(const ServerContext& ctx) {
  switch (ctx.engine.state()) {
    case engine::EngineState::kReady:
      return std::nullopt;
    case engine::EngineState::kLoading:
      return unavailable("The model is still loading; retry shortly");
    case engine::EngineState::kFailed:
      return unavailable("The engine failed; see the server log");
    case engine::EngineState::kStopped:
      return unavailable("The server is shutting down");
  }
  return unavailable("The engine is not available");
}

std::optional<ApiError> parse_common(const Json& body, Api api, const ServerContext& ctx,
                                     CommonParams* out) {
  engine::SamplingParams& sp = out->request.sampling;
  KILN_CHECK(read_float(body, "temperature", &sp.temperature));
  KILN_CHECK(read_float(body, "top_p", &sp.top_p));
  KILN_CHECK(read_float(body, "min_p", &sp.min_p));
  KILN_CHECK(read_float(body, "presence_penalty", &sp.presence_penalty));
  KILN_CHECK(read_float(body, "frequency_penalty", &sp.frequency_penalty));
  KILN_CHECK(read_float(body, "repetition_penalty", &sp.repetition_penalty));
  std::optional<int64_t> v;
  KILN_CHECK(read_int(body, "top_k", -1, INT32_MAX, &v));
  if (v) sp.top_k = *v < 0 ? 0 : static_cast<int32_t>(*v);  // -1: off (vLLM)
  v.reset();
  KILN_CHECK(read_int(body, "n", 1, ctx.options.max_n, &v));
  if (v) out->n = static_cast<int32_t>(*v);
  v.reset();
  KILN_CHECK(read_int(body, "seed", INT64_MIN, INT64_MAX, &v));
  sp.seed = v ? static_cast<uint64_t>(*v) : random_seed();
  auto asked = read_max_tokens_fields(body);
  if (auto* e = std::get_if<ApiError>(&asked)) return *e;
  auto resolved = resolve_max_tokens(
      std::get<MaxTokensAsked>(asked), ctx.options.token_limits,
      api == Api::kCompletions ? std::optional<int32_t>(16) : std::nullopt);  // OpenAI's
  if (auto* e = std::get_if<ApiError>(&resolved)) return *e;
  out->max_tokens = std::get<MaxTokens>(resolved).value;
  out->max_tokens_asked = std::get<MaxTokens>(resolved).asked;
  if (api == Api::kChat) {
    KILN_CHECK(read_bool(body, "logprobs", &sp.logprobs));
    v.reset();
    KILN_CHECK(read_int(body, "top_logprobs", 0, 20, &v));
    if (v) {
      if (!sp.logprobs)
        return invalid_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
      sp.top_logprobs = static_cast<int32_t>(*v);
    }
  } else {
    v.reset();
    KILN_CHECK(read_int(body, "logprobs", 0, 5, &v));
    if (v) {
      out->legacy_logprobs = static_cast<int32_t>(*v);
      sp.logprobs = true;
      sp.top_logprobs = static_cast<int32_t>(*v);
    }
  }
  KILN_CHECK(read_bool(body, "ignore_eos", &out->request.ignore_eos));
  KILN_CHECK(read_bool(body, "stream", &out->stream));
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object())
      return invalid_request("'stream_options' must be an object", "stream_options");
    KILN_CHECK(read_bool(*it, "include_usage", &out->include_usage));
    if (!out->stream)
      return invalid_request("'stream_options' is only allowed when 'stream' is true",
                             "stream_options");
  }
  KILN_CHECK(read_stop(body, &out->request.stop));
  KILN_CHECK(read_logit_bias(body, ctx.tokenizer.num_tokens(), &sp));
  if (Status st = engine::validate(sp, ctx.tokenizer.num_tokens()); !st.ok())
    return from_validation(st.error().message);
  return std::nullopt;
}

std::optional<ApiError> check_num_choices(const ServerContext& ctx, size_t num_prompts, int32_t n) {
  const size_t limit = static_cast<size_t>(std::max(ctx.options.max_choices, 1));
  const size_t asked = num_prompts * static_cast<size_t>(std::max(n, 1));
  if (asked <= limit) return std::nullopt;
  if (num_prompts == 1)
    return invalid_request(
        fmt::format("'n' asks for {} choices; this server takes at most {} generations per "
                    "request (kiln serve --max-waiting)",
                    asked, limit),
        "n");
  return invalid_request(
      fmt::format("this request asks for {} generations ({} prompts x n = {}); this server takes "
                  "at most {} per request (kiln serve --max-waiting)",
                  asked, num_prompts, n, limit),
      "prompt");
}

std::optional<ApiError> finalize_request(const ServerContext& ctx, int32_t num_prompt_tokens,
                                         CommonParams* params) {
  const int64_t n_ctx = ctx.engine.context_length();
  if (auto e = check_context_length(n_ctx, num_prompt_tokens,
                                    params->max_tokens_asked ? params->max_tokens : std::nullopt))
    return e;
  // A default length is bounded by what the context leaves; an asked one was checked above.
  int64_t max_tokens = n_ctx - num_prompt_tokens;
  if (params->max_tokens) max_tokens = std::min<int64_t>(max_tokens, *params->max_tokens);
  params->request.max_tokens = static_cast<int32_t>(max_tokens);
  if (ctx.options.request_timeout.count() > 0)
    params->request.deadline = Clock::now() + ctx.options.request_timeout;
  return std::nullopt;
}

MultiRun::~MultiRun() {
  cancel_all();
}

void MultiRun::cancel_all() {
  for (Choice& c : choices_)
    if (!c.finished && c.channel) c.channel->cancel();
}

std::optional<ApiError> MultiRun::submit(std::vector<engine::GenerationRequest> requests) {
  for (auto& req : requests) {
    auto result = ctx_.engine.submit(std::move(req));
    if (auto* refusal = std::get_if<engine::SubmitRefusal>(&result)) {
      cancel_all();
      return from_refusal(*refusal, ctx_.options.retry_after_seconds);
    }
    Choice c;
    c.channel = std::get<std::shared_ptr<engine::RequestChannel>>(std::move(result));
    c.submitted = Clock::now();
    choices_.push_back(std::move(c));
  }
  return std::nullopt;
}

void MultiRun::record(Choice& c, const engine::Event& e) {
  last_event_ = Clock::now();
  if (std::holds_alternative<engine::FinishEvent>(e)) {
    c.finished = true;
    return;
  }
  const Clock::time_point now = Clock::now();
  if (!c.got_token) {
    ctx_.metrics.observe_ttft(std::chrono::duration<double>(now - c.submitted).count());
    c.got_token = true;
  } else {
    ctx_.metrics.observe_inter_token(std::chrono::duration<double>(now - c.last_token).count());
  }
  c.last_token = now;
}

std::optional<std::pair<int, engine::Event>> MultiRun::next(HttpExchange& exchange) {
  using std::chrono::milliseconds;
  for (;;) {
    if (aborted_ != AbortReason::kNone) return std::nullopt;
    // The client is polled at most every 20 ms, also while events keep flowing.
    const Clock::time_point now = Clock::now();
    if (now - last_poll_ >= milliseconds(20)) {
      last_poll_ = now;
      aborted_ = exchange.abort_reason();
      if (aborted_ != AbortReason::kNone) {
        cancel_all();
        return std::nullopt;
      }
    }
    int first_open = -1;
    const size_t num = choices_.size();
    for (size_t k = 0; k < num; ++k) {
      const size_t i = (cursor_ + k) % num;
      Choice& c = choices_[i];
      if (c.finished) continue;
      if (first_open < 0) first_open = static_cast<int>(i);
      if (auto e = c.channel->pop(milliseconds(0))) {
        cursor_ = (i + 1) % num;
        record(c, *e);
        return std::make_pair(static_cast<int>(i), std::move(*e));
      }
    }
    if (first_open < 0) return std::nullopt;  // every request finished
    if (on_idle_ && idle_every_.count() > 0 && Clock::now() - last_event_ >= idle_every_) {
      last_event_ = Clock::now();
      on_idle_();
    }
    Choice& c = choices_[static_cast<size_t>(first_open)];
    if (auto e = c.channel->pop(milliseconds(num == 1 ? 20 : 5))) {
      record(c, *e);
      return std::make_pair(first_open, std::move(*e));
    }
  }
}

const char* finish_reason_name(engine::FinishReason reason) {
  return reason == engine::FinishReason::kLength ? "length" : "stop";
}

ApiError generation_error(const engine::FinishEvent& finish) {
  if (finish.reason == engine::FinishReason::kCancelled)
    return unavailable("The request was cancelled by the server (timeout or shutdown)");
  if (finish.unavailable) return unavailable("The model's device failed: " + finish.error);
  return internal_error("Generation failed: " +
                        (finish.error.empty() ? std::string("unknown error") : finish.error));
}

std::string sse_data(const std::string& json) {
  return "data: " + json + "\n\n";
}

std::string sse_event(std::string_view name, const std::string& json) {
  std::string out;
  out.reserve(name.size() + json.size() + 16);
  out += "event: ";
  out += name;
  out += "\ndata: ";
  out += json;
  out += "\n\n";
  return out;
}

uint64_t random_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

}  // namespace kiln::server
