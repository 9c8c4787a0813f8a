#include "kiln/model/mesh.h"

#include <algorithm>

namespace kiln::model {

namespace {

// n split over tp ranks: an error naming what n counts unless tp divides it.
Status divides(uint32_t n, int tp, const char* what) {
  if (n % static_cast<uint32_t>(tp) != 0)
    return err("--tp {} does not divide the model's {} ({})", tp, what, n);
  return {};
}

}  // namespace

Status check_mesh(const HParams& hp, const MeshShape& mesh) {
  if (mesh.tp < 1 || mesh.pp < 1)
    return err("the mesh needs --tp >= 1 and --pp >= 1 (got --tp {} --pp {})", mesh.tp, mesh.pp);
  const int tp = mesh.tp;
  if (tp > 1) {
    KILN_TRY_STATUS(divides(hp.n_head, tp, "attention heads"));
    if (hp.n_head_kv > 0 && hp.n_head_kv % static_cast<uint32_t>(tp) != 0 &&
        static_cast<uint32_t>(tp) % hp.n_head_kv != 0)
      return err(
          "--tp {} and the model's {} KV heads: one must divide the other (KV heads are split "
          "over the ranks, or each replicated on --tp / KV heads of them)",
          tp, hp.n_head_kv);
    if (hp.n_ff > 0) KILN_TRY_STATUS(divides(hp.n_ff, tp, "feed-forward width"));
    if (hp.n_expert > 0) {
      if (mesh.ep) {
        KILN_TRY_STATUS(divides(hp.n_expert, tp, "experts (--ep)"));
      } else {
        KILN_TRY_STATUS(divides(hp.n_ff_expert, tp, "expert feed-forward width"));
      }
    }
    if (hp.n_ff_shared > 0) KILN_TRY_STATUS(divides(hp.n_ff_shared, tp, "shared expert width"));
    if (hp.linear_n_k_heads > 0)
      KILN_TRY_STATUS(divides(hp.linear_n_k_heads, tp, "linear-attention key heads"));
    if (hp.linear_n_v_heads > 0)
      KILN_TRY_STATUS(divides(hp.linear_n_v_heads, tp, "linear-attention value heads"));
  }
  if (mesh.ep && hp.n_expert == 0) return err("--ep needs a mixture-of-experts model");
  if (static_cast<uint32_t>(mesh.pp) > hp.n_main_layers())
    return err("--pp {} stages need at least one layer each; the model has {}", mesh.pp,
               hp.n_main_layers());
  return {};
}

std::vector<std::pair<uint32_t, uint32_t>> pipeline_stages(const HParams& hp, int pp) {
  std::vector<std::pair<uint32_t, uint32_t>> stages;
  const uint32_t n = hp.n_main_layers(), p = static_cast<uint32_t>(std::max(1, pp));
  uint32_t first = 0;
  for (uint32_t s = 0; s < p; ++s) {
    const uint32_t len = n / p + (s < n % p ? 1 : 0);
    stages.emplace_back(first, first + len);
    first += len;
  }
  return stages;
}

}  // namespace kiln::model
