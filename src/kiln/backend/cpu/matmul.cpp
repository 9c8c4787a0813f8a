#include "kiln/backend/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "kiln/backend/cpu/kernels.h"
#include "kiln/backend/cpu/pack.h"
#include "kiln/backend/cpu/quantize_act.h"
#include "kiln/quant/convert.h"
#include "kiln/util/cpu.h"
#include "kiln/util/status.h"

namespace kiln::backend::cpu {

bool path_available(KernelPath p) {
  const util::CpuFeatures& f = util::cpu_features();
  switch (p) {
    case KernelPath::Scalar:
      return true;
    case KernelPath::Avx2:
      return f.avx2 && f.fma && f.f16c && gemm_avx2(quant::Type::Q8_0) != nullptr;
    case KernelPath::Avx512:
      return f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni && f.f16c &&
             gemm_avx512(quant::Type::Q8_0) != nullptr;
  }
  return false;
}

KernelPath best_kernel_path() {
  static const KernelPath best = [] {
    if (path_available(KernelPath::Avx512)) return KernelPath::Avx512;
    if (path_available(KernelPath::Avx2)) return KernelPath::Avx2;
    return KernelPath::Scalar;
  }();
  return best;
}

namespace {

GemmFn kernel_for(const Weight& w, KernelPath p) {
  const quant::Type t = w.type;
  const PackedCopy* packed = packed_copy(w);
  if (packed != nullptr && packed->rows == pack_rows(p)) {
    switch (p) {
      case KernelPath::Scalar:
        break;  // the reference dots read the rows as stored
      case KernelPath::Avx2:
        return gemm_packed_avx2(t);
      case KernelPath::Avx512:
        return gemm_packed_avx512(t);
    }
  }
  switch (p) {
    case KernelPath::Scalar:
      return gemm_scalar(t);
    case KernelPath::Avx2:
      return gemm_avx2(t);
    case KernelPath::Avx512:
      return gemm_avx512(t);
  }
  return nullptr;
}

// Output rows go to threads in chunks of this many (a multiple of every kernel's row tile).
constexpr int64_t kRowChunk = 16;
// Dynamic chunks per thread for the row split.
constexpr int64_t kChunksPerThread = 8;

}  // namespace

bool has_kernel(quant::Type type, KernelPath path) {
  Weight w;
  w.type = type;
  return kernel_for(w, path) != nullptr;
}

void matmul_on_path(const Weight& w, const float* x, float* y, int64_t n_tokens,
                    util::ThreadPool* pool, KernelPath path) {
  KILN_ASSERT(path_available(path));
  const GemmFn fn = kernel_for(w, path);
  const ActFormat format = act_format(w.type);
  if (fn == nullptr || w.n_in % act_block_elems(format) != 0) {
    matmul_reference(w, x, y, n_tokens, pool);
    return;
  }
  if (n_tokens <= 0 || w.n_out <= 0) return;
  // Grown to the largest step once, then reused: no allocation per call in steady state.
  thread_local QuantizedActs acts;
  GemmArgs args;
  args.w = &w;
  args.x = x;
  args.y = y;
  args.n_tokens = n_tokens;
  if (format != ActFormat::F32) {
    quantize_acts(format, x, n_tokens, w.n_in, &acts, pool);
    args.a = &acts;
  }
  const int64_t num_units = (w.n_out + kRowChunk - 1) / kRowChunk;
  auto rows = [&](int64_t begin, int64_t end, int) {
    GemmArgs a = args;
    a.row_begin = begin * kRowChunk;
    a.row_end = std::min(end * kRowChunk, w.n_out);
    fn(a);
  };
  if (pool != nullptr && pool->num_threads() > 1) {
    // Dynamic chunks, about kChunksPerThread per thread: a thread that loses its core (the
    // machine is shared) or a slower row range does not hold the others up. Which thread
    // computes a row does not change its bits (kernels.h).
    const int64_t per_chunk =
        std::max<int64_t>(1, num_units / (int64_t{pool->num_threads()} * kChunksPerThread));
    pool->parallel_for_dynamic(num_units, per_chunk, rows);
  } else {
    rows(0, num_units, 0);
  }
}

namespace {
std::atomic<MatmulMode> g_mode{MatmulMode::Fast};
}  // namespace

void set_matmul_mode(MatmulMode mode) {
  g_mode.store(mode, std::memory_order_relaxed);
}
MatmulMode matmul_mode() {
  return g_mode.load(std::memory_order_relaxed);
}

void matmul_fast(const Weight& w, const float* x, float* y, int64_t n_tokens,
                 util::ThreadPool* pool) {
  if (matmul_mode() == MatmulMode::Reference) {
    matmul_reference(w, x, y, n_tokens, pool);
    return;
  }
  matmul_on_path(w, x, y, n_tokens, pool, best_kernel_path());
}

void matmul_reference(const Weight& w, const float* x, float* y, int64_t n_tokens,
                      util::ThreadPool* pool) {
  auto rows = [&](int64_t begin, int64_t end, int) {
    std::vector<float> wrow(static_cast<size_t>(w.n_in));
    for (int64_t o = begin; o < end; ++o) {
      Status st = quant::dequantize_row(w.type, w.row(o), wrow.data(), w.n_in);
      KILN_ASSERT(st.ok());
      for (int64_t t = 0; t < n_tokens; ++t) {
        const float* xt = x + t * w.n_in;
        float sum = 0.0f;
        for (int64_t i = 0; i < w.n_in; ++i) sum += wrow[static_cast<size_t>(i)] * xt[i];
        y[t * w.n_out + o] = sum;
      }
    }
  };
  if (pool != nullptr) {
    pool->parallel_for(w.n_out, rows);
  } else {
    rows(0, w.n_out, 0);
  }
}

}  // namespace kiln::backend::cpu
