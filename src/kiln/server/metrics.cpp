#include "kiln/server/metrics.h"

#include <fmt/format.h>

#include "kiln/server/context.h"
#include "kiln/server/router.h"

namespace kiln::server {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(const std::string& name, std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    *out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  cumulative += counts_.back();
  *out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, cumulative);
  *out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
}

Metrics::Metrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      itl_({0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5}) {}

void Metrics::count_request(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_by_status_[status];
}

void Metrics::add_tokens(int64_t num_prompt, int64_t num_generated) {
  num_prompt_tokens_.fetch_add(num_prompt);
  num_generated_tokens_.fetch_add(num_generated);
}

namespace {
void metric(std::string* out, const char* name, const char* type, const char* help, double value) {
  *out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}
}  // namespace

std::string Metrics::render(const engine::EngineStats& s, engine::EngineState state) const {
  std::string out;
  out += "# HELP kiln_http_requests_total HTTP requests answered, by status code.\n";
  out += "# TYPE kiln_http_requests_total counter\n";
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [status, n] : requests_by_status_)
      out += fmt::format("kiln_http_requests_total{{status=\"{}\"}} {}\n", status, n);
  }
  metric(&out, "kiln_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
         static_cast<double>(num_prompt_tokens_.load()));
  metric(&out, "kiln_generation_tokens_total", "counter", "Generated tokens of finished requests.",
         static_cast<double>(num_generated_tokens_.load()));
  out += "# HELP kiln_time_to_first_token_seconds Submit to first token, measured in the server.\n";
  out += "# TYPE kiln_time_to_first_token_seconds histogram\n";
  ttft_.render("kiln_time_to_first_token_seconds", &out);
  out += "# HELP kiln_inter_token_latency_seconds Time between consecutive tokens of a request.\n";
  out += "# TYPE kiln_inter_token_latency_seconds histogram\n";
  itl_.render("kiln_inter_token_latency_seconds", &out);
  metric(&out, "kiln_num_requests_running", "gauge", "Sequences in the running batch.",
         static_cast<double>(s.num_running));
  metric(&out, "kiln_num_requests_waiting", "gauge", "Requests waiting to be scheduled.",
         static_cast<double>(s.num_waiting));
  metric(&out, "kiln_kv_blocks_used", "gauge", "KV cache blocks in use.",
         static_cast<double>(s.num_kv_blocks_used));
  metric(&out, "kiln_kv_blocks_total", "gauge", "KV cache blocks in the pool.",
         static_cast<double>(s.num_kv_blocks_total));
  metric(&out, "kiln_prefix_cache_hit_tokens_total", "counter",
         "Prompt tokens served from the prefix cache.",
         static_cast<double>(s.num_prefix_hit_tokens));
  metric(&out, "kiln_prefix_cache_queried_tokens_total", "counter",
         "Prompt tokens looked up in the prefix cache.",
         static_cast<double>(s.num_prefix_queried_tokens));
  metric(&out, "kiln_preemptions_total", "counter", "Sequences preempted for KV blocks.",
         static_cast<double>(s.num_preemptions));
  metric(&out, "kiln_state_slots_used", "gauge",
         "Recurrent-state slots held by running sequences (hybrid models).",
         static_cast<double>(s.num_state_slots_used));
  metric(&out, "kiln_state_snapshot_saves_total", "counter",
         "Recurrent-state snapshots saved at prefix checkpoints (hybrid models).",
         static_cast<double>(s.num_state_saves));
  metric(&out, "kiln_state_snapshot_restores_total", "counter",
         "Requests resumed from a recurrent-state snapshot (hybrid models' prefix hits).",
         static_cast<double>(s.num_state_restores));
  out +=
      "# HELP kiln_engine_step_seconds_total Engine thread time over its steps, by phase: "
      "schedule (host, before the forward), launch (queueing it; on the CPU the forward), "
      "wait (for the device), update (host: sampling, stops, detokenizing), deliver (events to "
      "the requests; while the next step runs on a GPU).\n";
  out += "# TYPE kiln_engine_step_seconds_total counter\n";
  for (const auto& [phase, secs] : {std::pair{"schedule", s.step_schedule_seconds},
                                    {"launch", s.step_launch_seconds},
                                    {"wait", s.step_wait_seconds},
                                    {"update", s.step_update_seconds},
                                    {"deliver", s.step_deliver_seconds}})
    out += fmt::format("kiln_engine_step_seconds_total{{phase=\"{}\"}} {}\n", phase, secs);
  metric(&out, "kiln_engine_steps_total", "counter", "Engine steps (forward passes).",
         static_cast<double>(s.num_steps));
  metric(&out, "kiln_engine_argmax_steps_total", "counter",
         "Steps whose rows all sampled plain greedy: argmax ids back, not logits.",
         static_cast<double>(s.num_argmax_steps));
  metric(&out, "kiln_engine_heartbeat_age_seconds", "gauge",
         "Seconds since the engine thread last finished a step or idled.",
         s.seconds_since_heartbeat);
  metric(&out, "kiln_engine_ready", "gauge", "1 when the engine serves requests.",
         state == engine::EngineState::kReady ? 1.0 : 0.0);
  return out;
}

void register_metrics_routes(Router& router, ServerContext& ctx) {
  router.add(
      "GET", "/metrics",
      [&ctx](const HttpRequest&, HttpExchange&) -> HandlerResult {
        return Response{200, "text/plain; version=0.0.4; charset=utf-8",
                        ctx.metrics.render(ctx.engine.stats(), ctx.engine.state())};
      },
      /*is_public=*/true);
}

}  // namespace kiln::server
