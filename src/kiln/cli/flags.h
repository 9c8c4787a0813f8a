// Command-line values are input: every numeric flag is checked at parse time, and a value out
// of its range is a usage error (exit 2) naming the flag and the range, never an assertion
// later. Add a numeric flag through add_ranged() (or one of the shared flags below) so it
// cannot be added without its range.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "kiln/model/mesh.h"

namespace kiln::cli {

// Ranges shared by several subcommands.
inline constexpr int64_t kMaxThreads = 1024;              // util::ThreadPool takes up to 4096
inline constexpr int64_t kMaxContext = int64_t{1} << 21;  // tokens per sequence
inline constexpr int64_t kMaxTokens = int64_t{1} << 30;   // generated tokens, prompt tokens

// A validator "must be in [lo, hi]" for integer flags (CLI11 prefixes the flag's name).
inline CLI::Validator int_range(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& input) -> std::string {
        int64_t v = 0;
        if (!CLI::detail::lexical_cast(input, v) || v < lo || v > hi)
          return fmt::format("{} is not an integer in [{}, {}]", input, lo, hi);
        return std::string();
      },
      fmt::format("INT in [{}, {}]", lo, hi));
}

// A validator "must be in [lo, hi]" for real-valued flags (NaN and infinities refused).
inline CLI::Validator real_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& input) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(input, v) || !(v >= lo && v <= hi))
          return fmt::format("{} is not a number in [{}, {}]", input, lo, hi);
        return std::string();
      },
      fmt::format("NUMBER in [{}, {}]", lo, hi));
}

// An integer flag with its range; the default is shown in --help.
template <typename T>
CLI::Option* add_ranged(CLI::App* cmd, const std::string& names, T& value, int64_t lo, int64_t hi,
                        const std::string& help) {
  return cmd->add_option(names, value, help)->capture_default_str()->check(int_range(lo, hi));
}

// -t,--threads: 0 (the default) means one per physical core; given, it must be in range.
inline CLI::Option* add_threads_flag(CLI::App* cmd, int& threads) {
  return cmd->add_option("-t,--threads", threads, "threads (default: physical cores)")
      ->check(int_range(1, kMaxThreads));
}

// --tp, --pp, --ep: a device mesh (the model is checked against it at load).
inline constexpr int64_t kMaxMeshRanks = 64;
inline void add_mesh_flags(CLI::App* cmd, model::MeshShape& mesh) {
  add_ranged(cmd, "--tp", mesh.tp, 1, kMaxMeshRanks,
             "tensor-parallel ranks: heads, FFN widths and the vocabulary split over them");
  add_ranged(cmd, "--pp", mesh.pp, 1, kMaxMeshRanks,
             "pipeline stages: each a run of whole layers, of --tp ranks each");
  cmd->add_flag("--ep", mesh.ep,
                "MoE: whole experts spread over the --tp ranks (else each expert split)");
  cmd->add_option("--devices", mesh.devices,
                  "GPUs of the ranks in rank order, e.g. 0,1,2,3 (default: consecutive from "
                  "--device's)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1023));
}

// --deterministic: greedy output that depends on the request alone (Backend::set_deterministic).
inline void add_deterministic_flag(CLI::App* cmd, bool& on) {
  cmd->add_flag("--deterministic", on,
                "the same output for a request whatever runs beside it: one reduction order per "
                "op for every batch, prefill chunking and prefix-cache hit (costs speed on CUDA)");
}

}  // namespace kiln::cli
