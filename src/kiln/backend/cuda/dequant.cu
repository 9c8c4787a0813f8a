// Dequantization of GGUF rows on the device: to fp32 (bit-exact with quant::dequantize_row,
// see quant_blocks.cuh), to fp16 (the fp32 value rounded to nearest even: the tiles the cuBLAS
// path of matmul.cu multiplies), and embedding-row gathers. One thread decodes 8 consecutive
// weights of a block (one element for the plain types), so a warp writes 1 KiB of fp32.
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>

#include "kiln/backend/cuda/env.h"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/quant_blocks.cuh"

namespace kiln::backend::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void store8(float* out, const float* v, bool vec) {
  if (vec) {
    reinterpret_cast<float4*>(out)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(out)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    for (int k = 0; k < 8; ++k) out[k] = v[k];
  }
}
__device__ __forceinline__ void store8(__half* out, const float* v, bool vec) {
  __half2 h[4];
  for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
  if (vec) {
    *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(h);
  } else {
    for (int k = 0; k < 4; ++k) {
      out[2 * k] = __low2half(h[k]);
      out[2 * k + 1] = __high2half(h[k]);
    }
  }
}
__device__ __forceinline__ void store1(float* out, float v) {
  *out = v;
}
__device__ __forceinline__ void store1(__half* out, float v) {
  *out = __float2half_rn(v);
}

// out[r][:] = row (row_ids ? row_ids[r] : row0 + r) of w, r < n_rows. `vec`: out is 16-byte
// aligned (then every row is: n_in is a multiple of 32 for the block types).
template <class D, typename Out>
__global__ void __launch_bounds__(kThreads)
    dequant_rows_kernel(const uint8_t* data, uint64_t row_bytes, int64_t row0,
                        const int32_t* row_ids, int64_t n_rows, int64_t n_in, Out* out, bool vec) {
  constexpr bool kPlain =
      D::kType == quant::Type::F32 || D::kType == quant::Type::F16 || D::kType == quant::Type::BF16;
  const int64_t per_row = kPlain ? n_in : n_in / 8;  // work items per row
  const int64_t total = n_rows * per_row;
  for (int64_t idx = blockIdx.x * int64_t{kThreads} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * kThreads) {
    const int64_t r = idx / per_row, g = idx - r * per_row;
    const int64_t src_row = row_ids != nullptr ? row_ids[r] : row0 + r;
    const uint8_t* row = data + static_cast<uint64_t>(src_row) * row_bytes;
    if constexpr (kPlain) {
      store1(out + r * n_in + g, D::elem(row, g));
    } else {
      const int64_t e = 8 * g;
      float v[8];
      D::template dec8<2, true>(row + (e / D::kElems) * D::kBytes,
                                static_cast<int>((e % D::kElems) / 8), v);
      store8(out + r * n_in + e, v, vec);
    }
  }
}

// The same rows with a CTA per row (rows past the grid in strides of it), its threads over the
// row's groups of 8: no 64-bit division of a flat index per group, which was most of the flat
// kernel's instructions (session 20's prefill profile: the fp16 dequantization 34% of a
// 512-token step, 412 GB/s read for Q4_K). The same values (each group decoded as above).
// For rows of at least kThreads groups (2,048 values): narrower ones would idle most threads.
// KILN_CUDA_DEQUANT_ROWS=1 turns it on (off by default until measured on a GPU).
template <class D, typename Out>
__global__ void __launch_bounds__(kThreads)
    dequant_row_ctas_kernel(const uint8_t* __restrict__ data, uint64_t row_bytes, int64_t row0,
                            const int32_t* row_ids, int64_t n_rows, int64_t n_in,
                            Out* __restrict__ out, bool vec) {
  constexpr bool kPlain =
      D::kType == quant::Type::F32 || D::kType == quant::Type::F16 || D::kType == quant::Type::BF16;
  const int per_row = static_cast<int>(kPlain ? n_in : n_in / 8);  // work items per row
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const int64_t src_row = row_ids != nullptr ? row_ids[r] : row0 + r;
    const uint8_t* row = data + static_cast<uint64_t>(src_row) * row_bytes;
    Out* o = out + r * n_in;
#pragma unroll 2
    for (int g = threadIdx.x; g < per_row; g += kThreads) {
      if constexpr (kPlain) {
        store1(o + g, D::elem(row, g));
      } else {
        const int e = 8 * g;
        float v[8];
        D::template dec8<2, true>(row + (e / D::kElems) * D::kBytes, (e % D::kElems) / 8, v);
        store8(o + e, v, vec);
      }
    }
  }
}

std::atomic<bool>& row_ctas_flag() {
  static std::atomic<bool> on{env_is("KILN_CUDA_DEQUANT_ROWS", "1")};
  return on;
}

template <typename Out>
void launch_dequant(const Weight& w, int64_t row0, const int32_t* row_ids, int64_t n_rows, Out* out,
                    cudaStream_t s) {
  if (n_rows <= 0 || w.n_in <= 0) return;
  const bool vec = (reinterpret_cast<uintptr_t>(out) & 15) == 0;
  const bool plain = quant::traits(w.type).block_elems == 1;
  const bool row_ctas = row_ctas_flag().load(std::memory_order_relaxed) &&
                        (plain ? w.n_in : w.n_in / 8) >= kThreads;
  const int64_t items = n_rows * w.n_in / 8 + n_rows;
  const int blocks =
      row_ctas ? static_cast<int>(std::min<int64_t>(n_rows, 1 << 20))
               : static_cast<int>(std::min<int64_t>((items + kThreads - 1) / kThreads, 1 << 20));
  switch (w.type) {
#define KILN_DEQUANT_CASE(T)                                                        \
  case quant::Type::T:                                                              \
    if (row_ctas) {                                                                 \
      dequant_row_ctas_kernel<qb::T, Out><<<blocks, kThreads, 0, s>>>(              \
          w.data, w.row_bytes, row0, row_ids, n_rows, w.n_in, out, vec);            \
    } else {                                                                        \
      dequant_rows_kernel<qb::T, Out><<<blocks, kThreads, 0, s>>>(                  \
          w.data, w.row_bytes, row0, row_ids, n_rows, w.n_in, out, vec);            \
    }                                                                               \
    break;
    KILN_CUDA_PLAIN_TYPES(KILN_DEQUANT_CASE)
    KILN_CUDA_BLOCK_TYPES(KILN_DEQUANT_CASE)
#undef KILN_DEQUANT_CASE
    default:
      break;  // supports_type() is false: nothing is written
  }
}

}  // namespace

void dequant_set_row_ctas(bool on) { row_ctas_flag().store(on, std::memory_order_relaxed); }

bool supports_type(quant::Type t) {
  switch (t) {
#define KILN_SUPPORTED_CASE(T) case quant::Type::T:
    KILN_CUDA_PLAIN_TYPES(KILN_SUPPORTED_CASE)
    KILN_CUDA_BLOCK_TYPES(KILN_SUPPORTED_CASE)
#undef KILN_SUPPORTED_CASE
    return true;
    default:
      return false;
  }
}

void dequantize_rows_f32(const Weight& w, int64_t row0, int64_t n_rows, float* out,
                         cudaStream_t s) {
  launch_dequant(w, row0, nullptr, n_rows, out, s);
}

void dequantize_rows_f16(const Weight& w, int64_t row0, int64_t n_rows, uint16_t* out,
                         cudaStream_t s) {
  launch_dequant(w, row0, nullptr, n_rows, reinterpret_cast<__half*>(out), s);
}

void embed(const Weight& table, const int32_t* tokens, int64_t n_tokens, float* out,
           cudaStream_t s) {
  launch_dequant(table, 0, tokens, n_tokens, out, s);
}

}  // namespace kiln::backend::cuda
