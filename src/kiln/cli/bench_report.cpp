#include "kiln/cli/bench_report.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "kiln/util/cpu.h"

#if defined(__linux__)
#include <sched.h>
#endif

namespace kiln::cli {
namespace {

// The CPU's model name from /proc/cpuinfo ("model name" on x86, "Model" or "Hardware" on some
// arm kernels); "" when there is none.
std::string read_cpu_info() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  for (const char* key : {"model name", "Model", "Hardware"}) {
    in.clear();
    in.seekg(0);
    while (std::getline(in, line)) {
      if (!line.starts_with(key)) continue;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      if (line.find_first_not_of(" \t", std::string_view(key).size()) != colon) continue;
      std::string v = line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      if (!v.empty()) return v;
    }
  }
  return "";
}

std::vector<int> affinity_cpus() {
  std::vector<int> cpus;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i)
      if (CPU_ISSET(i, &set)) cpus.push_back(i);
    return cpus;
  }
#endif
  for (int i = 0; i < util::num_logical_cores(); ++i) cpus.push_back(i);
  return cpus;
}

std::string join_values(std::span<const double> v, const char* format) {
  std::string out;
  for (double x : v) {
    if (!out.empty()) out += ' ';
    out += fmt::format(fmt::runtime(format), x);
  }
  return out;
}

}  // namespace

SampleStats sample_stats(std::span<const double> samples) {
  SampleStats s;
  if (samples.empty()) return s;
  std::vector<double> v(samples.begin(), samples.end());
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(n);
  if (n >= 2) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.stddev = std::sqrt(ss / static_cast<double>(n - 1));
  }
  s.min = v.front();
  s.max = v.back();
  s.median = n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
  return s;
}

std::string cpu_list(std::span<const int> cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

std::string cpu_mask_hex(std::span<const int> cpus) {
  int max_cpu = -1;
  for (int c : cpus) max_cpu = std::max(max_cpu, c);
  if (max_cpu < 0) return "0x0";
  std::string digits(static_cast<size_t>(max_cpu / 4 + 1), '0');  // most significant first
  for (int c : cpus) {
    char& d = digits[digits.size() - 1 - static_cast<size_t>(c / 4)];
    const int value = (d <= '9' ? d - '0' : d - 'a' + 10) | (1 << (c % 4));
    d = static_cast<char>(value < 10 ? '0' + value : 'a' + value - 10);
  }
  return "0x" + digits;
}

ThreadPlacement current_thread_placement(int n_threads, int spin_us) {
  ThreadPlacement p;
  p.n_threads = n_threads;
  p.spin_us = spin_us;
  p.cpus = affinity_cpus();
  p.cpu_mask = cpu_mask_hex(p.cpus);
  p.cpu_strict = false;  // util::ThreadPool does not pin its threads
  p.n_cpus_online = util::num_logical_cores();
  p.n_physical_cores = util::num_physical_cores();
  p.cpu_info = read_cpu_info();
  return p;
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json bench_json(const BenchRunInfo& run, const ThreadPlacement& placement,
                          std::span<const BenchFigure> figures) {
  nlohmann::json out = nlohmann::json::array();
  for (const BenchFigure& f : figures) {
    const SampleStats ts = sample_stats(f.tok_per_s);
    // Nanoseconds per repetition, as llama-bench times them (the whole test, not per token).
    std::vector<double> ns;
    for (double t : f.tok_per_s) ns.push_back(t > 0 ? f.n_tokens / t * 1e9 : 0.0);
    const SampleStats sns = sample_stats(ns);
    const bool gen = f.test.starts_with("tg");
    nlohmann::json j = {
        // llama-bench's fields
        {"cpu_info", placement.cpu_info},
        {"backends", run.backend.starts_with("cuda") ? "CUDA" : "CPU"},
        {"model_filename", run.model_path},
        {"model_type", run.arch},
        {"model_size", run.size_bytes},
        {"model_n_params", run.params},
        {"n_batch", run.n_batch},
        {"n_threads", placement.n_threads},
        {"cpu_mask", placement.cpu_mask},
        {"cpu_strict", placement.cpu_strict},
        {"type_k", run.type_kv},
        {"type_v", run.type_kv},
        {"n_prompt", gen ? 0 : f.n_tokens},
        {"n_gen", gen ? f.n_tokens : 0},
        {"test_time", run.test_time},
        {"avg_ns", sns.mean},
        {"stddev_ns", sns.stddev},
        {"avg_ts", ts.mean},
        {"stddev_ts", ts.stddev},
        {"samples_ns", ns},
        {"samples_ts", f.tok_per_s},
        // kiln's: the spread beyond mean and stddev, and where the threads may run
        {"repetitions", f.tok_per_s.size()},
        {"min_ts", ts.min},
        {"median_ts", ts.median},
        {"max_ts", ts.max},
        {"cpus", cpu_list(placement.cpus)},
        {"n_cpus_online", placement.n_cpus_online},
        {"n_physical_cores", placement.n_physical_cores},
        {"spin_us", placement.spin_us},
        // kiln's earlier names, kept for readers of older reports
        {"model", run.model_path},
        {"arch", run.arch},
        {"size_bytes", run.size_bytes},
        {"params", run.params},
        {"backend", run.backend},
        {"threads", placement.n_threads},
        {"type_kv", run.type_kv},
        {"test", f.test},
        {"n_tokens", f.n_tokens},
        {"tok_per_s_mean", ts.mean},
        {"tok_per_s_stddev", ts.stddev},
        {"samples", f.tok_per_s},
        {"weight_bytes_per_token", run.weight_bytes_per_token},
        {"gb_per_s", gen ? ts.mean * static_cast<double>(run.weight_bytes_per_token) / 1e9 : 0.0}};
    out.push_back(std::move(j));
  }
  return out;
}

void print_bench_table(const BenchRunInfo& run, const ThreadPlacement& placement,
                       std::span<const BenchFigure> figures) {
  fmt::print(
      "| {:<12} | {:>10} | {:>8} | {:<7} | {:>7} | {:>7} | {:>8} | {:>20} | {:>9} | {:>9} | "
      "{:>9} | {:>9} |\n",
      "model", "size", "params", "backend", "threads", "type_kv", "test", "t/s", "min", "median",
      "max", "GB/s");
  fmt::print(
      "| {:-<12} | {:->10} | {:->8} | {:-<7} | {:->7} | {:->7} | {:->8} | {:->20} | {:->9} | "
      "{:->9} | {:->9} | {:->9} |\n",
      "", "", "", "", "", "", "", "", "", "", "", "");
  for (const BenchFigure& f : figures) {
    const SampleStats s = sample_stats(f.tok_per_s);
    const std::string gbs =
        f.test.starts_with("tg")
            ? fmt::format("{:.2f}", s.mean * static_cast<double>(run.weight_bytes_per_token) / 1e9)
            : "";
    fmt::print(
        "| {:<12} | {:>6.2f} MiB | {:>6.2f} M | {:<7} | {:>7} | {:>7} | {:>8} | {:>11.2f} ± "
        "{:>6.2f} | {:>9.2f} | {:>9.2f} | {:>9.2f} | {:>9} |\n",
        run.arch, static_cast<double>(run.size_bytes) / 1048576.0,
        static_cast<double>(run.params) / 1e6, run.backend, placement.n_threads, run.type_kv,
        f.test, s.mean, s.stddev, s.min, s.median, s.max, gbs);
  }
  for (const BenchFigure& f : figures)
    fmt::print("{} t/s by repetition: {}\n", f.test, join_values(f.tok_per_s, "{:.2f}"));
  fmt::print(
      "threads: {} on CPUs {} (cpu_mask {}, {} online, {} physical cores allowed), not pinned "
      "(cpu_strict 0), idle spin {} us; CPU: {}\n",
      placement.n_threads, cpu_list(placement.cpus), placement.cpu_mask, placement.n_cpus_online,
      placement.n_physical_cores, placement.spin_us,
      placement.cpu_info.empty() ? "unknown" : placement.cpu_info);
}

}  // namespace kiln::cli
