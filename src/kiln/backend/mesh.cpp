#include "kiln/backend/mesh.h"

#include <algorithm>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cpu/cpu_collective.h"
#include "kiln/util/thread_pool.h"

namespace kiln::backend {

Mesh::~Mesh() {
  if (!ranks_.empty()) ranks_[0]->set_mesh(nullptr, nullptr);  // the caller's backend stays
}

Expected<std::unique_ptr<Mesh>> Mesh::create(Backend& first, int tp, int pp,
                                             const BackendOptions& opts,
                                             std::chrono::milliseconds timeout) {
  if (tp < 1 || pp < 1) return err("mesh: --tp {} --pp {}: both must be >= 1", tp, pp);
  if (!first.supports_mesh())
    return err(
        "{}: a mesh of --tp {} --pp {} needs collective ops between its ranks, which this "
        "backend does not have yet (NCCL for GPUs is not built; --device cpu has them)",
        first.name(), tp, pp);
  std::unique_ptr<Mesh> m(new Mesh());
  const int n = tp * pp;
  m->ranks_.push_back(&first);
  const int threads =
      opts.threads > 0 ? opts.threads : std::max(1, util::default_num_threads() / n);
  for (int r = 1; r < n; ++r) {
    m->owned_.push_back(std::make_unique<cpu::CpuBackend>(threads));
    m->ranks_.push_back(m->owned_.back().get());
  }
  if (n == 1) return m;
  // One communicator per stage's tensor-parallel ranks and per tensor-parallel rank's
  // pipeline; each rank holds its end of both (null when that side has one rank).
  std::vector<Collective*> tp_end(static_cast<size_t>(n), nullptr), pp_end(tp_end);
  auto join = [&](int size, auto rank_of, std::vector<Collective*>& ends) {
    auto comm = std::make_shared<cpu::CpuCommunicator>(size, timeout);
    for (int i = 0; i < size; ++i) {
      m->ends_.push_back(comm->rank(i));
      ends[static_cast<size_t>(rank_of(i))] = m->ends_.back().get();
    }
    m->comms_.push_back(comm);
  };
  if (tp > 1)
    for (int s = 0; s < pp; ++s)
      join(
          tp, [&](int i) { return s * tp + i; }, tp_end);
  if (pp > 1)
    for (int t = 0; t < tp; ++t)
      join(
          pp, [&](int i) { return i * tp + t; }, pp_end);
  for (int r = 0; r < n; ++r) m->ranks_[static_cast<size_t>(r)]->set_mesh(tp_end[r], pp_end[r]);
  return m;
}

void Mesh::abort(const std::string& why) {
  for (const auto& end : ends_) end->abort(why);
}

}  // namespace kiln::backend
