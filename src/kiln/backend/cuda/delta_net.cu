// The gated delta net kernels of kernels.h (qwen35/qwen3next linear attention): the causal
// conv1d + SiLU with its per-slot conv state, and the gated delta rule's recurrence. Each
// mirrors the CPU op of the same name (backend/cpu/delta_net.cpp); tests/unit/cuda/
// delta_net_test.cpp compares them on random inputs.
//
// The recurrence is latency-bound per token: a column j of a head's state S [dk, dv] evolves
// on its own given the token's k, q, beta, decay and v[j] (kv[j] and o[j] sum over i only), so
// a lane owns a column in registers and a warp the 32 columns of a block; per token the warp
// loads q and k once, normalises them in shared memory and every lane runs 2 * dk dependent
// multiply-adds. Nothing allocates or synchronises the host: capturable in a CUDA graph.
#include <cstdint>

#include <cuda_runtime.h>

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

// A warp per (sequence blockIdx.x, value head blockIdx.y, columns blockIdx.z * 32 + lane) runs
// the sequence's rows in order. kMaxDk >= head_k_dim: the register array's size (indices are
// compile-time after unrolling; entries past head_k_dim stay unused).
template <int kMaxDk>
__global__ void __launch_bounds__(kDeltaCols)
    delta_rule_kernel(DeltaLayer st, const int32_t* qo_indptr, const int32_t* positions,
                      const int32_t* slots, const float* qkv, const float* alpha, const float* beta,
                      const float* ssm_a, const float* dt_bias, float* out, DeltaShape p) {
  __shared__ float qn[kMaxDk], kn[kMaxDk];
  const int32_t seq = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
  const int32_t j = blockIdx.z * kDeltaCols + lane;
  const int32_t dk = p.head_k_dim, dv = p.head_v_dim;
  const int32_t hk = p.tiled_heads ? h % p.n_k_heads : h / (p.n_v_heads / p.n_k_heads);
  const int64_t begin = qo_indptr[seq], end = qo_indptr[seq + 1];
  if (begin == end) return;
  const bool fresh = positions[begin] == 0;
  const bool col = j < dv;
  float* state = st.ssm + slots[seq] * st.slot_stride + int64_t{h} * dk * dv;
  float s[kMaxDk];
#pragma unroll
  for (int i = 0; i < kMaxDk; ++i)
    s[i] = (col && i < dk && !fresh) ? state[int64_t{i} * dv + j] : 0.0f;
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
    __syncwarp();  // every lane is done with the previous row's qn, kn
    for (int i = lane; i < dk; i += 32) {
      qn[i] = __fmul_rn(__fmul_rn(q[i], q_inv), q_scale);
      kn[i] = __fmul_rn(k[i], k_inv);
    }
    __syncwarp();
    const int64_t ah = t * p.n_v_heads + h;
    const float b = 1.0f / (1.0f + expf(-beta[ah]));
    const float x = alpha[ah] + dt_bias[h];
    const float g = __fmul_rn(ssm_a[h], x > 20.0f ? x : log1pf(expf(x)));
    const float decay = expf(g);
    if (!col) continue;
    float kv = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDk; ++i) {
      if (i < dk) {
        s[i] = __fmul_rn(s[i], decay);
        kv = __fadd_rn(kv, __fmul_rn(s[i], kn[i]));
      }
    }
    const float delta =
        __fmul_rn(__fsub_rn(row[2 * int64_t{p.n_k_heads} * dk + int64_t{h} * dv + j], kv), b);
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDk; ++i) {
      if (i < dk) {
        s[i] = __fadd_rn(s[i], __fmul_rn(kn[i], delta));
        o = __fadd_rn(o, __fmul_rn(s[i], qn[i]));
      }
    }
    out[ah * dv + j] = o;
  }
  if (!col) return;
#pragma unroll
  for (int i = 0; i < kMaxDk; ++i)
    if (i < dk) state[int64_t{i} * dv + j] = s[i];
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
                      const float* qkv, const float* alpha, const float* beta, const float* ssm_a,
                      const float* dt_bias, float* out, const DeltaShape& p, cudaStream_t s) {
  if (b.num_seqs <= 0) return;
  const dim3 grid(static_cast<unsigned>(b.num_seqs), static_cast<unsigned>(p.n_v_heads),
                  static_cast<unsigned>((p.head_v_dim + kDeltaCols - 1) / kDeltaCols));
  const auto launch = [&](auto kernel) {
    kernel<<<grid, kDeltaCols, 0, s>>>(st, b.qo_indptr, b.positions, slots, qkv, alpha, beta, ssm_a,
                                       dt_bias, out, p);
  };
  if (p.head_k_dim <= 32) {
    launch(delta_rule_kernel<32>);
  } else if (p.head_k_dim <= 64) {
    launch(delta_rule_kernel<64>);
  } else {
    launch(delta_rule_kernel<kDeltaMaxHeadDimK>);
  }
}

}  // namespace kiln::backend::cuda
