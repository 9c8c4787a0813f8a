// Server-side counters for /metrics (Prometheus text format 0.0.4). Latencies are measured
// here, in the server, from submit to the first token event (TTFT) and between token events
// (inter-token latency); engine gauges come from EngineStats at scrape time.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/engine/api.h"

namespace kiln::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends the _bucket/_sum/_count lines of `name`.
  void render(const std::string& name, std::string* out) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative); last = +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void count_request(int status);
  void add_tokens(int64_t num_prompt, int64_t num_generated);
  void observe_ttft(double seconds) { ttft_.observe(seconds); }
  void observe_inter_token(double seconds) { itl_.observe(seconds); }

  std::string render(const engine::EngineStats& stats, engine::EngineState state) const;

 private:
  mutable std::mutex mu_;
  std::map<int, int64_t> requests_by_status_;
  std::atomic<int64_t> num_prompt_tokens_{0};
  std::atomic<int64_t> num_generated_tokens_{0};
  Histogram ttft_;
  Histogram itl_;
};

}  // namespace kiln::server
