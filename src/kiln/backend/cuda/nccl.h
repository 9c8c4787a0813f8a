// NCCL between the GPUs of a device mesh (the multi-GPU issue): the communicators that carry a
// mesh's all-reduce, all-gather and pipeline send/recv on the GPUs' streams. NCCL is opened at
// run time (libnccl.so.2): kiln runs where it is missing, and only a GPU mesh needs it (and
// then says it is missing).
//
// One process drives every GPU of the mesh, one thread per rank: a group's communicator is
// made for all its GPUs at once (ncclCommInitAll). Each end is a Collective (collective.h) of
// its rank; its host-side calls take device pointers and wait for NCCL on a stream of their
// own, while the CUDA backend's mesh ops issue the same calls on its own stream, in order with
// its kernels (and captured with them into CUDA graphs).
#pragma once

#include <memory>
#include <vector>

#include "kiln/backend/collective.h"
#include "kiln/util/status.h"

namespace kiln::backend::cuda {

// A communicator over `devices` (CUDA device indices, one per rank, in rank order); its ends.
Expected<std::vector<std::unique_ptr<Collective>>> nccl_group(const std::vector<int>& devices);

// The NCCL ops of an end made by nccl_group (an error for any other Collective), on `stream`
// (a cudaStream_t), device pointers. They return once queued.
Status nccl_all_reduce_sum(Collective* end, float* data, int64_t n, void* stream);
Status nccl_all_gather(Collective* end, const float* in, int64_t n, float* out, void* stream);
Status nccl_send(Collective* end, const void* data, uint64_t bytes, int peer, void* stream);
Status nccl_recv(Collective* end, void* data, uint64_t bytes, int peer, void* stream);

}  // namespace kiln::backend::cuda
