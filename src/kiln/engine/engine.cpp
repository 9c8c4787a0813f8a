#include "kiln/engine/engine.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string_view>

#include <fmt/format.h>
#include <unordered_map>

#include "kiln/backend/backend.h"
#include "kiln/chat/template.h"
#include "kiln/engine/constraint_gate.h"
#include "kiln/engine/executor.h"
#include "kiln/engine/scheduler.h"
#include "kiln/engine/sequence.h"
#include "kiln/engine/stop.h"
#include "kiln/kv/kv_cache.h"
#include "kiln/tokenizer/gguf_vocab.h"
#include "kiln/tokenizer/stream_decoder.h"
#include "kiln/util/log.h"
#include "kiln/util/thread_pool.h"

namespace kiln::engine {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A request's generation state, beside the scheduler's sequence of the same id.
struct Active {
  std::shared_ptr<RequestChannel> channel;
  GenerationRequest req;
  Sampler sampler;
  StopMatcher stop;
  StopTokens eog;
  tokenizer::StreamDecoder decoder;
  bool stopped_by_string = false;
  int32_t stop_index = -1;  // which stop string, once stopped_by_string
  // Structured output (req.grammar): where it applies, its matcher and how tokens are drawn.
  std::unique_ptr<ConstraintGate> gate;
  bool grammar_dead_end = false;
  // Embed requests: the pooled rows so far, and the pooled vector once the prompt is done.
  model::PoolAccumulator pool;
  std::vector<float> embedding;
};

FinishReason to_api(SeqFinishReason r) {
  switch (r) {
    case SeqFinishReason::kStop:
      return FinishReason::kStop;
    case SeqFinishReason::kLength:
      return FinishReason::kLength;
    case SeqFinishReason::kCancelled:
    case SeqFinishReason::kNone:
      break;
  }
  return FinishReason::kCancelled;
}

}  // namespace

struct Engine::Impl {
  Engine& engine;
  std::unique_ptr<backend::Backend> be;
  std::unique_ptr<Executor> exec;
  Scheduler sched;
  std::vector<int32_t> eog_ids;
  std::unordered_map<SeqId, Active> active;
  // The step's logit rows (generation sequences) and hidden rows (embed sequences), and for
  // each hidden row the sequence it belongs to.
  std::vector<int32_t> logit_rows, hidden_rows;
  std::vector<SeqId> hidden_owner;
  SeqId next_id = 1;
  int64_t num_steps = 0;
  int64_t num_argmax_steps = 0;
  // EngineStats' step_*_seconds.
  double schedule_s = 0, launch_s = 0, wait_s = 0, update_s = 0, deliver_s = 0;
  // The events of the engine thread's steps (tokens, finishes), in order, until flush_events()
  // hands them to their channels. On an asynchronous backend that is right after the next
  // step's launch: each push may wake an HTTP thread (a futex wake, and on a busy host a
  // preemption: ~0.5 ms for 64 streams on 2 cores, measured), which then overlaps the device's
  // step instead of keeping the device idle between steps. Elsewhere at the end of the step.
  // KILN_ENGINE_OVERLAP_EVENTS=1 defers them so on any backend (tests on the CPU), =0 never (A/B).
  std::vector<std::pair<std::shared_ptr<RequestChannel>, Event>> outbox;
  const bool overlap_events = [this] {
    const char* e = std::getenv("KILN_ENGINE_OVERLAP_EVENTS");
    if (e != nullptr && (std::string_view(e) == "0" || std::string_view(e) == "1"))
      return std::string_view(e) == "1";
    return exec->asynchronous();
  }();

  // The sampling threads asked for: KILN_ENGINE_SAMPLE_THREADS, else
  // EngineOptions::sample_threads (0: none, the default below).
  const int sample_threads_asked = [this] {
    if (const char* e = std::getenv("KILN_ENGINE_SAMPLE_THREADS"); e != nullptr && *e != '\0')
      return std::clamp(std::atoi(e), 1, 4096);
    return engine.opts_.sample_threads;
  }();
  // The threads that sample a step's rows; null: the engine thread samples them one after
  // another. Idle workers sleep at once (no spinning): between steps the host's cores are the
  // HTTP threads'.
  std::unique_ptr<util::ThreadPool> sample_pool = [this]() -> std::unique_ptr<util::ThreadPool> {
    int n = sample_threads_asked;
    if (n == 0) {
      // On a GPU the host's cores; on the CPU the forward's threads (idle while a step's rows
      // are drawn); at most 16.
      const int cores = util::default_num_threads();
      n = std::min(exec->asynchronous() || engine.opts_.threads <= 0 ? cores : engine.opts_.threads,
                   16);
    }
    if (n <= 1) return nullptr;
    util::ThreadPool::Options o;
    o.num_threads = n;
    o.spin_us = 0;
    return std::make_unique<util::ThreadPool>(o);
  }();
  // sample()'s per-row draws of the step, made in parallel before the rows are handed over.
  std::vector<std::optional<SampleResult>> drawn;

  Impl(Engine& e, std::unique_ptr<backend::Backend> b, std::unique_ptr<Executor> x,
       const SchedulerConfig& cfg)
      : engine(e),
        be(std::move(b)),
        exec(std::move(x)),
        sched(cfg),
        eog_ids(end_of_generation_ids(*e.tokenizer_)) {}

  void finish(SeqId id, FinishEvent ev) {
    auto it = active.find(id);
    if (it == active.end()) return;
    outbox.emplace_back(it->second.channel, std::move(ev));
    active.erase(it);
  }

  void flush_events() {
    if (outbox.empty()) return;
    const auto t = std::chrono::steady_clock::now();
    for (auto& [channel, ev] : outbox) channel->push(std::move(ev));
    outbox.clear();
    deliver_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  void admit(std::vector<Pending>& pending) {
    for (Pending& p : pending) {
      engine.num_queued_--;
      const SeqId id = next_id++;
      Request r{id, p.req.prompt_tokens, p.req.max_tokens};
      if (p.req.embed) {  // one slice past the prompt: the stop the engine reports
        r.max_tokens = 1;
        r.prefill_only = true;
        r.reuse_prefix = engine.pooling() == model::Pooling::kLast;
        r.whole_prompt = engine.model().arch().features.encoder;
      }
      const Admission a = sched.add(std::move(r));
      if (!a.ok()) {
        p.channel->push(FinishEvent{FinishReason::kError, "", {}, a.message});
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(engine.stats_mu_);
        engine.stats_.num_prompt_tokens += static_cast<int64_t>(p.req.prompt_tokens.size());
      }
      StopTokens eog(eog_ids);
      for (int32_t t : p.req.stop_token_ids) eog.add(t);
      const int32_t n_vocab = static_cast<int32_t>(engine.model_->hparams().n_vocab);
      auto [it, fresh] = active.emplace(
          id, Active{p.channel, p.req, Sampler(p.req.sampling, n_vocab), StopMatcher(p.req.stop),
                     std::move(eog),
                     tokenizer::StreamDecoder(*engine.tokenizer_, p.req.skip_special), false});
      if (p.req.grammar) {
        const tokenizer::Tokenizer* tok = engine.tokenizer_.get();
        it->second.gate = std::make_unique<ConstraintGate>(
            p.req.grammar, p.req.grammar_start, [tok](int32_t id) { return tok->token_piece(id); },
            p.req.stop_token_ids);
      }
      if (p.req.embed)
        it->second.pool = model::PoolAccumulator(engine.pooling(), engine.embedding_width());
    }
  }

  // The forward's output rows of a step: the last row of each generation sequence that
  // samples, and the rows each embed sequence's pooling needs.
  void plan_rows(const StepPlan& plan) {
    logit_rows.clear();
    hidden_rows.clear();
    hidden_owner.clear();
    const model::Pooling pooling = engine.pooling();
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      const ScheduledSeq& s = plan.seqs[i];
      const int32_t row0 = plan.qo_indptr[i];
      if (!active.at(s.id).req.embed) {
        if (s.needs_logits) logit_rows.push_back(row0 + s.num_tokens - 1);
        continue;
      }
      model::PoolAccumulator::wanted_rows(pooling, s.first_token, s.num_tokens,
                                          sched.find(s.id)->num_tokens(), row0, &hidden_rows);
      hidden_owner.resize(hidden_rows.size(), s.id);
    }
  }

  // Pools the step's hidden rows into their sequences; an embed sequence whose prompt is
  // done stops (its output token is a placeholder the scheduler never shows anyone).
  void pool(const StepPlan& plan, std::span<const float> hidden, std::vector<SeqOutput>* outputs) {
    const int64_t width = engine.embedding_width();
    for (const ScheduledSeq& s : plan.seqs) {  // a slice from position 0: (re)computed afresh
      Active& a = active.at(s.id);
      if (a.req.embed && s.first_token == 0) a.pool.reset();
    }
    for (size_t r = 0; r < hidden_owner.size(); ++r)
      active.at(hidden_owner[r])
          .pool.add(hidden.subspan(r * static_cast<size_t>(width), static_cast<size_t>(width)));
    for (const ScheduledSeq& s : plan.seqs) {
      Active& a = active.at(s.id);
      if (!a.req.embed || !s.needs_logits) continue;
      a.embedding = a.pool.result();
      outputs->push_back({s.id, 0, true});
    }
  }

  void apply_cancels() {
    const auto now = std::chrono::steady_clock::now();
    for (auto& [id, a] : active) {
      if (a.channel->cancelled() || (a.req.deadline && now >= *a.req.deadline)) sched.cancel(id);
    }
  }

  bool all_plain_greedy(const StepPlan& plan) const {
    bool any = false;
    for (const ScheduledSeq& s : plan.seqs) {
      if (!s.needs_logits) continue;
      const Active& a = active.at(s.id);
      if (a.req.embed) continue;
      if (a.gate != nullptr || !is_plain_greedy(a.sampler.params())) return false;
      any = true;
    }
    return any;
  }

  // The next mask of each constrained sequence that samples this step (ConstraintGate::
  // prefetch_mask), computed while the step runs.
  void prefetch_masks(const StepPlan& plan) {
    for (const ScheduledSeq& s : plan.seqs) {
      if (!s.needs_logits) continue;
      Active& a = active.at(s.id);
      if (a.gate != nullptr && !a.req.embed) a.gate->prefetch_mask();
    }
  }

  // A logit row the step samples: its sequence, in the order of the step's logit rows (embed
  // sequences, which pool() ends, take none).
  struct SampledRow {
    SeqId id;
    Active* a;
    const Sequence* seq;
  };

  // The unconstrained rows' draws in parallel on sample_pool (each row's sampler and history
  // are its sequence's own: the same draws as one after another), into drawn[row]; the
  // constrained ones (their grammar matchers) and everything after the draw stay on the engine
  // thread, in row order.
  void draw_in_parallel(const std::vector<SampledRow>& rows, std::span<const float> logits,
                        size_t n_vocab) {
    std::vector<size_t> jobs;  // rows
    for (size_t r = 0; r < rows.size(); ++r)
      if (rows[r].a->gate == nullptr) jobs.push_back(r);
    if (jobs.size() < 2) return;
    drawn.resize(rows.size());
    sample_pool->parallel_for_dynamic(
        static_cast<int64_t>(jobs.size()), 1, [&](int64_t begin, int64_t end, int) {
          for (int64_t i = begin; i < end; ++i) {
            const size_t r = jobs[static_cast<size_t>(i)];
            drawn[r] = rows[r].a->sampler.sample(logits.subspan(r * n_vocab, n_vocab),
                                                 rows[r].seq->tokens);
          }
        });
  }

  // Samples each sequence that reached the end of its known tokens; emits token events.
  std::vector<SeqOutput> sample(const StepPlan& plan) {
    std::vector<SeqOutput> outputs;
    const size_t n_vocab = engine.model_->hparams().n_vocab;
    // A step whose every logit row samples plain greedy (all_plain_greedy) brought back each
    // row's argmax id instead of its logits.
    const std::span<const float> logits = exec->logits();
    const std::span<const int32_t> argmax_ids = exec->argmax_ids();
    std::vector<SampledRow> rows;
    for (const ScheduledSeq& s : plan.seqs) {
      if (!s.needs_logits) continue;
      Active& a = active.at(s.id);
      if (!a.req.embed) rows.push_back({s.id, &a, sched.find(s.id)});
    }
    drawn.clear();
    // By default not for a small vocabulary: its rows take a few microseconds, less than
    // waking the pool (an explicit --sample-threads always uses it).
    constexpr size_t kParallelVocab = 16384;
    if (argmax_ids.empty() && sample_pool != nullptr &&
        (n_vocab >= kParallelVocab || sample_threads_asked > 0))
      draw_in_parallel(rows, logits, n_vocab);
    for (size_t this_row = 0; this_row < rows.size(); ++this_row) {
      const SeqId id = rows[this_row].id;
      Active& a = *rows[this_row].a;
      const Sequence* seq = rows[this_row].seq;
      SampleResult r;
      if (!argmax_ids.empty()) {
        r.token = argmax_ids[this_row];
      } else if (this_row < drawn.size() && drawn[this_row].has_value()) {
        r = std::move(*drawn[this_row]);
      } else {
        const std::span<const float> row_logits = logits.subspan(this_row * n_vocab, n_vocab);
        if (a.gate) {
          std::optional<SampleResult> sampled = a.gate->sample(
              row_logits, [&](std::span<const float> l, std::span<const uint64_t> allowed) {
                return a.sampler.sample(l, seq->tokens, allowed);
              });
          if (!sampled) {
            // Nothing allowed: end here (never emit a token outside the grammar).
            a.grammar_dead_end = true;
            outputs.push_back({id, eog_ids.empty() ? 0 : eog_ids[0], true});
            continue;
          }
          r = std::move(*sampled);
        } else {
          r = a.sampler.sample(row_logits, seq->tokens);
        }
      }
      bool stop = false;
      if (!a.req.ignore_eos && a.eog.contains(r.token)) {
        stop = true;
      } else {
        const StopMatcher::Result m = a.stop.feed(a.decoder.push(r.token));
        outbox.emplace_back(a.channel, TokenEvent{r.token, m.text, r.logprob, r.top});
        stop = m.stopped;
        a.stopped_by_string = m.stopped;
        if (m.stopped) a.stop_index = m.stop_index;
      }
      outputs.push_back({id, r.token, stop});
    }
    return outputs;
  }

  void report_finished(const std::vector<FinishedSeq>& finished) {
    for (const FinishedSeq& f : finished) {
      auto it = active.find(f.id);
      if (it == active.end()) continue;
      Active& a = it->second;
      FinishEvent ev;
      ev.reason = to_api(f.reason);
      if (a.stopped_by_string) ev.stop_index = a.stop_index;
      if (!a.stopped_by_string && ev.reason != FinishReason::kCancelled) {
        // Two statements: the operands of + are unsequenced, and flush() before feed() would
        // put the held-back text after the decoder's tail (and trip the matcher's assert).
        ev.text = a.stop.feed(a.decoder.flush()).text;
        ev.text += a.stop.flush();
      }
      ev.usage = {f.num_prompt_tokens, f.num_output_tokens, f.num_cached_prompt_tokens};
      if (a.req.embed) {
        ev.usage.completion_tokens = 0;
        ev.text.clear();
        ev.embedding = std::move(a.embedding);
      }
      if (a.grammar_dead_end) {
        ev.reason = FinishReason::kLength;
        ev.error = a.gate->matcher().exhausted()
                       ? "the output constraint became too ambiguous to follow (its automaton "
                         "ran out of room)"
                       : "the output constraint allows no further token (dead end)";
        log::warn("request {}: {}", a.req.request_id, ev.error);
      }
      finish(f.id, std::move(ev));
    }
  }

  bool plan_has_embed(const StepPlan& plan) const {
    for (const ScheduledSeq& s : plan.seqs)
      if (active.at(s.id).req.embed) return true;
    return false;
  }

  void fail_step(const StepPlan& plan, const std::string& why) {
    log::error("step failed: {}", why);
    const bool gone = exec->failed();
    if (gone) engine.device_failed(why);  // before any request hears of it
    for (const ScheduledSeq& s : plan.seqs) {
      sched.cancel(s.id);
      FinishEvent ev{FinishReason::kError, "", {}, why};
      ev.unavailable = gone;
      finish(s.id, std::move(ev));
    }
    if (gone) fail_all(why);
  }

  // The device is gone (a rank of the mesh failed; the engine's state is kFailed, /health
  // answers 503): every request still here fails as unavailable.
  void fail_all(const std::string& why) {
    std::vector<SeqId> ids;
    for (const auto& [id, a] : active) ids.push_back(id);
    for (SeqId id : ids) {
      sched.cancel(id);
      FinishEvent ev{FinishReason::kError, "", {}, why};
      ev.unavailable = true;
      finish(id, std::move(ev));
    }
  }

  void publish_stats() {
    std::lock_guard<std::mutex> lock(engine.stats_mu_);
    EngineStats& st = engine.stats_;
    st.num_running = sched.num_running();
    st.num_waiting = sched.num_waiting() + engine.num_queued_.load();
    st.num_kv_blocks_total = sched.config().num_blocks;
    st.num_kv_blocks_used = sched.kv().num_used_blocks();
    st.num_state_slots_used = sched.num_used_state_slots();
    st.num_state_saves = sched.stats().num_state_saves;
    st.num_state_restores = sched.stats().num_state_restores;
    st.num_preemptions = sched.stats().num_preemptions;
    st.num_prefix_queried_tokens = sched.stats().num_prompt_tokens;
    st.num_prefix_hit_tokens = sched.stats().num_cached_prompt_tokens;
    st.num_steps = num_steps;
    st.num_argmax_steps = num_argmax_steps;
    st.step_schedule_seconds = schedule_s;
    st.step_launch_seconds = launch_s;
    st.step_wait_seconds = wait_s;
    st.step_update_seconds = update_s;
    st.step_deliver_seconds = deliver_s;
  }

  // One schedule -> execute -> update step. False when there was nothing to do.
  bool step() {
    using Clock = std::chrono::steady_clock;
    auto since = [](Clock::time_point t) {
      return std::chrono::duration<double>(Clock::now() - t).count();
    };
    Clock::time_point t = Clock::now();
    StepPlan plan = sched.schedule();
    for (SeqId id : plan.cancelled) finish(id, FinishEvent{FinishReason::kCancelled, "", {}, ""});
    if (plan.empty()) {  // every schedule() is paired with an update()
      report_finished(sched.update(plan, {}));
      flush_events();  // no step to overlap them with
      return !plan.cancelled.empty();
    }
    plan_rows(plan);
    model::StepInput in;
    in.tokens = plan.token_ids;
    in.attn = plan.attn_batch();
    in.logit_rows = logit_rows;
    in.hidden_rows = hidden_rows;
    in.state = exec->state();
    in.state_slots = plan.state_slots;
    schedule_s += since(t);
    // A step that fails (an error, or an exception such as bad_alloc) fails its requests;
    // the engine goes on with the next step.
    std::string failure;
    std::vector<SeqOutput> outputs;
    size_t num_sampled = 0;  // outputs of generation sequences (embed ones follow)
    try {
      if (engine.opts_.before_step) engine.opts_.before_step(num_steps, *exec);
      const bool argmax = all_plain_greedy(plan);
      if (argmax) ++num_argmax_steps;
      // Snapshots (StepPlan): restores before the forward, saves after it, on the stream.
      for (const StateCopy& c : plan.state_restores) exec->state_copy(c.src_slot, c.dst_slot);
      t = Clock::now();
      const Status st = exec->launch(in, argmax);
      if (st.ok()) {
        for (const StateCopy& c : plan.state_saves) exec->state_copy(c.src_slot, c.dst_slot);
        launch_s += since(t);
        // While the device runs the step: the last step's events, and the grammar masks this
        // one's sampling will apply.
        if (overlap_events) flush_events();
        t = Clock::now();
        prefetch_masks(plan);
        launch_s += since(t);
        t = Clock::now();
        exec->wait();
        wait_s += since(t);
        t = Clock::now();
        outputs = sample(plan);
        num_sampled = outputs.size();
        if (plan_has_embed(plan)) pool(plan, exec->hidden(), &outputs);
      } else {
        failure = st.error().message;
      }
    } catch (const std::exception& e) {
      failure = fmt::format("internal error in the step: {}", e.what());
      exec->wait();  // a step queued before the throw finishes before the next one's inputs
    }
    ++num_steps;
    if (!failure.empty()) {
      fail_step(plan, failure);
      sched.abandon(plan);
      flush_events();
      return true;
    }
    report_finished(sched.update(plan, outputs));
    update_s += since(t);
    if (!overlap_events) flush_events();
    {
      std::lock_guard<std::mutex> lock(engine.stats_mu_);
      engine.stats_.num_generated_tokens += static_cast<int64_t>(num_sampled);
    }
    return true;
  }
};

Engine::Engine(EngineOptions opts) : opts_(std::move(opts)) {
  context_length_ = std::max(0, opts_.n_ctx);
}

Engine::~Engine() {
  stop();
}

void Engine::start() {
  if (Status st = validate(opts_); !st.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      load_error_ = "bad engine options: " + st.error().message;
      state_ = EngineState::kFailed;
    }
    ready_cv_.notify_all();
    return;
  }
  thread_ = std::thread([this] { thread_main(); });
}

void Engine::stop() {
  stop_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Engine::device_failed(const std::string& why) {
  log::error("engine: the device failed, serving no more: {}", why);
  std::lock_guard<std::mutex> lock(mu_);
  load_error_ = "the model's device failed: " + why;
  state_ = EngineState::kFailed;
}

Status Engine::wait_ready() {
  std::unique_lock<std::mutex> lock(mu_);
  ready_cv_.wait(lock, [&] { return state_.load() != EngineState::kLoading; });
  if (state_.load() == EngineState::kFailed) return Error{load_error_};
  return {};
}

std::variant<std::shared_ptr<RequestChannel>, SubmitRefusal> Engine::submit(GenerationRequest req) {
  if (state_.load() != EngineState::kReady)
    return SubmitRefusal{SubmitError::kUnavailable, "the model is not ready"};
  if (req.prompt_tokens.empty()) return SubmitRefusal{SubmitError::kInvalid, "empty prompt"};
  if (req.embed) return submit_embed(std::move(req));
  if (model_->arch().features.encoder)
    return SubmitRefusal{SubmitError::kInvalid,
                         fmt::format("this model ({}) is an encoder: it serves embeddings "
                                     "(/v1/embeddings), not text generation",
                                     model_->hparams().arch)};
  if (req.max_tokens < 1) return SubmitRefusal{SubmitError::kInvalid, "max_tokens must be >= 1"};
  const int64_t total = static_cast<int64_t>(req.prompt_tokens.size()) + req.max_tokens;
  const int32_t n_ctx = context_length();
  if (total > n_ctx)
    return SubmitRefusal{SubmitError::kContextLengthExceeded,
                         fmt::format("This model's maximum context length is {} tokens. However, "
                                     "you requested {} tokens ({} in the prompt, {} for the "
                                     "completion).",
                                     n_ctx, total, req.prompt_tokens.size(), req.max_tokens)};
  const int32_t n_vocab = static_cast<int32_t>(model_->hparams().n_vocab);
  for (int32_t t : req.prompt_tokens)
    if (t < 0 || t >= n_vocab)
      return SubmitRefusal{SubmitError::kInvalid, fmt::format("token id {} is out of range", t)};
  if (Status st = validate(req.sampling, n_vocab); !st.ok())
    return SubmitRefusal{SubmitError::kInvalid, st.error().message};
  if (Status st = validate_stops(req.stop); !st.ok())
    return SubmitRefusal{SubmitError::kInvalid, st.error().message};
  return enqueue(std::move(req));
}

std::variant<std::shared_ptr<RequestChannel>, SubmitRefusal> Engine::enqueue(
    GenerationRequest req) {
  if (stats().num_waiting >= opts_.max_waiting)
    return SubmitRefusal{SubmitError::kQueueFull, "too many requests are waiting; retry later"};
  auto channel = std::make_shared<RequestChannel>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back({std::move(req), channel});
    num_queued_++;
  }
  cv_.notify_one();
  return channel;
}

std::variant<std::shared_ptr<RequestChannel>, SubmitRefusal> Engine::submit_embed(
    GenerationRequest req) {
  if (pooling() == model::Pooling::kNone)
    return SubmitRefusal{SubmitError::kInvalid,
                         "this model serves no embeddings: it has no pooling type (start the "
                         "server with --pooling mean, cls or last)"};
  const int32_t n_ctx = context_length();
  if (static_cast<int64_t>(req.prompt_tokens.size()) > n_ctx)
    return SubmitRefusal{SubmitError::kContextLengthExceeded,
                         fmt::format("This model's maximum context length is {} tokens. However, "
                                     "the input has {} tokens.",
                                     n_ctx, req.prompt_tokens.size())};
  // An encoder's input is one step (every token sees every other): at most a step's tokens.
  if (model_->arch().features.encoder &&
      static_cast<int64_t>(req.prompt_tokens.size()) > opts_.max_batch_tokens)
    return SubmitRefusal{SubmitError::kContextLengthExceeded,
                         fmt::format("This model's maximum input is {} tokens (an encoder's "
                                     "input is one step: --max-batch-tokens). However, the "
                                     "input has {} tokens.",
                                     opts_.max_batch_tokens, req.prompt_tokens.size())};
  const int32_t n_vocab = static_cast<int32_t>(model_->hparams().n_vocab);
  for (int32_t t : req.prompt_tokens)
    if (t < 0 || t >= n_vocab)
      return SubmitRefusal{SubmitError::kInvalid, fmt::format("token id {} is out of range", t)};
  req.max_tokens = 1;
  req.stop.clear();
  req.grammar.reset();
  return enqueue(std::move(req));
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  EngineStats s = stats_;
  s.num_waiting = std::max<int64_t>(s.num_waiting, num_queued_.load());
  s.seconds_since_heartbeat = static_cast<double>(now_ns() - heartbeat_ns_.load()) * 1e-9;
  return s;
}

void Engine::thread_main() {
  heartbeat_ns_ = now_ns();
  auto load = [&]() -> Expected<std::unique_ptr<Impl>> {
    KILN_TRY(model_, model::Model::load(opts_.model_path));
    KILN_TRY(tokenizer::VocabData vocab, tokenizer::load_vocab(model_->file()));
    chat_template_ = chat::template_or_chatml(vocab.chat_template);
    KILN_TRY(tokenizer::Tokenizer tok, tokenizer::Tokenizer::create(std::move(vocab)));
    tokenizer_ = std::make_unique<tokenizer::Tokenizer>(std::move(tok));
    const model::HParams& hp = model_->hparams();
    if (opts_.n_ctx <= 0) {
      opts_.n_ctx = static_cast<int32_t>(std::min<uint32_t>(hp.n_ctx_train, 1u << 21));
    } else if (static_cast<uint32_t>(opts_.n_ctx) > hp.n_ctx_train &&
               model_->arch().features.encoder) {
      // Learned absolute positions: there is no position past the table.
      log::warn("context {} exceeds the encoder's {} positions: using {}", opts_.n_ctx,
                hp.n_ctx_train, hp.n_ctx_train);
      opts_.n_ctx = static_cast<int32_t>(hp.n_ctx_train);
    } else if (static_cast<uint32_t>(opts_.n_ctx) > hp.n_ctx_train) {
      const char* scaling = hp.rope_scaling == model::RopeScaling::kYarn     ? "YaRN"
                            : hp.rope_scaling == model::RopeScaling::kLinear ? "linear"
                            : model_->weights().rope_freqs != nullptr        ? "llama3"
                                                                             : "none";
      log::warn(
          "context {} exceeds the model's trained context {} (rope scaling in force: {}, "
          "factor {}): quality past {} tokens is not what the model was trained for",
          opts_.n_ctx, hp.n_ctx_train, scaling, hp.rope_scale_factor, hp.n_ctx_train);
    }
    backend::BackendOptions bo;
    bo.device = opts_.device;
    bo.threads = opts_.threads;
    bo.deterministic = opts_.deterministic;
    KILN_TRY(std::unique_ptr<backend::Backend> be, backend::create_backend(bo));
    if (bo.deterministic)
      log::info("deterministic: a request's output does not depend on what runs beside it");
    model::Pooling pooling = opts_.pooling.value_or(hp.pooling);
    if (pooling == model::Pooling::kRank) {
      log::warn("the model's pooling is 'rank' (a reranker), which kiln does not serve");
      pooling = model::Pooling::kNone;
    }
    pooling_ = pooling;
    embedding_width_ = static_cast<int32_t>(hp.n_embd);
    if (pooling != model::Pooling::kNone)
      log::info("embeddings: {} pooling of {} values", model::pooling_name(pooling), hp.n_embd);
    ExecutorOptions eo;
    eo.max_tokens = opts_.max_batch_tokens;
    eo.max_hidden_rows = pooling != model::Pooling::kNone ? opts_.max_batch_tokens : 0;
    eo.max_seqs = opts_.max_seqs;
    eo.max_context = opts_.n_ctx;
    eo.kv_type = opts_.kv_type;
    eo.kv_memory_bytes = opts_.kv_memory_bytes;
    eo.gpu_memory_fraction = opts_.gpu_memory_fraction;
    eo.mesh = opts_.mesh;
    if (opts_.enable_prefix_cache)  // snapshots only serve prefix reuse
      eo.state_snapshots = opts_.state_snapshots >= 0 ? opts_.state_snapshots : 2 * opts_.max_seqs;
    KILN_TRY(std::unique_ptr<Executor> exec, Executor::create(*model_, *be, eo));
    context_length_ = opts_.n_ctx;
    SchedulerConfig cfg;
    cfg.max_batch_tokens = opts_.max_batch_tokens;
    cfg.step_prompt_tokens = opts_.step_prompt_tokens;
    cfg.max_seqs = opts_.max_seqs;
    cfg.num_blocks = exec->num_blocks();
    cfg.max_context = opts_.n_ctx;
    cfg.max_waiting = opts_.max_waiting;
    cfg.enable_prefix_cache = opts_.enable_prefix_cache;
    cfg.state_slots = exec->state() != nullptr;
    cfg.state_checkpoint_blocks = opts_.state_checkpoint_blocks;
    cfg.state_snapshots = exec->plan().state_snapshots;
    if (cfg.state_slots && opts_.enable_prefix_cache && cfg.state_snapshots == 0) {
      log::info("prefix caching is off for {}: no recurrent-state snapshots (--state-snapshots)",
                hp.arch);
    } else if (cfg.state_slots && opts_.enable_prefix_cache) {
      log::info("prefix caching for {}: recurrent state saved every {} tokens, {} snapshots",
                hp.arch, cfg.state_checkpoint_blocks * kv::kBlockTokens, cfg.state_snapshots);
    }
    log::info("engine: {}", be->description());
    memory_plan_ = exec->plan().to_string();
    log::info("{}", memory_plan_);
    return std::make_unique<Impl>(*this, std::move(be), std::move(exec), cfg);
  };
  auto impl = load();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!impl.ok()) {
      load_error_ = impl.error().message;
      state_ = EngineState::kFailed;
    } else {
      state_ = EngineState::kReady;
    }
  }
  ready_cv_.notify_all();
  if (!impl.ok()) return;
  Impl& e = **impl;
  while (!stop_) {
    heartbeat_ns_ = now_ns();
    std::vector<Pending> pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending.swap(inbox_);
    }
    if (state_.load() == EngineState::kFailed) {  // the device failed: nothing more runs
      for (Pending& p : pending) {
        num_queued_--;
        FinishEvent ev{FinishReason::kError, "", {}, load_error_};
        ev.unavailable = true;
        p.channel->push(std::move(ev));
      }
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_ || !inbox_.empty(); });
      continue;
    }
    e.admit(pending);
    e.apply_cancels();
    const bool worked = e.step();
    e.publish_stats();
    if (!worked) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_ || !inbox_.empty(); });
    }
  }
  // Shutdown: everything still queued or running ends as cancelled (after what was produced).
  e.flush_events();
  for (auto& [id, a] : e.active) a.channel->push(FinishEvent{FinishReason::kCancelled, "", {}, ""});
  e.active.clear();
  std::lock_guard<std::mutex> lock(mu_);
  for (Pending& p : inbox_) p.channel->push(FinishEvent{FinishReason::kCancelled, "", {}, ""});
  inbox_.clear();
  state_ = EngineState::kStopped;
}

}  // namespace kiln::engine
