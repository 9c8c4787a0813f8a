// The paged KV cache (kv_write, kv_read) and paged attention on CUDA (kernels.h),
// checked against cpu::kv_write and cpu::attention_reference by
// tests/unit/cuda/attention_test.cpp.
//
// Both attention kernels do fp32 math with an online softmax (Milakov & Gimelshein 2018),
// handle GQA by giving one CTA up to 8 query heads of one kv head (so each K/V element read
// serves all of them), and are correct for any batch, decode and prefill rows mixed:
//  - decode: one CTA per (query row, kv head, head chunk, context split). It walks its share
//    of the row's context in chunks of 32 keys: K and V of the chunk are dequantized into
//    shared memory as fp32, one thread per (head, key) computes a score, one warp per head
//    updates the softmax (a lane per key), and the threads that own (head, 4 dims) of the
//    output accumulate P.V. Split-K (Flash-Decoding): when the grid would be small, the
//    context is split over several CTAs that write partial (m, l, acc) to the workspace,
//    and the last of them to finish (a counter per row and head chunk) merges them. The
//    split count depends only on host values.
//  - prefill: one CTA per (sequence, tile of query rows, kv head, head chunk); a tile is up
//    to 64 (32 for head dims over 128) rows of (token, head), so it covers 64 / group tokens.
//    Scores and P.V are register-tiled (4 rows x 4 keys / 4 rows x 4 float4 per thread) from
//    shared memory; keys run from the tile's first visible position to its last query
//    position (causal skipping, sliding window) in chunks of 32.
// Not causal (AttnParams::causal false, an encoder): a row's last visible key is its
// sequence's last, kv_len - 1, instead of its own position; both kernels take it.
// Nothing here allocates or synchronises: the launch shape depends on n_tokens, max_q_len,
// num_seqs, the head counts and the workspace size only (all host values).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kiln/backend/cuda/attention_impl.h"
#include "kiln/backend/cuda/device.h"
#include "kiln/backend/cuda/env.h"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/pdl.cuh"
#include "kiln/backend/cuda/q8_group.cuh"
#include "kiln/backend/cuda/rope.cuh"
#include "kiln/backend/cuda/row_norm.cuh"
#include "kiln/quant/fp16.h"

// kiln/util/status.h pulls in fmt, which nvcc's host pass does not compile; the same
// always-on invariant check as its KILN_ASSERT.
#define KILN_CUDA_ASSERT(cond)                                                                  \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "kiln: assertion failed: %s at %s:%d\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)

namespace kiln::backend::cuda {
namespace {

enum class KvT { F32, F16, Q8 };

constexpr int kThreads = 128;        // every kernel here
constexpr int kChunk = 32;           // keys per shared-memory chunk: one per lane in the softmax
constexpr int kHeadChunk = 8;        // query heads of one kv head per CTA
constexpr int kMaxSplits = 64;       // context splits of one decode row (a multiple of 32)
constexpr int kMinSplitBlocks = 4;   // KV blocks a split takes at least
constexpr int kMaxSplitRows = 1024;  // n_splits * n_tokens the workspace holds
constexpr int kPrefetchBlocks = 8;   // KV blocks a decode CTA asks into L2 before its wait
constexpr int kMaxHeadDim = 256;     // check_layer's bound
// The deterministic mode (AttnParams::deterministic): every row's context in at most kDetSplits
// splits of at least kDetSplitBlocks KV blocks (a rule of the row's own length), over runs of
// kDetSplitRows / kDetSplits rows.
constexpr int kDetSplits = 16;
constexpr int kDetSplitBlocks = 16;
constexpr int kDetSplitRows = 4096;

// ---- fp16 and Q8_0 conversion, bit-exact with the CPU's quant:: functions ------------------

// quant::fp32_to_fp16: round to nearest even, overflow to inf, NaN payload kept.
__device__ __forceinline__ uint16_t fp32_to_fp16_bits(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) {  // NaN
    uint32_t payload = (ax >> 13) & 0x3ffu;
    if (payload == 0) payload = 0x200;
    return static_cast<uint16_t>(sign | 0x7c00u | payload);
  }
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (ax >= 0x38800000u) {  // normal f16
    const uint32_t exp16 = (ax >> 23) - (127 - 15);
    const uint32_t mant = ax & 0x7fffffu;
    uint32_t h = (exp16 << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);
  const uint32_t exp32 = ax >> 23;  // subnormal f16: 102..112
  const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exp32;
  uint32_t h = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

__device__ __forceinline__ float fp16_bits_to_fp32(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xffffu)));
}

// quant::detail::scale_to_fp16: NaN -> 0, clamped to the largest finite f16.
__device__ __forceinline__ uint16_t scale_to_fp16_bits(float d) {
  if (isnan(d)) return 0;
  return fp32_to_fp16_bits(fminf(fmaxf(d, -65504.0f), 65504.0f));
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
// Every lane ends with the same bits: each butterfly step adds the same pair in either order.
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// ---- the cache as the kernels see it ------------------------------------------------------

struct Cache {  // K or V of one layer
  uint8_t* data;
  int64_t block_bytes;  // all kv heads
  int64_t head_bytes;   // one kv head's part of a block
  int32_t dim;
};

struct Batch {
  const int32_t* qo;
  const int32_t* kv_ptr;
  const int32_t* kv_idx;
  const int32_t* pos;
  const int32_t* kv_len;  // [num_seqs]: keys of the sequence after this step's write
  int32_t num_seqs;
};

// The sequence s with qo[s] <= t < qo[s + 1] (empty sequences are never returned).
__device__ __forceinline__ int seq_of_token(const int32_t* qo, int num_seqs, int t) {
  int lo = 0, hi = num_seqs;  // qo[lo] <= t < qo[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (qo[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Eight consecutive elements of one cached row, as loaded: F32 a, b = 8 floats; F16 a = 8
// halves; Q8_0 a.x, a.y = 8 int8 levels and b.x = the f16 scale of their group of 32.
struct Raw8 {
  uint4 a, b;
};

// Elements e..e+7 of token j of one kv head's part of a block (head).
template <KvT T>
__device__ __forceinline__ Raw8 load8(const uint8_t* head, int dim, int block_tokens, int j,
                                      int e) {
  Raw8 r{};
  if constexpr (T == KvT::F32) {
    const uint4* p = reinterpret_cast<const uint4*>(head + (int64_t{j} * dim + e) * 4);
    r.a = __ldg(p);
    r.b = __ldg(p + 1);
  } else if constexpr (T == KvT::F16) {
    r.a = __ldg(reinterpret_cast<const uint4*>(head + (int64_t{j} * dim + e) * 2));
  } else {
    const uint2 q = __ldg(reinterpret_cast<const uint2*>(head + int64_t{j} * dim + e));
    r.a.x = q.x;
    r.a.y = q.y;
    r.b.x = __ldg(reinterpret_cast<const unsigned short*>(head + int64_t{block_tokens} * dim +
                                                          (int64_t{j} * (dim / 32) + e / 32) * 2));
  }
  return r;
}

template <KvT T>
__device__ __forceinline__ void unpack8(const Raw8& r, float x[8]) {
  if constexpr (T == KvT::F32) {
    x[0] = __uint_as_float(r.a.x), x[1] = __uint_as_float(r.a.y);
    x[2] = __uint_as_float(r.a.z), x[3] = __uint_as_float(r.a.w);
    x[4] = __uint_as_float(r.b.x), x[5] = __uint_as_float(r.b.y);
    x[6] = __uint_as_float(r.b.z), x[7] = __uint_as_float(r.b.w);
  } else if constexpr (T == KvT::F16) {
    const uint32_t w[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = fp16_bits_to_fp32(w[i]);
      x[2 * i + 1] = fp16_bits_to_fp32(w[i] >> 16);
    }
  } else {  // as quant's dequant_q8_0: float(q) * float(d)
    const float d = fp16_bits_to_fp32(r.b.x);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[i] = static_cast<float>(static_cast<int8_t>((r.a.x >> (8 * i)) & 0xffu)) * d;
      x[4 + i] = static_cast<float>(static_cast<int8_t>((r.a.y >> (8 * i)) & 0xffu)) * d;
    }
  }
}

// Registers that hold one chunk of one of K or V as loaded (kChunk rows of up to kDimMax).
template <int kDimMax>
constexpr int chunk_iters() {
  return (kChunk * kDimMax / 8 + kThreads - 1) / kThreads;
}

// Issues the loads of keys [c0, c0 + kChunk) of kv head kvh of one sequence (blocks: its block
// table) into raw; keys outside [kbeg, kend) are zero and are never read from the cache.
template <KvT T, int kDimMax>
__device__ __forceinline__ void load_chunk_raw(Raw8 (&raw)[chunk_iters<kDimMax>()], const Cache& c,
                                               int kvh, int block_tokens, const int32_t* blocks,
                                               int c0, int kbeg, int kend) {
  const int units_per_row = c.dim / 8;
  const int units = kChunk * units_per_row;
#pragma unroll
  for (int i = 0; i < chunk_iters<kDimMax>(); ++i) {
    const int u = threadIdx.x + i * kThreads;
    const int j = u / units_per_row;
    const int e = (u - j * units_per_row) * 8;
    const int p = c0 + j;
    raw[i] = Raw8{};
    if (u < units && p >= kbeg && p < kend) {
      const int64_t block = blocks[p / block_tokens];
      raw[i] = load8<T>(c.data + block * c.block_bytes + int64_t{kvh} * c.head_bytes, c.dim,
                        block_tokens, p % block_tokens, e);
    }
  }
}

// Stores a loaded chunk as fp32 rows of dim at dst + j * stride.
template <KvT T, int kDimMax>
__device__ __forceinline__ void store_chunk(const Raw8 (&raw)[chunk_iters<kDimMax>()], int dim,
                                            float* dst, int stride) {
  const int units_per_row = dim / 8;
  const int units = kChunk * units_per_row;
#pragma unroll
  for (int i = 0; i < chunk_iters<kDimMax>(); ++i) {
    const int u = threadIdx.x + i * kThreads;
    if (u < units) {
      const int j = u / units_per_row;
      const int e = (u - j * units_per_row) * 8;
      float x[8];
      unpack8<T>(raw[i], x);
      float4* d = reinterpret_cast<float4*>(dst + j * stride + e);
      d[0] = make_float4(x[0], x[1], x[2], x[3]);
      d[1] = make_float4(x[4], x[5], x[6], x[7]);
    }
  }
}

// Both at once: all loads of the chunk are issued before the first store.
template <KvT T, int kDimMax>
__device__ __forceinline__ void load_chunk(const Cache& c, int kvh, int block_tokens,
                                           const int32_t* blocks, int c0, int kbeg, int kend,
                                           float* dst, int stride) {
  Raw8 raw[chunk_iters<kDimMax>()];
  load_chunk_raw<T, kDimMax>(raw, c, kvh, block_tokens, blocks, c0, kbeg, kend);
  store_chunk<T, kDimMax>(raw, c.dim, dst, stride);
}

// ---- kv_write ------------------------------------------------------------------------------

// Token j of one kv head's part of a block (head) from the fp32 row x of dim elements.
template <KvT T>
__device__ __forceinline__ void write_row(uint8_t* head, int dim, int block_tokens, int j,
                                          const float* x) {
  if constexpr (T == KvT::F32) {
    float* row = reinterpret_cast<float*>(head) + int64_t{j} * dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) row[d] = x[d];
  } else if constexpr (T == KvT::F16) {
    uint16_t* row = reinterpret_cast<uint16_t*>(head) + int64_t{j} * dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) row[d] = fp32_to_fp16_bits(x[d]);
  } else {
    // quant's q8_levels: d = f16(amax / 127), q = round(x / d) against the stored d.
    const int lane = threadIdx.x & 31;
    int8_t* qs = reinterpret_cast<int8_t*>(head) + int64_t{j} * dim;
    uint16_t* ds =
        reinterpret_cast<uint16_t*>(head + int64_t{block_tokens} * dim) + int64_t{j} * (dim / 32);
    for (int g = threadIdx.x >> 5; g < dim / 32; g += blockDim.x >> 5) {
      const float xv = x[g * 32 + lane];
      const float amax = warp_max(fabsf(xv));  // fmaxf skips NaN, as std::max(amax, NaN)
      const uint16_t dbits = scale_to_fp16_bits(__fdiv_rn(amax, 127.0f));
      const float d = fp16_bits_to_fp32(dbits);
      const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
      const float v = __fmul_rn(xv, id);
      qs[g * 32 + lane] =
          static_cast<int8_t>(isnan(v) ? 0.0f : roundf(fminf(fmaxf(v, -127.0f), 127.0f)));
      if (lane == 0) ds[g] = dbits;
    }
  }
}

template <KvT T>
__global__ void __launch_bounds__(kThreads)
    kv_write_kernel(Cache k, Cache v, int block_tokens, Batch b, int n_kv_heads, const float* ks,
                    const float* vs) {
  pdl_start();
  const int t = blockIdx.x, h = blockIdx.y;
  const int s = seq_of_token(b.qo, b.num_seqs, t);
  const int pos = b.pos[t];
  const int64_t block = b.kv_idx[b.kv_ptr[s] + pos / block_tokens];
  const int j = pos % block_tokens;
  const int64_t row = int64_t{t} * n_kv_heads + h;
  write_row<T>(k.data + block * k.block_bytes + h * k.head_bytes, k.dim, block_tokens, j,
               ks + row * k.dim);
  write_row<T>(v.data + block * v.block_bytes + h * v.head_bytes, v.dim, block_tokens, j,
               vs + row * v.dim);
}

// rope_apply2 of q and k, then kv_write, in one launch: CTA (t, h) rotates query head h in place
// (h < n_heads_q), or rotates kv head h - n_heads_q of k in place (through shared memory) and
// writes it and the v row into the cache. With q_norm / k_norm (qwen3, gemma3), each head row is
// first RMS-normed with those weights, as rmsnorm_kernel would (row_norm.cuh: the same bits;
// the host passes them only where that kernel takes its one-float4-per-thread path).
template <KvT T>
__global__ void __launch_bounds__(kThreads)
    rope_kv_write_kernel(Cache k, Cache v, int block_tokens, Batch b, int n_kv_heads, float* q,
                         int n_heads_q, float* ks, const float* vs, int n_pairs, bool neox,
                         const float* cos, const float* sin, const float* q_norm,
                         const float* k_norm, float eps) {
  __shared__ __align__(16) float row_s[kMaxHeadDim];
  const int t = blockIdx.x;
  int h = blockIdx.y;
  const int dim = k.dim;
  const float* c = cos + int64_t{t} * n_pairs;
  const float* s = sin + int64_t{t} * n_pairs;
  // The angles, the norm weights and the cache slot depend on no earlier kernel of the step's
  // chain (the angles are the step's first kernel): read them before the wait. A thread's first
  // pair (every pair when n_pairs <= blockDim.x, as in every model's head dim up to 256).
  const int i0 = threadIdx.x;
  const float c0 = i0 < n_pairs ? c[i0] : 0.0f, s0 = i0 < n_pairs ? s[i0] : 0.0f;
  const float* nw = h < n_heads_q ? q_norm : k_norm;
  const bool norm_lane = nw != nullptr && i0 < dim / 4;
  const float4 g =
      norm_lane ? reinterpret_cast<const float4*>(nw)[i0] : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
  int64_t block = 0;
  if (h >= n_heads_q) {
    const int sq = seq_of_token(b.qo, b.num_seqs, t);
    block = b.kv_idx[b.kv_ptr[sq] + b.pos[t] / block_tokens];
  }
  pdl_start();
  if (h < n_heads_q && nw == nullptr) {
    float* row = q + (int64_t{t} * n_heads_q + h) * dim;
    if (i0 < n_pairs) rope_pair(row, i0, n_pairs, neox, c0, s0);
    for (int i = i0 + blockDim.x; i < n_pairs; i += blockDim.x)
      rope_pair(row, i, n_pairs, neox, c[i], s[i]);
    return;
  }
  const bool is_q = h < n_heads_q;
  if (!is_q) h -= n_heads_q;
  float* row =
      is_q ? q + (int64_t{t} * n_heads_q + h) * dim : ks + (int64_t{t} * n_kv_heads + h) * dim;
  if (nw != nullptr) {
    const float4 x =
        norm_lane ? reinterpret_cast<const float4*>(row)[i0] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float inv = row_rms_inv(x, dim, eps);  // every thread: it syncs the block
    if (norm_lane) reinterpret_cast<float4*>(row_s)[i0] = row_rms_apply(x, inv, g);
  } else {
    for (int d = threadIdx.x; d < dim; d += blockDim.x) row_s[d] = row[d];
  }
  __syncthreads();
  if (i0 < n_pairs) rope_pair(row_s, i0, n_pairs, neox, c0, s0);
  for (int i = i0 + blockDim.x; i < n_pairs; i += blockDim.x)
    rope_pair(row_s, i, n_pairs, neox, c[i], s[i]);
  __syncthreads();
  for (int d = threadIdx.x; d < dim; d += blockDim.x) row[d] = row_s[d];
  if (is_q) return;
  const int j = b.pos[t] % block_tokens;
  write_row<T>(k.data + block * k.block_bytes + h * k.head_bytes, dim, block_tokens, j, row_s);
  write_row<T>(v.data + block * v.block_bytes + h * v.head_bytes, v.dim, block_tokens, j,
               vs + (int64_t{t} * n_kv_heads + h) * v.dim);
}

// ---- attention -----------------------------------------------------------------------------

struct AttnArgs {
  Cache k, v;
  int32_t block_tokens;
  Batch b;
  const float* q;  // [n_tokens, n_heads, dk]
  float* out;      // [n_tokens, n_heads, dv]
  float* ws;       // split-K partials: acc [n_splits][n_tokens][n_heads][dv], then (m, l)
  int* counters;   // [n_tokens][gridDim.y]: splits of a (row, head chunk) done; zero between
  int8_t* xq;      // null, or out quantized as quantize_q8_32 does ([n_tokens][n_heads * dv])
  float2* xds;
  int32_t n_tokens, n_heads;
  int32_t row0;       // decode: the step's row of this launch's row 0 (q, out, xq point at it)
  int32_t group;      // query heads per kv head
  int32_t n_hchunks;  // ceil(group / kHeadChunk): blockIdx.y = kv_head * n_hchunks + chunk
  int32_t n_splits;
  int32_t min_split_blocks;            // KV blocks a split takes at least
  int32_t tile_tokens, tiles_per_seq;  // prefill
  int32_t window;
  bool causal;  // false: every row sees keys 0 .. kv_len - 1 of its sequence (window 0)
  float scale, softcap;
};

__device__ __forceinline__ float score_of(float dot, const AttnArgs& a) {
  float s = dot * a.scale;
  if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
  return s;
}

// One online-softmax step of a row over a chunk's scores, one per lane (-inf = masked). m and
// l are the row's running max and normaliser (the same in every lane); corr rescales the
// row's accumulator. Returns the lane's weight.
__device__ __forceinline__ float softmax_step(float sc, float& m, float& l, float& corr) {
  const float m_new = fmaxf(m, warp_max(sc));
  corr = m_new == -INFINITY ? 1.0f : expf(m - m_new);
  const float p = sc == -INFINITY ? 0.0f : expf(sc - m_new);
  l = l * corr + warp_sum(p);
  m = m_new;
  return p;
}

__device__ __forceinline__ float4 fma4(float p, float4 v, float4 o) {
  return make_float4(fmaf(p, v.x, o.x), fmaf(p, v.y, o.y), fmaf(p, v.z, o.z), fmaf(p, v.w, o.w));
}
__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

// Writes the float4 o at dims [4 d4, 4 d4 + 4) of head h of token t's output row and, when
// a.xq is set, its int8 levels (q8_group4: 8 consecutive threads hold a group of 32 values, so
// every thread of the warp calls this, inactive ones with zeros).
__device__ __forceinline__ void store_out(const AttnArgs& a, int t, int h, int d4, float4 o,
                                          bool active) {
  const int dv = a.v.dim;
  const int64_t idx = (int64_t{t} * a.n_heads + h) * dv + 4 * d4;
  if (active) *reinterpret_cast<float4*>(a.out + idx) = o;
  if (a.xq != nullptr) q8_group4(o, active, a.xq + idx, a.xds + idx / 32);
}

// Token t's output for heads h0 .. h0 + gc: thread tid holds the float4s u = tid + r kThreads
// (r < kAcc) of the [gc][dv / 4] block, each value(r, g, d4) for head h0 + g, dims 4 d4..;
// every thread calls store_out for every r (the int8 levels need whole warps).
template <int kAcc, class Value>
__device__ __forceinline__ void write_heads(const AttnArgs& a, int t, int h0, int gc, Value value) {
  const int dv4 = a.v.dim / 4;
#pragma unroll
  for (int r = 0; r < kAcc; ++r) {
    const int u = threadIdx.x + r * kThreads;
    const bool active = u < gc * dv4;
    const int g = active ? u / dv4 : 0, d4 = u - g * dv4;
    const float4 o = active ? value(r, g, d4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    store_out(a, t, h0 + g, d4, o, active);
  }
}

// The merge of n_active split partials of token t's heads h0 .. h0 + gc (the decode kernel's
// last split to finish runs it): warp w weighs heads w, w + 4 (a lane per split: exp(m - m_max)
// / the weighted sum of l, into wgt), then each thread sums its dims over the splits.
template <int kAcc>
__device__ void merge_splits(const AttnArgs& a, int t, int h0, int gc, int n_active, float* wgt) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int dv4 = a.v.dim / 4;
  const int64_t rows = int64_t{a.n_tokens} * a.n_heads;
  const float* ml = a.ws + int64_t{a.n_splits} * rows * a.v.dim;
  for (int g = warp; g < gc; g += kThreads / 32) {
    const int64_t row = int64_t{t} * a.n_heads + h0 + g;
    float m[kMaxSplits / 32], l[kMaxSplits / 32];
    float m_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) {
      const int sp = lane + 32 * i;
      m[i] = -INFINITY, l[i] = 0.0f;
      if (sp < n_active) {
        const float2 x = __ldcg(reinterpret_cast<const float2*>(ml + (sp * rows + row) * 2));
        m[i] = x.x, l[i] = x.y;
        if (l[i] > 0.0f) m_max = fmaxf(m_max, m[i]);
      }
    }
    m_max = warp_max(m_max);
    float e[kMaxSplits / 32], l_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) {
      e[i] = l[i] > 0.0f ? expf(m[i] - m_max) : 0.0f;
      l_sum += l[i] * e[i];
    }
    l_sum = warp_sum(l_sum);
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) wgt[g * kMaxSplits + lane + 32 * i] = e[i] / l_sum;
  }
  __syncthreads();
  const float4* acc = reinterpret_cast<const float4*>(a.ws);
  write_heads<kAcc>(a, t, h0, gc, [&](int, int g, int d4) {
    const int64_t row = int64_t{t} * a.n_heads + h0 + g;
    const float4* p = acc + row * dv4 + d4;
    const int64_t stride = rows * dv4;
    const float* w = wgt + g * kMaxSplits;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // Eight partials' loads in flight at a time (one L2 read after another was the merge's
    // latency), summed in split order. Every active split wrote its partial (finite).
    int sp = 0;
    for (; sp + 8 <= n_active; sp += 8) {
      float4 v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = __ldcg(p + (sp + i) * stride);
#pragma unroll
      for (int i = 0; i < 8; ++i) o = fma4(w[sp + i], v[i], o);
    }
    for (; sp < n_active; ++sp) o = fma4(w[sp], __ldcg(p + sp * stride), o);
    return o;
  });
}

// The end of a decode CTA (row t, heads h0 .. h0 + gc, context split `split` of n_active):
// ml_s holds each head's (m, l) (m in the natural-log frame of expf), acc(r, g, d4) the
// unnormalised float4 that thread's r-th slot holds (write_heads' order). A split that covers
// the whole context (whole) writes the normalised row; otherwise the partial goes to the
// workspace and the last split of this (row, head chunk) to finish merges them all (no second
// kernel): the partials are published before the count (threadfence), read after it through
// L2. scratch: gc * kMaxSplits floats of shared memory for the merge's weights.
template <int kAcc, class Acc>
__device__ __forceinline__ void finish_split(const AttnArgs& a, int t, int h0, int gc, int split,
                                             int n_active, bool whole, const float* ml_s,
                                             float* scratch, Acc acc) {
  const int tid = threadIdx.x;
  const int dv4 = a.v.dim / 4;
  const int64_t rows = int64_t{a.n_tokens} * a.n_heads;
  if (whole) {
    write_heads<kAcc>(a, t, h0, gc, [&](int r, int g, int d4) {
      const float li = ml_s[2 * g + 1];  // > 0: key last_key is always visible
      const float4 x = acc(r, g, d4);
      return make_float4(x.x / li, x.y / li, x.z / li, x.w / li);
    });
    return;
  }
#pragma unroll
  for (int r = 0; r < kAcc; ++r) {
    const int u = tid + r * kThreads;
    if (u < gc * dv4) {
      const int g = u / dv4, d4 = u - g * dv4;
      const int64_t row = int64_t{t} * a.n_heads + h0 + g;
      reinterpret_cast<float4*>(a.ws)[(split * rows + row) * dv4 + d4] = acc(r, g, d4);
    }
  }
  if (tid < gc) {
    float* ml = a.ws + int64_t{a.n_splits} * rows * a.v.dim +
                (split * rows + int64_t{t} * a.n_heads + h0 + tid) * 2;
    ml[0] = ml_s[2 * tid];
    ml[1] = ml_s[2 * tid + 1];
  }
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    int* count = a.counters + int64_t{t} * gridDim.y + blockIdx.y;
    last = atomicAdd(count, 1) == n_active - 1;
    if (last) atomicExch(count, 0);  // zero again for the next launch (and graph replays)
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  merge_splits<kAcc>(a, t, h0, gc, n_active, scratch);
}

size_t decode_smem_bytes(int dk, int dv) {
  const int ks = dk + 4;
  return sizeof(float) * static_cast<size_t>(kChunk * ks + kChunk * dv + kHeadChunk * ks +
                                             kHeadChunk * kChunk + 3 * kHeadChunk);
}

// Blocks pb0..pb1 of kv head kvh's part of a K or V cache (its head_bytes in each) asked into
// L2, a 128-byte line per thread and step.
__device__ __forceinline__ void prefetch_blocks(const Cache& c, int kvh, const int32_t* blocks,
                                                int pb0, int pb1) {
  const int lines = static_cast<int>((c.head_bytes + 127) / 128);
  for (int u = threadIdx.x; u < (pb1 - pb0 + 1) * lines; u += kThreads) {
    const int bi = u / lines;
    const uint8_t* p = c.data + int64_t{blocks[pb0 + bi]} * c.block_bytes +
                       int64_t{kvh} * c.head_bytes + int64_t{u - bi * lines} * 128;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
  }
}

// What a decode CTA works on: row t (of sequence s), the query heads h0 .. h0 + gc of kv head
// kvh, and keys [kbeg, kend) of the row's context, its split's share of the blocks they span.
struct DecodeCta {
  int t, kvh, h0, gc, split;
  const int32_t* blocks;  // the sequence's block table
  int kbeg, kend;
  int n_active;  // splits with keys (the others return at once)
  bool whole;    // one split covers the row: it writes the final output, no merge
};

__device__ __forceinline__ DecodeCta decode_cta(const AttnArgs& a) {
  DecodeCta c;
  c.t = blockIdx.x;
  c.kvh = blockIdx.y / a.n_hchunks;
  const int hc = blockIdx.y - c.kvh * a.n_hchunks;
  c.h0 = c.kvh * a.group + hc * kHeadChunk;
  c.gc = min(kHeadChunk, a.group - hc * kHeadChunk);
  c.split = blockIdx.z;
  const int s = seq_of_token(a.b.qo, a.b.num_seqs, a.row0 + c.t);
  // The last key the row sees: its own position, or the sequence's last when not causal.
  const int last_key = a.causal ? a.b.pos[a.row0 + c.t] : a.b.kv_len[s] - 1;
  c.blocks = a.b.kv_idx + a.b.kv_ptr[s];
  const int bt = a.block_tokens;
  // Keys [lo, last_key]; this split takes its share of the blocks they span.
  const int lo = a.window > 0 ? max(0, last_key - a.window + 1) : 0;
  const int b_first = lo / bt, n_blocks = last_key / bt - b_first + 1;
  // At least min_split_blocks blocks per split: a short context uses the first few splits (the
  // rest see no key and are skipped by the merge).
  const int per_split = max((n_blocks + a.n_splits - 1) / a.n_splits, a.min_split_blocks);
  c.kbeg = max(lo, (b_first + c.split * per_split) * bt);
  c.kend = min(last_key + 1, (b_first + (c.split + 1) * per_split) * bt);
  // A context that one split covers: split 0 writes the final row (the merge skips the row),
  // the others have nothing to do.
  c.whole = a.n_splits == 1 || n_blocks <= per_split;
  c.n_active = c.whole ? 1 : (n_blocks + per_split - 1) / per_split;
  return c;
}

// Everything decode_cta reads is the step's metadata, which no kernel writes. The cached keys
// and values before this token's own were written by earlier steps: start the first of the
// split's blocks towards L2 before waiting for the kernel before (the one that writes q and this
// token's k and v row; the decode kernels are launched with launch_pdl).
__device__ __forceinline__ void decode_prefetch(const AttnArgs& a, const DecodeCta& c) {
  if (c.kbeg < c.kend) {
    const int bt = a.block_tokens;
    const int pb0 = c.kbeg / bt, pb1 = min((c.kend - 1) / bt, pb0 + kPrefetchBlocks - 1);
    prefetch_blocks(a.k, c.kvh, c.blocks, pb0, pb1);
    prefetch_blocks(a.v, c.kvh, c.blocks, pb0, pb1);
  }
}

template <KvT T, int kDimMax>
__global__ void __launch_bounds__(kThreads) decode_kernel(const AttnArgs a) {
  extern __shared__ float4 smem4[];
  const int dk = a.k.dim, dv = a.v.dim, ks = dk + 4, dk4 = dk / 4, dv4 = dv / 4;
  float* Ks = reinterpret_cast<float*>(smem4);  // [kChunk][ks]
  float* Vs = Ks + kChunk * ks;                 // [kChunk][dv]
  float* Qs = Vs + kChunk * dv;                 // [kHeadChunk][ks]
  float* Ps = Qs + kHeadChunk * ks;             // [kHeadChunk][kChunk] scores, then weights
  float* corr_s = Ps + kHeadChunk * kChunk;     // [kHeadChunk]
  float* ml_s = corr_s + kHeadChunk;            // [kHeadChunk][2]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  const DecodeCta c = decode_cta(a);
  if (c.split >= c.n_active) return;  // past the context (or a row split 0 takes whole)
  const int t = c.t, kvh = c.kvh, h0 = c.h0, gc = c.gc, split = c.split, bt = a.block_tokens;
  const int kbeg = c.kbeg, kend = c.kend, n_active = c.n_active;
  const bool whole = c.whole;
  const int32_t* blocks = c.blocks;
  decode_prefetch(a, c);
  pdl_start();

  for (int u = tid; u < gc * dk4; u += kThreads) {
    const int g = u / dk4, d4 = u - g * dk4;
    reinterpret_cast<float4*>(Qs + g * ks)[d4] =
        reinterpret_cast<const float4*>(a.q + (int64_t{t} * a.n_heads + h0 + g) * dk)[d4];
  }

  constexpr int kAcc = (kHeadChunk * kDimMax / 4 + kThreads - 1) / kThreads;
  float4 acc[kAcc];
#pragma unroll
  for (int r = 0; r < kAcc; ++r) acc[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float m[kHeadChunk / 4], l[kHeadChunk / 4];  // heads warp + 4 i
#pragma unroll
  for (int i = 0; i < kHeadChunk / 4; ++i) m[i] = -INFINITY, l[i] = 0.0f;

  // Software pipeline: the next chunk's loads are in flight while this one is computed.
  Raw8 raw_k[chunk_iters<kDimMax>()], raw_v[chunk_iters<kDimMax>()];
  if (kbeg < kend) {
    load_chunk_raw<T, kDimMax>(raw_k, a.k, kvh, bt, blocks, kbeg, kbeg, kend);
    load_chunk_raw<T, kDimMax>(raw_v, a.v, kvh, bt, blocks, kbeg, kbeg, kend);
  }
  for (int c0 = kbeg; c0 < kend; c0 += kChunk) {
    __syncthreads();  // Qs written; the previous chunk's readers done
    store_chunk<T, kDimMax>(raw_k, dk, Ks, ks);
    store_chunk<T, kDimMax>(raw_v, dv, Vs, dv);
    __syncthreads();
    if (c0 + kChunk < kend) {
      load_chunk_raw<T, kDimMax>(raw_k, a.k, kvh, bt, blocks, c0 + kChunk, kbeg, kend);
      load_chunk_raw<T, kDimMax>(raw_v, a.v, kvh, bt, blocks, c0 + kChunk, kbeg, kend);
    }
    for (int u = tid; u < gc * kChunk; u += kThreads) {
      const int g = u / kChunk, j = u - g * kChunk;
      float sc = -INFINITY;
      if (c0 + j < kend) {
        const float4* qr = reinterpret_cast<const float4*>(Qs + g * ks);
        const float4* kr = reinterpret_cast<const float4*>(Ks + j * ks);
        float dot = 0.0f;
#pragma unroll 8
        for (int d4 = 0; d4 < dk4; ++d4) dot = dot4(qr[d4], kr[d4], dot);
        sc = score_of(dot, a);
      }
      Ps[g * kChunk + j] = sc;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kHeadChunk / 4; ++i) {
      const int g = warp + 4 * i;
      if (g < gc) {
        float corr;
        const float p = softmax_step(Ps[g * kChunk + lane], m[i], l[i], corr);
        Ps[g * kChunk + lane] = p;
        if (lane == 0) corr_s[g] = corr;
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kAcc; ++r) {
      const int u = tid + r * kThreads;
      if (u < gc * dv4) {
        const int g = u / dv4, d4 = u - g * dv4;
        const float c = corr_s[g];
        float4 o = make_float4(acc[r].x * c, acc[r].y * c, acc[r].z * c, acc[r].w * c);
        const float* pr = Ps + g * kChunk;
        const float4* vc = reinterpret_cast<const float4*>(Vs) + d4;
#pragma unroll 8
        for (int j = 0; j < kChunk; ++j) o = fma4(pr[j], vc[j * dv4], o);
        acc[r] = o;
      }
    }
  }

  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < kHeadChunk / 4; ++i) {
      const int g = warp + 4 * i;
      if (g < gc) ml_s[2 * g] = m[i], ml_s[2 * g + 1] = l[i];
    }
  }
  __syncthreads();
  finish_split<kAcc>(a, t, h0, gc, split, n_active, whole, ml_s, Ks,
                     [&](int r, int, int) { return acc[r]; });
}

// ---- decode on the tensor cores ----------------------------------------------------------------
//
// decode_kernel stages K and V through shared memory as fp32 and reads each value back once per
// query head: at long context it is bound by shared-memory bandwidth (~1.1 TB/s of KV on the
// H200). decode_tc_kernel (F16 caches, dk == dv in {64, 128, 256}) takes the same CTAs and
// splits but keeps everything in registers: each warp walks every fourth tile of 16 keys of
// the split, loading K and V rows with 16-byte loads straight into mma.sync m16n8k16 fragments
// (fp16 in, fp32 accumulate), its up to 8 query heads the A rows (rows 8-15 zero). No shared
// memory and no barrier until the warps combine their (m, l, O) at the end.
//  - S = Q K^T: lane (g, q) = (lane / 4, lane % 4) loads dims [32 s + 8 q, +8) of key g of
//    each 8-key half-tile; the k16 step 2 s takes the first two words, 2 s + 1 the last two,
//    and Q's A fragments (rounded to fp16 once, scale and log2(e) folded in) follow the same
//    order of dims: the dot product is a sum, so the order of its terms is free.
//  - P V: the C fragments of S are P's A fragment (as FlashAttention-2); V's B fragment wants
//    two keys' values of one dim in a register: lane (g, q) loads dims [64 j + 8 g, +8) of
//    keys 2 q, 2 q + 1, 2 q + 8, 2 q + 9 and pairs them with byte_perm, so output column n of
//    n8 tile 8 j + e is dim 64 j + 8 n + e; the end writes the rows back in dim order.
// Precision as the tensor-core prefill: Q and P rounded to fp16 (the test's bound, 4e-3 of
// max |V|).

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// (d0, d1) += rows 0-7 of A B on mma.sync m16n8k16: a0, a2 are A's registers of rows 0-7 (rows
// 8-15 are zero) and the results of rows 8-15 are dropped (a CTA serves at most 8 query heads).
__device__ __forceinline__ void mma_rows8(float& d0, float& d1, uint32_t a0, uint32_t a2,
                                          uint32_t b0, uint32_t b1) {
  float d2 = 0.0f, d3 = 0.0f;
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word_of(const uint4& x, int i) {
  return i == 0 ? x.x : i == 1 ? x.y : i == 2 ? x.z : x.w;
}

template <int kD>
__global__ void __launch_bounds__(kThreads) decode_tc_kernel(const AttnArgs a) {
  constexpr int kWarps = kThreads / 32;
  constexpr int kSteps = kD / 16;  // k16 steps of Q K^T
  constexpr int kSeg = kD / 64;    // 64-dim segments of V a lane loads 8 dims of
  constexpr int kNt = kD / 8;      // n8 tiles of an output row
  constexpr int kAcc = (kHeadChunk * kD / 4 + kThreads - 1) / kThreads;
  constexpr int kRowBytes = kD * 2;
  __shared__ __align__(16) float ow_s[kWarps][kHeadChunk][kD];  // each warp's unnormalised rows
  __shared__ float wml_s[kWarps][kHeadChunk][2];                // and their (m, l), log2 frame
  __shared__ float wgt_s[kHeadChunk][kWarps];
  __shared__ float ml_s[2 * kHeadChunk];
  __shared__ float scratch[kHeadChunk * kMaxSplits];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q4 = lane & 3;

  const DecodeCta c = decode_cta(a);
  if (c.split >= c.n_active) return;  // past the context (or a row split 0 takes whole)
  decode_prefetch(a, c);
  pdl_start();

  const bool capped = a.softcap > 0.0f;
  const float qscale = capped ? a.scale : a.scale * kLog2e;
  // A registers 0 and 2 of each k16 step (head g, dims as K's): in registers, or at head dim
  // 256 in shared memory (32 more registers would spill the loop).
  constexpr bool kQShared = kD > 128;
  uint2 qa[kQShared ? 1 : kSteps] = {};
  __shared__ uint2 qa_s[kQShared ? kSteps * 32 : 1];
  {
    const bool row = g < c.gc;
    const float* qr = a.q + (int64_t{c.t} * a.n_heads + c.h0 + (row ? g : 0)) * kD + 8 * q4;
#pragma unroll
    for (int s = 0; s < kD / 32; ++s) {
      float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
      if (row) {
        x0 = *reinterpret_cast<const float4*>(qr + 32 * s);
        x1 = *reinterpret_cast<const float4*>(qr + 32 * s + 4);
      }
      const uint2 f0 = make_uint2(pack_half2(x0.x * qscale, x0.y * qscale),
                                  pack_half2(x0.z * qscale, x0.w * qscale));
      const uint2 f1 = make_uint2(pack_half2(x1.x * qscale, x1.y * qscale),
                                  pack_half2(x1.z * qscale, x1.w * qscale));
      if constexpr (kQShared) {
        if (warp == 0) qa_s[2 * s * 32 + lane] = f0, qa_s[(2 * s + 1) * 32 + lane] = f1;
      } else {
        qa[2 * s] = f0, qa[2 * s + 1] = f1;
      }
    }
    if constexpr (kQShared) __syncthreads();
  }
  const auto q_frag = [&](int step) {
    if constexpr (kQShared) {
      return qa_s[step * 32 + lane];
    } else {
      return qa[step];
    }
  };

  float o[kNt][2];  // head g, dims 64 j + 16 q4 + 8 i + e of tile 8 j + e
#pragma unroll
  for (int j = 0; j < kNt; ++j) o[j][0] = o[j][1] = 0.0f;
  float m = -INFINITY, l = 0.0f;  // head g's running max (log2 frame) and this lane's sum
  const int bt = a.block_tokens;
  const uint8_t* kbase = a.k.data + int64_t{c.kvh} * a.k.head_bytes + 16 * q4;
  const uint8_t* vbase = a.v.data + int64_t{c.kvh} * a.v.head_bytes + 16 * g;
  // K and V rows have the same size and place in their blocks (dk == dv, both F16). (One
  // block-table read per tile where a tile lies in one block measured no faster.)
  const auto key_off = [&](int p) {
    return int64_t{c.blocks[p / bt]} * a.k.block_bytes + int64_t{p % bt} * kRowBytes;
  };
  for (int p0 = c.kbeg + 16 * warp; p0 < c.kend; p0 += 16 * kWarps) {
    // Keys past the split's end read its last key (finite) and are masked below.
    uint4 kr[2][kD / 32];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const uint8_t* r = kbase + key_off(min(p0 + 8 * n + g, c.kend - 1));
#pragma unroll
      for (int s = 0; s < kD / 32; ++s)
        kr[n][s] = __ldg(reinterpret_cast<const uint4*>(r + 64 * s));
    }
    uint4 vr[4][kSeg];  // keys p0 + 2 q4 + {0, 1, 8, 9}
    const auto load_v = [&] {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint8_t* r = vbase + key_off(min(p0 + 2 * q4 + (i & 1) + 8 * (i >> 1), c.kend - 1));
#pragma unroll
        for (int j = 0; j < kSeg; ++j)
          vr[i][j] = __ldg(reinterpret_cast<const uint4*>(r + 128 * j));
      }
    };
    // Head dim 256: V's loads after S's math (K's registers free again), or it spills.
    if constexpr (kD <= 128) load_v();
    float sc[2][2];  // head g, keys p0 + 8 n + 2 q4 + i
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
      for (int s = 0; s < kD / 32; ++s) {
        const uint2 f0 = q_frag(2 * s), f1 = q_frag(2 * s + 1);
        mma_rows8(d0, d1, f0.x, f0.y, kr[n][s].x, kr[n][s].y);
        mma_rows8(d0, d1, f1.x, f1.y, kr[n][s].z, kr[n][s].w);
      }
      sc[n][0] = d0, sc[n][1] = d1;
    }
    if constexpr (kD > 128) load_v();
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float x = sc[n][i];
        if (capped) x = a.softcap * tanhf(x / a.softcap) * kLog2e;
        x = p0 + 8 * n + 2 * q4 + i < c.kend ? x : -INFINITY;
        sc[n][i] = x;
        mx = fmaxf(mx, x);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m, mx);  // finite: key p0 is in the split
    const float corr = exp2f(m - m_new);
    m = m_new;
    float pr[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int i = 0; i < 2; ++i) pr[n][i] = exp2f(sc[n][i] - m_new);
    }
    l = l * corr + ((pr[0][0] + pr[0][1]) + (pr[1][0] + pr[1][1]));
    const uint32_t pa0 = pack_half2(pr[0][0], pr[0][1]), pa2 = pack_half2(pr[1][0], pr[1][1]);
#pragma unroll
    for (int j = 0; j < kSeg; ++j) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const uint32_t sel = (e & 1) ? 0x7632u : 0x5410u;
        const uint32_t b0 = __byte_perm(word_of(vr[0][j], e / 2), word_of(vr[1][j], e / 2), sel);
        const uint32_t b1 = __byte_perm(word_of(vr[2][j], e / 2), word_of(vr[3][j], e / 2), sel);
        float& o0 = o[8 * j + e][0];
        float& o1 = o[8 * j + e][1];
        o0 *= corr, o1 *= corr;
        mma_rows8(o0, o1, pa0, pa2, b0, b1);
      }
    }
  }
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);

  if (g < c.gc) {
#pragma unroll
    for (int j = 0; j < kSeg; ++j) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
#pragma unroll
        for (int i = 0; i < 2; ++i) ow_s[warp][g][64 * j + 16 * q4 + 8 * i + e] = o[8 * j + e][i];
      }
    }
    if (q4 == 0) wml_s[warp][g][0] = m, wml_s[warp][g][1] = l;
  }
  __syncthreads();
  if (tid < c.gc) {  // the warps' rows weighed into one (a warp with no key has l = 0)
    float mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (wml_s[w][tid][1] > 0.0f) mm = fmaxf(mm, wml_s[w][tid][0]);
    }
    float ll = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float e = wml_s[w][tid][1] > 0.0f ? exp2f(wml_s[w][tid][0] - mm) : 0.0f;
      wgt_s[tid][w] = e;
      ll += wml_s[w][tid][1] * e;
    }
    ml_s[2 * tid] = mm * kLn2;  // the natural-log frame of the merge
    ml_s[2 * tid + 1] = ll;
  }
  __syncthreads();
  finish_split<kAcc>(a, c.t, c.h0, c.gc, c.split, c.n_active, c.whole, ml_s, scratch,
                     [&](int, int gg, int d4) {
                       float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                       for (int w = 0; w < kWarps; ++w) {
                         const float e = wgt_s[gg][w];
                         if (e > 0.0f)
                           x = fma4(e, reinterpret_cast<const float4*>(ow_s[w][gg])[d4], x);
                       }
                       return x;
                     });
}

// Rows (token, head) of a prefill tile: 64, or 32 when a head dim exceeds 128 (registers).
template <int kDimMax>
constexpr int prefill_rows() {
  return kDimMax > 128 ? 32 : 64;
}

size_t prefill_smem_bytes(int rows, int dk, int dv) {
  const int ks = dk + 4;
  return sizeof(float) * static_cast<size_t>(rows * ks + kChunk * ks + kChunk * dv +
                                             rows * (kChunk + 1) + 3 * rows) +
         sizeof(int) * static_cast<size_t>(rows + 2);
}

template <KvT T, int kDimMax>
__global__ void __launch_bounds__(kThreads) prefill_kernel(const AttnArgs a) {
  constexpr int kRows = prefill_rows<kDimMax>();
  constexpr int kRI = kRows / 16;    // rows per thread: rg + 16 i
  constexpr int kCI = kDimMax / 32;  // float4 output columns per thread: cg + 8 k
  constexpr int kSs = kChunk + 1;    // score row stride
  extern __shared__ float4 smem4[];
  const int dk = a.k.dim, dv = a.v.dim, ks = dk + 4, ks4 = ks / 4, dk4 = dk / 4, dv4 = dv / 4;
  float* Qs = reinterpret_cast<float*>(smem4);  // [kRows][ks]
  float* Ks = Qs + kRows * ks;                  // [kChunk][ks]
  float* Vs = Ks + kChunk * ks;                 // [kChunk][dv]
  float* Ss = Vs + kChunk * dv;                 // [kRows][kSs] scores, then weights
  float* m_s = Ss + kRows * kSs;                // [kRows]
  float* l_s = m_s + kRows;
  float* corr_s = l_s + kRows;
  int* pos_s = reinterpret_cast<int*>(corr_s + kRows);  // [kRows] last visible key; -1 = no row
  int* range_s = pos_s + kRows;                         // min, max of pos_s over the tile
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  const int s = blockIdx.x / a.tiles_per_seq;
  const int q0 = a.b.qo[s] + (blockIdx.x - s * a.tiles_per_seq) * a.tile_tokens;
  const int qn = min(a.tile_tokens, a.b.qo[s + 1] - q0);
  if (qn <= 0) return;
  const int kvh = blockIdx.y / a.n_hchunks;
  const int hc = blockIdx.y - kvh * a.n_hchunks;
  const int h0 = kvh * a.group + hc * kHeadChunk;
  const int gc = min(kHeadChunk, a.group - hc * kHeadChunk);
  const int n_rows = qn * gc;  // row r: token q0 + r / gc, head h0 + r % gc
  const int32_t* blocks = a.b.kv_idx + a.b.kv_ptr[s];

  if (tid == 0) range_s[0] = INT_MAX, range_s[1] = -1;
  __syncthreads();
  const int seq_last = a.causal ? -1 : a.b.kv_len[s] - 1;
  for (int r = tid; r < kRows; r += kThreads) {
    int p = -1;  // the last key row r sees: its position, or the sequence's last (not causal)
    if (r < n_rows) {
      p = a.causal ? a.b.pos[q0 + r / gc] : seq_last;
      atomicMin(&range_s[0], p);
      atomicMax(&range_s[1], p);
    }
    pos_s[r] = p;
    m_s[r] = -INFINITY;
    l_s[r] = 0.0f;
  }
  for (int u = tid; u < kRows * dk4; u += kThreads) {
    const int r = u / dk4, d4 = u - r * dk4;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < n_rows) {
      const int64_t row = int64_t{q0 + r / gc} * a.n_heads + h0 + r % gc;
      x = reinterpret_cast<const float4*>(a.q + row * dk)[d4];
    }
    reinterpret_cast<float4*>(Qs + r * ks)[d4] = x;
  }
  __syncthreads();
  const int lo = a.window > 0 ? max(0, range_s[0] - a.window + 1) : 0;
  const int hi = range_s[1] + 1;

  const int rg = tid / 8, cg = tid % 8;  // rows rg + 16 i; keys / float4 columns cg + 8 k
  float4 acc[kRI][kCI];
#pragma unroll
  for (int i = 0; i < kRI; ++i) {
#pragma unroll
    for (int k = 0; k < kCI; ++k) acc[i][k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }

  for (int c0 = lo; c0 < hi; c0 += kChunk) {
    load_chunk<T, kDimMax>(a.k, kvh, a.block_tokens, blocks, c0, lo, hi, Ks, ks);
    load_chunk<T, kDimMax>(a.v, kvh, a.block_tokens, blocks, c0, lo, hi, Vs, dv);
    __syncthreads();
    float sc[kRI][4];
#pragma unroll
    for (int i = 0; i < kRI; ++i) {
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) sc[i][jj] = 0.0f;
    }
    const float4* Q4 = reinterpret_cast<const float4*>(Qs);
    const float4* K4 = reinterpret_cast<const float4*>(Ks);
#pragma unroll 2
    for (int d4 = 0; d4 < dk4; ++d4) {
      float4 qv[kRI], kv[4];
#pragma unroll
      for (int i = 0; i < kRI; ++i) qv[i] = Q4[(rg + 16 * i) * ks4 + d4];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) kv[jj] = K4[(cg + 8 * jj) * ks4 + d4];
#pragma unroll
      for (int i = 0; i < kRI; ++i) {
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) sc[i][jj] = dot4(qv[i], kv[jj], sc[i][jj]);
      }
    }
#pragma unroll
    for (int i = 0; i < kRI; ++i) {
      const int r = rg + 16 * i;
      const int pr = pos_s[r];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int key = cg + 8 * jj, p = c0 + key;
        const bool visible = pr >= 0 && p <= pr && (a.window <= 0 || p > pr - a.window);
        Ss[r * kSs + key] = visible ? score_of(sc[i][jj], a) : -INFINITY;
      }
    }
    __syncthreads();
    for (int r = warp; r < kRows; r += kThreads / 32) {
      float m = m_s[r], l = l_s[r], corr;
      const float p = softmax_step(Ss[r * kSs + lane], m, l, corr);
      Ss[r * kSs + lane] = p;
      __syncwarp();  // every lane has read m_s[r], l_s[r] (racecheck: warp-level WAR)
      if (lane == 0) m_s[r] = m, l_s[r] = l, corr_s[r] = corr;
    }
    __syncthreads();
    const float4* V4 = reinterpret_cast<const float4*>(Vs);
#pragma unroll
    for (int i = 0; i < kRI; ++i) {
      const float c = corr_s[rg + 16 * i];
#pragma unroll
      for (int k = 0; k < kCI; ++k)
        acc[i][k] = make_float4(acc[i][k].x * c, acc[i][k].y * c, acc[i][k].z * c, acc[i][k].w * c);
    }
#pragma unroll 4
    for (int j = 0; j < kChunk; ++j) {
      float pj[kRI];
#pragma unroll
      for (int i = 0; i < kRI; ++i) pj[i] = Ss[(rg + 16 * i) * kSs + j];
#pragma unroll
      for (int k = 0; k < kCI; ++k) {
        if (cg + 8 * k < dv4) {
          const float4 v = V4[j * dv4 + cg + 8 * k];
#pragma unroll
          for (int i = 0; i < kRI; ++i) acc[i][k] = fma4(pj[i], v, acc[i][k]);
        }
      }
    }
    __syncthreads();  // before the next chunk overwrites Ks, Vs, Ss
  }

#pragma unroll
  for (int i = 0; i < kRI; ++i) {
    const int r = rg + 16 * i;
    if (r < n_rows) {
      const float li = l_s[r];
      const int64_t row = int64_t{q0 + r / gc} * a.n_heads + h0 + r % gc;
#pragma unroll
      for (int k = 0; k < kCI; ++k) {
        if (cg + 8 * k < dv4) {
          reinterpret_cast<float4*>(a.out)[row * dv4 + cg + 8 * k] =
              make_float4(acc[i][k].x / li, acc[i][k].y / li, acc[i][k].z / li, acc[i][k].w / li);
        }
      }
    }
  }
}

// ---- host side -------------------------------------------------------------------------------

using AttnKernelFn = void (*)(AttnArgs);

KvT kv_t(quant::Type t) {
  switch (t) {
    case quant::Type::F32:
      return KvT::F32;
    case quant::Type::F16:
      return KvT::F16;
    case quant::Type::Q8_0:
      return KvT::Q8;
    default:
      KILN_CUDA_ASSERT(false && "KV cache type must be F32, F16 or Q8_0");
  }
  return KvT::F16;
}

int dim_bucket(const KvLayer& kv) {
  const int d = std::max(kv.head_dim_k, kv.head_dim_v);
  return d <= 64 ? 64 : d <= 128 ? 128 : 256;
}

void check_layer(const KvLayer& kv) {
  KILN_CUDA_ASSERT(kv.head_dim_k > 0 && kv.head_dim_k % 8 == 0 && kv.head_dim_k <= 256);
  KILN_CUDA_ASSERT(kv.head_dim_v > 0 && kv.head_dim_v % 8 == 0 && kv.head_dim_v <= 256);
  if (kv.type == quant::Type::Q8_0)
    KILN_CUDA_ASSERT(kv.head_dim_k % 32 == 0 && kv.head_dim_v % 32 == 0);
  KILN_CUDA_ASSERT(kv.block_tokens > 0 && kv.n_kv_heads > 0);
}

template <int D>
AttnKernelFn pick(bool decode, KvT t) {
  switch (t) {
    case KvT::F32:
      return decode ? decode_kernel<KvT::F32, D> : prefill_kernel<KvT::F32, D>;
    case KvT::F16:
      return decode ? decode_kernel<KvT::F16, D> : prefill_kernel<KvT::F16, D>;
    default:
      return decode ? decode_kernel<KvT::Q8, D> : prefill_kernel<KvT::Q8, D>;
  }
}

AttnKernelFn pick(bool decode, KvT t, int bucket) {
  if (bucket == 64) return pick<64>(decode, t);
  if (bucket == 128) return pick<128>(decode, t);
  return pick<256>(decode, t);
}

AttnKernelFn pick_decode_tc(int d) {
  return d == 64 ? decode_tc_kernel<64> : d == 128 ? decode_tc_kernel<128> : decode_tc_kernel<256>;
}

// Raises a kernel's dynamic shared memory limit to the most it can ask for, once per device
// (the attribute belongs to the device's context).
void allow_smem(AttnKernelFn fn, bool decode, int bucket) {
  const int rows = bucket > 128 ? 32 : 64;
  const size_t bytes =
      decode ? decode_smem_bytes(bucket, bucket) : prefill_smem_bytes(rows, bucket, bucket);
  KILN_CUDA_ASSERT(allow_dynamic_smem(reinterpret_cast<const void*>(fn), bytes));
}

Cache cache_of(const KvLayer& kv, bool is_k) {
  Cache c;
  c.data = is_k ? kv.k : kv.v;
  c.block_bytes = is_k ? kv.k_block_bytes : kv.v_block_bytes;
  c.head_bytes = c.block_bytes / kv.n_kv_heads;
  c.dim = is_k ? kv.head_dim_k : kv.head_dim_v;
  return c;
}

Batch batch_of(const AttnBatch& b) {
  return Batch{b.qo_indptr, b.kv_indptr, b.kv_indices, b.positions, b.kv_len, b.num_seqs};
}

int64_t split_bytes_per_token(int32_t n_heads, int32_t head_dim_v) {
  return int64_t{n_heads} * (head_dim_v + 2) * static_cast<int64_t>(sizeof(float));
}

}  // namespace

// The workspace: split partials, then the split counters ([token][kv head x head chunk] <=
// kMaxSplitRows x n_heads ints).
int64_t counter_bytes(int32_t n_heads) {
  return int64_t{kMaxSplitRows} * n_heads * 4;
}

int64_t attention_workspace_bytes(int32_t n_heads, int32_t head_dim_v, bool deterministic) {
  return (deterministic ? kDetSplitRows : kMaxSplitRows) *
             split_bytes_per_token(n_heads, head_dim_v) +
         counter_bytes(n_heads);
}

void kv_write(const KvLayer& kv, const AttnBatch& b, int64_t n_tokens, const float* k,
              const float* v, cudaStream_t s) {
  if (n_tokens <= 0) return;
  check_layer(kv);
  const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>(kv.n_kv_heads));
  const Cache kc = cache_of(kv, true), vc = cache_of(kv, false);
  const Batch bb = batch_of(b);
  switch (kv_t(kv.type)) {
    case KvT::F32:
      launch_pdl(kv_write_kernel<KvT::F32>, grid, dim3(kThreads), 0, s, kc, vc, kv.block_tokens, bb,
                 kv.n_kv_heads, k, v);
      break;
    case KvT::F16:
      launch_pdl(kv_write_kernel<KvT::F16>, grid, dim3(kThreads), 0, s, kc, vc, kv.block_tokens, bb,
                 kv.n_kv_heads, k, v);
      break;
    case KvT::Q8:
      launch_pdl(kv_write_kernel<KvT::Q8>, grid, dim3(kThreads), 0, s, kc, vc, kv.block_tokens, bb,
                 kv.n_kv_heads, k, v);
      break;
  }
}

bool rope_kv_write_norms_fuse(const KvLayer& kv, const float* q, const float* k,
                              const float* q_norm, const float* k_norm) {
  const auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return kv.head_dim_k % 4 == 0 && kv.head_dim_k / 4 <= kThreads && a16(q) && a16(k) &&
         q_norm != nullptr && k_norm != nullptr && a16(q_norm) && a16(k_norm);
}

void rope_kv_write(const KvLayer& kv, const AttnBatch& b, int64_t n_tokens, float* q,
                   int32_t n_heads_q, float* k, const float* v, int32_t n_pairs, bool neox,
                   const float* cos, const float* sin, cudaStream_t s, const float* q_norm,
                   const float* k_norm, float eps) {
  if (n_tokens <= 0) return;
  check_layer(kv);
  KILN_CUDA_ASSERT(kv.head_dim_k <= kMaxHeadDim && 2 * n_pairs <= kv.head_dim_k);
  KILN_CUDA_ASSERT((q_norm == nullptr) == (k_norm == nullptr));
  KILN_CUDA_ASSERT(q_norm == nullptr || rope_kv_write_norms_fuse(kv, q, k, q_norm, k_norm));
  const dim3 grid(static_cast<unsigned>(n_tokens),
                  static_cast<unsigned>(n_heads_q + kv.n_kv_heads));
  const Cache kc = cache_of(kv, true), vc = cache_of(kv, false);
  const Batch bb = batch_of(b);
  switch (kv_t(kv.type)) {
    case KvT::F32:
      launch_pdl(rope_kv_write_kernel<KvT::F32>, grid, dim3(kThreads), 0, s, kc, vc,
                 kv.block_tokens, bb, kv.n_kv_heads, q, n_heads_q, k, v, n_pairs, neox, cos, sin,
                 q_norm, k_norm, eps);
      break;
    case KvT::F16:
      launch_pdl(rope_kv_write_kernel<KvT::F16>, grid, dim3(kThreads), 0, s, kc, vc,
                 kv.block_tokens, bb, kv.n_kv_heads, q, n_heads_q, k, v, n_pairs, neox, cos, sin,
                 q_norm, k_norm, eps);
      break;
    case KvT::Q8:
      launch_pdl(rope_kv_write_kernel<KvT::Q8>, grid, dim3(kThreads), 0, s, kc, vc, kv.block_tokens,
                 bb, kv.n_kv_heads, q, n_heads_q, k, v, n_pairs, neox, cos, sin, q_norm, k_norm,
                 eps);
      break;
  }
}

bool attention_decode_tc_supports(const KvLayer& kv) {
  return kv.type == quant::Type::F16 && kv.head_dim_k == kv.head_dim_v &&
         (kv.head_dim_k == 64 || kv.head_dim_k == 128 || kv.head_dim_k == 256);
}

namespace {

// CTAs of the decode kernel that fit on one multiprocessor (its registers and shared memory),
// read once per kernel: the split count fills one wave of them.
int decode_ctas_per_sm(bool tc, const KvLayer& kv) {
  static int fp32 = 0, tc_by_dim[3] = {0, 0, 0};
  const int d = kv.head_dim_k;
  int& slot = !tc ? fp32 : tc_by_dim[d == 64 ? 0 : d == 128 ? 1 : 2];
  if (slot == 0) {
    int n = 0;
    if (tc) {
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &n, reinterpret_cast<const void*>(pick_decode_tc(d)), kThreads, 0);
    }
    // The fp32 kernel: about four (its shared memory allows five at head dim 128).
    slot = n > 0 ? n : 4;
  }
  return slot;
}

bool decode_tc_enabled() {
  static const bool on = !env_is("KILN_CUDA_ATTN_DECODE_TC", "0");
  return on;
}

}  // namespace

int32_t attention_decode_splits(const KvLayer& kv, int64_t n_tokens, const AttnParams& p,
                                AttnKernel kernel) {
  if (p.workspace == nullptr || n_tokens <= 0) return 1;
  const bool tc =
      attention_decode_tc_supports(kv) &&
      (kernel == AttnKernel::DecodeTc || (kernel == AttnKernel::Auto && decode_tc_enabled()));
  const int group = p.n_heads / kv.n_kv_heads;
  const int64_t ctas = n_tokens * kv.n_kv_heads * ((group + kHeadChunk - 1) / kHeadChunk);
  int sms = current_sm_count();
  if (sms <= 0) sms = 132;
  // One wave of resident CTAs, each walking a long enough stretch of context (the kernel's
  // min_split_blocks).
  int64_t splits = (decode_ctas_per_sm(tc, kv) * int64_t{sms}) / ctas;
  static const int forced = [] {  // KILN_CUDA_ATTN_SPLITS=N: N splits, for comparisons
    const char* e = std::getenv("KILN_CUDA_ATTN_SPLITS");
    const int v = e == nullptr ? 0 : std::atoi(e);
    return v >= 1 && v <= kMaxSplits ? v : 0;
  }();
  if (forced > 0) splits = forced;
  splits = std::min<int64_t>(splits, kMaxSplits);
  const int64_t partial_bytes = p.workspace_bytes - counter_bytes(p.n_heads);
  if (partial_bytes <= 0) return 1;
  splits = std::min<int64_t>(
      splits, partial_bytes / (n_tokens * split_bytes_per_token(p.n_heads, kv.head_dim_v)));
  return static_cast<int32_t>(std::max<int64_t>(splits, 1));
}

bool attention_with(AttnKernel kernel, const KvLayer& kv, const AttnBatch& b, int64_t n_tokens,
                    int32_t max_q_len, const float* q, float* out, const AttnParams& p,
                    cudaStream_t s) {
  if (n_tokens <= 0 || b.num_seqs <= 0) return false;
  check_layer(kv);
  // The deterministic mode: the decode kernels for every row.
  if (p.deterministic && kernel == AttnKernel::Auto)
    kernel = attention_decode_tc_supports(kv) ? AttnKernel::DecodeTc : AttnKernel::Decode;
  KILN_CUDA_ASSERT(p.n_heads > 0 && p.n_heads % kv.n_kv_heads == 0);
  KILN_CUDA_ASSERT(p.causal || p.sliding_window == 0);  // a window of what, without an order
  const bool decode = kernel == AttnKernel::Decode || kernel == AttnKernel::DecodeTc ||
                      (kernel == AttnKernel::Auto && max_q_len <= 1);
  const bool decode_tc =
      decode && attention_decode_tc_supports(kv) &&
      (kernel == AttnKernel::DecodeTc || (kernel == AttnKernel::Auto && decode_tc_enabled()));
  static const bool tc_enabled = !env_is("KILN_CUDA_ATTN_TC", "0");
  if (kernel == AttnKernel::PrefillTc || (kernel == AttnKernel::Auto && !decode && tc_enabled)) {
    if (attention_prefill_tc(kv, b, n_tokens, max_q_len, q, out, p, s)) return false;
  }
  const int bucket = dim_bucket(kv);
  AttnArgs a{};
  a.k = cache_of(kv, true);
  a.v = cache_of(kv, false);
  a.block_tokens = kv.block_tokens;
  a.b = batch_of(b);
  a.q = q;
  a.out = out;
  a.ws = static_cast<float*>(p.workspace);
  a.n_tokens = static_cast<int32_t>(n_tokens);
  a.n_heads = p.n_heads;
  a.group = p.n_heads / kv.n_kv_heads;
  a.n_hchunks = (a.group + kHeadChunk - 1) / kHeadChunk;
  a.window = p.sliding_window;
  a.causal = p.causal;
  a.scale = p.scale;
  a.softcap = p.softcap;
  const AttnKernelFn fn =
      decode_tc ? pick_decode_tc(kv.head_dim_k) : pick(decode, kv_t(kv.type), bucket);
  if (!decode_tc) allow_smem(fn, decode, bucket);
  const unsigned gy = static_cast<unsigned>(kv.n_kv_heads * a.n_hchunks);
  if (decode) {
    const bool fixed = p.deterministic && p.workspace != nullptr;
    a.n_splits = fixed
                     ? kDetSplits
                     : attention_decode_splits(
                           kv, n_tokens, p, decode_tc ? AttnKernel::DecodeTc : AttnKernel::Decode);
    static const int min_split = [] {  // KILN_CUDA_ATTN_MIN_SPLIT=N (blocks) for comparisons
      const char* e = std::getenv("KILN_CUDA_ATTN_MIN_SPLIT");
      const int v = e == nullptr ? kMinSplitBlocks : std::atoi(e);
      return v >= 1 && v <= 64 ? v : kMinSplitBlocks;
    }();
    a.min_split_blocks = fixed ? kDetSplitBlocks : min_split;
    if (a.n_splits > 1) {
      a.counters = reinterpret_cast<int*>(static_cast<char*>(p.workspace) + p.workspace_bytes -
                                          counter_bytes(p.n_heads));
    }
    const bool q8 = p.xq != nullptr && p.xds != nullptr && kv.head_dim_v % 32 == 0;
    if (q8) a.xq = p.xq, a.xds = p.xds;
    const size_t smem = decode_tc ? 0 : decode_smem_bytes(kv.head_dim_k, kv.head_dim_v);
    // The fixed split count's partials for runs of rows the workspace holds (else one run: the
    // split count fits the workspace, attention_decode_splits).
    int64_t run = n_tokens;
    if (fixed) {
      const int64_t partial_rows = (p.workspace_bytes - counter_bytes(p.n_heads)) /
                                   split_bytes_per_token(p.n_heads, kv.head_dim_v);
      run = std::min<int64_t>(kMaxSplitRows, partial_rows / a.n_splits);
      KILN_CUDA_ASSERT(run >= 1);
    }
    for (int64_t r0 = 0; r0 < n_tokens; r0 += run) {
      AttnArgs ar = a;
      ar.row0 = static_cast<int32_t>(r0);
      ar.n_tokens = static_cast<int32_t>(std::min(run, n_tokens - r0));
      ar.q = q + r0 * p.n_heads * kv.head_dim_k;
      ar.out = out + r0 * p.n_heads * kv.head_dim_v;
      if (q8) {
        ar.xq = a.xq + r0 * p.n_heads * kv.head_dim_v;
        ar.xds = a.xds + r0 * p.n_heads * kv.head_dim_v / 32;
      }
      const dim3 grid(static_cast<unsigned>(ar.n_tokens), gy, static_cast<unsigned>(a.n_splits));
      launch_pdl(fn, grid, dim3(kThreads), smem, s, ar);
    }
    return q8;
  }
  const int rows = bucket > 128 ? 32 : 64;
  a.n_splits = 1;
  a.tile_tokens = std::max(1, rows / std::min(a.group, kHeadChunk));
  a.tiles_per_seq = (std::max(max_q_len, 1) + a.tile_tokens - 1) / a.tile_tokens;
  const dim3 grid(static_cast<unsigned>(int64_t{b.num_seqs} * a.tiles_per_seq), gy);
  fn<<<grid, kThreads, prefill_smem_bytes(rows, kv.head_dim_k, kv.head_dim_v), s>>>(a);
  return false;
}

bool attention(const KvLayer& kv, const AttnBatch& b, int64_t n_tokens, int32_t max_q_len,
               const float* q, float* out, const AttnParams& p, cudaStream_t s) {
  return attention_with(AttnKernel::Auto, kv, b, n_tokens, max_q_len, q, out, p, s);
}

void kv_read(const KvLayer& kv, bool is_k, int64_t block, int32_t in_block, int32_t kvh,
             float* host_out) {
  const Cache c = cache_of(kv, is_k);
  const uint8_t* head = c.data + block * c.block_bytes + int64_t{kvh} * c.head_bytes;
  const int dim = c.dim;
  if (kv.type == quant::Type::F32) {
    KILN_CUDA_ASSERT(cudaMemcpy(host_out, head + int64_t{in_block} * dim * 4, size_t(dim) * 4,
                                cudaMemcpyDeviceToHost) == cudaSuccess);
  } else if (kv.type == quant::Type::F16) {
    std::vector<uint16_t> h(static_cast<size_t>(dim));
    KILN_CUDA_ASSERT(cudaMemcpy(h.data(), head + int64_t{in_block} * dim * 2, size_t(dim) * 2,
                                cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int d = 0; d < dim; ++d) host_out[d] = quant::fp16_to_fp32(h[d]);
  } else {
    std::vector<int8_t> qs(static_cast<size_t>(dim));
    std::vector<uint16_t> ds(static_cast<size_t>(dim / 32));
    KILN_CUDA_ASSERT(cudaMemcpy(qs.data(), head + int64_t{in_block} * dim, size_t(dim),
                                cudaMemcpyDeviceToHost) == cudaSuccess);
    KILN_CUDA_ASSERT(
        cudaMemcpy(ds.data(),
                   head + int64_t{kv.block_tokens} * dim + int64_t{in_block} * (dim / 32) * 2,
                   ds.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int d = 0; d < dim; ++d)
      host_out[d] = static_cast<float>(qs[d]) * quant::fp16_to_fp32(ds[d / 32]);
  }
}

}  // namespace kiln::backend::cuda
