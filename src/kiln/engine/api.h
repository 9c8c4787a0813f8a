// What the server sees of the engine: submit a generation request, read its events from a
// channel, cancel it. HTTP threads never touch the model, the KV cache or the scheduler; the
// engine thread never touches HTTP. Nothing throws across this boundary.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/engine/sampler.h"
#include "kiln/grammar/matcher.h"
#include "kiln/model/pooling.h"
#include "kiln/util/status.h"

namespace kiln::engine {

// Where GenerationRequest::grammar applies (engine/constraint_gate.h).
struct GrammarStart {
  // A lazy grammar (tool_choice auto): the output is free text until one of these strings
  // appears in it (a tool call opening in the chat format's syntax), then the grammar applies
  // from the trigger's first byte to the end. Empty: the grammar applies from the start.
  struct Trigger {
    std::string text;
    bool at_start = false;  // only as the first non-whitespace text of the answer
    // An at_start trigger may hold 0..max_space whitespace bytes (' ', '\t', '\n') before
    // text[space_at], as the grammar allows there (Llama 3's `{  "name"`, pretty-printed).
    size_t space_at = std::string::npos;
    int32_t max_space = 0;
  };
  std::vector<Trigger> triggers;
  // The reasoning exemption: a thinking block at the start of the output (think_open after
  // whitespace, or already open when reasoning_open_at_start) is free; the grammar (or the
  // watch for triggers) starts after think_close. A forced grammar masks the end tokens inside
  // the block.
  bool reasoning = false;
  bool reasoning_open_at_start = false;
  std::string think_open;
  std::string think_close;
};

struct GenerationRequest {
  std::string request_id;              // for logs (X-Request-Id)
  std::vector<int32_t> prompt_tokens;  // already templated and tokenized by the server
  SamplingParams sampling;
  int32_t max_tokens = 256;             // generated tokens at most
  std::vector<std::string> stop;        // stop strings (matched on the detokenized text)
  std::vector<int32_t> stop_token_ids;  // extra end-of-generation ids
  bool ignore_eos = false;
  bool skip_special = true;  // detokenize without control tokens
  // Deadline after which the engine cancels the request (steady clock); none = no timeout.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  // Structured output: each step samples only tokens this grammar allows (the mask is applied
  // to the logits before any sampling step), and end-of-generation only where it may end. A
  // dead end (no token allowed) finishes the request with kLength and a note in `error`.
  std::shared_ptr<grammar::CompiledGrammar> grammar;
  GrammarStart grammar_start;
  // Embedding: the prompt is computed (its own sequence, batched with everything else) and
  // pooled with the engine's pooling; nothing is generated (sampling, max_tokens and stops
  // are ignored). FinishEvent::embedding holds the pooled vector.
  bool embed = false;
};

// One generated token and the text it completes (after the stop-string hold-back; may be
// empty when the text is held back, e.g. a partial UTF-8 character or a possible stop string).
struct TokenEvent {
  int32_t token = -1;
  std::string text;
  float logprob = 0.0f;                        // when sampling.logprobs
  std::vector<std::pair<int32_t, float>> top;  // when sampling.top_logprobs > 0
};

enum class FinishReason : uint8_t {
  kStop,       // end-of-generation token or stop string
  kLength,     // max_tokens or the context filled up
  kCancelled,  // cancel() or deadline
  kError,      // the step failed; `error` says why
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens served from the prefix cache
};

struct FinishEvent {
  FinishReason reason = FinishReason::kStop;
  std::string text;  // text released at the end (held-back text flushed); may be empty
  Usage usage;
  std::string error;  // for kError; for kLength, why a constrained output stopped early
  // kError because the model's device failed (a rank of its mesh): the engine serves no more
  // (/health says so) and the server answers 503, not 500.
  bool unavailable = false;
  // kStop by a stop string: its index in GenerationRequest::stop; -1 otherwise (an
  // end-of-generation token).
  int32_t stop_index = -1;
  // An embed request that finished with kStop: the pooled final-norm hidden state, [n_embd],
  // not normalized.
  std::vector<float> embedding;
};

using Event = std::variant<TokenEvent, FinishEvent>;

// A request's event channel: the engine thread pushes, one HTTP thread pops. FinishEvent is
// always the last event.
class RequestChannel {
 public:
  void push(Event e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(std::move(e));
    }
    cv_.notify_one();
  }
  // The next event, or nullopt after `timeout` (so the caller can check its client).
  std::optional<Event> pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
    Event e = std::move(events_.front());
    events_.pop_front();
    return e;
  }
  // Asks the engine to stop this request; it frees the sequence at its next step and then
  // pushes FinishEvent{kCancelled}.
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::atomic<bool> cancelled_{false};
};

// Why a submit was refused before any work; the server maps each to its HTTP status.
enum class SubmitError : uint8_t {
  kInvalid,                // bad parameters (400)
  kContextLengthExceeded,  // prompt + max_tokens beyond the context (400)
  kQueueFull,              // the waiting queue is full (429 with Retry-After)
  kUnavailable,            // loading or shutting down (503)
};

struct SubmitRefusal {
  SubmitError error;
  std::string message;
};

enum class EngineState : uint8_t { kLoading, kReady, kFailed, kStopped };

// Counters for /metrics (a snapshot; the engine keeps the authoritative ones).
struct EngineStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t num_kv_blocks_used = 0;
  int64_t num_kv_blocks_total = 0;
  int64_t num_state_slots_used = 0;  // hybrid models: recurrent-state slots held
  int64_t num_state_saves = 0;       // hybrid models: state snapshots saved at checkpoints
  int64_t num_state_restores = 0;    // admissions that resumed from a snapshot
  int64_t num_prefix_hit_tokens = 0;
  int64_t num_prefix_queried_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t num_steps = 0;
  // Steps whose every logit row sampled plain greedy, so that only each row's argmax id came
  // back from the device, not its logits.
  int64_t num_argmax_steps = 0;
  int64_t num_prompt_tokens = 0;
  int64_t num_generated_tokens = 0;
  // Where the engine thread's time went over its steps (seconds, summed): the host's work
  // before the forward (scheduling, the step's rows), queueing the forward (on the CPU the
  // forward itself) and the host's work meanwhile (grammar masks), waiting for the device to
  // finish it, the host's work after (sampling, stop checks, detokenizing), and handing the
  // step's events to the requests' channels (on an asynchronous backend while the next step
  // runs on the device, so not in the device's way). The host's share of a GPU step is
  // schedule + launch + update (+ deliver where the backend is synchronous).
  double step_schedule_seconds = 0;
  double step_launch_seconds = 0;
  double step_wait_seconds = 0;
  double step_update_seconds = 0;
  double step_deliver_seconds = 0;
  // Seconds since the engine thread last finished a step or idled (liveness for /health).
  double seconds_since_heartbeat = 0;
};

class EngineApi {
 public:
  virtual ~EngineApi() = default;
  // Queues the request; the channel then receives its events.
  virtual std::variant<std::shared_ptr<RequestChannel>, SubmitRefusal> submit(
      GenerationRequest req) = 0;
  virtual EngineState state() const = 0;
  virtual EngineStats stats() const = 0;
  virtual int32_t context_length() const = 0;
  // How embed requests are pooled (kNone: the engine serves no embeddings) and the width of
  // their vectors; valid once ready.
  virtual model::Pooling pooling() const { return model::Pooling::kNone; }
  virtual int32_t embedding_width() const { return 0; }
};

}  // namespace kiln::engine
