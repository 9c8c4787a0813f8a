// The ranks of a device mesh (the multi-GPU issue): one backend per rank, rank number
// stage * tp + tp_rank, each joined to the tensor-parallel ranks of its pipeline stage and to
// the stages of its pipeline by communicators (Backend::set_mesh). On the CPU each rank is a
// backend with its own thread pool and the communicators carry values between the ranks'
// threads (cpu/cpu_collective.h); on GPUs each rank is a GPU (rank r the r-th after the first
// rank's) and NCCL carries them (cuda/nccl.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kiln/backend/backend.h"

namespace kiln::backend {

class Mesh {
 public:
  // tp x pp ranks: rank 0 is `first` (the caller's backend, which outlives the mesh), the
  // others new backends of the same device kind (CPU: opts.threads threads each, 0: the
  // machine's cores shared out; rank 0 takes the same count for the mesh's life, when its pool
  // is its own). Every CPU collective wait gives up after `timeout`.
  // GPUs: `devices` names each rank's (rank 0's must be first's), else rank r takes the r-th
  // GPU after first's.
  static Expected<std::unique_ptr<Mesh>> create(
      Backend& first, int tp, int pp, const BackendOptions& opts,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(60000),
      const std::vector<int>& devices = {});
  ~Mesh();

  int size() const { return static_cast<int>(ranks_.size()); }
  Backend& rank(int r) const { return *ranks_[static_cast<size_t>(r)]; }
  // Gives up: every pending and later collective call of every rank fails with `why` (a rank
  // that failed must not leave the others waiting).
  void abort(const std::string& why);

 private:
  Mesh() = default;
  std::vector<std::unique_ptr<Backend>> owned_;  // ranks 1 ..
  std::vector<Backend*> ranks_;
  int first_threads_ = 0;  // a CPU mesh: rank 0's threads before it took its share (restored)
  // The communicators (type-erased: the CPU's), and each rank's ends of them.
  std::vector<std::shared_ptr<void>> comms_;
  std::vector<std::unique_ptr<Collective>> ends_;
};

}  // namespace kiln::backend
