// Fast CPU matmul: y[t][o] = sum_i W[o][i] * x[t][i] for the weight types with kernels (F32,
// F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K); other types fall back to matmul_reference.
//
// Quantized weights are multiplied with activations quantized on the fly per token row
// (quantize_act.h: Q8_0 blocks for Q8_0/Q4_0, Q8_K for the K-quants), with integer dots per
// block; float weights use fp32 fused multiply-adds against the fp32 activations. The
// kernel path (scalar, AVX2, AVX-512) is picked at run time from util::cpu_features().
//
// Batch invariance: y[t][o] is bit-identical whatever n_tokens, the other tokens, the
// thread count or the tiling (kernels.h states the arithmetic contract). It differs between
// paths, and from matmul_reference, by rounding (bounds in tests/unit/backend/).
#pragma once

#include <cstdint>

#include "kiln/backend/weight.h"
#include "kiln/util/thread_pool.h"

namespace kiln::backend::cpu {

enum class KernelPath { Scalar, Avx2, Avx512 };
const char* path_name(KernelPath p);

// The fastest path this CPU runs.
KernelPath best_kernel_path();
// Whether this CPU (and this build) can run the path.
bool path_available(KernelPath p);
// Whether `type` has a kernel on `path` (otherwise matmul falls back).
bool has_kernel(quant::Type type, KernelPath path);

// x: [n_tokens, w.n_in], y: [n_tokens, w.n_out]. Rows are split over pool (may be null).
void matmul_fast(const Weight& w, const float* x, float* y, int64_t n_tokens,
                 util::ThreadPool* pool);
// The same on a given path (which must be available); used by tests and benchmarks.
void matmul_on_path(const Weight& w, const float* x, float* y, int64_t n_tokens,
                    util::ThreadPool* pool, KernelPath path);

// Process-wide switch for tests and debugging: Reference makes matmul (ops.h) and
// matmul_fast run matmul_reference, i.e. fp32 activations against dequantized weights.
enum class MatmulMode { Fast, Reference };
void set_matmul_mode(MatmulMode mode);
MatmulMode matmul_mode();

// The reference: dequantize each weight row (quant::dequantize_row), sequential fp32 dot.
void matmul_reference(const Weight& w, const float* x, float* y, int64_t n_tokens,
                      util::ThreadPool* pool);

}  // namespace kiln::backend::cpu
