// The gated delta net kernels of kernels.h (qwen35/qwen3next linear attention): the causal
// conv1d + SiLU with its per-slot conv state, and the gated delta rule's recurrence. Each
// mirrors the CPU op of the same name (backend/cpu/delta_net.cpp); tests/unit/cuda/
// delta_net_test.cpp compares them on random inputs.
//
// The recurrence is latency-bound per token: a column j of a head's state S [dk, dv] evolves
// on its own given the token's k, q, beta, decay and v[j] (kv[j] and o[j] sum over i only), so
// a lane owns a column and a CTA the 32 columns of a block, its warps splitting the column's dk
// rows (in registers); per token each warp normalises q and k in shared memory, runs its rows'
// multiply-adds, and the partial sums meet in shared memory. Nothing allocates or synchronises
// the host: capturable in a CUDA graph.
//
// Prefill runs of at least kDeltaChunkRows rows take the chunked form instead (the WY/UT
// representation derived in backend/cpu/delta_net.cpp): a CTA per (sequence, value head, 32
// state columns) walks the run's chunks of 64 rows in order, each chunk a few matrix products
// in shared memory (the decayed q.k and beta k.k matrices, Q S0 and K S0, a forward
// substitution for the chunk's updates U, the outputs and the next state), so the dependent
// chain is 64 times shorter than the recurrence's. A column block of the state evolves on its
// own given the chunk's q, k, beta and decays (which each CTA recomputes), so the column blocks
// of a head run in parallel.
#include <cstdint>

#include <cuda_runtime.h>

#include "kiln/backend/cuda/device.h"
#include "kiln/backend/cuda/kernels.h"

namespace kiln::backend::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 2048;
constexpr int kDeltaCols = 32;  // state columns per block: one warp

int grid_for(int64_t n_items) {
  const int64_t blocks = (n_items + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

// The sequence that owns flat row t: the last s with qo_indptr[s] <= t.
__device__ int32_t seq_of_row(const int32_t* qo_indptr, int32_t num_seqs, int64_t t) {
  int32_t lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (qo_indptr[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// One output per thread (row, channel): the window's inputs before the sequence's first row
// come from its slot's conv state (zero when it starts at position 0). Sum in the CPU's order,
// each product and sum rounded (no FMA).
__global__ void conv1d_silu_kernel(DeltaLayer st, const int32_t* qo_indptr,
                                   const int32_t* positions, const int32_t* slots, int32_t num_seqs,
                                   int64_t n_tokens, const float* x, const float* w, float* out) {
  const int64_t n_c = st.conv_dim, k = st.conv_k, total = n_tokens * n_c;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t t = i / n_c, c = i - t * n_c;
    const int32_t seq = seq_of_row(qo_indptr, num_seqs, t);
    const int64_t begin = qo_indptr[seq];
    const bool fresh = positions[begin] == 0;
    const float* win = st.conv + slots[seq] * st.slot_stride;
    float a = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t src = t - (k - 1) + j;
      float v = 0.0f;
      if (src >= begin) {
        v = x[src * n_c + c];
      } else if (!fresh) {
        v = win[(src - begin + k - 1) * n_c + c];
      }
      a = __fadd_rn(a, __fmul_rn(w[c * k + j], v));
    }
    out[i] = a / (1.0f + expf(-a));
  }
}

// After conv1d_silu_kernel: each (sequence, channel) keeps its last conv_k - 1 inputs, oldest
// first. Entry m takes input end - (k - 1) + m: a row of the step, or old entry m + n of the
// window (n the sequence's rows), which this thread has not yet overwritten (m ascends).
__global__ void conv_state_kernel(DeltaLayer st, const int32_t* qo_indptr, const int32_t* positions,
                                  const int32_t* slots, int32_t num_seqs, const float* x) {
  const int64_t n_c = st.conv_dim, k = st.conv_k, total = int64_t{num_seqs} * n_c;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t seq = i / n_c, c = i - seq * n_c;
    const int64_t begin = qo_indptr[seq], end = qo_indptr[seq + 1], n = end - begin;
    if (n == 0) continue;
    const bool fresh = positions[begin] == 0;
    float* win = st.conv + slots[seq] * st.slot_stride;
    for (int64_t m = 0; m + 1 < k; ++m) {
      const int64_t src = end - (k - 1) + m;
      float v = 0.0f;
      if (src >= begin) {
        v = x[src * n_c + c];
      } else if (!fresh) {
        v = win[(m + n) * n_c + c];
      }
      win[m * n_c + c] = v;
    }
  }
}

__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A CTA per (sequence blockIdx.x, value head blockIdx.y, columns blockIdx.z * 32 + lane) runs
// the sequence's rows in order; its kMaxDk / 16 warps split the state's rows (warp w holds rows
// w + kWarps r, r < 16, of its lane's column in registers), so that a decode step has enough
// loads in flight to stream the state. Per row every warp normalises q and k into its own
// shared copy, the partial sums of S^T k and S^T q meet in shared memory (summed in warp order).
// kMaxDk >= head_k_dim (entries past head_k_dim stay zero).
template <int kMaxDk>
__global__ void __launch_bounds__(kMaxDk * 2)
    delta_rule_kernel(DeltaLayer st, const int32_t* qo_indptr, const int32_t* positions,
                      const int32_t* slots, const float* qkv, const float* alpha, const float* beta,
                      const float* ssm_a, const float* dt_bias, float* out, DeltaShape p,
                      int64_t chunk_min_rows) {
  constexpr int kRows = 16, kWarps = kMaxDk / kRows;
  __shared__ float qn[kWarps][kMaxDk], kn[kWarps][kMaxDk];
  __shared__ float red[2][kWarps][kDeltaCols];
  const int32_t seq = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int32_t j = blockIdx.z * kDeltaCols + lane;
  const int32_t dk = p.head_k_dim, dv = p.head_v_dim;
  const int32_t hk = p.tiled_heads ? h % p.n_k_heads : h / (p.n_v_heads / p.n_k_heads);
  const int64_t begin = qo_indptr[seq], end = qo_indptr[seq + 1];
  if (begin == end || end - begin >= chunk_min_rows) return;
  const bool fresh = positions[begin] == 0;
  const bool col = j < dv;
  float* state = st.ssm + slots[seq] * st.slot_stride + int64_t{h} * dk * dv;
  float s[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int32_t i = w + kWarps * r;
    s[r] = (col && i < dk && !fresh) ? state[int64_t{i} * dv + j] : 0.0f;
  }
  const float q_scale = 1.0f / sqrtf(static_cast<float>(dk));
  const int64_t n_c = st.conv_dim;
  for (int64_t t = begin; t < end; ++t) {
    const float* row = qkv + t * n_c;
    const float* q = row + int64_t{hk} * dk;
    const float* k = row + int64_t{p.n_k_heads + hk} * dk;
    double q_sum = 0.0, k_sum = 0.0;
    for (int i = lane; i < dk; i += 32) {
      q_sum += static_cast<double>(q[i]) * q[i];
      k_sum += static_cast<double>(k[i]) * k[i];
    }
    const float q_inv = static_cast<float>(1.0 / sqrt(warp_sum(q_sum) + p.norm_eps));
    const float k_inv = static_cast<float>(1.0 / sqrt(warp_sum(k_sum) + p.norm_eps));
    for (int i = lane; i < dk; i += 32) {
      qn[w][i] = __fmul_rn(__fmul_rn(q[i], q_inv), q_scale);
      kn[w][i] = __fmul_rn(k[i], k_inv);
    }
    __syncwarp();
    const int64_t ah = t * p.n_v_heads + h;
    const float b = 1.0f / (1.0f + expf(-beta[ah]));
    const float x = alpha[ah] + dt_bias[h];
    const float g = __fmul_rn(ssm_a[h], x > 20.0f ? x : log1pf(expf(x)));
    const float decay = expf(g);
    float kv = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int32_t i = w + kWarps * r;
      if (i < dk) {
        s[r] *= decay;
        kv = fmaf(s[r], kn[w][i], kv);
      }
    }
    red[0][w][lane] = kv;
    __syncthreads();
    kv = 0.0f;
#pragma unroll
    for (int u = 0; u < kWarps; ++u) kv += red[0][u][lane];
    const float v = col ? row[2 * int64_t{p.n_k_heads} * dk + int64_t{h} * dv + j] : 0.0f;
    const float delta = (v - kv) * b;
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int32_t i = w + kWarps * r;
      if (i < dk) {
        s[r] = fmaf(kn[w][i], delta, s[r]);
        o = fmaf(s[r], qn[w][i], o);
      }
    }
    red[1][w][lane] = o;
    __syncthreads();
    if (w == 0 && col) {
      o = 0.0f;
#pragma unroll
      for (int u = 0; u < kWarps; ++u) o += red[1][u][lane];
      out[ah * dv + j] = o;
    }
  }
  if (!col) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int32_t i = w + kWarps * r;
    if (i < dk) state[int64_t{i} * dv + j] = s[r];
  }
}

// ---- the chunked form ----------------------------------------------------------------------

constexpr int kChunk = 64;  // rows per chunk: cpu::kDeltaChunkRows
constexpr int kChunkThreads = 256;
constexpr int kChunkWarps = kChunkThreads / 32;
constexpr int kUStride = 36;  // U's row stride: the forward substitution's lanes hit 32 banks
constexpr int kMStride = kChunk + 4;

// q and k rows in shared memory: dk rounded up to 4 (zero-padded, for 16-byte loads) plus 4,
// so that 8 consecutive rows fall in 8 different 16-byte bank groups.
__host__ __device__ constexpr int32_t chunk_dk4(int32_t dk) {
  return (dk + 3) / 4 * 4;
}
__host__ __device__ constexpr int32_t chunk_kp(int32_t dk) {
  return chunk_dk4(dk) + 4;
}
// Shared memory of delta_chunked_kernel for head_k_dim dk: kChunk doubles, then floats.
size_t chunk_smem_bytes(int32_t dk) {
  const int64_t floats = 3 * kChunk + 2 * int64_t{kChunk} * chunk_kp(dk) +
                         int64_t{chunk_dk4(dk)} * kDeltaCols + kChunk * kUStride +
                         kChunk * kDeltaCols + 2 * kChunk * kMStride;
  return kChunk * sizeof(double) + static_cast<size_t>(floats) * sizeof(float);
}

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}
__device__ __forceinline__ float4 lds4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

// A CTA per (sequence blockIdx.x, value head blockIdx.y, state columns blockIdx.z * 32 + lane)
// over sequences of at least min_rows rows: their chunks in order (cpu::gated_delta_rule's
// chunked_rows, the same steps; sums in other orders and FMA-contracted). Per chunk: the rows
// (q, k normalised, beta, the cumulative decays), M and A (a 4 x 4 tile of each per thread),
// Q S0 and K S0 with the right-hand sides, the forward substitution in registers (8 threads per
// column, the solved u_s passed by shuffle), the outputs, the next state.
__global__ void __launch_bounds__(kChunkThreads, 1)
    delta_chunked_kernel(DeltaLayer st, const int32_t* qo_indptr, const int32_t* positions,
                         const int32_t* slots, const float* qkv, const float* alpha,
                         const float* beta, const float* ssm_a, const float* dt_bias, float* out,
                         DeltaShape p, int64_t min_rows) {
  const int64_t begin = qo_indptr[blockIdx.x], end = qo_indptr[blockIdx.x + 1];
  if (end - begin < min_rows || end == begin) return;
  extern __shared__ double chunk_smem[];
  const int32_t h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int32_t dk = p.head_k_dim, dv = p.head_v_dim, dk4 = chunk_dk4(dk), kp = chunk_kp(dk);
  const int32_t j = blockIdx.z * kDeltaCols + lane;
  const bool col = j < dv;
  const int32_t hk = p.tiled_heads ? h % p.n_k_heads : h / (p.n_v_heads / p.n_k_heads);
  double* g_cum = chunk_smem;                                 // [kChunk] G_t (double)
  float* sb = reinterpret_cast<float*>(chunk_smem + kChunk);  // [kChunk] beta_t
  float* eg = sb + kChunk;                                    // [kChunk] exp(G_t)
  float* to_end = eg + kChunk;                                // [kChunk] exp(G_n - G_t)
  float* qs = to_end + kChunk;                                // [kChunk, kp] q normalised
  float* ks = qs + kChunk * kp;                               // [kChunk, kp] k normalised
  float* S = ks + kChunk * kp;                                // [dk4, 32] the state's columns
  float* U = S + dk4 * kDeltaCols;                            // [kChunk, kUStride] updates
  float* O = U + kChunk * kUStride;                           // [kChunk, 32] Q S0, outputs
  float* A = O + kChunk * kDeltaCols;  // [kChunk, kMStride] beta_t e^(G_t-G_s) k_t.k_s, s < t
  float* M = A + kChunk * kMStride;    // [kChunk, kMStride] e^(G_t-G_s) q_t.k_s, s <= t
  const bool fresh = positions[begin] == 0;
  float* state = st.ssm + slots[blockIdx.x] * st.slot_stride + int64_t{h} * dk * dv;
  for (int32_t i = warp; i < dk4; i += kChunkWarps)
    S[i * kDeltaCols + lane] = (col && !fresh && i < dk) ? state[int64_t{i} * dv + j] : 0.0f;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(dk));
  const int64_t n_c = st.conv_dim;
  const int64_t v_off = 2 * int64_t{p.n_k_heads} * dk + int64_t{h} * dv + j;
  constexpr int kRowsPerWarp = kChunk / kChunkWarps;  // 8
  constexpr int kPerLane = kDeltaMaxHeadDimK / 32;    // 4
  for (int64_t c0 = begin; c0 < end; c0 += kChunk) {
    const int32_t n = static_cast<int32_t>(min(int64_t{kChunk}, end - c0));
    // The rows t = warp + 8 a: every load issued first, then the sums (in double, as the
    // recurrence), then the normalised rows (zero past dk).
    {
      float qv[kRowsPerWarp][kPerLane], kv[kRowsPerWarp][kPerLane];
#pragma unroll
      for (int a = 0; a < kRowsPerWarp; ++a) {
        const int32_t t = warp + kChunkWarps * a;
        const float* row = qkv + (c0 + min(t, n - 1)) * n_c;
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) {
          const int32_t i = lane + 32 * c;
          qv[a][c] = i < dk ? row[int64_t{hk} * dk + i] : 0.0f;
          kv[a][c] = i < dk ? row[int64_t{p.n_k_heads + hk} * dk + i] : 0.0f;
        }
      }
#pragma unroll
      for (int a = 0; a < kRowsPerWarp; ++a) {
        double q_sum = 0.0, k_sum = 0.0;
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) {
          q_sum += static_cast<double>(qv[a][c]) * qv[a][c];
          k_sum += static_cast<double>(kv[a][c]) * kv[a][c];
        }
        const float q_inv = static_cast<float>(1.0 / sqrt(warp_sum(q_sum) + p.norm_eps));
        const float k_inv = static_cast<float>(1.0 / sqrt(warp_sum(k_sum) + p.norm_eps));
        const int32_t t = warp + kChunkWarps * a;
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) {  // columns [dk, dk4) zero: the 16-byte loads read them
          const int32_t i = lane + 32 * c;
          if (i < dk) {
            qs[t * kp + i] = __fmul_rn(__fmul_rn(qv[a][c], q_inv), q_scale);
            ks[t * kp + i] = __fmul_rn(kv[a][c], k_inv);
          } else if (i < kp) {
            qs[t * kp + i] = 0.0f;
            ks[t * kp + i] = 0.0f;
          }
        }
      }
      if (tid < n) {
        const int64_t ah = (c0 + tid) * p.n_v_heads + h;
        sb[tid] = 1.0f / (1.0f + expf(-beta[ah]));
        const float x = alpha[ah] + dt_bias[h];
        g_cum[tid] = __fmul_rn(ssm_a[h], x > 20.0f ? x : log1pf(expf(x)));
      }
    }
    __syncthreads();
    if (warp == 0) {
      // The cumulative decays: an inclusive scan of two rows per lane, then exp.
      const double g0 = 2 * lane < n ? g_cum[2 * lane] : 0.0;
      const double g1 = 2 * lane + 1 < n ? g_cum[2 * lane + 1] : 0.0;
      double incl = g0 + g1;
      for (int o = 1; o < 32; o <<= 1) {
        const double v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const double c0v = incl - g1;                            // through row 2 lane
      const double last = __shfl_sync(0xffffffffu, incl, 31);  // G of row n - 1 (zeros after)
      if (2 * lane < n) {
        g_cum[2 * lane] = c0v;
        eg[2 * lane] = static_cast<float>(exp(c0v));
        to_end[2 * lane] = static_cast<float>(exp(last - c0v));
      }
      if (2 * lane + 1 < n) {
        g_cum[2 * lane + 1] = incl;
        eg[2 * lane + 1] = static_cast<float>(exp(incl));
        to_end[2 * lane + 1] = static_cast<float>(exp(last - incl));
      }
    }
    __syncthreads();
    // M and A: thread (ty, tx) owns rows t = ty + 16 a and columns s = tx + 16 b.
    {
      const int32_t tx = tid & 15, ty = tid >> 4;
      float am[4][4], aa[4][4];
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) am[a][b] = aa[a][b] = 0.0f;
      for (int32_t i = 0; i < dk4; i += 4) {
        float4 qa[4], ka[4], kb[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          qa[a] = lds4(qs + (ty + 16 * a) * kp + i);
          ka[a] = lds4(ks + (ty + 16 * a) * kp + i);
          kb[a] = lds4(ks + (tx + 16 * a) * kp + i);
        }
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            am[a][b] = dot4(qa[a], kb[b], am[a][b]);
            aa[a][b] = dot4(ka[a], kb[b], aa[a][b]);
          }
      }
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const int32_t t = ty + 16 * a;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int32_t s = tx + 16 * b;
          const bool in = t < n && s <= t;
          const float d = in ? expf(static_cast<float>(g_cum[t] - g_cum[s])) : 0.0f;
          M[t * kMStride + s] = in ? am[a][b] * d : 0.0f;
          A[t * kMStride + s] = in && s < t ? aa[a][b] * (d * sb[t]) : 0.0f;
        }
      }
    }
    // Q S0 and K S0: a thread owns column lane of rows t = warp + 8 a. U takes the
    // right-hand sides beta_t (v_t - exp(G_t) (K S0)_t), O takes exp(G_t) (Q S0)_t; rows past
    // n are zero.
    {
      float aq[kRowsPerWarp], ak[kRowsPerWarp];
#pragma unroll
      for (int a = 0; a < kRowsPerWarp; ++a) aq[a] = ak[a] = 0.0f;
      for (int32_t i = 0; i < dk4; i += 4) {
        const float4 s4 =
            make_float4(S[i * kDeltaCols + lane], S[(i + 1) * kDeltaCols + lane],
                        S[(i + 2) * kDeltaCols + lane], S[(i + 3) * kDeltaCols + lane]);
#pragma unroll
        for (int a = 0; a < kRowsPerWarp; ++a) {
          const int32_t t = warp + kChunkWarps * a;
          aq[a] = dot4(lds4(qs + t * kp + i), s4, aq[a]);
          ak[a] = dot4(lds4(ks + t * kp + i), s4, ak[a]);
        }
      }
#pragma unroll
      for (int a = 0; a < kRowsPerWarp; ++a) {
        const int32_t t = warp + kChunkWarps * a;
        const bool live = t < n;
        const float v = col && live ? qkv[(c0 + t) * n_c + v_off] : 0.0f;
        U[t * kUStride + lane] = live ? sb[t] * (v - eg[t] * ak[a]) : 0.0f;
        O[t * kDeltaCols + lane] = live ? aq[a] * eg[t] : 0.0f;
      }
    }
    __syncthreads();
    // The forward substitution u_t -= sum_{s<t} A[t][s] u_s, column-oriented: 8 threads per
    // column (lane & 3 picks it within the warp's 4), thread r = lane >> 2 holds rows
    // r + 8 m; u_s is final when step s starts, passed from its owner by shuffle.
    {
      const int32_t jc = warp * 4 + (lane & 3), r = lane >> 2;
      float x[kRowsPerWarp];
#pragma unroll
      for (int m = 0; m < kRowsPerWarp; ++m) x[m] = U[(r + 8 * m) * kUStride + jc];
#pragma unroll
      for (int s = 0; s < kChunk - 1; ++s) {
        const float us = __shfl_sync(0xffffffffu, x[s >> 3], (s & 7) * 4 + (lane & 3));
#pragma unroll
        for (int m = 0; m < kRowsPerWarp; ++m) {
          const int32_t t = r + 8 * m;
          if (t > s) x[m] = fmaf(-A[t * kMStride + s], us, x[m]);
        }
      }
#pragma unroll
      for (int m = 0; m < kRowsPerWarp; ++m) U[(r + 8 * m) * kUStride + jc] = x[m];
    }
    __syncthreads();
    // Outputs exp(G_t) Q S0 + sum_{s<=t} M[t][s] u_s (rows t = warp + 8 a).
    {
      float acc[kRowsPerWarp];
#pragma unroll
      for (int a = 0; a < kRowsPerWarp; ++a)
        acc[a] = O[(warp + kChunkWarps * a) * kDeltaCols + lane];
      for (int32_t s = 0; s < n; s += 4) {
        const float4 u4 = make_float4(U[s * kUStride + lane], U[(s + 1) * kUStride + lane],
                                      U[(s + 2) * kUStride + lane], U[(s + 3) * kUStride + lane]);
#pragma unroll
        for (int a = 0; a < kRowsPerWarp; ++a)
          acc[a] = dot4(lds4(M + (warp + kChunkWarps * a) * kMStride + s), u4, acc[a]);
      }
      if (col) {
#pragma unroll
        for (int a = 0; a < kRowsPerWarp; ++a) {
          const int32_t t = warp + kChunkWarps * a;
          if (t < n) out[((c0 + t) * p.n_v_heads + h) * dv + j] = acc[a];
        }
      }
    }
    // The state after the chunk: exp(G_n) S0 + sum_t k_t (exp(G_n - G_t) u_t)^T; warp w owns
    // state rows 16 w .. 16 w + 15.
    {
      constexpr int kRows = kDeltaMaxHeadDimK / kChunkWarps;  // 16
      const int32_t i0 = kRows * warp;
      if (i0 < dk4) {
        const float e = eg[n - 1];
        float acc[kRows];
#pragma unroll
        for (int c = 0; c < kRows; ++c)
          acc[c] = i0 + c < dk4 ? S[(i0 + c) * kDeltaCols + lane] * e : 0.0f;
        for (int32_t t = 0; t < n; ++t) {
          const float u = U[t * kUStride + lane] * to_end[t];
#pragma unroll
          for (int c = 0; c < kRows; c += 4) {
            if (i0 + c < dk4) {
              const float4 k4 = lds4(ks + t * kp + i0 + c);
              acc[c] = fmaf(k4.x, u, acc[c]);
              acc[c + 1] = fmaf(k4.y, u, acc[c + 1]);
              acc[c + 2] = fmaf(k4.z, u, acc[c + 2]);
              acc[c + 3] = fmaf(k4.w, u, acc[c + 3]);
            }
          }
        }
#pragma unroll
        for (int c = 0; c < kRows; ++c)
          if (i0 + c < dk4) S[(i0 + c) * kDeltaCols + lane] = acc[c];
      }
    }
    __syncthreads();  // the next chunk overwrites q, k, U, O, g
  }
  if (!col) return;
  for (int32_t i = warp; i < dk; i += kChunkWarps)
    state[int64_t{i} * dv + j] = S[i * kDeltaCols + lane];
}

// Whether the chunked kernel takes head_k_dim dk (its dynamic shared memory limit raised once
// per device, for the largest dk).
bool chunked_ready(int32_t dk) {
  return dk <= kDeltaMaxHeadDimK &&
         allow_dynamic_smem(reinterpret_cast<const void*>(delta_chunked_kernel),
                            chunk_smem_bytes(kDeltaMaxHeadDimK));
}

}  // namespace

void conv1d_silu(const DeltaLayer& st, const AttnBatch& b, const int32_t* slots, int64_t n_tokens,
                 const float* x, const float* w, float* out, cudaStream_t s) {
  if (b.num_seqs <= 0 || n_tokens <= 0) return;
  conv1d_silu_kernel<<<grid_for(n_tokens * st.conv_dim), kThreads, 0, s>>>(
      st, b.qo_indptr, b.positions, slots, b.num_seqs, n_tokens, x, w, out);
  if (st.conv_k > 1)
    conv_state_kernel<<<grid_for(int64_t{b.num_seqs} * st.conv_dim), kThreads, 0, s>>>(
        st, b.qo_indptr, b.positions, slots, b.num_seqs, x);
}

void gated_delta_rule(const DeltaLayer& st, const AttnBatch& b, const int32_t* slots,
                      int64_t n_tokens, const float* qkv, const float* alpha, const float* beta,
                      const float* ssm_a, const float* dt_bias, float* out, const DeltaShape& p,
                      DeltaKernel kernel, cudaStream_t s) {
  if (b.num_seqs <= 0) return;
  // Runs of kDeltaChunkRows+ rows chunked (none when the step has fewer tokens: decode steps
  // launch the recurrence alone), the rest by the recurrence.
  int64_t chunk_min_rows = kChunk;
  if (kernel == DeltaKernel::kRecurrent || n_tokens < kChunk) chunk_min_rows = INT64_MAX;
  if (kernel == DeltaKernel::kChunked) chunk_min_rows = 1;
  if (chunk_min_rows != INT64_MAX && !chunked_ready(p.head_k_dim)) chunk_min_rows = INT64_MAX;
  const dim3 grid(static_cast<unsigned>(b.num_seqs), static_cast<unsigned>(p.n_v_heads),
                  static_cast<unsigned>((p.head_v_dim + kDeltaCols - 1) / kDeltaCols));
  if (chunk_min_rows != INT64_MAX) {
    delta_chunked_kernel<<<grid, kChunkThreads, chunk_smem_bytes(p.head_k_dim), s>>>(
        st, b.qo_indptr, b.positions, slots, qkv, alpha, beta, ssm_a, dt_bias, out, p,
        chunk_min_rows);
  }
  if (chunk_min_rows == 1) return;
  // delta_rule_kernel<D> runs D / 16 warps (2 D threads).
  const auto launch = [&](auto kernel_fn, int max_dk) {
    kernel_fn<<<grid, 2 * max_dk, 0, s>>>(st, b.qo_indptr, b.positions, slots, qkv, alpha, beta,
                                          ssm_a, dt_bias, out, p, chunk_min_rows);
  };
  if (p.head_k_dim <= 32) {
    launch(delta_rule_kernel<32>, 32);
  } else if (p.head_k_dim <= 64) {
    launch(delta_rule_kernel<64>, 64);
  } else {
    launch(delta_rule_kernel<kDeltaMaxHeadDimK>, kDeltaMaxHeadDimK);
  }
}

}  // namespace kiln::backend::cuda
