#include "kiln/backend/cpu/quantize_act.h"

#include <algorithm>
#include <cmath>

#include "kiln/backend/cpu/attention.h"
#include "kiln/backend/cpu/ops.h"
#include "kiln/util/status.h"

namespace kiln::backend::cpu {

ActFormat act_format(quant::Type weight_type) {
  switch (weight_type) {
    case quant::Type::Q8_0:
    case quant::Type::Q4_0:
      return ActFormat::Q8_0;
    case quant::Type::Q4_K:
    case quant::Type::Q5_K:
    case quant::Type::Q6_K:
      return ActFormat::Q8_K;
    default:
      return ActFormat::F32;
  }
}

int act_block_elems(ActFormat f) {
  switch (f) {
    case ActFormat::Q8_0:
      return 32;
    case ActFormat::Q8_K:
      return 256;
    case ActFormat::F32:
      break;
  }
  return 1;
}

namespace {

// Round to nearest, ties to even, for |v| <= 127: adding 1.5 * 2^23 leaves an integer-valued
// float in the default rounding mode (no libm call, vectorizes).
inline int32_t round_even(float v) {
  const float r = (v + 12582912.0f) - 12582912.0f;
  return static_cast<int32_t>(r);
}

}  // namespace

void quantize_act_row(const float* x, int64_t n, int block_elems, int8_t* qs, float* d,
                      int16_t* bsums) {
#if defined(__x86_64__)
  // The small ops' switch (ops.h): AVX2 where available, unless the ops mode is Reference.
  static const bool avx2 = avx2_ops_available();
  if (avx2 && ops_mode() == OpsMode::Fast && block_elems % 32 == 0) {
    quantize_act_row_avx2(x, n, block_elems, qs, d, bsums);
    return;
  }
#endif
  quantize_act_row_scalar(x, n, block_elems, qs, d, bsums);
}

void quantize_act_row_scalar(const float* x, int64_t n, int block_elems, int8_t* qs, float* d,
                             int16_t* bsums) {
  const int64_t nb = n / block_elems;
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * block_elems;
    int8_t* qb = qs + b * block_elems;
    float amax = 0.0f;
    for (int i = 0; i < block_elems; ++i) amax = std::max(amax, std::fabs(xb[i]));
    // A NaN/inf row gives d = NaN/inf and q = 0 or +-127: garbage in, garbage out, no UB.
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    for (int i = 0; i < block_elems; ++i) {
      const float v = std::min(127.0f, std::max(-127.0f, xb[i] * id));  // NaN -> -127
      qb[i] = static_cast<int8_t>(round_even(v));
    }
  }
  if (bsums != nullptr) {
    for (int64_t g = 0; g < n / 16; ++g) {
      int32_t s = 0;
      for (int i = 0; i < 16; ++i) s += qs[g * 16 + i];
      bsums[g] = static_cast<int16_t>(s);
    }
  }
}

void quantize_acts(ActFormat format, const float* x, int64_t n_tokens, int64_t n_in,
                   QuantizedActs* out, util::ThreadPool* pool) {
  const int block = act_block_elems(format);
  KILN_ASSERT(format != ActFormat::F32 && n_in % block == 0 && n_tokens >= 0);
  out->format = format;
  out->n_in = n_in;
  out->n_tokens = n_tokens;
  out->qs_stride = (n_in + 63) / 64 * 64;
  out->d_stride = n_in / block;
  out->bsums_stride = format == ActFormat::Q8_K ? n_in / 16 : 0;
  out->offs_stride = format == ActFormat::Q8_0 ? n_in / 32 : n_in / 16;
  out->bsums32_stride = format == ActFormat::Q8_K ? n_in / 32 : 0;
  const auto grow = [](auto& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  };
  grow(out->qs, n_tokens * out->qs_stride);
  grow(out->d, n_tokens * out->d_stride);
  grow(out->bsums, n_tokens * out->bsums_stride);
  grow(out->offs, n_tokens * out->offs_stride);
  grow(out->bsums32, n_tokens * out->bsums32_stride);
  auto rows = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      quantize_act_row(x + t * n_in, n_in, block, out->qs.data() + t * out->qs_stride,
                       out->d.data() + t * out->d_stride,
                       out->bsums_stride ? out->bsums.data() + t * out->bsums_stride : nullptr);
      int32_t* o = out->offs.data() + t * out->offs_stride;
      if (format == ActFormat::Q8_0) {
        const int8_t* q = out->qs.data() + t * out->qs_stride;
        for (int64_t b = 0; b < out->offs_stride; ++b) {
          int32_t s = 0;
          for (int i = 0; i < 32; ++i) s += q[b * 32 + i];
          o[b] = -128 * s;
        }
      } else {
        const int16_t* bs = out->bsums.data() + t * out->bsums_stride;
        for (int64_t g = 0; g < out->offs_stride; ++g) o[g] = -32 * bs[g];
      }
      if (out->bsums32_stride != 0) {
        const int16_t* bs = out->bsums.data() + t * out->bsums_stride;
        int16_t* s32 = out->bsums32.data() + t * out->bsums32_stride;
        for (int64_t k = 0; k < out->bsums32_stride; ++k) {
          s32[k] = static_cast<int16_t>(bs[2 * k] + bs[2 * k + 1]);
        }
      }
    }
  };
  if (pool != nullptr && n_tokens > 1) {
    pool->parallel_for(n_tokens, rows);
  } else {
    rows(0, n_tokens, 0);
  }
}

}  // namespace kiln::backend::cpu
