// Scalar reference kernels: plain per-block integer dots written from the GGUF block
// definitions (quant/blocks.h), one output at a time. They are the oracles of the SIMD
// paths and the fallback on CPUs without AVX2.
#include <cstring>

#include "kiln/backend/cpu/kernels.h"
#include "kiln/quant/blocks.h"
#include "kiln/quant/fp16.h"

namespace kiln::backend::cpu {

using quant::BlockQ4_0;
using quant::BlockQ4_K;
using quant::BlockQ5_K;
using quant::BlockQ6_K;
using quant::BlockQ8_0;
using quant::fp16_to_fp32;
using quant::kQK_K;
using quant::load_block;

const char* path_name(KernelPath p) {
  switch (p) {
    case KernelPath::Scalar:
      return "scalar";
    case KernelPath::Avx2:
      return "avx2";
    case KernelPath::Avx512:
      return "avx512";
  }
  return "?";
}

float vec_dot_q8_0_scalar(const uint8_t* w, const int8_t* xq, const float* xd, int64_t n) {
  float acc = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b) {
    const BlockQ8_0 blk = load_block<BlockQ8_0>(w, b);
    int32_t isum = 0;
    for (int i = 0; i < 32; ++i) isum += blk.qs[i] * xq[b * 32 + i];
    acc += fp16_to_fp32(blk.d) * xd[b] * static_cast<float>(isum);
  }
  return acc;
}

float vec_dot_q4_0_scalar(const uint8_t* w, const int8_t* xq, const float* xd, int64_t n) {
  float acc = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b) {
    const BlockQ4_0 blk = load_block<BlockQ4_0>(w, b);
    const int8_t* x = xq + b * 32;
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += ((blk.qs[j] & 0xf) - 8) * x[j];
      isum += ((blk.qs[j] >> 4) - 8) * x[j + 16];
    }
    acc += fp16_to_fp32(blk.d) * xd[b] * static_cast<float>(isum);
  }
  return acc;
}

namespace {

// Q4_K and Q5_K: y = d * scale_j * q - dmin * min_j over 8 sub-blocks j of 32; q5 adds the
// qh bit (+16). Weight j's element l (0..31) is nibble j % 2 of qs[32 * (j / 2) + l].
template <bool kQ5>
float vec_dot_qk45_scalar(const uint8_t* w, const int8_t* xq, const float* xd, int64_t n) {
  float acc = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    uint16_t d16, dmin16;
    const uint8_t *scales, *qs, *qh = nullptr;
    BlockQ4_K b4;
    BlockQ5_K b5;
    if constexpr (kQ5) {
      b5 = load_block<BlockQ5_K>(w, b);
      d16 = b5.d, dmin16 = b5.dmin, scales = b5.scales, qs = b5.qs, qh = b5.qh;
    } else {
      b4 = load_block<BlockQ4_K>(w, b);
      d16 = b4.d, dmin16 = b4.dmin, scales = b4.scales, qs = b4.qs;
    }
    const int8_t* x = xq + b * kQK_K;
    int32_t sumi = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      quant::unpack_scale_min_k4(j, scales, &sc, &m);
      int32_t dot = 0, xsum = 0;
      for (int l = 0; l < 32; ++l) {
        int q = (j % 2) ? qs[32 * (j / 2) + l] >> 4 : qs[32 * (j / 2) + l] & 0xf;
        if constexpr (kQ5) q += ((qh[l] >> j) & 1) << 4;
        dot += q * x[32 * j + l];
        xsum += x[32 * j + l];
      }
      sumi += sc * dot;
      summ += m * xsum;
    }
    acc += fp16_to_fp32(d16) * xd[b] * static_cast<float>(sumi);
    acc -= fp16_to_fp32(dmin16) * xd[b] * static_cast<float>(summ);
  }
  return acc;
}

}  // namespace

float vec_dot_q4_k_scalar(const uint8_t* w, const int8_t* xq, const float* xd, int64_t n) {
  return vec_dot_qk45_scalar<false>(w, xq, xd, n);
}
float vec_dot_q5_k_scalar(const uint8_t* w, const int8_t* xq, const float* xd, int64_t n) {
  return vec_dot_qk45_scalar<true>(w, xq, xd, n);
}

float vec_dot_q6_k_scalar(const uint8_t* w, const int8_t* xq, const float* xd, int64_t n) {
  float acc = 0.0f;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockQ6_K blk = load_block<BlockQ6_K>(w, b);
    const int8_t* x = xq + b * kQK_K;
    int32_t sumi = 0;
    for (int g = 0; g < 16; ++g) {  // sub-blocks of 16
      int32_t dot = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e) {
        const int h = e / 128, s = (e % 128) / 32, l = e % 32;
        // s = 0, 1: low nibbles of ql[64h + 32s + l]; s = 2, 3: high nibbles of ql[64h +
        // 32(s-2) + l]; top bits 2s..2s+1 of qh[32h + l].
        const uint8_t ql = blk.ql[64 * h + 32 * (s % 2) + l];
        const int lo = s < 2 ? ql & 0xf : ql >> 4;
        const int q = lo | (((blk.qh[32 * h + l] >> (2 * s)) & 3) << 4);
        dot += (q - 32) * x[e];
      }
      sumi += blk.scales[g] * dot;
    }
    acc += fp16_to_fp32(blk.d) * xd[b] * static_cast<float>(sumi);
  }
  return acc;
}

float vec_dot_f32_scalar(const uint8_t* w, const float* x, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, w + 4 * i, 4);
    acc += v * x[i];
  }
  return acc;
}

float vec_dot_f16_scalar(const uint8_t* w, const float* x, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, w + 2 * i, 2);
    acc += fp16_to_fp32(h) * x[i];
  }
  return acc;
}

float vec_dot_bf16_scalar(const uint8_t* w, const float* x, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, w + 2 * i, 2);
    acc += quant::bf16_to_fp32(h) * x[i];
  }
  return acc;
}

namespace {

using QDot = float (*)(const uint8_t*, const int8_t*, const float*, int64_t);
using FDot = float (*)(const uint8_t*, const float*, int64_t);

template <QDot kDot>
void gemm_q_scalar(const GemmArgs& g) {
  const Weight& w = *g.w;
  const QuantizedActs& a = *g.a;
  for (int64_t o = g.row_begin; o < g.row_end; ++o) {
    for (int64_t t = 0; t < g.n_tokens; ++t) {
      g.y[t * w.n_out + o] =
          kDot(w.row(o), a.qs.data() + t * a.qs_stride, a.d.data() + t * a.d_stride, w.n_in);
    }
  }
}

template <FDot kDot>
void gemm_f_scalar(const GemmArgs& g) {
  const Weight& w = *g.w;
  for (int64_t o = g.row_begin; o < g.row_end; ++o) {
    for (int64_t t = 0; t < g.n_tokens; ++t) {
      g.y[t * w.n_out + o] = kDot(w.row(o), g.x + t * w.n_in, w.n_in);
    }
  }
}

}  // namespace

GemmFn gemm_scalar(quant::Type t) {
  switch (t) {
    case quant::Type::F32:
      return gemm_f_scalar<vec_dot_f32_scalar>;
    case quant::Type::F16:
      return gemm_f_scalar<vec_dot_f16_scalar>;
    case quant::Type::BF16:
      return gemm_f_scalar<vec_dot_bf16_scalar>;
    case quant::Type::Q8_0:
      return gemm_q_scalar<vec_dot_q8_0_scalar>;
    case quant::Type::Q4_0:
      return gemm_q_scalar<vec_dot_q4_0_scalar>;
    case quant::Type::Q4_K:
      return gemm_q_scalar<vec_dot_q4_k_scalar>;
    case quant::Type::Q5_K:
      return gemm_q_scalar<vec_dot_q5_k_scalar>;
    case quant::Type::Q6_K:
      return gemm_q_scalar<vec_dot_q6_k_scalar>;
    default:
      return nullptr;
  }
}

}  // namespace kiln::backend::cpu
