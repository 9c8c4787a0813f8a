// matmul and matmul_id on CUDA. Two paths:
//
// matmul_id of up to 64 pairs (decode) on the int8 matvec's types: matvec_id (matvec.cu), a
// warp per (output row, pair), the activation rows quantized once into the context's int8
// buffer, no expert plan.
//
// Direct (n_tokens <= 8, and matmul_id on other types): the weight rows are
// read in place as stored. A CTA of 4 warps owns 4 output rows; the warps split each row into
// chunks of whole blocks (chunk c goes to warp c % 4), copy the chunk of all 4 rows into shared
// memory with cp.async (16-byte copies when the row is 16-byte aligned, as real model rows are;
// 8/4/2-byte copies otherwise), double-buffered, then each lane decodes 8 weights at a time
// (quant_blocks.cuh) and multiplies them with the fp32 activations (read through L1, reused
// across the 4 rows) in fp32 FMAs. Per-lane partial sums are reduced across the warp and the
// 4 warps in a fixed order, so a result does not depend on n_tokens or the other tokens.
// Memory-bound at 1-2 tokens; at 8 tokens the fp32 FMAs (8 per weight) bound it near half the
// memory bandwidth for the 4-bit types. F16, BF16, F32, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K have
// kernels for 4 and 8 tokens; the other types one for 8 (fewer tokens are masked).
//
// mmh (Q4_K/Q5_K/Q6_K/Q8_0 from 9 tokens up to a crossover by weight size: 128 or 16, below):
// activations rounded to fp16 once per call into the context's x16 in mmh's layout, the weights
// as stored dequantized to fp16 in registers, fp16 tensor-core MMA (mmh.cu: wgmma, sm_90 only).
// KILN_CUDA_MMH=0 sends these to mmq. matmul_shared launches its mmh weights together, one
// launch per type (mmh_shared), and a short weight of a type a long one has joins them above 16
// tokens (KILN_CUDA_MMH_GROUP=0: one launch per weight, no joining).
// mmq (Q4_0, and the mmh types without mmh, from 9 tokens up to a crossover by weight size: 64
// or 16, below): activations quantized to int8 per 32 values (or as their producer wrote them),
// int8 tensor-core MMA on the weights as stored (mmq.cu). KILN_CUDA_MMQ=0 sends these to cuBLAS
// (for comparisons). matmul_id of more than 64 pairs on these types runs mmq's grouped variant
// (mmq_id): the pairs grouped by expert into tiles of 16-64 pairs of one expert, the activation
// rows quantized once into the context's own int8 buffer (KILN_CUDA_MMQ=0: the direct kernel).
//
// cuBLAS (n_tokens > 8, and above the mmq range): activations are rounded to fp16 into scratch; F16
// weights are used in place, other types are dequantized to fp16 in chunks of rows (<= 64 MiB of
// scratch) and each chunk is one GemmEx (fp16 operands, fp32 accumulation and output) on the tensor
// cores. F32 weights stay fp32: one GemmEx in plain fp32 (no TF32), no scratch. The weights of a
// matmul_shared call on this path round x to fp16 once. A weight whose `prepared` holds its fp16
// copy (the CUDA backend makes them at load, cuda_backend.cpp add_f16_copy) is one GemmEx on it,
// no dequantization.
//
// Deterministic mode (matmul_set_deterministic): one of the paths above per weight for every
// token count, each summing a token's products in one order whatever the batch: mmh with its
// split count fixed by the weight's shape (MmqScratch::by_shape) for the types it takes, the
// direct kernels in runs of 8 tokens for the rest, matmul_id's direct kernels always (a rare
// weight the direct kernels cannot read goes to cuBLAS one token at a time: one shape, one
// algorithm). Costs: prefill on mmh instead of cuBLAS, single-token decode on mmh instead of the
// int8 matvec (docs/performance.md).
//
// Nothing here allocates or synchronises the host: the cuBLAS workspace is the context's
// (cublasSetWorkspace after every cublasSetStream, which resets it), so a call can be captured.
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kiln/backend/cuda/env.h"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/mmh.h"
#include "kiln/backend/cuda/mmq.h"
#include "kiln/backend/cuda/quant_blocks.cuh"
#include "kiln/backend/cuda/tile_common.cuh"

namespace kiln::backend::cuda {

// The default of MatmulContext::copy_min_tokens (below).
constexpr int64_t kCopyMinTokens = 64;

struct MatmulContext {
  cublasHandle_t cublas = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  __half* x16 = nullptr;  // [x16_elems]: activations rounded to fp16
  int64_t x16_elems = 0;
  __half* w16 = nullptr;  // [w16_elems]: a chunk of dequantized weight rows
  int64_t w16_elems = 0;
  int32_t* moe = nullptr;      // perm [max_pairs], num_tiles [1], tiles [3 * max_tiles]
  int8_t* xq = nullptr;        // [q8_tokens, max_n_in]: activations quantized for matvec / mmq
  float2* xds = nullptr;       // [q8_tokens, max_n_in / 32]
  int64_t q8_tokens = 0;       // kMatvecMaxTokens, or up to kMmqMaxTokens when mmq may run
  int64_t mmq_max_tokens = 0;  // the largest token count mmq takes (0: none)
  bool mmq_forced = false;     // matmul_set_mmq: mmq_max_tokens for every weight size
  MmqScratch mmq;
  int64_t mmh_max_tokens = 0;  // the largest token count mmh takes (0: none)
  bool mmh_forced = false;     // matmul_set_mmh: mmh_max_tokens for every weight size
  MmqScratch mmh;              // mmq's split-K scratch, mmh's own forced tiling
  // matmul_id's grouped mmq: int8 activations [id_rows, max_n_in rounded up to 256] and their
  // (d, sum) pairs, holding either the token rows of a gate/up call or the pair rows of a down
  // call (never live together: the down input is produced after the up call has read its
  // rows), so id_rows = max(max_tokens, max_pairs).
  int8_t* id_xq = nullptr;
  float2* id_xds = nullptr;
  int64_t id_values = 0;  // capacity of id_xq in values (rows x n_in, any split)
  int64_t mmq_id_min_pairs = kMmqIdMinPairs;
  int mmq_id_tile_pairs = 0;  // forced tile width (matmul_set_mmq_id); 0: by the shape
  int64_t max_n_in = 0;
  int64_t max_pairs = 0;
  int64_t max_experts = 0;
  int64_t max_tiles = 0;
  uint64_t device_bytes = 0;
  bool deterministic = false;  // matmul_set_deterministic
  // Steps of at least this many tokens multiply a weight's fp16 copy (Weight::prepared) with
  // cuBLAS instead of taking mmh or mmq on its quantized rows (KILN_CUDA_F16_COPY_TOKENS=N sets
  // it). 8B Q4_K_M decode, `kiln bench --parallel P -d 512`: at 64 sequences +12.7% on the H200
  // (8,994 against 7,982 tok/s), at 16 and 32 -26% and -21% on an H100 (docs/performance.md).
  int64_t copy_min_tokens = kCopyMinTokens;
};

namespace {

constexpr int kWarps = 4;         // warps per CTA of the direct kernel, splitting n_in
constexpr int kRowsPerCta = 4;    // output rows per CTA
constexpr int kDirectTokens = 8;  // the direct path's largest token count
constexpr int kThreads = 32 * kWarps;
constexpr int64_t kW16Bytes = int64_t{64} << 20;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS' advice for Hopper
// mmq's range, from the crossover measured on the H200 (docs/performance.md): 9..64 tokens for
// weights of 4096 x 4096 values or more, 9..16 for smaller ones (a 1024 x 4096 projection has
// too few 64-row tiles to fill the GPU: dequantize + cuBLAS wins from 32 tokens); dequantize +
// cuBLAS above.
constexpr int64_t kMmqDefaultTokens = 64;
constexpr int64_t kMmqSmallTokens = 16;
constexpr int64_t kMmqLargeWeight = int64_t{4096} * 4096;
// mmh's range (Q4_K, Q5_K, Q6_K, Q8_0), from CudaMatmulBench.Mmh on the H200
// (docs/performance.md): 9..128 tokens for weights of 4096 x 4096 values or more (ahead of mmq
// and cuBLAS there), 9..16 for smaller ones (a 1024 x 4096 projection has 8 row tiles of 128: mmq
// or cuBLAS win above 16).
constexpr int64_t kMmhDefaultTokens = 128;
constexpr int64_t kMmqPartialFloats = int64_t{4} << 20;  // split-K partial sums, at most
constexpr int64_t kMmqCounters = 16384;

// Blocks per chunk: whole blocks, 16-byte multiples where one block is not, ~0.5-1 KiB.
template <class D>
constexpr int chunk_blocks() {
  switch (D::kType) {
    case quant::Type::F32:
    case quant::Type::F16:
    case quant::Type::BF16:
      return 32;  // 256 elements
    case quant::Type::Q8_0:
    case quant::Type::Q8_1:
      return 16;
    case quant::Type::Q8_K:
      return 2;
    default:
      return D::kElems == 32 ? 32 : 4;
  }
}

template <class D>
constexpr bool has_token_variants() {
  switch (D::kType) {
    case quant::Type::F32:
    case quant::Type::F16:
    case quant::Type::BF16:
    case quant::Type::Q8_0:
    case quant::Type::Q4_0:
    case quant::Type::Q4_K:
    case quant::Type::Q5_K:
    case quant::Type::Q6_K:
      return true;
    default:
      return false;
  }
}

// KILN_CUDA_MMQ=0: batches of 9+ tokens go to dequantize + cuBLAS (for comparisons).
bool mmq_enabled() {
  static const bool enabled = !env_is("KILN_CUDA_MMQ", "0");
  return enabled;
}
// KILN_CUDA_MMH=0: the weights mmh takes go to mmq instead (for comparisons).
bool mmh_enabled() {
  static const bool enabled = !env_is("KILN_CUDA_MMH", "0");
  return enabled;
}

constexpr int gcd16(int b) {
  return (b % 16 == 0) ? 16 : (b % 8 == 0) ? 8 : (b % 4 == 0) ? 4 : 2;
}

struct DirectArgs {
  const uint8_t* w;
  uint64_t row_bytes;
  uint64_t expert_bytes;  // matmul_id: bytes of one expert's matrix
  int64_t n_in, n_out, n_blocks;
  const float* x;
  float* y;
  bool x_vec;    // x rows are 16-byte aligned
  int n_tokens;  // plain matmul
  // matmul_id (null for plain matmul): pair p of tile slot i is perm[tiles[3i+1] + t], t <
  // tiles[3i+2], all of expert tiles[3i]; *num_tiles slots are filled.
  const int32_t* tiles;
  const int32_t* num_tiles;
  const int32_t* perm;
  const int32_t* x_rows;
};

// cp.async into shared memory at a generic pointer (tile_common.cuh's, which take the address).
__device__ __forceinline__ uint32_t smem_addr(const uint8_t* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint8_t* dst, const uint8_t* src) {
  tile::cp_async16(smem_addr(dst), src);
}
__device__ __forceinline__ void cp_async8(uint8_t* dst, const uint8_t* src) {
  tile::cp_async8(smem_addr(dst), src);
}
__device__ __forceinline__ void cp_async4(uint8_t* dst, const uint8_t* src) {
  tile::cp_async4(smem_addr(dst), src);
}
using tile::cp_async_commit;
using tile::cp_async_wait;

// The warp copies `bytes` (even) from src (2-byte aligned) to dst (16-byte aligned shared).
__device__ __forceinline__ void warp_copy(uint8_t* dst, const uint8_t* src, int bytes, int lane) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(src) | static_cast<uintptr_t>(bytes);
  if ((a & 15) == 0) {
#pragma unroll 1
    for (int i = 16 * lane; i < bytes; i += 512) cp_async16(dst + i, src + i);
  } else if ((a & 7) == 0) {
    for (int i = 8 * lane; i < bytes; i += 256) cp_async8(dst + i, src + i);
  } else if ((a & 3) == 0) {
    for (int i = 4 * lane; i < bytes; i += 128) cp_async4(dst + i, src + i);
  } else {
    for (int i = 2 * lane; i < bytes; i += 64) {
      *reinterpret_cast<uint16_t*>(dst + i) = __ldg(reinterpret_cast<const uint16_t*>(src + i));
    }
  }
}

__device__ __forceinline__ void load_x8(const float* p, bool vec, float* v) {
  if (vec) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    for (int k = 0; k < 8; ++k) v[k] = __ldg(p + k);
  }
}

// y rows [blockIdx.x * 4, +4) for up to T tokens: one tile of matmul_id (a set of pairs of
// one expert) per blockIdx.y step, or the whole plain matmul.
template <class D, int T>
__global__ void __launch_bounds__(kThreads) direct_kernel(const DirectArgs a) {
  constexpr int kChunkBlocks = chunk_blocks<D>();
  constexpr int kChunkBytes = kChunkBlocks * D::kBytes;
  constexpr int kChunkElems = kChunkBlocks * D::kElems;
  constexpr int kGroupsPerBlock = D::kElems / 8;
  constexpr int kAlign = gcd16(D::kBytes);
  static_assert(kChunkBytes % 16 == 0 || kChunkBytes % 8 == 0, "chunk copies");
  __shared__ __align__(16) uint8_t stage[2][kWarps][kRowsPerCta][kChunkBytes];
  __shared__ float red[kWarps][kRowsPerCta][T];
  __shared__ int s_xrow[T], s_yrow[T];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = int64_t{blockIdx.x} * kRowsPerCta;
  const int64_t n_chunks = (a.n_blocks + kChunkBlocks - 1) / kChunkBlocks;
  const int num_tiles = a.tiles != nullptr ? *a.num_tiles : 1;

  for (int tile = blockIdx.y; tile < num_tiles; tile += gridDim.y) {
    const uint8_t* wbase = a.w;
    int cnt = a.n_tokens;
    if (a.tiles != nullptr) {
      wbase += static_cast<uint64_t>(a.tiles[3 * tile]) * a.expert_bytes;
      const int start = a.tiles[3 * tile + 1];
      cnt = a.tiles[3 * tile + 2];
      if (threadIdx.x < T) {
        const int p = a.perm[start + min(static_cast<int>(threadIdx.x), cnt - 1)];
        s_xrow[threadIdx.x] = a.x_rows[p];
        s_yrow[threadIdx.x] = p;
      }
    } else if (threadIdx.x < T) {
      s_xrow[threadIdx.x] = threadIdx.x;
      s_yrow[threadIdx.x] = threadIdx.x;
    }
    __syncthreads();
    const float* xp[T];
#pragma unroll
    for (int t = 0; t < T; ++t) xp[t] = a.x + int64_t{s_xrow[t]} * a.n_in;
    const uint8_t* rowp[kRowsPerCta];
#pragma unroll
    for (int r = 0; r < kRowsPerCta; ++r)
      rowp[r] =
          wbase + static_cast<uint64_t>(std::min<int64_t>(row0 + r, a.n_out - 1)) * a.row_bytes;

    float acc[kRowsPerCta][T];
#pragma unroll
    for (int r = 0; r < kRowsPerCta; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;

    auto issue = [&](int64_t c, int buf) {
      const int nb =
          static_cast<int>(std::min<int64_t>(kChunkBlocks, a.n_blocks - c * kChunkBlocks));
#pragma unroll
      for (int r = 0; r < kRowsPerCta; ++r)
        warp_copy(stage[buf][warp][r], rowp[r] + c * kChunkBytes, nb * D::kBytes, lane);
    };
    int buf = 0;
    if (warp < n_chunks) issue(warp, 0);
    cp_async_commit();
#pragma unroll 1
    for (int64_t c = warp; c < n_chunks; c += kWarps) {
      if (c + kWarps < n_chunks) issue(c + kWarps, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();  // chunk c has landed (this lane's copies)
      __syncwarp();        // ... and every lane's
      const int nb =
          static_cast<int>(std::min<int64_t>(kChunkBlocks, a.n_blocks - c * kChunkBlocks));
      const int groups = nb * kGroupsPerBlock;
      // Not unrolled: unrolling decoded several groups of 4 rows at once and spilled at 1-2
      // tokens under the 128-register cap.
#pragma unroll 1
      for (int g = lane; g < groups; g += 32) {
        const int blk = g / kGroupsPerBlock, j = g % kGroupsPerBlock;
        const int64_t col = c * kChunkElems + 8 * int64_t{g};
        float w[kRowsPerCta][8];
#pragma unroll
        for (int r = 0; r < kRowsPerCta; ++r)
          D::template dec8<kAlign, false>(stage[buf][warp][r] + blk * D::kBytes, j, w[r]);
#pragma unroll
        for (int t = 0; t < T; ++t) {
          if (t < cnt) {
            float xv[8];
            load_x8(xp[t] + col, a.x_vec, xv);
#pragma unroll
            for (int r = 0; r < kRowsPerCta; ++r)
#pragma unroll
              for (int k = 0; k < 8; ++k) acc[r][t] = fmaf(w[r][k], xv[k], acc[r][t]);
          }
        }
      }
      __syncwarp();  // the buffer is refilled two chunks later
      buf ^= 1;
    }
    cp_async_wait<0>();

#pragma unroll
    for (int r = 0; r < kRowsPerCta; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float v = acc[r][t];
#pragma unroll
        for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) red[warp][r][t] = v;
      }
    __syncthreads();
    if (threadIdx.x < kRowsPerCta * T) {
      const int r = threadIdx.x / T, t = threadIdx.x % T;
      if (t < cnt && row0 + r < a.n_out) {
        float v = red[0][r][t];
#pragma unroll
        for (int k = 1; k < kWarps; ++k) v += red[k][r][t];
        a.y[int64_t{s_yrow[t]} * a.n_out + row0 + r] = v;
      }
    }
    __syncthreads();  // red, s_xrow, s_yrow and stage are reused by the next tile
  }
}

template <class D>
void launch_direct(const DirectArgs& a, int n_tokens, dim3 grid, cudaStream_t s) {
  // 1 and 2 tokens run the 4-token kernel masked: compiled for 1 or 2 tokens, ptxas kept
  // ~230 registers live (8 warps per SM), and capped at 128 it spilled 300-450 bytes.
  if constexpr (has_token_variants<D>()) {
    if (n_tokens <= 4) {
      direct_kernel<D, 4><<<grid, kThreads, 0, s>>>(a);
      return;
    }
  }
  direct_kernel<D, kDirectTokens><<<grid, kThreads, 0, s>>>(a);
}

void dispatch_direct(quant::Type type, const DirectArgs& a, int n_tokens, dim3 grid,
                     cudaStream_t s) {
  switch (type) {
#define KILN_DIRECT_CASE(T)                     \
  case quant::Type::T:                          \
    launch_direct<qb::T>(a, n_tokens, grid, s); \
    break;
    KILN_CUDA_PLAIN_TYPES(KILN_DIRECT_CASE)
    KILN_CUDA_BLOCK_TYPES(KILN_DIRECT_CASE)
#undef KILN_DIRECT_CASE
    default:
      break;
  }
}

DirectArgs direct_args(const Weight& w, const float* x, float* y) {
  DirectArgs a{};
  const auto& tr = quant::traits(w.type);
  a.w = w.data;
  a.row_bytes = w.row_bytes;
  a.n_in = w.n_in;
  a.n_out = w.n_out;
  a.n_blocks = tr.is_quantized ? w.n_in / tr.block_elems : w.n_in / 8;
  a.x = x;
  a.y = y;
  a.x_vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0 && w.n_in % 4 == 0;
  return a;
}

// Groups the pairs by expert: perm lists the pairs of expert 0, then 1, ...; one tile per
// run of up to tile_pairs pairs of one expert (kDirectTokens for the direct kernel, the grouped
// mmq's tile width for it). One CTA; counts in shared memory.
__global__ void moe_plan_kernel(const int32_t* ids, int64_t n_pairs, int n_expert, int tile_pairs,
                                int32_t* perm, int32_t* num_tiles, int32_t* tiles) {
  extern __shared__ int counts[];  // [n_expert] counts, then [n_expert] cursors
  int* cursor = counts + n_expert;
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
    const int e = ids[p];
    if (e >= 0 && e < n_expert) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int off = 0, nt = 0;
    for (int e = 0; e < n_expert; ++e) {
      cursor[e] = off;
      for (int k = 0; k < counts[e]; k += tile_pairs, ++nt) {
        tiles[3 * nt] = e;
        tiles[3 * nt + 1] = off + k;
        tiles[3 * nt + 2] = min(tile_pairs, counts[e] - k);
      }
      off += counts[e];
    }
    *num_tiles = nt;
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
    const int e = ids[p];
    if (e >= 0 && e < n_expert) perm[atomicAdd(&cursor[e], 1)] = static_cast<int32_t>(p);
  }
}

__global__ void to_half_kernel(const float* x, __half* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = __float2half_rn(x[i]);
}

void gemm(MatmulContext* ctx, const void* a, cudaDataType_t type, int64_t lda, const void* b,
          float* c, int64_t m, int64_t n, int64_t k, int64_t ldc) {
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major y[n][ldc] = x[n][k] . W[m][k]^T is column-major C[m][n] = A^T B with A = W
  // (k x m, lda) and B = x (k x n).
  cublasGemmEx(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n),
               static_cast<int>(k), &alpha, a, type, static_cast<int>(lda), b, type,
               static_cast<int>(k), &beta, c, CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F,
               CUBLAS_GEMM_DEFAULT);
}

// The backend's fp16 copy of a quantized weight (Weight::prepared: cuda_backend.cpp
// add_f16_copy), or null.
const void* f16_copy(const Weight& w) {
  return w.n_mats <= 1 && w.type != quant::Type::F16 ? w.prepared : nullptr;
}

// x16_holds_x: the context's x16 already holds x rounded to fp16, row-major (the previous call
// of the same matmul_shared converted it). Returns whether x16 holds x afterwards (x in one
// token chunk).
bool matmul_cublas(MatmulContext* ctx, const Weight& w, const float* x, float* y, int64_t n_tokens,
                   cudaStream_t s, bool x16_holds_x = false) {
  cublasSetStream(ctx->cublas, s);
  cublasSetWorkspace(ctx->cublas, ctx->workspace, ctx->workspace_bytes);
  const int64_t n_in = w.n_in, n_out = w.n_out;
  if (w.type == quant::Type::F32) {  // plain fp32 (the handle's default math mode: no TF32)
    gemm(ctx, w.data, CUDA_R_32F, n_in, x, y, n_out, n_tokens, n_in, n_out);
    return x16_holds_x;
  }
  // Token chunks that fit the fp16 activation scratch (one chunk when within max_tokens).
  const int64_t tok_chunk = std::max<int64_t>(1, ctx->x16_elems / n_in);
  const int64_t row_chunk = n_out <= ctx->w16_elems / n_in
                                ? n_out
                                : std::max<int64_t>(1, ctx->w16_elems / n_in / 64 * 64);
  for (int64_t t0 = 0; t0 < n_tokens; t0 += tok_chunk) {
    const int64_t nt = std::min(tok_chunk, n_tokens - t0);
    const int64_t n = nt * n_in;
    if (!(x16_holds_x && nt == n_tokens)) {
      to_half_kernel<<<static_cast<int>(std::min<int64_t>((n + 255) / 256, 1 << 16)), 256, 0, s>>>(
          x + t0 * n_in, ctx->x16, n);
    }
    // F16 rows in place, or the backend's fp16 copy of a quantized weight (Weight::prepared).
    const void* whole = w.type == quant::Type::F16 ? w.data : f16_copy(w);
    if (whole != nullptr) {
      gemm(ctx, whole, CUDA_R_16F, n_in, ctx->x16, y + t0 * n_out, n_out, nt, n_in, n_out);
      continue;
    }
    for (int64_t r0 = 0; r0 < n_out; r0 += row_chunk) {
      const int64_t nr = std::min(row_chunk, n_out - r0);
      dequantize_rows_f16(w, r0, nr, reinterpret_cast<uint16_t*>(ctx->w16), s);
      gemm(ctx, ctx->w16, CUDA_R_16F, n_in, ctx->x16, y + t0 * n_out + r0, nr, nt, n_in, n_out);
    }
  }
  return n_tokens <= tok_chunk;
}

}  // namespace

MatmulContext* create_matmul_context(int64_t max_tokens, int64_t max_n_in, int64_t max_n_out,
                                     int64_t max_pairs, int64_t max_experts) {
  auto* ctx = new MatmulContext();
  bool ok = cublasCreate(&ctx->cublas) == CUBLAS_STATUS_SUCCESS;
  auto alloc = [&](void** p, size_t bytes) {
    if (ok && bytes > 0) {
      ok = cudaMalloc(p, bytes) == cudaSuccess;
      if (ok) ctx->device_bytes += bytes;
    }
  };
  ctx->max_n_in = max_n_in;
  ctx->workspace_bytes = kWorkspaceBytes;
  alloc(&ctx->workspace, ctx->workspace_bytes);
  // Rounded up to 8 tokens: mmh's activations come in groups of 8 (mmh.h).
  ctx->x16_elems = (std::max<int64_t>(1, max_tokens) + 7) / 8 * 8 * std::max<int64_t>(1, max_n_in);
  alloc(reinterpret_cast<void**>(&ctx->x16), static_cast<size_t>(ctx->x16_elems) * 2);
  ctx->w16_elems = std::max<int64_t>(std::min<int64_t>(kW16Bytes / 2, max_n_in * max_n_out),
                                     std::max<int64_t>(1, max_n_in));
  alloc(reinterpret_cast<void**>(&ctx->w16), static_cast<size_t>(ctx->w16_elems) * 2);
  const int64_t q_in = (std::max<int64_t>(1, max_n_in) + 255) / 256 * 256;
  ctx->mmq_max_tokens = mmq_enabled() ? kMmqDefaultTokens : 0;
  if (const char* e = std::getenv("KILN_CUDA_F16_COPY_TOKENS"); e != nullptr && *e != '\0')
    ctx->copy_min_tokens = std::max<int64_t>(kMatvecMaxTokens + 1, std::atoll(e));
  // The int8 activations hold up to kMmqMaxTokens rows (when mmq is on), so that a benchmark or
  // test can move the crossover (matmul_set_mmq).
  ctx->q8_tokens = std::max<int64_t>(
      kMatvecMaxTokens, std::min(max_tokens, mmq_enabled() ? int64_t{kMmqMaxTokens} : 0));
  alloc(reinterpret_cast<void**>(&ctx->xq), static_cast<size_t>(ctx->q8_tokens * q_in));
  alloc(reinterpret_cast<void**>(&ctx->xds),
        static_cast<size_t>(ctx->q8_tokens * q_in / 32) * sizeof(float2));
  ctx->mmh_max_tokens = mmh_enabled() ? std::min(kMmhDefaultTokens, max_tokens) : 0;
  if (ctx->q8_tokens > kMatvecMaxTokens || ctx->mmh_max_tokens > kMatvecMaxTokens) {
    const int64_t split_tokens = std::max(ctx->q8_tokens, ctx->mmh_max_tokens);
    ctx->mmq.partial_floats =
        std::min(kMmqPartialFloats, 4 * split_tokens * std::max<int64_t>(1, max_n_out));
    alloc(reinterpret_cast<void**>(&ctx->mmq.partials),
          static_cast<size_t>(ctx->mmq.partial_floats) * sizeof(float));
    ctx->mmq.n_counters = kMmqCounters;
    alloc(reinterpret_cast<void**>(&ctx->mmq.counters),
          static_cast<size_t>(kMmqCounters) * sizeof(int32_t));
    if (ok) ok = cudaMemset(ctx->mmq.counters, 0, kMmqCounters * sizeof(int32_t)) == cudaSuccess;
    ctx->mmh = ctx->mmq;
  }
  if (max_pairs > 0) {
    ctx->max_pairs = max_pairs;
    ctx->max_experts = max_experts;
    ctx->max_tiles = (max_pairs + kDirectTokens - 1) / kDirectTokens +
                     std::min(max_pairs, std::max<int64_t>(1, max_experts));
    alloc(reinterpret_cast<void**>(&ctx->moe),
          static_cast<size_t>(max_pairs + 1 + 3 * ctx->max_tiles) * sizeof(int32_t));
    if (mmq_enabled()) {
      ctx->id_values = std::max(std::max<int64_t>(1, max_tokens), max_pairs) * q_in;
      alloc(reinterpret_cast<void**>(&ctx->id_xq), static_cast<size_t>(ctx->id_values));
      alloc(reinterpret_cast<void**>(&ctx->id_xds),
            static_cast<size_t>(ctx->id_values / 32) * sizeof(float2));
    }
  }
  if (!ok) {
    destroy_matmul_context(ctx);
    return nullptr;
  }
  return ctx;
}

void destroy_matmul_context(MatmulContext* ctx) {
  if (ctx == nullptr) return;
  if (ctx->cublas != nullptr) cublasDestroy(ctx->cublas);
  cudaFree(ctx->workspace);
  cudaFree(ctx->x16);
  cudaFree(ctx->w16);
  cudaFree(ctx->moe);
  cudaFree(ctx->xq);
  cudaFree(ctx->xds);
  cudaFree(ctx->mmq.partials);
  cudaFree(ctx->mmq.counters);
  cudaFree(ctx->id_xq);
  cudaFree(ctx->id_xds);
  delete ctx;
}

uint64_t matmul_context_bytes(const MatmulContext* ctx) {
  return ctx != nullptr ? ctx->device_bytes : 0;
}

namespace {

// KILN_CUDA_MATVEC=0 sends small batches to the fp32 direct kernels instead (for comparisons).
bool matvec_enabled() {
  static const bool enabled = !env_is("KILN_CUDA_MATVEC", "0");
  return enabled;
}

bool use_matvec(const MatmulContext* ctx, const Weight& w, int64_t n_tokens) {
  return matvec_enabled() && n_tokens <= kMatvecMaxTokens && w.n_in <= ctx->max_n_in &&
         matvec_supports(w);
}

// The grouped mmq for matmul_id above mmq_id_min_pairs pairs (kMmqIdMinPairs = 64 by default):
// up to 64 pairs (a decode step of up to 8 sequences at top-8 routing) each chosen expert has
// about one pair, every path reads each chosen expert's weights once, and the direct kernel
// does so in exact fp32 arithmetic; with more pairs the direct kernel re-reads an expert's
// weights per 8 of its pairs on the FP32 pipe while mmq reads them once per 16-64 on the tensor
// cores. (Not measured at the boundary: matmul_set_mmq_id moves it.)
bool use_mmq_id(const MatmulContext* ctx, const Weight& w, int64_t n_x_rows, int64_t n_pairs,
                int64_t tile_slots) {
  return ctx->id_xq != nullptr && n_pairs > ctx->mmq_id_min_pairs && mmq_supports(w) &&
         n_x_rows * w.n_in <= ctx->id_values && tile_slots <= 65535;
}

// Tile slots for n_pairs in tiles of up to tile_pairs pairs of one expert: at most one
// part-filled run per expert with pairs, the rest full.
int64_t moe_tile_slots(int64_t n_pairs, int64_t n_expert, int tile_pairs) {
  return (n_pairs + tile_pairs - 1) / tile_pairs + std::min(n_pairs, n_expert);
}

// Whether mmh can take w at all (the token range, the context's scratch, the type).
constexpr int kMaxShared = 16;  // matmul_shared's weights handled at once

// Whether a step of n_tokens multiplies w's fp16 copy on cuBLAS rather than its quantized rows
// on mmh or mmq (MatmulContext::copy_min_tokens).
bool use_copy(const MatmulContext* ctx, const Weight& w, int64_t n_tokens) {
  return n_tokens >= ctx->copy_min_tokens && f16_copy(w) != nullptr;
}

bool mmh_fits(const MatmulContext* ctx, const Weight& w, int64_t n_tokens) {
  return n_tokens > kMatvecMaxTokens && n_tokens <= ctx->mmh_max_tokens &&
         !use_copy(ctx, w, n_tokens) &&
         (n_tokens + 7) / 8 * 8 * w.n_in <= ctx->x16_elems && w.n_in <= ctx->max_n_in &&
         mmh_supports(w);
}

bool use_mmh(const MatmulContext* ctx, const Weight& w, int64_t n_tokens) {
  if (!mmh_fits(ctx, w, n_tokens)) return false;
  return ctx->mmh_forced || n_tokens <= kMmqSmallTokens || w.n_in * w.n_out >= kMmqLargeWeight;
}

// KILN_CUDA_MMH_GROUP=0: each weight mmh takes gets its own launch, and short weights never
// join a long one's (for comparisons).
bool mmh_group_enabled() {
  static const bool enabled = !env_is("KILN_CUDA_MMH_GROUP", "0");
  return enabled;
}

// The weights sharing x that go to mmh, launched together by type (mmh_shared): those use_mmh
// sends to it, and the short ones mmh can take of a type a long one has (the k projection
// beside q, 1,024 x 4,096 beside 4,096 x 4,096: alone it is faster on dequantize + cuBLAS above
// 16 tokens, but in q's launch its CTAs take the SMs q's tiles leave idle). take[i] says which;
// returns their count.
int mmh_members(const MatmulContext* ctx, const Weight* const* ws, int n_w, int64_t n_tokens,
                bool* take) {
  int n = 0;
  for (int i = 0; i < n_w; ++i) {
    take[i] = ws[i]->n_out > 0 && supports_type(ws[i]->type) && use_mmh(ctx, *ws[i], n_tokens);
    n += take[i];
  }
  if (!mmh_group_enabled()) return n;
  for (int i = 0; i < n_w; ++i) {
    if (take[i] || ws[i]->n_out <= 0 || !mmh_fits(ctx, *ws[i], n_tokens)) continue;
    for (int j = 0; j < n_w; ++j)
      if (take[j] && ws[j]->type == ws[i]->type && ws[j]->n_in == ws[i]->n_in) {
        take[i] = true;
        ++n;
        break;
      }
  }
  return n;
}

bool use_mmq(const MatmulContext* ctx, const Weight& w, int64_t n_tokens) {
  if (n_tokens <= kMatvecMaxTokens || n_tokens > ctx->mmq_max_tokens || n_tokens > ctx->q8_tokens ||
      w.n_in > ctx->max_n_in || !mmq_supports(w) || use_copy(ctx, w, n_tokens))
    return false;
  return ctx->mmq_forced || n_tokens <= kMmqSmallTokens || w.n_in * w.n_out >= kMmqLargeWeight;
}

// Whether the direct kernels read w's rows in place.
bool direct_shape(const Weight& w) {
  return w.n_in % 8 == 0 && (reinterpret_cast<uintptr_t>(w.data) & 1) == 0;
}

// y = w x for up to kDirectTokens tokens on the direct kernels (w of direct_shape).
void direct(const Weight& w, const float* x, float* y, int64_t n_tokens, cudaStream_t s) {
  DirectArgs a = direct_args(w, x, y);
  a.n_tokens = static_cast<int>(n_tokens);
  const dim3 grid(static_cast<unsigned>((w.n_out + kRowsPerCta - 1) / kRowsPerCta), 1);
  dispatch_direct(w.type, a, static_cast<int>(n_tokens), grid, s);
}

// The weights marked on_mmh (at least one) on mmh: x rounded into x16 once, then one mmh_shared
// launch per type (grouped) or per weight.
void launch_mmh(MatmulContext* ctx, const Weight* const* ws, float* const* ys, int n_w,
                const bool* on_mmh, const float* x, int64_t n_tokens, bool grouped,
                const MmqScratch& scratch, cudaStream_t s) {
  int first = 0;
  while (!on_mmh[first]) ++first;
  mmh_prepare(x, n_tokens, ws[first]->n_in, ctx->x16, s);
  bool launched[kMaxShared] = {};
  for (int i = first; i < n_w; ++i) {
    if (!on_mmh[i] || launched[i]) continue;
    const Weight* gw[kMaxShared];
    float* gy[kMaxShared];
    int n = 0;
    for (int j = i; j < n_w && (grouped || n == 0); ++j)
      if (on_mmh[j] && !launched[j] && ws[j]->type == ws[i]->type) {
        gw[n] = ws[j];
        gy[n++] = ys[j];
        launched[j] = true;
      }
    mmh_shared(gw, gy, n, ctx->x16, n_tokens, scratch, s);
  }
}

// The deterministic mode's paths (matmul.cu's top comment): the same for a weight whatever
// n_tokens (runs of the tokens x16 holds, so that the choice does not depend on it).
void matmul_deterministic(MatmulContext* ctx, const Weight* const* ws, float* const* ys, int n_w,
                          const float* x, int64_t n_tokens, cudaStream_t s) {
  const int64_t n_in = ws[0]->n_in;
  const int64_t run = ctx->x16_elems / std::max<int64_t>(1, ctx->max_n_in) / 8 * 8;
  if (n_tokens > run && run > 0) {
    for (int64_t t0 = 0; t0 < n_tokens; t0 += run) {
      float* ry[kMaxShared];
      for (int i = 0; i < n_w; ++i) ry[i] = ys[i] + t0 * ws[i]->n_out;
      matmul_deterministic(ctx, ws, ry, n_w, x + t0 * n_in, std::min(run, n_tokens - t0), s);
    }
    return;
  }
  bool on_mmh[kMaxShared] = {};
  bool any_mmh = false;
  for (int i = 0; i < n_w; ++i) {
    on_mmh[i] = ws[i]->n_out > 0 && supports_type(ws[i]->type) && ws[i]->n_in <= ctx->max_n_in &&
                run > 0 && mmh_supports(*ws[i]);
    any_mmh = any_mmh || on_mmh[i];
  }
  if (any_mmh) {
    MmqScratch sc = ctx->mmh;
    sc.by_shape = true;
    sc.tile_tokens = 0;
    sc.splits = 0;
    launch_mmh(ctx, ws, ys, n_w, on_mmh, x, n_tokens, true, sc, s);
  }
  for (int i = 0; i < n_w; ++i) {
    const Weight& w = *ws[i];
    if (on_mmh[i] || w.n_out <= 0 || !supports_type(w.type)) continue;
    const int64_t step = direct_shape(w) ? kDirectTokens : 1;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += step) {
      if (step > 1) {
        direct(w, x + t0 * n_in, ys[i] + t0 * w.n_out, std::min(step, n_tokens - t0), s);
      } else if (w.n_in <= ctx->max_n_in) {
        matmul_cublas(ctx, w, x + t0 * n_in, ys[i] + t0 * w.n_out, 1, s);
      }
    }
  }
}

}  // namespace

void matmul_set_deterministic(MatmulContext* ctx, bool on) {
  ctx->deterministic = on;
}

void matmul(MatmulContext* ctx, const Weight& w, const float* x, float* y, int64_t n_tokens,
            cudaStream_t s) {
  float* ys[1] = {y};
  const Weight* ws[1] = {&w};
  matmul_shared(ctx, ws, ys, 1, x, n_tokens, s);
}

bool matmul_shared(MatmulContext* ctx, const Weight* const* ws, float* const* ys, int n_w,
                   const float* x, int64_t n_tokens, cudaStream_t s, bool x_quantized) {
  if (n_w > kMaxShared) {  // in runs of kMaxShared (the same results: each weight's own)
    for (int i = 0; i < n_w; i += kMaxShared)
      x_quantized = matmul_shared(ctx, ws + i, ys + i, std::min(kMaxShared, n_w - i), x, n_tokens,
                                  s, x_quantized);
    return x_quantized;
  }
  if (ctx->deterministic) {
    if (n_tokens > 0) matmul_deterministic(ctx, ws, ys, n_w, x, n_tokens, s);
    return false;
  }
  bool quantized = x_quantized && n_tokens <= ctx->q8_tokens;
  // Decode-sized products the matvec kernels take are launched together after the loop: one
  // launch per weight type for the weights sharing x.
  const Weight* mq[8];
  float* yq[8];
  const Weight* mh[8];
  float* yh[8];
  int n_q = 0, n_h = 0;
  // mmh's weights first, one launch per type (mmh_shared), before anything else takes x16 (it
  // leaves x there in its own layout); then x16 holds x for cuBLAS from the first such weight
  // on.
  bool on_mmh[kMaxShared] = {};
  if (n_tokens > kMatvecMaxTokens && mmh_members(ctx, ws, n_w, n_tokens, on_mmh) > 0)
    launch_mmh(ctx, ws, ys, n_w, on_mmh, x, n_tokens, mmh_group_enabled(), ctx->mmh, s);
  bool x16_holds_x = false;
  for (int i = 0; i < n_w; ++i) {
    const Weight& w = *ws[i];
    float* y = ys[i];
    if (n_tokens <= 0 || w.n_out <= 0 || !supports_type(w.type)) continue;
    if (use_matvec(ctx, w, n_tokens) && n_q < 8) {
      mq[n_q] = &w;
      yq[n_q++] = y;
      continue;
    }
    if (n_tokens <= kMatvecMaxTokens && matvec_enabled() && matvec_half_supports(w, x) && n_h < 8) {
      mh[n_h] = &w;
      yh[n_h++] = y;
      continue;
    }
    if (on_mmh[i]) continue;
    if (use_mmq(ctx, w, n_tokens)) {
      if (!quantized) quantize_q8_32(x, n_tokens, w.n_in, ctx->xq, ctx->xds, s);
      quantized = true;
      mmq(w, y, ctx->xq, ctx->xds, n_tokens, ctx->mmq, s);
      continue;
    }
    if (n_tokens <= kDirectTokens && direct_shape(w)) {
      direct(w, x, y, n_tokens, s);
      continue;
    }
    if (w.n_in > ctx->max_n_in) continue;  // outside the context's bounds: scratch too small
    x16_holds_x = matmul_cublas(ctx, w, x, y, n_tokens, s, x16_holds_x);
  }
  if (n_q > 0) {
    if (!quantized) quantize_q8_32(x, n_tokens, mq[0]->n_in, ctx->xq, ctx->xds, s);
    quantized = true;
    matvec_q8(mq, yq, n_q, ctx->xq, ctx->xds, n_tokens, s);
  }
  if (n_h > 0) matvec_half(mh, yh, n_h, x, n_tokens, s);
  return quantized;
}

void matmul_set_mmq(MatmulContext* ctx, int64_t max_tokens, int tile_tokens, int splits) {
  ctx->mmq_max_tokens = std::min(max_tokens, ctx->q8_tokens);
  ctx->mmq_forced = true;
  ctx->mmq.tile_tokens = tile_tokens;
  ctx->mmq.splits = splits;
}

void matmul_set_mmh(MatmulContext* ctx, int64_t max_tokens, int tile_tokens, int splits) {
  ctx->mmh_max_tokens = max_tokens;
  ctx->mmh_forced = true;
  ctx->mmh.tile_tokens = tile_tokens;
  ctx->mmh.splits = splits;
}

MatmulQ8 matmul_id_q8(MatmulContext* ctx, int64_t n_rows, int64_t n_in) {
  MatmulQ8 q;
  if (ctx->id_xq == nullptr || n_rows * n_in > ctx->id_values) return q;
  q.xq = ctx->id_xq;
  q.xds = ctx->id_xds;
  q.max_tokens = n_rows;
  q.max_cols = n_in;
  return q;
}

MatmulQ8 matmul_q8(MatmulContext* ctx) {
  MatmulQ8 q;
  q.xq = ctx->xq;
  q.xds = ctx->xds;
  q.max_tokens = std::max<int64_t>(kMatvecMaxTokens, std::min(ctx->q8_tokens, ctx->mmq_max_tokens));
  q.max_cols = (std::max<int64_t>(1, ctx->max_n_in) + 255) / 256 * 256;
  return q;
}

void matmul_set_mmq_id(MatmulContext* ctx, int64_t min_pairs, int tile_pairs) {
  ctx->mmq_id_min_pairs = min_pairs;
  ctx->mmq_id_tile_pairs = tile_pairs;
}

namespace {
int id_tile_pairs(const MatmulContext* ctx, int64_t n_pairs, int64_t n_expert) {
  return ctx->mmq_id_tile_pairs > 0 ? std::min(ctx->mmq_id_tile_pairs, 64)
                                    : mmq_id_tile_pairs(n_pairs, n_expert);
}
}  // namespace

bool matmul_id_few(const MatmulContext* ctx, const Weight& stacked, int64_t n_expert,
                   int64_t n_x_rows, int64_t n_pairs) {
  if (ctx->deterministic || n_pairs <= 0 || n_pairs > ctx->max_pairs ||
      n_expert > ctx->max_experts || stacked.n_in % 8 != 0 || !supports_type(stacked.type))
    return false;
  const int mmq_pairs = id_tile_pairs(ctx, n_pairs, n_expert);
  const bool grouped =
      use_mmq_id(ctx, stacked, n_x_rows, n_pairs, moe_tile_slots(n_pairs, n_expert, mmq_pairs));
  return !grouped && n_pairs <= kMmqIdMinPairs && ctx->id_xq != nullptr &&
         matvec_supports(stacked) && n_x_rows * stacked.n_in <= ctx->id_values;
}

bool matmul_id(MatmulContext* ctx, const Weight& stacked, int64_t n_expert, const float* x,
               int64_t n_x_rows, const int32_t* x_rows, const int32_t* ids, float* y,
               int64_t n_pairs, cudaStream_t s, bool x_quantized, const int8_t* xq_given,
               const float2* xds_given) {
  if (n_pairs <= 0 || stacked.n_out <= 0 || !supports_type(stacked.type)) return x_quantized;
  if (n_pairs > ctx->max_pairs || n_expert > ctx->max_experts || stacked.n_in % 8 != 0)
    return x_quantized;
  int32_t* perm = ctx->moe;
  int32_t* num_tiles = perm + ctx->max_pairs;
  int32_t* tiles = num_tiles + 1;
  const int mmq_pairs = id_tile_pairs(ctx, n_pairs, n_expert);
  // The deterministic mode: the direct kernels for every pair count (x as fp32).
  const bool grouped =
      !ctx->deterministic &&
      use_mmq_id(ctx, stacked, n_x_rows, n_pairs, moe_tile_slots(n_pairs, n_expert, mmq_pairs));
  if (ctx->deterministic) x_quantized = false;
  // A decode step's few pairs: the int8 matvec per (output row, pair), with no plan.
  const bool few = matmul_id_few(ctx, stacked, n_expert, n_x_rows, n_pairs);
  // Both int8 paths read x quantized: rows the caller gives, or the context's rows (quantized
  // once for gate and up).
  const int8_t* xq = xq_given != nullptr ? xq_given : ctx->id_xq;
  const float2* xds = xq_given != nullptr ? xds_given : ctx->id_xds;
  if ((grouped || few) && !x_quantized && xq_given == nullptr) {
    quantize_q8_32(x, n_x_rows, stacked.n_in, ctx->id_xq, ctx->id_xds, s);
    x_quantized = true;
  }
  if (few && matvec_id(stacked, n_expert, xq, xds, x_rows, ids, y, n_pairs, s)) return true;
  const int tile_pairs = grouped ? mmq_pairs : kDirectTokens;
  const int64_t tile_slots = moe_tile_slots(n_pairs, n_expert, tile_pairs);
  moe_plan_kernel<<<1, 1024, 2 * static_cast<size_t>(n_expert) * sizeof(int), s>>>(
      ids, n_pairs, static_cast<int>(n_expert), tile_pairs, perm, num_tiles, tiles);
  if (grouped) {
    MmqIdTiles t;
    t.tiles = tiles;
    t.num_tiles = num_tiles;
    t.perm = perm;
    t.x_rows = x_rows;
    t.tile_slots = tile_slots;
    t.tile_pairs = tile_pairs;
    mmq_id(stacked, y, xq, xds, t, s);
    return true;
  }
  DirectArgs a = direct_args(stacked, x, y);
  a.expert_bytes = static_cast<uint64_t>(stacked.n_out) * stacked.row_bytes;
  a.tiles = tiles;
  a.num_tiles = num_tiles;
  a.perm = perm;
  a.x_rows = x_rows;
  const dim3 grid(static_cast<unsigned>((stacked.n_out + kRowsPerCta - 1) / kRowsPerCta),
                  static_cast<unsigned>(std::min<int64_t>(tile_slots, 65535)));
  dispatch_direct(stacked.type, a, kDirectTokens, grid, s);
  return x_quantized;
}

}  // namespace kiln::backend::cuda
