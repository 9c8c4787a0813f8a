// A generation whose thinking is bounded: once the reply has spent its thinking budget
// (tokens, request_controls.h thinking_budget) and is still inside the template's reasoning
// block, the engine request is cancelled and continued from the same tokens with the
// closing tag (think_close + "\n\n") appended, so the answer follows. When max_tokens
// leaves no room for the tag and one answer token, thinking runs on to max_tokens. The prefix cache
// makes the continuation's prompt nearly free. The closing tag reaches the caller as a
// token event (token -1), so the output parser closes the reasoning block as usual; the
// final FinishEvent's usage covers the whole reply (prompt and cached tokens of the first
// request, every generated and forced token).
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/chat/output_parser.h"
#include "kiln/server/generation.h"

namespace kiln::server {

class BudgetedGeneration {
 public:
  // budget unset: a plain generation.
  BudgetedGeneration(ServerContext& ctx, chat::ParserConfig config, std::optional<int32_t> budget);

  std::optional<ApiError> submit(engine::GenerationRequest request);
  // TokenEvents, then one FinishEvent; nullopt when the run was aborted (abort_reason()).
  std::optional<engine::Event> next(HttpExchange& ex);
  AbortReason abort_reason() const { return run_ ? run_->abort_reason() : AbortReason::kNone; }
  void on_idle(std::chrono::milliseconds every, std::function<void()> fn);
  bool budget_spent() const { return continued_; }

 private:
  bool in_reasoning() const;
  // Cancels the running request and submits its continuation after the closing tag.
  void continue_after_budget(HttpExchange& ex);

  ServerContext& ctx_;
  chat::ParserConfig config_;
  std::optional<int32_t> budget_;
  engine::GenerationRequest request_;  // the first request
  std::unique_ptr<MultiRun> run_;
  std::deque<engine::Event> pending_;
  std::vector<int32_t> generated_;  // token ids of the first request
  std::string text_;                // its text
  std::vector<int32_t> forced_;     // think_close + "\n\n" tokenized
  bool budget_checked_ = false;
  bool continued_ = false;
  int32_t num_forced_ = 0;  // the closing tag's tokens
  int32_t first_cached_ = 0;
  std::chrono::milliseconds idle_every_{0};
  std::function<void()> on_idle_;
};

}  // namespace kiln::server
