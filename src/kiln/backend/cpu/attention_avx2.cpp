// Paged attention with AVX2 + FMA + F16C (flash-attention style on the CPU).
//
// Work item: (sequence, kv head, tile of that sequence's query tokens). Its rows are the
// tile's tokens times the query heads that share the kv head (GQA), so each K/V block is
// decoded once per item and used by every row. Per 16-token block of the sequence:
//   scores[r][0..16) = q_r . k_j        (K stored transposed: one vector = 8 keys of one dim)
//   online softmax per row over the block (Milakov & Gimelshein 2018; Dao et al. 2022):
//     m' = max(m, max_j s_j), l' = l e^(m-m') + sum_j e^(s_j-m'),
//     acc' = acc e^(m-m') + sum_j e^(s_j-m') v_j
// Not causal (AttnParams::causal false): every row of a sequence sees keys 0 .. kv_len - 1.
// Batch invariance: a row's arithmetic depends only on its own position and window (which
// blocks, which keys of each block count), never on the other rows of the item: each score
// lane is one FMA chain over the dims, blocks a row does not reach are skipped for that row,
// and its PV sum runs over its own keys in order. So a token gets bitwise the same output
// alone, in any tile, in any batch and with any thread count.
//
// The target region holds only code with internal linkage and no std:: templates (see
// kernels_avx2.cpp); buffers and the item list are set up outside it.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kiln/backend/cpu/attention.h"
#include "kiln/util/cpu.h"
#include "kiln/util/status.h"

namespace kiln::backend::cpu {
namespace {

constexpr int32_t kBT = 16;  // keys per block that the kernel handles (two vectors)

struct Item {
  int32_t seq;
  int32_t kvh;
  int32_t row_begin;  // flat token rows [row_begin, row_end) of the sequence
  int32_t row_end;
};

struct Ctx {
  const KvLayerView* kv;
  const AttnBatch* b;
  const float* q;
  float* out;
  AttnParams p;
  int32_t group;
};

// Per-thread buffers for one item of up to max_rows rows.
struct Bufs {
  float* q;        // [rows][head_dim_k]
  float* acc;      // [rows][head_dim_v]
  float* sc;       // [rows][16] scores, then probabilities
  float* kt;       // [head_dim_k][16] decoded K (unused for F32)
  float* vb;       // [16][head_dim_v] decoded V (unused for F32)
  float* m;        // [rows] running max
  float* l;        // [rows] running normaliser
  float* corr;     // [rows] e^(m_old - m_new) of the current block
  int32_t* first;  // [rows] first visible position
  int32_t* last;   // [rows] last visible position: its own (causal) or kv_len - 1
  int32_t* lo;     // [rows] first key of the current block the row sees (> hi: none)
  int32_t* hi;     // [rows] last key of the current block the row sees
};

}  // namespace
}  // namespace kiln::backend::cpu

#if defined(__x86_64__)
#include <immintrin.h>

#if defined(__clang__)  // clang has no GCC target pragma: the same as a function attribute
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace kiln::backend::cpu {
namespace {

#include "kiln/backend/cpu/vec_math_avx2.h"

// The fp32 [head_dim][16] K of (block, kvh): the cache itself for F32, else decoded into kt.
const float* load_k(const KvLayerView& kv, int64_t block, int32_t kvh, float* kt) {
  const uint8_t* head = kv.k + block * kv.k_block_bytes + kvh * kv.k_head_bytes();
  const int32_t dk = kv.head_dim_k;
  if (kv.type == quant::Type::F32) return reinterpret_cast<const float*>(head);
  if (kv.type == quant::Type::F16) {
    const __m128i* src = reinterpret_cast<const __m128i*>(head);
    for (int32_t i = 0; i < dk * kBT / 8; ++i)
      _mm256_storeu_ps(kt + 8 * i, _mm256_cvtph_ps(_mm_loadu_si128(src + i)));
    return kt;
  }
  // Q8_0: [16][dk / 32 blocks of (f16 d, 32 x int8)], scattered into the transposed layout.
  const int32_t nb = dk / 32;
  for (int32_t j = 0; j < kBT; ++j) {
    const uint8_t* row = head + int64_t{j} * nb * 34;
    for (int32_t bl = 0; bl < nb; ++bl) {
      uint16_t dh;
      std::memcpy(&dh, row + bl * 34, 2);
      const float d = _cvtsh_ss(dh);
      const int8_t* qs = reinterpret_cast<const int8_t*>(row + bl * 34 + 2);
      for (int32_t i = 0; i < 32; ++i) kt[(bl * 32 + i) * kBT + j] = d * static_cast<float>(qs[i]);
    }
  }
  return kt;
}

// The fp32 [16][head_dim_v] V of (block, kvh).
const float* load_v(const KvLayerView& kv, int64_t block, int32_t kvh, float* vb) {
  const uint8_t* head = kv.v + block * kv.v_block_bytes + kvh * kv.v_head_bytes();
  const int32_t dv = kv.head_dim_v;
  if (kv.type == quant::Type::F32) return reinterpret_cast<const float*>(head);
  if (kv.type == quant::Type::F16) {
    const __m128i* src = reinterpret_cast<const __m128i*>(head);
    for (int32_t i = 0; i < dv * kBT / 8; ++i)
      _mm256_storeu_ps(vb + 8 * i, _mm256_cvtph_ps(_mm_loadu_si128(src + i)));
    return vb;
  }
  const int32_t nb = dv / 32;
  for (int32_t j = 0; j < kBT; ++j) {
    const uint8_t* row = head + int64_t{j} * nb * 34;
    for (int32_t bl = 0; bl < nb; ++bl) {
      uint16_t dh;
      std::memcpy(&dh, row + bl * 34, 2);
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(dh));
      const uint8_t* qs = row + bl * 34 + 2;
      float* dst = vb + int64_t{j} * dv + bl * 32;
      for (int32_t i = 0; i < 4; ++i) {
        const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * i));
        const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
        _mm256_storeu_ps(dst + 8 * i, _mm256_mul_ps(d, f));
      }
    }
  }
  return vb;
}

// sc[r][0..16) = sum_d q[r][d] * kt[d][0..16) for NR rows: one FMA chain per (row, key) lane,
// dims in order, the same whatever NR is.
template <int NR>
void score_rows(const float* q, int32_t dk, const float* kt, float* sc) {
  __m256 a[NR][2];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
  for (int32_t d = 0; d < dk; ++d) {
    const __m256 k0 = _mm256_loadu_ps(kt + d * kBT);
    const __m256 k1 = _mm256_loadu_ps(kt + d * kBT + 8);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const __m256 qb = _mm256_broadcast_ss(q + int64_t{r} * dk + d);
      a[r][0] = _mm256_fmadd_ps(qb, k0, a[r][0]);
      a[r][1] = _mm256_fmadd_ps(qb, k1, a[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
    _mm256_storeu_ps(sc + r * kBT, a[r][0]);
    _mm256_storeu_ps(sc + r * kBT + 8, a[r][1]);
  }
}

// acc[0..8*NV) = acc * corr + sum_{j=lo..hi} p[j] * v[j][0..8*NV), j in order.
template <int NV>
void pv_chunk(float* acc, float corr, const float* p, const float* v, int32_t dv, int32_t lo,
              int32_t hi) {
  __m256 a[NV];
  const __m256 c = _mm256_set1_ps(corr);
#pragma GCC unroll 8
  for (int i = 0; i < NV; ++i) a[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * i), c);
  for (int32_t j = lo; j <= hi; ++j) {
    const __m256 pj = _mm256_broadcast_ss(p + j);
    const float* vj = v + int64_t{j} * dv;
#pragma GCC unroll 8
    for (int i = 0; i < NV; ++i) a[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * i), a[i]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < NV; ++i) _mm256_storeu_ps(acc + 8 * i, a[i]);
}

// The same for two rows over the same keys [lo, hi]: each V vector is loaded once for both.
// Per element the operations are those of pv_chunk.
template <int NV>
void pv_pair(float* acc0, float* acc1, float corr0, float corr1, const float* p0, const float* p1,
             const float* v, int32_t dv, int32_t lo, int32_t hi) {
  __m256 a0[NV], a1[NV];
  const __m256 c0 = _mm256_set1_ps(corr0), c1 = _mm256_set1_ps(corr1);
#pragma GCC unroll 8
  for (int i = 0; i < NV; ++i) {
    a0[i] = _mm256_mul_ps(_mm256_loadu_ps(acc0 + 8 * i), c0);
    a1[i] = _mm256_mul_ps(_mm256_loadu_ps(acc1 + 8 * i), c1);
  }
  for (int32_t j = lo; j <= hi; ++j) {
    const __m256 pj0 = _mm256_broadcast_ss(p0 + j);
    const __m256 pj1 = _mm256_broadcast_ss(p1 + j);
    const float* vj = v + int64_t{j} * dv;
#pragma GCC unroll 8
    for (int i = 0; i < NV; ++i) {
      const __m256 vv = _mm256_loadu_ps(vj + 8 * i);
      a0[i] = _mm256_fmadd_ps(pj0, vv, a0[i]);
      a1[i] = _mm256_fmadd_ps(pj1, vv, a1[i]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < NV; ++i) {
    _mm256_storeu_ps(acc0 + 8 * i, a0[i]);
    _mm256_storeu_ps(acc1 + 8 * i, a1[i]);
  }
}

// Online-softmax update of row r with keys [lo, hi] of a block whose raw scores are in sc.
// Online-softmax statistics of row r for keys [lo, hi] of a block whose raw scores are in sc:
// leaves the probabilities in sc and the correction of the old sums in corr.
void softmax_row(const Ctx& c, const Bufs& w, int32_t r, int32_t lo, int32_t hi) {
  float* s = w.sc + r * kBT;
  const __m256 scale = _mm256_set1_ps(c.p.scale);
  __m256 s0 = _mm256_mul_ps(_mm256_loadu_ps(s), scale);
  __m256 s1 = _mm256_mul_ps(_mm256_loadu_ps(s + 8), scale);
  if (c.p.softcap > 0) {
    const __m256 cap = _mm256_set1_ps(c.p.softcap);
    const __m256 inv = _mm256_set1_ps(1.0f / c.p.softcap);
    s0 = _mm256_mul_ps(cap, tanh8(_mm256_mul_ps(s0, inv)));
    s1 = _mm256_mul_ps(cap, tanh8(_mm256_mul_ps(s1, inv)));
  }
  const __m256 idx0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 idx1 = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
  const __m256 vlo = _mm256_set1_ps(static_cast<float>(lo));
  const __m256 vhi = _mm256_set1_ps(static_cast<float>(hi));
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256 ok0 =
      _mm256_and_ps(_mm256_cmp_ps(idx0, vlo, _CMP_GE_OQ), _mm256_cmp_ps(idx0, vhi, _CMP_LE_OQ));
  const __m256 ok1 =
      _mm256_and_ps(_mm256_cmp_ps(idx1, vlo, _CMP_GE_OQ), _mm256_cmp_ps(idx1, vhi, _CMP_LE_OQ));
  s0 = _mm256_blendv_ps(ninf, s0, ok0);
  s1 = _mm256_blendv_ps(ninf, s1, ok1);
  const float m_old = w.m[r];
  const float m_new = std::max(m_old, hmax8(_mm256_max_ps(s0, s1)));
  const __m256 mn = _mm256_set1_ps(m_new);
  const float corr = _mm256_cvtss_f32(exp8(_mm256_set1_ps(m_old - m_new)));  // 0 when m_old=-inf
  const __m256 p0 = exp8(_mm256_sub_ps(s0, mn));  // masked lanes: exp(-inf) = 0
  const __m256 p1 = exp8(_mm256_sub_ps(s1, mn));
  w.l[r] = w.l[r] * corr + hsum8(_mm256_add_ps(p0, p1));
  w.m[r] = m_new;
  _mm256_storeu_ps(s, p0);
  _mm256_storeu_ps(s + 8, p1);
  w.corr[r] = corr;
}

// acc_r = acc_r * corr_r + sum_j p_rj v_j for every row that sees keys of this block; rows with
// the same key range go in pairs (one V load for both), with the same per-element arithmetic.
void pv_rows(const Bufs& w, int32_t n_rows, const float* vb, int32_t dv) {
  for (int32_t r = 0; r < n_rows;) {
    const int32_t lo = w.lo[r], hi = w.hi[r];
    if (lo > hi) {
      ++r;
      continue;
    }
    float* acc = w.acc + int64_t{r} * dv;
    const float* p = w.sc + r * kBT;
    if (r + 1 < n_rows && w.lo[r + 1] == lo && w.hi[r + 1] == hi) {
      float* acc1 = acc + dv;
      const float* p1 = p + kBT;
      int32_t i = 0;
      for (; i + 32 <= dv; i += 32)
        pv_pair<4>(acc + i, acc1 + i, w.corr[r], w.corr[r + 1], p, p1, vb + i, dv, lo, hi);
      for (; i < dv; i += 8)
        pv_pair<1>(acc + i, acc1 + i, w.corr[r], w.corr[r + 1], p, p1, vb + i, dv, lo, hi);
      r += 2;
    } else {
      int32_t i = 0;
      for (; i + 64 <= dv; i += 64) pv_chunk<8>(acc + i, w.corr[r], p, vb + i, dv, lo, hi);
      for (; i < dv; i += 8) pv_chunk<1>(acc + i, w.corr[r], p, vb + i, dv, lo, hi);
      r += 1;
    }
  }
}

void attend_item(const Ctx& c, const Item& it, const Bufs& w) {
  const KvLayerView& kv = *c.kv;
  const AttnBatch& b = *c.b;
  const int32_t dk = kv.head_dim_k, dv = kv.head_dim_v, g = c.group, n_heads = c.p.n_heads;
  const int32_t n_rows = (it.row_end - it.row_begin) * g;
  int32_t blk_lo = std::numeric_limits<int32_t>::max(), blk_hi = -1;
  for (int32_t t = it.row_begin; t < it.row_end; ++t) {
    const int32_t pos = b.positions[t];
    const int32_t first = c.p.sliding_window > 0 ? std::max(0, pos - c.p.sliding_window + 1) : 0;
    const int32_t last = c.p.causal ? pos : b.kv_len[it.seq] - 1;
    blk_lo = std::min(blk_lo, first / kBT);
    blk_hi = std::max(blk_hi, last / kBT);
    for (int32_t gi = 0; gi < g; ++gi) {
      const int32_t r = (t - it.row_begin) * g + gi;
      const int64_t h = int64_t{it.kvh} * g + gi;
      std::memcpy(w.q + int64_t{r} * dk, c.q + (int64_t{t} * n_heads + h) * dk, sizeof(float) * dk);
      std::memset(w.acc + int64_t{r} * dv, 0, sizeof(float) * dv);
      w.m[r] = -std::numeric_limits<float>::infinity();
      w.l[r] = 0.0f;
      w.first[r] = first;
      w.last[r] = last;
    }
  }
  const int32_t* table = b.kv_indices + b.kv_indptr[it.seq];
  for (int32_t bi = blk_lo; bi <= blk_hi; ++bi) {
    const int64_t block = table[bi];
    const float* kt = load_k(kv, block, it.kvh, w.kt);
    const float* vb = load_v(kv, block, it.kvh, w.vb);
    int32_t r = 0;
    for (; r + 4 <= n_rows; r += 4) score_rows<4>(w.q + int64_t{r} * dk, dk, kt, w.sc + r * kBT);
    for (; r < n_rows; ++r) score_rows<1>(w.q + int64_t{r} * dk, dk, kt, w.sc + r * kBT);
    const int32_t base = bi * kBT;
    for (r = 0; r < n_rows; ++r) {
      w.lo[r] = std::max(w.first[r], base) - base;
      w.hi[r] = std::min(w.last[r], base + kBT - 1) - base;
      if (w.lo[r] <= w.hi[r]) softmax_row(c, w, r, w.lo[r], w.hi[r]);
    }
    pv_rows(w, n_rows, vb, dv);
  }
  for (int32_t t = it.row_begin; t < it.row_end; ++t) {
    for (int32_t gi = 0; gi < g; ++gi) {
      const int32_t r = (t - it.row_begin) * g + gi;
      const int64_t h = int64_t{it.kvh} * g + gi;
      const float* acc = w.acc + int64_t{r} * dv;
      float* o = c.out + (int64_t{t} * n_heads + h) * dv;
      const __m256 l = _mm256_set1_ps(w.l[r]);
      for (int32_t i = 0; i < dv; i += 8)
        _mm256_storeu_ps(o + i, _mm256_div_ps(_mm256_loadu_ps(acc + i), l));
    }
  }
}

}  // namespace
}  // namespace kiln::backend::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace kiln::backend::cpu {
namespace {
constexpr bool kHaveAvx2Kernels = true;
}  // namespace
}  // namespace kiln::backend::cpu

#else  // not x86-64

namespace kiln::backend::cpu {
namespace {
constexpr bool kHaveAvx2Kernels = false;
void attend_item(const Ctx&, const Item&, const Bufs&) {
  KILN_ASSERT(false);
}
}  // namespace
}  // namespace kiln::backend::cpu

#endif

namespace kiln::backend::cpu {

bool avx2_ops_available() {
  const util::CpuFeatures& f = util::cpu_features();
  return kHaveAvx2Kernels && f.avx2 && f.fma && f.f16c;
}

bool attention_avx2_supports(const KvLayerView& kv) {
  return kv.block_tokens == kBT && kv.head_dim_k % 8 == 0 && kv.head_dim_v % 8 == 0 &&
         (kv.type == quant::Type::F32 || kv.type == quant::Type::F16 ||
          (kv.type == quant::Type::Q8_0 && kv.head_dim_k % 32 == 0 && kv.head_dim_v % 32 == 0));
}

namespace {

// Below this many multiply-adds (q.k plus p.v over every visible key) the step runs on the
// calling thread: waking the pool costs more than it saves.
constexpr int64_t kParallelMinWork = int64_t{1} << 17;

// Query tokens per item: about 16 rows with the GQA group, at least one token.
int32_t tile_tokens(int32_t group) {
  return std::max<int32_t>(1, 16 / group);
}

}  // namespace

void attention_avx2(const KvLayerView& kv, const AttnBatch& b, const float* q, float* out,
                    const AttnParams& params, util::ThreadPool* pool) {
  KILN_ASSERT(avx2_ops_available() && attention_avx2_supports(kv));
  KILN_ASSERT(params.n_heads > 0 && params.n_heads % kv.n_kv_heads == 0);
  KILN_ASSERT(params.causal || params.sliding_window == 0);
  Ctx c{&kv, &b, q, out, params, params.n_heads / kv.n_kv_heads};
  const int32_t tile = tile_tokens(c.group);
  // Items, the costliest (last tiles of each sequence) first so dynamic scheduling ends even.
  thread_local std::vector<Item> items;
  items.clear();
  int64_t work = 0;
  for (int32_t s = 0; s < b.num_seqs; ++s) {
    const int32_t begin = b.qo_indptr[s], end = b.qo_indptr[s + 1];
    for (int32_t t = begin; t < end; ++t) {
      KILN_ASSERT(b.positions[t] >= 0 && b.positions[t] < b.kv_len[s]);
      const int32_t last = params.causal ? b.positions[t] : b.kv_len[s] - 1;
      KILN_ASSERT(b.kv_indptr[s] + last / kBT < b.kv_indptr[s + 1]);
      const int32_t first =
          params.sliding_window > 0 ? std::max(0, b.positions[t] - params.sliding_window + 1) : 0;
      work += int64_t{last - first + 1} * params.n_heads * (kv.head_dim_k + kv.head_dim_v);
    }
    const int32_t num_tiles = (end - begin + tile - 1) / tile;
    for (int32_t k = num_tiles - 1; k >= 0; --k) {
      const int32_t tb = begin + k * tile;
      for (int32_t h = 0; h < kv.n_kv_heads; ++h)
        items.push_back(Item{s, h, tb, std::min(tb + tile, end)});
    }
  }
  const int32_t max_rows = tile * c.group;
  const Item* item_list = items.data();  // the caller's list (items is thread_local)
  auto run = [&](int64_t begin, int64_t end, int) {
    thread_local std::vector<float> fbuf;
    thread_local std::vector<int32_t> ibuf;
    const size_t dk = static_cast<size_t>(kv.head_dim_k), dv = static_cast<size_t>(kv.head_dim_v);
    const size_t rows = static_cast<size_t>(max_rows);
    const size_t need = rows * (dk + dv + kBT + 3) + dk * kBT + kBT * dv;
    if (fbuf.size() < need) fbuf.resize(need);
    if (ibuf.size() < 4 * rows) ibuf.resize(4 * rows);
    Bufs w;
    w.q = fbuf.data();
    w.acc = w.q + rows * dk;
    w.sc = w.acc + rows * dv;
    w.kt = w.sc + rows * kBT;
    w.vb = w.kt + dk * kBT;
    w.m = w.vb + kBT * dv;
    w.l = w.m + rows;
    w.corr = w.l + rows;
    w.first = ibuf.data();
    w.last = w.first + rows;
    w.lo = w.last + rows;
    w.hi = w.lo + rows;
    for (int64_t i = begin; i < end; ++i) attend_item(c, item_list[i], w);
  };
  const int64_t n_items = static_cast<int64_t>(items.size());
  if (pool != nullptr && pool->num_threads() > 1 && work >= kParallelMinWork) {
    pool->parallel_for_dynamic(n_items, 1, run);
  } else {
    run(0, n_items, 0);
  }
}

}  // namespace kiln::backend::cpu
