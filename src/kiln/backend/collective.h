// Collective operations between the ranks of a device mesh (the multi-GPU issue): what the
// forward over a mesh calls between ranks, whatever carries it (NCCL on GPUs; threads as ranks
// on the CPU, backend/cpu/cpu_collective.h, so that the sharded forward runs and is tested on
// any machine).
//
// Each rank holds its own Collective; every rank of the mesh makes the same calls in the same
// order (as with NCCL). A call returns once this rank's part is done. Failure never hangs: a
// rank that gives up (abort(), or a call whose peers do not arrive within the deadline) makes
// every call on every rank of the mesh, pending or later, return an error naming the cause.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/util/status.h"

namespace kiln::backend {

class Collective {
 public:
  virtual ~Collective() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[i] = the sum over ranks of their data[i], in place, for n values. Every rank gets the
  // same bits: the ranks' values are added in rank order (((r0 + r1) + r2) + ...), whatever
  // the order the ranks arrived in.
  virtual Status all_reduce_sum(float* data, int64_t n) = 0;
  // out[r * n + i] = rank r's in[i] for every rank r; out holds size() * n values and does not
  // overlap in.
  virtual Status all_gather(const float* in, int64_t n, float* out) = 0;
  // Point to point: send returns once peer's matching recv has the bytes.
  virtual Status send(const void* data, uint64_t bytes, int peer) = 0;
  virtual Status recv(void* data, uint64_t bytes, int peer) = 0;
  // Returns once every rank has called it.
  virtual Status barrier() = 0;
  // Gives up: every pending and later call of every rank fails with `why`.
  virtual void abort(const std::string& why) = 0;
};

}  // namespace kiln::backend
