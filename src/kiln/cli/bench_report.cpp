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

// The weight bandwidth of a generation figure: the weights read per step (once for the step's
// n_seqs tokens) times steps per second.
double weight_gbs(const BenchRunInfo& run, const BenchFigure& f, double tok_per_s) {
  return tok_per_s / std::max(f.n_seqs, 1) * static_cast<double>(run.weight_bytes_per_token) / 1e9;
}

// The roofline's rows in the table's order: the classes (longest first), their sum, attention,
// the other ops, the eager step, the tg step.
std::vector<std::pair<std::string, const engine::RooflineRow*>> roofline_rows(
    const engine::Roofline& r) {
  std::vector<std::pair<std::string, const engine::RooflineRow*>> rows;
  for (const engine::RooflineRow& c : r.classes) rows.emplace_back("class", &c);
  rows.emplace_back("matmuls", &r.matmuls);
  rows.emplace_back("attention", &r.attention);
  rows.emplace_back("other", &r.other);
  rows.emplace_back("eager_step", &r.eager_step);
  if (r.tg_step) rows.emplace_back("tg_step", &*r.tg_step);
  return rows;
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
                          std::span<const BenchFigure> figures, const engine::Roofline* roofline) {
  nlohmann::json out = nlohmann::json::array();
  for (const BenchFigure& f : figures) {
    const SampleStats ts = sample_stats(f.tok_per_s);
    // Nanoseconds per repetition, as llama-bench times them (the whole test, not per token).
    std::vector<double> ns;
    for (double t : f.tok_per_s) ns.push_back(t > 0 ? f.n_tokens / t * 1e9 : 0.0);
    const SampleStats sns = sample_stats(ns);
    const bool gen = f.gen;
    const int32_t per_seq = f.n_tokens / std::max(f.n_seqs, 1);
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
        {"n_prompt", gen ? 0 : per_seq},
        {"n_gen", gen ? per_seq : 0},
        {"n_depth", f.n_depth},
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
        {"n_seqs", f.n_seqs},
        // kiln's earlier names, kept for readers of older reports
        {"model", run.model_path},
        {"arch", run.arch},
        {"size_bytes", run.size_bytes},
        {"params", run.params},
        {"backend", run.backend},
        {"deterministic", run.deterministic},
        {"threads", placement.n_threads},
        {"type_kv", run.type_kv},
        {"test", f.test},
        {"n_tokens", f.n_tokens},
        {"tok_per_s_mean", ts.mean},
        {"tok_per_s_stddev", ts.stddev},
        {"samples", f.tok_per_s},
        {"weight_bytes_per_token", run.weight_bytes_per_token},
        {"gb_per_s", gen ? weight_gbs(run, f, ts.mean) : 0.0},
    };
    if (gen && roofline != nullptr) j["roofline"] = roofline_json(*roofline);
    out.push_back(std::move(j));
  }
  return out;
}

void print_bench_table(const BenchRunInfo& run, const ThreadPlacement& placement,
                       std::span<const BenchFigure> figures) {
  size_t test_width = 8;  // wider for "tg128 x8 @ d32768"
  for (const BenchFigure& f : figures) test_width = std::max(test_width, f.test.size());
  fmt::print(
      "| {:<12} | {:>10} | {:>8} | {:<7} | {:>7} | {:>7} | {:>{}} | {:>20} | {:>9} | {:>9} | "
      "{:>9} | {:>9} |\n",
      "model", "size", "params", "backend", "threads", "type_kv", "test", test_width, "t/s", "min",
      "median", "max", "GB/s");
  fmt::print(
      "| {:-<12} | {:->10} | {:->8} | {:-<7} | {:->7} | {:->7} | {:->{}} | {:->20} | {:->9} | "
      "{:->9} | {:->9} | {:->9} |\n",
      "", "", "", "", "", "", "", test_width, "", "", "", "", "");
  for (const BenchFigure& f : figures) {
    const SampleStats s = sample_stats(f.tok_per_s);
    const std::string gbs = f.gen ? fmt::format("{:.2f}", weight_gbs(run, f, s.mean)) : "";
    fmt::print(
        "| {:<12} | {:>6.2f} MiB | {:>6.2f} M | {:<7} | {:>7} | {:>7} | {:>{}} | {:>11.2f} ± "
        "{:>6.2f} | {:>9.2f} | {:>9.2f} | {:>9.2f} | {:>9} |\n",
        run.arch, static_cast<double>(run.size_bytes) / 1048576.0,
        static_cast<double>(run.params) / 1e6,
        run.deterministic ? run.backend + " det" : run.backend, placement.n_threads, run.type_kv,
        f.test, test_width, s.mean, s.stddev, s.min, s.median, s.max, gbs);
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

void print_roofline(const engine::Roofline& r) {
  fmt::print(
      "\nroofline of a decode step: {} sequence{} after {} tokens of context, {} profiled eager "
      "steps; copy bandwidth {:.1f} GB/s (read + written, {:.0f} MiB copies, median of 5)\n\n",
      r.n_seqs, r.n_seqs == 1 ? "" : "s", r.depth, r.steps, r.copy_gbs,
      static_cast<double>(r.copy_bytes) / 1048576.0);
  const auto rows = roofline_rows(r);
  size_t width = 5;
  for (const auto& [kind, row] : rows) width = std::max(width, row->label.size());
  fmt::print("| {:<{}} | {:>10} | {:>10} | {:>10} | {:>8} | {:>7} |\n", "class", width,
             "calls/step", "MB/step", "us/step", "GB/s", "% copy");
  fmt::print("| {:-<{}} | {:->10} | {:->10} | {:->10} | {:->8} | {:->7} |\n", "", width, ":", ":",
             ":", ":", ":");
  for (const auto& [kind, row] : rows) {
    const bool counted = row->bytes > 0;
    const std::string calls = row->calls > 0 ? fmt::format("{:.2f}", row->calls) : "";
    const std::string mb = counted ? fmt::format("{:.3f}", row->bytes / 1e6) : "";
    const std::string gbs = counted ? fmt::format("{:.1f}", row->gb_per_s()) : "";
    const std::string pct = counted ? fmt::format("{:.1f}", r.percent_of_copy(*row)) : "";
    fmt::print("| {:<{}} | {:>10} | {:>10} | {:>10.1f} | {:>8} | {:>7} |\n", row->label, width,
               calls, mb, row->us, gbs, pct);
  }
}

nlohmann::json roofline_json(const engine::Roofline& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [kind, row] : roofline_rows(r)) {
    rows.push_back({{"kind", kind},
                    {"label", row->label},
                    {"calls_per_step", row->calls},
                    {"bytes_per_step", row->bytes},
                    {"us_per_step", row->us},
                    {"gb_per_s", row->gb_per_s()},
                    {"percent_of_copy", r.percent_of_copy(*row)}});
  }
  return {{"copy_gb_per_s", r.copy_gbs},
          {"copy_bytes", r.copy_bytes},
          {"n_seqs", r.n_seqs},
          {"n_depth", r.depth},
          {"steps", r.steps},
          {"kv_bytes_per_token", r.kv_bytes_per_token},
          {"rows", std::move(rows)}};
}

}  // namespace kiln::cli
