// A scripted EngineApi for the server tests: each submitted request plays a script of text
// pieces (one token event each, on its own thread), honouring max_tokens, stop strings
// (engine::StopMatcher, as the real engine) and cancel().
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kiln/engine/api.h"
#include "kiln/engine/stop.h"

namespace kiln::server::testing {

struct Script {
  std::vector<std::string> pieces = {"Hello", " world"};
  engine::FinishReason reason = engine::FinishReason::kStop;  // at the end of the pieces
  std::string error;                                          // for kError
  int32_t cached_tokens = 0;
  std::chrono::milliseconds delay{0};  // before each token
};

class FakeEngine final : public engine::EngineApi {
 public:
  ~FakeEngine() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& t : threads_) t.join();
  }

  std::variant<std::shared_ptr<engine::RequestChannel>, engine::SubmitRefusal> submit(
      engine::GenerationRequest req) override {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(req);
    if (refusal_) {
      engine::SubmitRefusal r = *refusal_;
      refusal_.reset();
      return r;
    }
    Script script = default_script_;
    if (!scripts_.empty()) {
      script = scripts_.front();
      scripts_.pop_front();
    }
    auto channel = std::make_shared<engine::RequestChannel>();
    threads_.emplace_back([this, channel, req = std::move(req), script = std::move(script)] {
      play(*channel, req, script);
    });
    return channel;
  }
  engine::EngineState state() const override { return state_.load(); }
  engine::EngineStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  int32_t context_length() const override { return n_ctx_; }
  model::Pooling pooling() const override { return pooling_; }
  int32_t embedding_width() const override { return embedding_width_; }

  // What an embed request's FinishEvent carries: a pooled vector that depends on the prompt
  // (value k: (prompt[0] + 1) * (k + 1), sign alternating), not normalized.
  static std::vector<float> fake_embedding(const std::vector<int32_t>& prompt, int32_t width) {
    std::vector<float> v(static_cast<size_t>(width));
    for (int32_t k = 0; k < width; ++k)
      v[k] = static_cast<float>((prompt.at(0) + 1) * (k + 1)) * (k % 2 == 0 ? 1.0f : -1.0f);
    return v;
  }

  // Test controls.
  void set_state(engine::EngineState s) { state_.store(s); }
  void set_stats(engine::EngineStats s) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = s;
  }
  void push_script(Script s) {
    std::lock_guard<std::mutex> lock(mu_);
    scripts_.push_back(std::move(s));
  }
  void set_default_script(Script s) {
    std::lock_guard<std::mutex> lock(mu_);
    default_script_ = std::move(s);
  }
  void refuse_next(engine::SubmitError error, std::string message) {
    std::lock_guard<std::mutex> lock(mu_);
    refusal_ = engine::SubmitRefusal{error, std::move(message)};
  }
  std::vector<engine::GenerationRequest> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  int num_cancelled() const { return num_cancelled_.load(); }
  int num_finished() const { return num_finished_.load(); }
  int32_t n_ctx_ = 4096;
  model::Pooling pooling_ = model::Pooling::kNone;
  int32_t embedding_width_ = 8;

 private:
  void play(engine::RequestChannel& ch, const engine::GenerationRequest& req,
            const Script& script) {
    engine::StopMatcher stops(req.stop);
    engine::FinishEvent finish;
    finish.usage.prompt_tokens = static_cast<int32_t>(req.prompt_tokens.size());
    finish.usage.cached_tokens = script.cached_tokens;
    if (req.embed) {  // later inputs finish first when prompt[0] says so (batch order)
      std::this_thread::sleep_for(std::chrono::milliseconds(5 * (req.prompt_tokens.at(0) % 7)));
      finish.reason = engine::FinishReason::kStop;
      finish.embedding = fake_embedding(req.prompt_tokens, embedding_width_);
      ch.push(finish);
      num_finished_.fetch_add(1);
      return;
    }
    int32_t n = 0;
    for (const std::string& piece : script.pieces) {
      if (script.delay.count() > 0) std::this_thread::sleep_for(script.delay);
      if (ch.cancelled()) {
        num_cancelled_.fetch_add(1);
        finish.reason = engine::FinishReason::kCancelled;
        finish.usage.completion_tokens = n;
        ch.push(finish);
        num_finished_.fetch_add(1);
        return;
      }
      engine::TokenEvent t;
      t.token = 100 + n;
      auto r = stops.feed(piece);
      t.text = r.text;
      if (req.sampling.logprobs) t.logprob = -0.25f * static_cast<float>(n + 1);
      for (int32_t k = 0; k < req.sampling.top_logprobs; ++k)
        t.top.emplace_back(200 + k, -0.5f * static_cast<float>(k + 1));
      ++n;
      ch.push(t);
      if (r.stopped) {
        finish.reason = engine::FinishReason::kStop;
        finish.stop_index = r.stop_index;
        finish.usage.completion_tokens = n;
        ch.push(finish);
        num_finished_.fetch_add(1);
        return;
      }
      if (n >= req.max_tokens) {
        finish.reason = engine::FinishReason::kLength;
        finish.text = stops.flush();
        finish.usage.completion_tokens = n;
        ch.push(finish);
        num_finished_.fetch_add(1);
        return;
      }
    }
    finish.reason = script.reason;
    finish.error = script.error;
    finish.text = stops.flush();
    finish.usage.completion_tokens = n;
    ch.push(finish);
    num_finished_.fetch_add(1);
  }

  mutable std::mutex mu_;
  std::atomic<engine::EngineState> state_{engine::EngineState::kReady};
  engine::EngineStats stats_;
  std::deque<Script> scripts_;
  Script default_script_;
  std::optional<engine::SubmitRefusal> refusal_;
  std::vector<engine::GenerationRequest> requests_;
  std::vector<std::thread> threads_;
  std::atomic<int> num_cancelled_{0};
  std::atomic<int> num_finished_{0};
};

}  // namespace kiln::server::testing
