// Prefill attention on the tensor cores (FlashAttention-2 style), for F16 caches with
// head_dim_k == head_dim_v in {64, 128, 256}: the common case, which the fp32 kernel of
// attention.cu runs at CUDA-core speed. (256: Gemma and the Qwen3.5 / Qwen3-Next family's
// full-attention layers.)
//
// One CTA of 4 warps per (sequence, tile of query rows, kv head, <= 8 query heads of it), as
// the fp32 prefill kernel: a tile is 64 rows of (token, head). Q is rounded to fp16 once into
// shared memory and each warp keeps the A fragments of its 16 rows in registers. Keys run in
// chunks of 64 from the tile's first visible position to its last query position (the
// sequence's last key when not causal: AttnParams::causal false); each chunk's
// K and V rows are copied from their paged blocks into shared memory with cp.async (keys outside
// the range are zero-filled), double-buffered so the next chunk's copies overlap this chunk's
// math. S = Q K^T on mma.sync m16n8k16 (fp16 in, fp32 out), the scale, softcap and the causal /
// sliding-window mask in fp32 registers (no mask on the chunks every row of the tile sees
// whole), an online softmax per row in base 2 (the row's 4 lanes reduce the max with shuffles;
// the normaliser stays per lane until the end), then P (rounded to fp16) times V on the tensor
// cores again, accumulated in fp32.
//
// Precision: Q and P are rounded to fp16 (K and V are the cache's fp16 values): the output is
// within ~1e-3 of max |V| of the fp32 reference (the test's bound: 4e-3).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "kiln/backend/cuda/attention_impl.h"
#include "kiln/backend/cuda/device.h"
#include "kiln/backend/cuda/env.h"

namespace kiln::backend::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps, 16 rows each
constexpr int kRows = 64;
constexpr int kKeys = 64;      // keys per chunk
constexpr int kHeadChunk = 8;  // query heads of one kv head per CTA (as attention.cu)

struct TcArgs {
  const uint8_t* k;
  const uint8_t* v;
  int64_t k_block_bytes, v_block_bytes, k_head_bytes, v_head_bytes;
  int32_t block_tokens;
  const int32_t* qo;
  const int32_t* kv_ptr;
  const int32_t* kv_idx;
  const int32_t* pos;
  const int32_t* kv_len;  // [num_seqs]
  const float* q;         // [n_tokens, n_heads, D]
  float* out;             // [n_tokens, n_heads, D]
  int32_t n_heads, group, n_hchunks, tile_tokens, tiles_per_seq, window;
  bool causal;  // false: every row sees keys 0 .. kv_len - 1 of its sequence (window 0)
  float scale, softcap;
};

template <int D>
constexpr int row_stride() {  // halves per shared row: 16-byte multiple, not a 128-byte one
  return D + 8;
}
template <int D>
constexpr size_t smem_bytes() {
  return sizeof(__half) * static_cast<size_t>(row_stride<D>()) * (kRows + 4 * kKeys) +
         sizeof(int) * (kRows + 2);
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// c += a (16x16, row) * b (16x8, col), fp16 in, fp32 accumulate.
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&h);
}

// Issues the copies of keys [c0, c0 + kKeys) of K and V (kv head kvh) into Ks, Vs; keys
// outside [lo, hi) become zeros.
template <int D>
__device__ __forceinline__ void load_chunk(const TcArgs& a, const int32_t* blocks, int kvh, int c0,
                                           int lo, int hi, __half* Ks, __half* Vs) {
  constexpr int kUnits = D / 8;  // 16-byte pieces per row
  constexpr int kS = row_stride<D>();
#pragma unroll
  for (int i = 0; i < kKeys * kUnits / kThreads; ++i) {
    const int u = threadIdx.x + i * kThreads;
    const int j = u / kUnits, e = (u % kUnits) * 8;
    const int p = c0 + j;
    const bool valid = p >= lo && p < hi;
    const uint8_t* kp = a.k;
    const uint8_t* vp = a.v;
    if (valid) {
      const int64_t blk = blocks[p / a.block_tokens];
      const int64_t row = (p % a.block_tokens) * int64_t{D} + e;
      kp = a.k + blk * a.k_block_bytes + kvh * a.k_head_bytes + row * 2;
      vp = a.v + blk * a.v_block_bytes + kvh * a.v_head_bytes + row * 2;
    }
    cp_async16(Ks + j * kS + e, kp, valid);
    cp_async16(Vs + j * kS + e, vp, valid);
  }
}

// kExp2: the softmax in base 2 (the scale times log2 e folded into the logits, exp2f: one
// MUFU.EX2 a value, where expf adds the range reduction); the same probabilities up to
// rounding. KILN_CUDA_ATTN_EXP2=0 keeps expf (comparisons).
template <int D, bool kExp2>
__global__ void __launch_bounds__(kThreads) prefill_tc_kernel(const TcArgs a) {
  constexpr int kS = row_stride<D>();
  constexpr int kKSteps = D / 16;  // k-steps of S = Q K^T
  constexpr int kDTiles = D / 8;   // n-tiles of O
  extern __shared__ __align__(16) unsigned char smem[];
  __half* Qs = reinterpret_cast<__half*>(smem);  // [kRows][kS]
  __half* Kbuf = Qs + kRows * kS;                // [2][kKeys][kS]
  __half* Vbuf = Kbuf + 2 * kKeys * kS;          // [2][kKeys][kS]
  // [kRows] the last key each row sees (its position, or kv_len - 1 when not causal); -1 = no row
  int* pos_s = reinterpret_cast<int*>(Vbuf + 2 * kKeys * kS);
  int* range_s = pos_s + kRows;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  const int s = blockIdx.x / a.tiles_per_seq;
  const int q0 = a.qo[s] + (blockIdx.x - s * a.tiles_per_seq) * a.tile_tokens;
  const int qn = min(a.tile_tokens, a.qo[s + 1] - q0);
  if (qn <= 0) return;
  const int kvh = blockIdx.y / a.n_hchunks;
  const int hc = blockIdx.y - kvh * a.n_hchunks;
  const int h0 = kvh * a.group + hc * kHeadChunk;
  const int gc = min(kHeadChunk, a.group - hc * kHeadChunk);
  const int n_rows = qn * gc;  // row r: token q0 + r / gc, head h0 + r % gc
  const int32_t* blocks = a.kv_idx + a.kv_ptr[s];

  if (tid == 0) range_s[0] = INT_MAX, range_s[1] = -1;
  __syncthreads();
  if (tid < kRows) {
    int p = -1;
    if (tid < n_rows) {
      p = a.causal ? a.pos[q0 + tid / gc] : a.kv_len[s] - 1;
      atomicMin(&range_s[0], p);
      atomicMax(&range_s[1], p);
    }
    pos_s[tid] = p;
  }
  for (int u = tid; u < kRows * (D / 4); u += kThreads) {
    const int r = u / (D / 4), d4 = u % (D / 4);
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < n_rows) {
      const int64_t row = int64_t{q0 + r / gc} * a.n_heads + h0 + r % gc;
      x = reinterpret_cast<const float4*>(a.q + row * D)[d4];
    }
    uint2 h;
    h.x = pack_half2(x.x, x.y);
    h.y = pack_half2(x.z, x.w);
    *reinterpret_cast<uint2*>(Qs + r * kS + 4 * d4) = h;
  }
  __syncthreads();
  const int lo = a.window > 0 ? max(0, range_s[0] - a.window + 1) : 0;
  const int hi = range_s[1] + 1;
  // Chunks that end at or before the tile's first row's last key are visible to every row
  // (without a window): no mask there (the same values: the mask passes them all).
  const int unmasked_end = a.window > 0 ? INT_MIN : range_s[0] + 1;
  constexpr float kLog2e = 1.4426950408889634f;
  const float to_exp = kExp2 ? kLog2e : 1.0f;
  const float scale = a.scale * to_exp;
  if (hi <= lo) return;  // no row in the tile (cannot happen for a non-empty tile)

  // This warp's Q fragments: rows 16 warp + (0..15), all of D, in registers up to D = 128; at
  // 256 (the O accumulators alone take 128 registers) read from shared memory per chunk.
  constexpr bool kQRegs = D <= 128;
  const __half* q_frag = Qs + (16 * warp + (lane % 16)) * kS + 8 * (lane / 16);
  unsigned qf[kQRegs ? kKSteps : 1][4];
  if constexpr (kQRegs) {
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) ldmatrix_x4(qf[kk], q_frag + 16 * kk);
  }
  const int g = lane / 4, qd = lane % 4;  // fragment row (and row + 8), column pair
  const int pr0 = pos_s[16 * warp + g], pr1 = pos_s[16 * warp + g + 8];

  float o[kDTiles][4];
#pragma unroll
  for (int n = 0; n < kDTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // rows g, g + 8

  int buf = 0;
  load_chunk<D>(a, blocks, kvh, lo, lo, hi, Kbuf, Vbuf);
  cp_async_commit();
  for (int c0 = lo; c0 < hi; c0 += kKeys) {
    if (c0 + kKeys < hi) {
      load_chunk<D>(a, blocks, kvh, c0 + kKeys, lo, hi, Kbuf + (buf ^ 1) * kKeys * kS,
                    Vbuf + (buf ^ 1) * kKeys * kS);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const __half* Ks = Kbuf + buf * kKeys * kS;
    const __half* Vs = Vbuf + buf * kKeys * kS;

    // S = Q K^T: 16 rows x 64 keys per warp, 8 n-tiles of 8 keys.
    float sc[kKeys / 8][4];
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      unsigned qa[4];
      if constexpr (kQRegs) {
        qa[0] = qf[kk][0], qa[1] = qf[kk][1], qa[2] = qf[kk][2], qa[3] = qf[kk][3];
      } else {
        ldmatrix_x4(qa, q_frag + 16 * kk);
      }
#pragma unroll
      for (int j = 0; j < kKeys / 8; j += 2) {
        unsigned b[4];
        ldmatrix_x4(
            b, Ks + (8 * j + (lane % 8) + 8 * (lane / 16)) * kS + 16 * kk + 8 * ((lane / 8) % 2));
        mma16816(sc[j], qa, b[0], b[1]);
        mma16816(sc[j + 1], qa, b[2], b[3]);
      }
    }
    // Scale, softcap, mask; the rows' running max.
    float mx0 = -INFINITY, mx1 = -INFINITY;
    const bool masked = c0 + kKeys > unmasked_end;  // CTA-uniform
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x;
        if (a.softcap > 0.0f) {
          x = a.softcap * tanhf(sc[j][e] * a.scale / a.softcap) * to_exp;
        } else {
          x = sc[j][e] * scale;
        }
        if (masked) {
          const int p = c0 + 8 * j + 2 * qd + (e & 1);
          const int pr = e < 2 ? pr0 : pr1;
          const bool visible = pr >= 0 && p <= pr && (a.window <= 0 || p > pr - a.window);
          x = visible ? x : -INFINITY;
        }
        sc[j][e] = x;
        if (e < 2) {
          mx0 = fmaxf(mx0, x);
        } else {
          mx1 = fmaxf(mx1, x);
        }
      }
    }
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 *= 2) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float base0 = mn0 == -INFINITY ? 0.0f : mn0, base1 = mn1 == -INFINITY ? 0.0f : mn1;
    const float corr0 = kExp2 ? exp2f(m0 - base0) : expf(m0 - base0);
    const float corr1 = kExp2 ? exp2f(m1 - base1) : expf(m1 - base1);
    m0 = mn0, m1 = mn1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j) {
      if constexpr (kExp2) {
        sc[j][0] = exp2f(sc[j][0] - base0);
        sc[j][1] = exp2f(sc[j][1] - base0);
        sc[j][2] = exp2f(sc[j][2] - base1);
        sc[j][3] = exp2f(sc[j][3] - base1);
      } else {
        sc[j][0] = expf(sc[j][0] - base0);
        sc[j][1] = expf(sc[j][1] - base0);
        sc[j][2] = expf(sc[j][2] - base1);
        sc[j][3] = expf(sc[j][3] - base1);
      }
      sum0 += sc[j][0] + sc[j][1];
      sum1 += sc[j][2] + sc[j][3];
    }
    l0 = l0 * corr0 + sum0;
    l1 = l1 * corr1 + sum1;
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      o[n][0] *= corr0, o[n][1] *= corr0;
      o[n][2] *= corr1, o[n][3] *= corr1;
    }
    // O += P V: P's C fragments of two adjacent key tiles are the A fragment of a 16-key step.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      unsigned pf[4];
      pf[0] = pack_half2(sc[2 * kk][0], sc[2 * kk][1]);
      pf[1] = pack_half2(sc[2 * kk][2], sc[2 * kk][3]);
      pf[2] = pack_half2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
      pf[3] = pack_half2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
      for (int n = 0; n < kDTiles; n += 2) {
        unsigned b[4];
        ldmatrix_x4_trans(
            b, Vs + (16 * kk + (lane % 8) + 8 * ((lane / 8) % 2)) * kS + 8 * n + 8 * (lane / 16));
        mma16816(o[n], pf, b[0], b[1]);
        mma16816(o[n + 1], pf, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
    buf ^= 1;
  }
  cp_async_wait<0>();

#pragma unroll
  for (int o2 = 1; o2 <= 2; o2 *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
  }
  const int r0 = 16 * warp + g, r1 = r0 + 8;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half ? r1 : r0;
    const float l = half ? l1 : l0;
    if (r >= n_rows || l <= 0.0f) continue;
    const int64_t row = int64_t{q0 + r / gc} * a.n_heads + h0 + r % gc;
    float* out = a.out + row * D;
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      *reinterpret_cast<float2*>(out + 8 * n + 2 * qd) =
          make_float2(o[n][2 * half] / l, o[n][2 * half + 1] / l);
    }
  }
}

bool exp2_enabled() {
  static const bool on = !env_is("KILN_CUDA_ATTN_EXP2", "0");
  return on;
}

template <int D>
void launch_tc(const TcArgs& a, dim3 grid, cudaStream_t s) {
  auto go = [&](auto kernel) {
    allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem_bytes<D>());
    kernel<<<grid, kThreads, smem_bytes<D>(), s>>>(a);
  };
  // At D = 256 the base-2 form spilled registers (ptxas, 255 a thread): expf there.
  if constexpr (D <= 128) {
    if (exp2_enabled()) {
      go(prefill_tc_kernel<D, true>);
      return;
    }
  }
  go(prefill_tc_kernel<D, false>);
}

}  // namespace

bool attention_prefill_tc_supports(const KvLayer& kv) {
  return kv.type == quant::Type::F16 && kv.head_dim_k == kv.head_dim_v &&
         (kv.head_dim_k == 64 || kv.head_dim_k == 128 || kv.head_dim_k == 256);
}

bool attention_prefill_tc(const KvLayer& kv, const AttnBatch& b, int64_t n_tokens,
                          int32_t max_q_len, const float* q, float* out, const AttnParams& p,
                          cudaStream_t s) {
  if (!attention_prefill_tc_supports(kv)) return false;
  if (n_tokens <= 0 || b.num_seqs <= 0) return true;
  TcArgs a{};
  a.k = kv.k;
  a.v = kv.v;
  a.k_block_bytes = kv.k_block_bytes;
  a.v_block_bytes = kv.v_block_bytes;
  a.k_head_bytes = kv.k_block_bytes / kv.n_kv_heads;
  a.v_head_bytes = kv.v_block_bytes / kv.n_kv_heads;
  a.block_tokens = kv.block_tokens;
  a.qo = b.qo_indptr;
  a.kv_ptr = b.kv_indptr;
  a.kv_idx = b.kv_indices;
  a.pos = b.positions;
  a.kv_len = b.kv_len;
  a.q = q;
  a.out = out;
  a.n_heads = p.n_heads;
  a.group = p.n_heads / kv.n_kv_heads;
  a.n_hchunks = (a.group + kHeadChunk - 1) / kHeadChunk;
  a.tile_tokens = std::max(1, kRows / std::min(a.group, kHeadChunk));
  a.tiles_per_seq = (std::max(max_q_len, 1) + a.tile_tokens - 1) / a.tile_tokens;
  a.window = p.sliding_window;
  a.causal = p.causal;
  a.scale = p.scale;
  a.softcap = p.softcap;
  const dim3 grid(static_cast<unsigned>(int64_t{b.num_seqs} * a.tiles_per_seq),
                  static_cast<unsigned>(kv.n_kv_heads * a.n_hchunks));
  if (kv.head_dim_k == 64) {
    launch_tc<64>(a, grid, s);
  } else if (kv.head_dim_k == 256) {
    launch_tc<256>(a, grid, s);
  } else {
    launch_tc<128>(a, grid, s);
  }
  return true;
}

}  // namespace kiln::backend::cuda
