// kiln bench's report: every repetition's value, their spread (mean, standard deviation, min,
// median, max) and where the threads ran, as a table or as JSON with llama-bench's field
// names (`llama-bench -o json`), so interleaved runs of both can be compared and judged.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/engine/bench.h"

namespace kiln::cli {

// One test of a run ("pp512", "tg128 @ d32768"): tokens per second of each timed repetition.
using BenchFigure = engine::BenchFigure;

// The spread of a set of samples. stddev is the sample standard deviation (n - 1, as
// llama-bench), 0 for fewer than two samples; median is the middle value, or the mean of the
// two middle values. All 0 for no samples.
struct SampleStats {
  double mean = 0, stddev = 0, min = 0, median = 0, max = 0;
};
SampleStats sample_stats(std::span<const double> samples);

// Where the benchmark's threads may run, in llama-bench's terms: n_threads, cpu_mask (hex,
// the CPUs of the process's affinity), cpu_strict (whether each thread is pinned to one CPU:
// kiln's pool never pins, the OS places its threads within the mask) and the pool's idle spin
// (kiln's counterpart of llama-bench's `poll`).
struct ThreadPlacement {
  int n_threads = 0;
  int spin_us = 0;
  std::vector<int> cpus;  // the affinity's CPU ids, ascending
  std::string cpu_mask;   // "0x3": bit i set for CPU i
  bool cpu_strict = false;
  int n_cpus_online = 0;
  int n_physical_cores = 0;  // among the allowed CPUs
  std::string cpu_info;      // the CPU's model name ("" when unknown)
};
ThreadPlacement current_thread_placement(int n_threads, int spin_us);

// "0-3,6,8-9" for the CPU ids {0,1,2,3,6,8,9} (the Linux cpulist format).
std::string cpu_list(std::span<const int> cpus);
// "0x35b" for the same ids (no leading zeros; "0x0" for none).
std::string cpu_mask_hex(std::span<const int> cpus);

// What the report says about the run besides its figures.
struct BenchRunInfo {
  std::string model_path;
  std::string arch;
  uint64_t size_bytes = 0;
  uint64_t params = 0;
  std::string type_kv;
  int32_t n_batch = 0;
  uint64_t weight_bytes_per_token = 0;
  std::string test_time;        // when the run began, ISO 8601 UTC
  std::string backend = "cpu";  // the backend's name: cpu, cuda:0, ...
  bool deterministic = false;   // --deterministic (the table's backend column says "det")
};

// One object per test, as llama-bench -o json prints them (with kiln's earlier field names
// kept beside llama-bench's). With a roofline, the tg test's object holds it as "roofline".
nlohmann::json bench_json(const BenchRunInfo& run, const ThreadPlacement& placement,
                          std::span<const BenchFigure> figures,
                          const engine::Roofline* roofline = nullptr);
// The table, each test's repetitions and the placement line (stdout).
void print_bench_table(const BenchRunInfo& run, const ThreadPlacement& placement,
                       std::span<const BenchFigure> figures);
// The roofline of a decode step as a markdown table (stdout), and as JSON.
void print_roofline(const engine::Roofline& r);
nlohmann::json roofline_json(const engine::Roofline& r);
// The current UTC time as "2025-01-31T12:34:56Z".
std::string utc_now_iso8601();

}  // namespace kiln::cli
