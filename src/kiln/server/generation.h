// What chat and completions share: the sampling/stop/length parameters of a request body,
// the admission checks done before submit (model name, context length, validation), and
// running n engine requests while watching the client (MultiRun).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/engine/api.h"
#include "kiln/server/context.h"
#include "kiln/server/errors.h"
#include "kiln/server/http_server.h"

namespace kiln::server {

using Json = nlohmann::ordered_json;

enum class Api { kChat, kCompletions };

struct CommonParams {
  engine::GenerationRequest request;  // sampling, stop, ignore_eos; max_tokens below
  std::optional<int32_t> max_tokens;  // unset: whatever the context leaves
  bool max_tokens_asked = false;      // by the request (else a default: request_controls.h)
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;
  int32_t legacy_logprobs = -1;  // completions `logprobs` (0..5), -1 when off
};

// The body must be a JSON object; malformed JSON -> 400.
std::variant<Json, ApiError> parse_body(const std::string& body);

// 404 model_not_found when `model` is present and not the served name.
std::optional<ApiError> check_model(const Json& body, const ServerContext& ctx);
// 503 while the engine is not ready.
std::optional<ApiError> check_ready(const ServerContext& ctx);

// Reads model-independent parameters (errors name the param). The output length follows
// request_controls.h (completions default to 16 tokens, chat to the context's rest).
std::optional<ApiError> parse_common(const Json& body, Api api, const ServerContext& ctx,
                                     CommonParams* out);

// A request for more generations (prompts x n) than the server's queue can ever hold is a
// 400 naming the limit (a 429 would have clients retry it forever).
std::optional<ApiError> check_num_choices(const ServerContext& ctx, size_t num_prompts, int32_t n);

// With the prompt known: default max_tokens, the context check, sampling/stop validation.
std::optional<ApiError> finalize_request(const ServerContext& ctx, int32_t num_prompt_tokens,
                                         CommonParams* params);

using Clock = std::chrono::steady_clock;

// Runs several engine requests (n choices, or several prompts) and hands out their events in
// arrival order, while polling the client: a hang-up or a server cut cancels them all.
class MultiRun {
 public:
  explicit MultiRun(ServerContext& ctx) : ctx_(ctx) {}
  ~MultiRun();  // cancels whatever has not finished

  // Submits every request; on a refusal cancels those already submitted and returns it.
  std::optional<ApiError> submit(std::vector<engine::GenerationRequest> requests);
  // The next event of any unfinished request, or nullopt when all finished or the run was
  // aborted (then abort_reason() says why).
  std::optional<std::pair<int, engine::Event>> next(HttpExchange& exchange);
  AbortReason abort_reason() const { return aborted_; }
  size_t size() const { return choices_.size(); }
  // Cancels every unfinished request; their FinishEvents still come through next().
  void cancel() { cancel_all(); }
  // While next() waits, `fn` runs whenever no event came for `every` (a stream's keep-alive
  // during a long prefill: Anthropic's ping events).
  void on_idle(std::chrono::milliseconds every, std::function<void()> fn) {
    idle_every_ = every;
    on_idle_ = std::move(fn);
  }

 private:
  struct Choice {
    std::shared_ptr<engine::RequestChannel> channel;
    bool finished = false;
    bool got_token = false;
    Clock::time_point submitted;
    Clock::time_point last_token;
  };
  void record(Choice& c, const engine::Event& e);
  void cancel_all();

  ServerContext& ctx_;
  std::vector<Choice> choices_;
  size_t cursor_ = 0;  // round-robin start
  AbortReason aborted_ = AbortReason::kNone;
  Clock::time_point last_poll_{};
  std::chrono::milliseconds idle_every_{0};
  std::function<void()> on_idle_;
  Clock::time_point last_event_ = Clock::now();
};

// "stop" / "length" for the wire (tool_calls is decided by the chat handler).
const char* finish_reason_name(engine::FinishReason reason);

// The API error of a generation that ended in kError or an unexpected kCancelled.
ApiError generation_error(const engine::FinishEvent& finish);

// One SSE event: "data: <json>\n\n".
std::string sse_data(const std::string& json);
// One named SSE event: "event: <name>\ndata: <json>\n\n" (Anthropic's stream).
std::string sse_event(std::string_view name, const std::string& json);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// A random 64-bit seed for a request that has none.
uint64_t random_seed();

}  // namespace kiln::server
