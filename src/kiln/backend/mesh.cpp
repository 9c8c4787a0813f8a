#include "kiln/backend/mesh.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cpu/cpu_collective.h"
#include "kiln/util/log.h"
#include "kiln/util/thread_pool.h"

#ifdef KILN_HAVE_CUDA
#include "kiln/backend/cuda/nccl.h"
#endif

namespace kiln::backend {

Mesh::~Mesh() {
  if (ranks_.empty()) return;
  ranks_[0]->set_mesh(nullptr, nullptr);  // the caller's backend stays, with its threads
  if (auto* cpu = dynamic_cast<cpu::CpuBackend*>(ranks_[0]); cpu != nullptr && first_threads_ > 0)
    cpu->set_threads(first_threads_);
}

Expected<std::unique_ptr<Mesh>> Mesh::create(Backend& first, int tp, int pp,
                                             const BackendOptions& opts,
                                             std::chrono::milliseconds timeout,
                                             const std::vector<int>& devices) {
  if (tp < 1 || pp < 1) return err("mesh: --tp {} --pp {}: both must be >= 1", tp, pp);
  if (!first.supports_mesh())
    return err(
        "{}: a mesh of --tp {} --pp {} needs collective ops between its ranks, which this "
        "backend does not have",
        first.name(), tp, pp);
  std::unique_ptr<Mesh> m(new Mesh());
  const int n = tp * pp;
  m->ranks_.push_back(&first);
  // GPUs: rank r on devices[r], else on the GPU r after the first's (CUDA_VISIBLE_DEVICES
  // picks which they are).
  const std::string_view cuda = "cuda:";
  const bool gpu = first.name().rfind(cuda, 0) == 0;
  const int first_gpu = gpu ? std::atoi(first.name().c_str() + cuda.size()) : 0;
  std::vector<int> gpus = devices;
  if (!gpus.empty() && !gpu) return err("--devices names GPUs; {} has none", first.name());
  if (gpus.empty())
    for (int r = 0; r < n && gpu; ++r) gpus.push_back(first_gpu + r);
  if (gpu) {
    if (static_cast<int>(gpus.size()) != n)
      return err("--devices names {} GPUs for a mesh of {} ranks (--tp {} x --pp {})", gpus.size(),
                 n, tp, pp);
    if (gpus[0] != first_gpu)
      return err("--devices starts with GPU {}, but rank 0 is {} (--device)", gpus[0],
                 first.name());
    for (int r = 0; r < n; ++r) {
      if (gpus[r] < 0 || gpus[r] >= cuda_device_count())
        return err("--devices: no GPU {} ({} found)", gpus[r], cuda_device_count());
      for (int q = 0; q < r; ++q)
        if (gpus[q] == gpus[r]) return err("--devices names GPU {} twice", gpus[r]);
    }
  }
  const int threads =
      opts.threads > 0 ? opts.threads : std::max(1, util::default_num_threads() / n);
  // The CPU collective sums in rank order whatever the count; NCCL picks its algorithm and
  // chunking by the message's size, so a sum's order can follow the batch.
  if (gpu && tp > 1 && first.deterministic())
    log::warn(
        "--deterministic with --tp {} on GPUs: NCCL's all-reduce order depends on the "
        "step's size, so outputs may still vary with the batch (the mode holds on one GPU "
        "and with --pp)",
        tp);
  // Rank 0 takes its share of the cores too (else its pool's threads and the other ranks'
  // outnumber the cores: 3 threads on 2 cores at --tp 2, each rank's spinning workers taking
  // the core another rank computes on).
  if (auto* cpu = dynamic_cast<cpu::CpuBackend*>(&first); cpu != nullptr && n > 1) {
    m->first_threads_ = cpu->threads();
    cpu->set_threads(threads);
  }
  for (int r = 1; r < n; ++r) {
    if (gpu) {
      KILN_TRY(std::unique_ptr<Backend> be, create_backend({fmt::format("cuda:{}", gpus[r]),
                                                            opts.threads, first.deterministic()}));
      m->owned_.push_back(std::move(be));
    } else {
      m->owned_.push_back(std::make_unique<cpu::CpuBackend>(threads));
      m->owned_.back()->set_deterministic(first.deterministic());
    }
    m->ranks_.push_back(m->owned_.back().get());
  }
  if (n == 1) return m;
  // One communicator per stage's tensor-parallel ranks and per tensor-parallel rank's
  // pipeline; each rank holds its end of both (null when that side has one rank).
  std::vector<Collective*> tp_end(static_cast<size_t>(n), nullptr), pp_end(tp_end);
  auto join = [&](int size, auto rank_of, std::vector<Collective*>& ends) -> Status {
    std::vector<std::unique_ptr<Collective>> made;
    if (gpu) {
#ifdef KILN_HAVE_CUDA
      std::vector<int> group;
      for (int i = 0; i < size; ++i) group.push_back(gpus[rank_of(i)]);
      KILN_TRY(made, cuda::nccl_group(group));
#endif
    } else {
      auto comm = std::make_shared<cpu::CpuCommunicator>(size, timeout);
      for (int i = 0; i < size; ++i) made.push_back(comm->rank(i));
      m->comms_.push_back(comm);
    }
    for (int i = 0; i < size; ++i) {
      m->ends_.push_back(std::move(made[static_cast<size_t>(i)]));
      ends[static_cast<size_t>(rank_of(i))] = m->ends_.back().get();
    }
    return {};
  };
  if (tp > 1)
    for (int s = 0; s < pp; ++s)
      KILN_TRY_STATUS(join(
          tp, [&](int i) { return s * tp + i; }, tp_end));
  if (pp > 1)
    for (int t = 0; t < tp; ++t)
      KILN_TRY_STATUS(join(
          pp, [&](int i) { return i * tp + t; }, pp_end));
  for (int r = 0; r < n; ++r) m->ranks_[static_cast<size_t>(r)]->set_mesh(tp_end[r], pp_end[r]);
  return m;
}

void Mesh::abort(const std::string& why) {
  for (const auto& end : ends_) end->abort(why);
}

}  // namespace kiln::backend
