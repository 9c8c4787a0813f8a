// Per-op timing of a backend (Backend::set_profiling, profile_take): kiln bench --roofline's
// classes of a decode step. The labels and byte counts are defined here once, so every
// backend names and weighs an op the same way.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/backend/weight.h"

namespace kiln::backend {

struct MoeWeights;

// One class of profiled ops: every op issued under one label since the last take, summed.
struct OpTime {
  std::string label;
  uint64_t bytes = 0;  // the weight bytes the ops had to read (copy: the bytes copied)
  int64_t calls = 0;
  double us = 0;  // the ops' time (CUDA: device time between events; CPU: wall time)
};

// "q4_K 4096x14336": the weight's type, then n_out x n_in (a matmul's class).
std::string matmul_label(const Weight& w);
// The members' labels joined by " + " (a matmuls group: q/k/v, gate/up).
std::string matmuls_label(std::span<const Weight* const> ws);
// "moe experts q4_K 768x2048 + q4_K 768x2048 + q6_K 2048x768 (8 of 128), router f32 128x2048".
std::string moe_label(const MoeWeights& w);
// The bytes a MoE op over `rows` token rows must read: the router, and of each stacked expert
// tensor the experts the rows can reach (n_expert_used per row, at most n_expert of them).
uint64_t moe_bytes(const MoeWeights& w, int64_t rows);

// The sums by label, in the order the labels were first seen.
class OpTimeSums {
 public:
  void add(const std::string& label, uint64_t bytes, double us);
  // The sums since the last take; the sums start again from nothing.
  std::vector<OpTime> take();

 private:
  std::vector<OpTime> sums_;
};

}  // namespace kiln::backend
