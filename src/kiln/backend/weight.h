// A matmul weight as the GGUF file stores it: n_out rows of n_in elements of one type
// (ggml shape [n_in, n_out]); experts stack n_expert such matrices.
#pragma once

#include <cstdint>

#include "kiln/quant/types.h"

namespace kiln::backend {

struct Weight {
  quant::Type type = quant::Type::F32;
  int64_t n_in = 0;   // ne[0]: elements per row, the reduction dimension
  int64_t n_out = 0;  // ne[1]: rows, the output dimension
  const uint8_t* data = nullptr;
  uint64_t row_bytes = 0;
  // The preparing backend's own form of this weight (Backend::prepare_weight), in its
  // kernels' layout (CPU: the interleaved copy of backend/cpu/pack.h), or null when its
  // kernels read the rows as stored. Only the backend that made it reads it.
  const void* prepared = nullptr;
  int64_t n_mats = 1;  // ne[2]: stacked matrices (experts), each n_out rows

  const uint8_t* row(int64_t r) const { return data + static_cast<uint64_t>(r) * row_bytes; }
  bool empty() const { return data == nullptr; }
  uint64_t total_bytes() const { return static_cast<uint64_t>(n_mats * n_out) * row_bytes; }
};

// Expert e of a stacked weight (n_expert matrices of n_out rows, back to back), as a plain
// matrix view of the stored rows.
inline Weight expert(const Weight& stacked, int64_t e) {
  Weight w = stacked;
  w.data = stacked.data + static_cast<uint64_t>(e) * stacked.n_out * stacked.row_bytes;
  w.n_mats = 1;
  w.prepared = nullptr;
  return w;
}

// Paged attention metadata for one step, CSR style (FlashInfer's paged_kv_t): sequence s owns
// query rows [qo_indptr[s], qo_indptr[s+1]) of the flat batch and KV blocks
// kv_indices[kv_indptr[s] .. kv_indptr[s+1]); kv_len[s] tokens of it are valid after this
// step's KV writes. positions[t] is the absolute position of flat row t.
struct AttnBatch {
  int32_t num_seqs = 0;
  const int32_t* qo_indptr = nullptr;   // [num_seqs + 1]
  const int32_t* kv_indptr = nullptr;   // [num_seqs + 1]
  const int32_t* kv_indices = nullptr;  // [kv_indptr[num_seqs]]
  const int32_t* kv_len = nullptr;      // [num_seqs]
  const int32_t* positions = nullptr;   // [n_tokens]
};

}  // namespace kiln::backend
