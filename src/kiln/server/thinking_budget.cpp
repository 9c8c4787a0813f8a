#include "kiln/server/thinking_budget.h"

namespace kiln::server {

BudgetedGeneration::BudgetedGeneration(ServerContext& ctx, chat::ParserConfig config,
                                       std::optional<int32_t> budget)
    : ctx_(ctx), config_(std::move(config)), budget_(config_.reasoning ? budget : std::nullopt) {
  if (!budget_) return;
  auto ids = ctx_.tokenizer.encode(config_.think_close + "\n\n", /*add_special=*/false,
                                   /*parse_special=*/true);
  if (ids.ok()) forced_ = std::move(ids).value();
}

void BudgetedGeneration::on_idle(std::chrono::milliseconds every, std::function<void()> fn) {
  idle_every_ = every;
  on_idle_ = std::move(fn);
  if (run_) run_->on_idle(idle_every_, on_idle_);
}

std::optional<ApiError> BudgetedGeneration::submit(engine::GenerationRequest request) {
  request_ = request;
  run_ = std::make_unique<MultiRun>(ctx_);
  if (on_idle_) run_->on_idle(idle_every_, on_idle_);
  std::vector<engine::GenerationRequest> one;
  one.push_back(std::move(request));
  return run_->submit(std::move(one));
}

bool BudgetedGeneration::in_reasoning() const {
  if (text_.find(config_.think_close) != std::string::npos) return false;
  if (config_.reasoning_open_at_start) return true;
  const size_t first = text_.find_first_not_of(" \t\r\n");
  return first != std::string::npos &&
         text_.compare(first, config_.think_open.size(), config_.think_open) == 0;
}

std::optional<engine::Event> BudgetedGeneration::next(HttpExchange& ex) {
  if (!pending_.empty()) {
    engine::Event e = std::move(pending_.front());
    pending_.pop_front();
    return e;
  }
  auto ev = run_->next(ex);
  if (!ev) return std::nullopt;
  engine::Event& e = ev->second;
  if (auto* t = std::get_if<engine::TokenEvent>(&e)) {
    if (continued_) return e;
    generated_.push_back(t->token);
    text_ += t->text;
    const int32_t num_generated = static_cast<int32_t>(generated_.size());
    if (budget_ && !budget_checked_ && num_generated >= *budget_ && in_reasoning()) {
      budget_checked_ = true;
      // Room for the closing tag and at least one answer token, else thinking runs on to
      // max_tokens as it would without a budget.
      if (request_.max_tokens - num_generated - static_cast<int32_t>(forced_.size()) >= 1) {
        pending_.push_back(std::move(e));
        continue_after_budget(ex);
        return next(ex);
      }
    }
    return e;
  }
  auto& f = std::get<engine::FinishEvent>(e);
  if (continued_) {
    // The whole reply: the first request's prompt and cache hits, all its output.
    f.usage.prompt_tokens = static_cast<int32_t>(request_.prompt_tokens.size());
    f.usage.cached_tokens = first_cached_;
    f.usage.completion_tokens += static_cast<int32_t>(generated_.size()) + num_forced_;
  }
  return e;
}

void BudgetedGeneration::continue_after_budget(HttpExchange& ex) {
  continued_ = true;
  // Stop the first request and wait for its end (tokens it still made are dropped).
  run_->cancel();
  while (auto ev = run_->next(ex)) {
    if (auto* f = std::get_if<engine::FinishEvent>(&ev->second)) {
      first_cached_ = f->usage.cached_tokens;
      break;
    }
  }
  if (run_->abort_reason() != AbortReason::kNone) return;
  engine::TokenEvent closing;
  closing.token = -1;
  closing.text = config_.think_close + "\n\n";
  pending_.push_back(std::move(closing));
  num_forced_ = static_cast<int32_t>(forced_.size());
  const int32_t used = static_cast<int32_t>(generated_.size()) + num_forced_;
  engine::GenerationRequest r = request_;
  r.request_id += "-answer";
  r.prompt_tokens.insert(r.prompt_tokens.end(), generated_.begin(), generated_.end());
  r.prompt_tokens.insert(r.prompt_tokens.end(), forced_.begin(), forced_.end());
  r.max_tokens = request_.max_tokens - used;
  // The block is closed: a grammar (engine::GrammarStart) applies from the first token on.
  r.grammar_start.reasoning = false;
  r.grammar_start.reasoning_open_at_start = false;
  run_ = std::make_unique<MultiRun>(ctx_);
  if (on_idle_) run_->on_idle(idle_every_, on_idle_);
  std::vector<engine::GenerationRequest> one;
  one.push_back(std::move(r));
  if (auto refusal = run_->submit(std::move(one))) {
    engine::FinishEvent failed;
    failed.reason = engine::FinishReason::kError;
    failed.error = "the answer after the thinking budget could not be queued: " + refusal->message;
    pending_.push_back(std::move(failed));
  }
}

}  // namespace kiln::server
