// Elementwise and row ops of kernels.h: rmsnorm, layernorm, bias/add/scale, softcap,
// swiglu/geglu/gelu, sigmoid_mul, column and row copies, deinterleave, per-row scale, argmax.
// Each mirrors the CPU op of the same name (ops.cpp, delta_net.cpp); the bounds against it are
// in tests/unit/cuda/ops_test.cpp (layernorm, gelu: encoder_ops_test.cpp; sigmoid_mul,
// deinterleave: delta_net_test.cpp).
//
// Launch shapes: elementwise ops are grid-stride loops over float4 when every pointer is 16-byte
// aligned and the row length allows it (a scalar loop finishes the tail); row ops (rmsnorm,
// layernorm, argmax) run one block per row with warp-shuffle reductions. Nothing allocates or
// synchronises.
#include <algorithm>
#include <cfloat>
#include <cstdint>

#include <cuda_runtime.h>

#include "kiln/backend/cuda/kernels.h"
#include "kiln/backend/cuda/pdl.cuh"
#include "kiln/backend/cuda/q8_group.cuh"
#include "kiln/backend/cuda/row_norm.cuh"
#include "kiln/backend/cuda/swiglu.cuh"

namespace kiln::backend::cuda {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops need no more blocks than this (132 SMs x 2048 threads / 256 on an H200).
constexpr int64_t kMaxBlocks = 2048;

int grid_for(int64_t n_items) {
  const int64_t blocks = (n_items + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

__device__ __forceinline__ int64_t thread_index() {
  return int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t thread_stride() {
  return int64_t{gridDim.x} * blockDim.x;
}

// ---- binary maps: out[i] = op(a[i], b[i]) (b may be null for unary ops; out may alias a) ----

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct ScaleOp {
  float s;
  __device__ float operator()(float a, float) const { return a * s; }
};
struct SoftcapOp {
  float cap;
  __device__ float operator()(float a, float) const { return cap * tanhf(a / cap); }
};
// silu(g) * u (swiglu.cuh).
struct SwigluOp {
  __device__ float operator()(float g, float u) const { return swiglu_value(g, u); }
};
// gelu_tanh(g) * u as geglu_reference writes it, each product rounded as there (the _rn
// intrinsics keep nvcc from fusing them into FMAs); only tanhf (2 ulp) differs.
struct GegluOp {
  __device__ float operator()(float g, float u) const {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    const float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
    const float t = tanhf(__fmul_rn(kSqrt2OverPi, __fadd_rn(g, cube)));
    return __fmul_rn(__fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, t)), u);
  }
};

// x * sigmoid(g) as cpu::sigmoid_mul writes it; expf within 2 ulp.
struct SigmoidMulOp {
  __device__ float operator()(float x, float g) const { return x / (1.0f + expf(-g)); }
};

// The exact GELU 0.5 x (1 + erf(x / sqrt 2)) written as 0.5 x erfc(-x / sqrt 2), the same
// function without 1 + erf's cancellation for x < 0; cpu::gelu evaluates it in double. erfcf is
// within 4 ulp; the rounded argument adds a relative error of about 2^-23 x^2 where erfc is
// steep (x << 0): tests/unit/cuda/encoder_ops_test.cpp states the bound.
struct GeluOp {
  __device__ float operator()(float x, float) const {
    return __fmul_rn(__fmul_rn(0.5f, x), erfcf(__fmul_rn(-x, 0.70710678118654752f)));
  }
};

// n4: the number of leading float4 groups (0 when the pointers are not 16-byte aligned).
template <typename Op>
__global__ void map2_kernel(const float* a, const float* b, float* out, int64_t n, int64_t n4,
                            Op op) {
  pdl_start();
  const int64_t stride = thread_stride();
  for (int64_t i = thread_index(); i < n4; i += stride) {
    const float4 x = reinterpret_cast<const float4*>(a)[i];
    float4 y = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (b != nullptr) y = reinterpret_cast<const float4*>(b)[i];
    reinterpret_cast<float4*>(out)[i] =
        make_float4(op(x.x, y.x), op(x.y, y.y), op(x.z, y.z), op(x.w, y.w));
  }
  for (int64_t i = n4 * 4 + thread_index(); i < n; i += stride)
    out[i] = op(a[i], b != nullptr ? b[i] : 0.0f);
}

template <typename Op>
void map2(const float* a, const float* b, float* out, int64_t n, Op op, cudaStream_t s) {
  if (n <= 0) return;
  const bool vec = aligned16(a) && aligned16(out) && (b == nullptr || aligned16(b));
  const int64_t n4 = vec ? n / 4 : 0;
  launch_pdl(map2_kernel<Op>, dim3(grid_for(n4 > 0 ? n4 : n)), dim3(kThreads), 0, s, a, b, out, n,
             n4, op);
}

// swiglu over float4 groups, one per thread, with the output quantized for the matvec.
__global__ void swiglu_q8_kernel(const float* g, const float* u, float* out, int64_t n4, int8_t* q,
                                 float2* ds) {
  pdl_start();
  const int64_t i = thread_index();
  const bool active = i < n4;
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (active) {
    const float4 a = reinterpret_cast<const float4*>(g)[i];
    const float4 b = reinterpret_cast<const float4*>(u)[i];
    const SwigluOp op;
    v = make_float4(op(a.x, b.x), op(a.y, b.y), op(a.z, b.z), op(a.w, b.w));
    reinterpret_cast<float4*>(out)[i] = v;
  }
  q8_group4(v, active, q + 4 * i, ds + i / 8);
}

// ---- row-broadcast ops ----------------------------------------------------------------------

// x[r][i] += b[i]; vec: n % 4 == 0 and both aligned, then the index runs over float4 groups.
__global__ void add_bias_kernel(float* x, const float* b, int64_t n_rows, int64_t n, bool vec) {
  const int64_t stride = thread_stride();
  if (vec) {
    const int64_t n4 = n / 4, total = n_rows * n4;
    for (int64_t i = thread_index(); i < total; i += stride) {
      float4 v = reinterpret_cast<float4*>(x)[i];
      const float4 w = reinterpret_cast<const float4*>(b)[i % n4];
      v.x += w.x;
      v.y += w.y;
      v.z += w.z;
      v.w += w.w;
      reinterpret_cast<float4*>(x)[i] = v;
    }
    return;
  }
  const int64_t total = n_rows * n;
  for (int64_t i = thread_index(); i < total; i += stride) x[i] += b[i % n];
}

// x[r][i] *= s[r]
__global__ void scale_rows_kernel(float* x, const float* s, int64_t n_rows, int64_t n, bool vec) {
  const int64_t stride = thread_stride();
  if (vec) {
    const int64_t n4 = n / 4, total = n_rows * n4;
    for (int64_t i = thread_index(); i < total; i += stride) {
      float4 v = reinterpret_cast<float4*>(x)[i];
      const float f = s[i / n4];
      v.x *= f;
      v.y *= f;
      v.z *= f;
      v.w *= f;
      reinterpret_cast<float4*>(x)[i] = v;
    }
    return;
  }
  const int64_t total = n_rows * n;
  for (int64_t i = thread_index(); i < total; i += stride) x[i] *= s[i / n];
}

// dst[r][c] = src[r][col0 + c]; vec: every width, offset and pointer in float4 units.
__global__ void copy_cols_kernel(const float* src, int64_t src_cols, int64_t col0, float* dst,
                                 int64_t n_cols, int64_t n_rows, bool vec) {
  const int64_t stride = thread_stride();
  if (vec) {
    const int64_t w4 = n_cols / 4, s4 = src_cols / 4, c4 = col0 / 4, total = n_rows * w4;
    for (int64_t i = thread_index(); i < total; i += stride) {
      const int64_t r = i / w4, c = i - r * w4;
      reinterpret_cast<float4*>(dst)[i] = reinterpret_cast<const float4*>(src)[r * s4 + c4 + c];
    }
    return;
  }
  const int64_t total = n_rows * n_cols;
  for (int64_t i = thread_index(); i < total; i += stride) {
    const int64_t r = i / n_cols, c = i - r * n_cols;
    dst[i] = src[r * src_cols + col0 + c];
  }
}

// dst[i] = src[rows[i]], rows of n floats.
__global__ void gather_rows_kernel(const float* src, const int32_t* rows, float* dst, int64_t n_out,
                                   int64_t n, bool vec) {
  const int64_t stride = thread_stride();
  if (vec) {
    const int64_t n4 = n / 4, total = n_out * n4;
    for (int64_t i = thread_index(); i < total; i += stride) {
      const int64_t r = i / n4, c = i - r * n4;
      reinterpret_cast<float4*>(dst)[i] = reinterpret_cast<const float4*>(src)[rows[r] * n4 + c];
    }
    return;
  }
  const int64_t total = n_out * n;
  for (int64_t i = thread_index(); i < total; i += stride) {
    const int64_t r = i / n, c = i - r * n;
    dst[i] = src[int64_t{rows[r]} * n + c];
  }
}

// Element i of src [n_rows * n_groups, 2 * width] goes to a or b [n_rows * n_groups, width].
__global__ void deinterleave_kernel(const float* src, int64_t n_pairs, int64_t width, float* a,
                                    float* b) {
  const int64_t stride = thread_stride(), total = n_pairs * 2 * width;
  for (int64_t i = thread_index(); i < total; i += stride) {
    const int64_t pair = i / (2 * width), c = i - pair * 2 * width;
    if (c < width) {
      a[pair * width + c] = src[i];
    } else {
      b[pair * width + c - width] = src[i];
    }
  }
}

// ---- row reductions: one block per row -----------------------------------------------------

// Threads for a row of n units: one unit each up to 1024 (a decode row is one short-lived
// block, so its latency is what counts), at least a warp.
int row_threads(int64_t n) {
  return static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, (n + 31) / 32 * 32)));
}

// The reference's arithmetic: the sum of squares in double (each fp32 square is exact in
// double; only the order of the additions differs), inv = float(1 / sqrt(mean + eps)) in
// double, y = (x * inv) * w in fp32. x and y may alias: each element is read before it is
// written, by the thread that writes it.
// With r (add_rmsnorm): x += r first, written back by the thread that reads it again below.
// With yq (vec only, n % 32 == 0): y is also quantized for the matvec (q8_group4).
__global__ void rmsnorm_kernel(float* x, const float* r, const float* w, float* y, int64_t n,
                               float eps, bool vec, int8_t* yq, float2* yds) {
  const int64_t row = blockIdx.x;
  float* xr = x + row * n;
  float* yr = y + row * n;
  if (vec && n / 4 <= blockDim.x) {
    // A row of at most one float4 per thread (every decode row up to 4096 values): the same
    // arithmetic as below, with the norm weights read before the wait for the kernel before
    // (they depend on none) and x kept in registers, not read back.
    const int64_t i = threadIdx.x;
    const bool active = i < n / 4;
    float4 g = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    if (active && w != nullptr) g = reinterpret_cast<const float4*>(w)[i];
    pdl_start();
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (active) {
      v = reinterpret_cast<const float4*>(xr)[i];
      if (r != nullptr) {
        const float4 a = reinterpret_cast<const float4*>(r + row * n)[i];
        v = make_float4(v.x + a.x, v.y + a.y, v.z + a.z, v.w + a.w);
        reinterpret_cast<float4*>(xr)[i] = v;
      }
    }
    const float inv = row_rms_inv(v, n, eps);
    if (active) {
      v = row_rms_apply(v, inv, g);
      reinterpret_cast<float4*>(yr)[i] = v;
    }
    if (yq != nullptr) q8_group4(v, active, yq + row * n + 4 * i, yds + row * (n / 32) + i / 8);
    return;
  }
  pdl_start();
  double sum = 0.0;
  if (vec) {
    float4* x4 = reinterpret_cast<float4*>(xr);
    const float4* r4 = reinterpret_cast<const float4*>(r + row * n);
    for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
      float4 v = x4[i];
      if (r != nullptr) {
        const float4 a = r4[i];
        v = make_float4(v.x + a.x, v.y + a.y, v.z + a.z, v.w + a.w);
        x4[i] = v;
      }
      sum += static_cast<double>(v.x) * v.x + static_cast<double>(v.y) * v.y +
             static_cast<double>(v.z) * v.z + static_cast<double>(v.w) * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      float v = xr[i];
      if (r != nullptr) {
        v += r[row * n + i];
        xr[i] = v;
      }
      sum += static_cast<double>(v) * v;
    }
  }
  sum = block_sum(sum);
  const float inv = static_cast<float>(1.0 / sqrt(sum / static_cast<double>(n) + eps));
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    float4* y4 = reinterpret_cast<float4*>(yr);
    // Uniform trip count over the block, so the quantizing lanes' shuffles see full warps.
    for (int64_t base = 0; base < n / 4; base += blockDim.x) {
      const int64_t i = base + threadIdx.x;
      const bool active = i < n / 4;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (active) {
        v = x4[i];
        v.x *= inv;
        v.y *= inv;
        v.z *= inv;
        v.w *= inv;
        if (w != nullptr) {
          const float4 g = w4[i];
          v.x *= g.x;
          v.y *= g.y;
          v.z *= g.z;
          v.w *= g.w;
        }
        y4[i] = v;
      }
      if (yq != nullptr) q8_group4(v, active, yq + row * n + 4 * i, yds + row * (n / 32) + i / 8);
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      float v = xr[i] * inv;
      if (w != nullptr) v *= w[i];
      yr[i] = v;
    }
  }
}

// cpu::layernorm's arithmetic: the mean, then the sum of squared deviations from it, in double
// (two passes over the row, which stays in L1; only the order of the additions differs from the
// CPU), and each output (x - mean) * inv * w + b evaluated in double and rounded once. x and y
// may alias: each element is read before it is written, by the thread that writes it (every
// pass maps elements to threads alike). With r (add_layernorm): x += r first in fp32, written
// back, as add does; y may alias r too.
__global__ void layernorm_kernel(float* x, const float* r, const float* w, const float* b, float* y,
                                 int64_t n, float eps, bool vec) {
  pdl_start();
  const int64_t row = blockIdx.x;
  float* xr = x + row * n;
  float* yr = y + row * n;
  const float* rr = r != nullptr ? r + row * n : nullptr;
  const double dn = static_cast<double>(n);
  double sum = 0.0;
  if (vec) {
    float4* x4 = reinterpret_cast<float4*>(xr);
    for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
      float4 v = x4[i];
      if (rr != nullptr) {
        const float4 a = reinterpret_cast<const float4*>(rr)[i];
        v = make_float4(v.x + a.x, v.y + a.y, v.z + a.z, v.w + a.w);
        x4[i] = v;
      }
      sum += static_cast<double>(v.x) + v.y + static_cast<double>(v.z) + v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      float v = xr[i];
      if (rr != nullptr) {
        v += rr[i];
        xr[i] = v;
      }
      sum += v;
    }
  }
  const double mean = block_sum(sum) / dn;
  __syncthreads();  // block_sum's partials are read by every warp before the next call writes
  double sq = 0.0;
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
      const float4 v = x4[i];
      const double d0 = v.x - mean, d1 = v.y - mean, d2 = v.z - mean, d3 = v.w - mean;
      sq += d0 * d0 + d1 * d1 + d2 * d2 + d3 * d3;
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const double d = xr[i] - mean;
      sq += d * d;
    }
  }
  const double inv = 1.0 / sqrt(block_sum(sq) / dn + eps);
  const auto norm = [&](float v, int64_t i) {
    double o = __dmul_rn(v - mean, inv);  // _rn: no FMA contraction, as the CPU's statements
    if (w != nullptr) o = __dmul_rn(o, w[i]);
    if (b != nullptr) o = __dadd_rn(o, b[i]);
    return static_cast<float>(o);
  };
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    float4* y4 = reinterpret_cast<float4*>(yr);
    for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
      const float4 v = x4[i];
      y4[i] = make_float4(norm(v.x, 4 * i), norm(v.y, 4 * i + 1), norm(v.z, 4 * i + 2),
                          norm(v.w, 4 * i + 3));
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = norm(xr[i], i);
  }
}

// The better of two candidates as cpu::argmax sees them: larger value, then lower index.
__device__ __forceinline__ bool better(float v, int32_t i, float bv, int32_t bi) {
  return v > bv || (v == bv && i < bi);
}

constexpr int kArgmaxThreads = 1024;

// cpu::argmax keeps index 0 unless a later value compares greater, so: NaNs never win, ties go
// to the first index, and a row whose first value is NaN (or that is all NaN) gives 0.
__global__ void argmax_kernel(const float* x, int64_t n, int32_t* out, bool vec) {
  const float* xr = x + int64_t{blockIdx.x} * n;
  float bv = -INFINITY;
  int32_t bi = INT32_MAX;  // none yet; any value >= -inf replaces it (ties to the lower index)
  auto consider = [&](float v, int64_t i) {
    if (v == v && better(v, static_cast<int32_t>(i), bv, bi)) {
      bv = v;
      bi = static_cast<int32_t>(i);
    }
  };
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
      const float4 v = x4[i];
      consider(v.x, 4 * i);
      consider(v.y, 4 * i + 1);
      consider(v.z, 4 * i + 2);
      consider(v.w, 4 * i + 3);
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) consider(xr[i], i);
  }
  __shared__ float part_v[32];
  __shared__ int32_t part_i[32];
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
  if (lane == 0) {
    part_v[warp] = bv;
    part_i[warp] = bi;
  }
  __syncthreads();
  if (warp != 0) return;
  bv = lane < n_warps ? part_v[lane] : -INFINITY;
  bi = lane < n_warps ? part_i[lane] : INT32_MAX;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  if (lane == 0) out[blockIdx.x] = (bi == INT32_MAX || xr[0] != xr[0]) ? 0 : bi;
}

}  // namespace

bool rmsnorm(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps,
             cudaStream_t s, int8_t* yq, float2* yds) {
  if (n_rows <= 0 || n <= 0) return false;
  const bool vec = n % 4 == 0 && aligned16(x) && aligned16(y) && (w == nullptr || aligned16(w));
  const bool q8 = vec && yq != nullptr && n % 32 == 0;
  // x is only read (r is null).
  launch_pdl(rmsnorm_kernel, dim3(static_cast<unsigned>(n_rows)),
             dim3(row_threads(vec ? n / 4 : n)), 0, s, const_cast<float*>(x), nullptr, w, y, n, eps,
             vec, q8 ? yq : nullptr, yds);
  return q8;
}

bool add_rmsnorm(float* x, const float* r, const float* w, float* y, int64_t n_rows, int64_t n,
                 float eps, cudaStream_t s, int8_t* yq, float2* yds) {
  if (n_rows <= 0 || n <= 0) return false;
  const bool vec =
      n % 4 == 0 && aligned16(x) && aligned16(r) && aligned16(y) && (w == nullptr || aligned16(w));
  const bool q8 = vec && yq != nullptr && n % 32 == 0;
  launch_pdl(rmsnorm_kernel, dim3(static_cast<unsigned>(n_rows)),
             dim3(row_threads(vec ? n / 4 : n)), 0, s, x, r, w, y, n, eps, vec, q8 ? yq : nullptr,
             yds);
  return q8;
}

void layernorm(const float* x, const float* w, const float* b, float* y, int64_t n_rows, int64_t n,
               float eps, cudaStream_t s) {
  if (n_rows <= 0 || n <= 0) return;
  const bool vec = n % 4 == 0 && aligned16(x) && aligned16(y);
  // x is only read (r is null).
  launch_pdl(layernorm_kernel, dim3(static_cast<unsigned>(n_rows)),
             dim3(row_threads(vec ? n / 4 : n)), 0, s, const_cast<float*>(x), nullptr, w, b, y, n,
             eps, vec);
}

void add_layernorm(float* x, const float* r, const float* w, const float* b, float* y,
                   int64_t n_rows, int64_t n, float eps, cudaStream_t s) {
  if (n_rows <= 0 || n <= 0) return;
  const bool vec = n % 4 == 0 && aligned16(x) && aligned16(r) && aligned16(y);
  launch_pdl(layernorm_kernel, dim3(static_cast<unsigned>(n_rows)),
             dim3(row_threads(vec ? n / 4 : n)), 0, s, x, r, w, b, y, n, eps, vec);
}

void add_bias(float* x, const float* b, int64_t n_rows, int64_t n, cudaStream_t s) {
  if (n_rows <= 0 || n <= 0) return;
  const bool vec = n % 4 == 0 && aligned16(x) && aligned16(b);
  add_bias_kernel<<<grid_for(n_rows * (vec ? n / 4 : n)), kThreads, 0, s>>>(x, b, n_rows, n, vec);
}

void add(float* x, const float* y, int64_t n, cudaStream_t s) {
  map2(x, y, x, n, AddOp{}, s);
}

void scale(float* x, float scale, int64_t n, cudaStream_t s) {
  map2(x, nullptr, x, n, ScaleOp{scale}, s);
}

void softcap(float* x, float cap, int64_t n, cudaStream_t s) {
  map2(x, nullptr, x, n, SoftcapOp{cap}, s);
}

void swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s) {
  map2(gate, up, out, n, SwigluOp{}, s);
}

bool swiglu_q8(const float* gate, const float* up, float* out, int64_t n, int8_t* q, float2* ds,
               cudaStream_t s) {
  if (n <= 0) return false;
  if (n % 32 != 0 || !aligned16(gate) || !aligned16(up) || !aligned16(out)) {
    swiglu(gate, up, out, n, s);
    return false;
  }
  const int64_t n4 = n / 4;
  launch_pdl(swiglu_q8_kernel, dim3(static_cast<unsigned>((n4 + kThreads - 1) / kThreads)),
             dim3(kThreads), 0, s, gate, up, out, n4, q, ds);
  return true;
}

void geglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s) {
  map2(gate, up, out, n, GegluOp{}, s);
}

void gelu(const float* x, float* out, int64_t n, cudaStream_t s) {
  map2(x, nullptr, out, n, GeluOp{}, s);
}

void sigmoid_mul(const float* x, const float* gate, float* out, int64_t n, cudaStream_t s) {
  map2(x, gate, out, n, SigmoidMulOp{}, s);
}

void deinterleave(const float* src, int64_t n_rows, int64_t n_groups, int64_t width, float* a,
                  float* b, cudaStream_t s) {
  const int64_t n_pairs = n_rows * n_groups;
  if (n_pairs <= 0 || width <= 0) return;
  deinterleave_kernel<<<grid_for(n_pairs * 2 * width), kThreads, 0, s>>>(src, n_pairs, width, a, b);
}

__global__ void add_gated_rows_kernel(float* x, const float* y, const float* s, int64_t n_rows,
                                      int64_t n) {
  const int64_t stride = thread_stride();
  for (int64_t i = thread_index(); i < n_rows * n; i += stride) {
    const float g = 1.0f / (1.0f + expf(-s[i / n]));
    x[i] += g * y[i];
  }
}

void add_gated_rows(float* x, const float* y, const float* s, int64_t n_rows, int64_t n,
                    cudaStream_t st) {
  if (n_rows <= 0 || n <= 0) return;
  add_gated_rows_kernel<<<grid_for(n_rows * n), kThreads, 0, st>>>(x, y, s, n_rows, n);
}

void scale_rows(float* x, const float* s, int64_t n_rows, int64_t n, cudaStream_t st) {
  if (n_rows <= 0 || n <= 0) return;
  const bool vec = n % 4 == 0 && aligned16(x);
  scale_rows_kernel<<<grid_for(n_rows * (vec ? n / 4 : n)), kThreads, 0, st>>>(x, s, n_rows, n,
                                                                               vec);
}

void copy_cols(const float* src, int64_t src_cols, int64_t col0, float* dst, int64_t n_cols,
               int64_t n_rows, cudaStream_t s) {
  if (n_rows <= 0 || n_cols <= 0) return;
  const bool vec =
      n_cols % 4 == 0 && src_cols % 4 == 0 && col0 % 4 == 0 && aligned16(src) && aligned16(dst);
  copy_cols_kernel<<<grid_for(n_rows * (vec ? n_cols / 4 : n_cols)), kThreads, 0, s>>>(
      src, src_cols, col0, dst, n_cols, n_rows, vec);
}

void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n_out, int64_t n,
                 cudaStream_t s) {
  if (n_out <= 0 || n <= 0) return;
  const bool vec = n % 4 == 0 && aligned16(src) && aligned16(dst);
  gather_rows_kernel<<<grid_for(n_out * (vec ? n / 4 : n)), kThreads, 0, s>>>(src, rows, dst, n_out,
                                                                              n, vec);
}

void argmax_rows(const float* x, int64_t n_rows, int64_t n, int32_t* out, cudaStream_t s) {
  if (n_rows <= 0 || n <= 0) return;
  const bool vec = n % 4 == 0 && aligned16(x);
  const int64_t items = vec ? n / 4 : n;
  const int threads = items >= kArgmaxThreads ? kArgmaxThreads : (items <= 128 ? 32 : 256);
  argmax_kernel<<<static_cast<unsigned>(n_rows), threads, 0, s>>>(x, n, out, vec);
}

}  // namespace kiln::backend::cuda
