#include "kiln/backend/profile.h"

#include <algorithm>

#include <fmt/format.h>

#include "kiln/backend/backend.h"

namespace kiln::backend {

std::string matmul_label(const Weight& w) {
  return fmt::format("{} {}x{}", quant::type_name(w.type), w.n_out, w.n_in);
}

std::string matmuls_label(std::span<const Weight* const> ws) {
  std::string s;
  for (const Weight* w : ws) {
    if (!s.empty()) s += " + ";
    s += matmul_label(*w);
  }
  return s;
}

std::string moe_label(const MoeWeights& w) {
  return fmt::format("moe experts {} + {} + {} ({} of {}), router {}", matmul_label(*w.gate_exps),
                     matmul_label(*w.up_exps), matmul_label(*w.down_exps), w.n_expert_used,
                     w.n_expert, matmul_label(*w.router));
}

uint64_t moe_bytes(const MoeWeights& w, int64_t rows) {
  const int64_t n_expert = std::max<int64_t>(w.n_expert, 1);
  const auto reached = static_cast<uint64_t>(std::min<int64_t>(n_expert, w.n_expert_used * rows));
  uint64_t bytes = w.router->total_bytes();
  for (const Weight* e : {w.gate_exps, w.up_exps, w.down_exps})
    bytes += e->total_bytes() / static_cast<uint64_t>(n_expert) * reached;
  return bytes;
}

void OpTimeSums::add(const std::string& label, uint64_t bytes, double us) {
  auto it =
      std::find_if(sums_.begin(), sums_.end(), [&](const OpTime& t) { return t.label == label; });
  if (it == sums_.end()) it = sums_.insert(sums_.end(), OpTime{label, 0, 0, 0});
  it->bytes += bytes;
  it->calls += 1;
  it->us += us;
}

std::vector<OpTime> OpTimeSums::take() {
  std::vector<OpTime> out;
  out.swap(sums_);
  return out;
}

}  // namespace kiln::backend
