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
  // Optional interleaved copy of the same values made at load by the CPU backend
  // (backend/cpu/pack.h): packed_rows rows side by side per block, so one SIMD instruction
  // serves that many output rows. Null when the weight is used only as stored. `data` stays
  // valid either way (row access, the reference kernel, a path with another row count).
  const uint8_t* packed = nullptr;
  int32_t packed_rows = 0;

  const uint8_t* row(int64_t r) const { return data + static_cast<uint64_t>(r) * row_bytes; }
  bool empty() const { return data == nullptr; }
};

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
