// The CUDA paged KV cache and attention (backend/cuda/attention.cu) against the CPU backend.
//
// - kv_write: both backends write the same fp32 K/V rows into their own cache layout; every
//   stored row read back (cuda::kv_read vs cpu::kv_read_k / kv_read_v) is equal bit for bit,
//   special values included (f16 overflow, ties and subnormals; Q8_0 all-zero groups and
//   clamped scales).
// - attention: each kernel (decode with and without split-K, prefill) on random batches of
//   several sequences (1-token sequences, lengths off the block size, scattered block ids,
//   prefill, chunked prefill and decode rows mixed) matches cpu::attention_reference within
//   kTol of the largest |V|. Both read the same stored K/V values, so the difference is
//   fp32 arithmetic in another order (dot products, per-chunk softmax, split merging) and
//   CUDA's expf/tanhf (2 ulp): observed ~1e-6, bound 1e-5.
// Outputs are poisoned (NaN) before each run, so an unwritten element fails.
//
// DISABLED_CudaAttentionBench prints achieved GB/s (decode, kv_write) and TFLOP/s (prefill)
// against a device-to-device copy measured in the same run; run it with
// --gtest_also_run_disabled_tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kiln/backend/cpu/attention.h"
#include "kiln/backend/cpu/ops.h"
#include "kiln/backend/cuda/attention_impl.h"
#include "kiln/backend/cuda/kernels.h"
#include "kiln/quant/fp16.h"
#include "kiln/quant/types.h"
#include "kiln/util/thread_pool.h"
#include "test_util.h"

namespace kiln::backend {
namespace {

using quant::Type;

constexpr float kTol = 1e-5f;  // of max |V|
// The tensor-core prefill (F16 caches, head dim 64/128/256) rounds Q and the softmax weights to
// fp16 (relative 2^-11 each): 4e-3 of max |V|.
constexpr float kTcTol = 4e-3f;

std::vector<float> random_vec(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

util::ThreadPool& pool() {
  static util::ThreadPool p(
      static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 32u)));
  return p;
}

struct Shape {
  Type type = Type::F16;
  int32_t n_kv_heads = 2;
  int32_t group = 1;  // query heads per kv head
  int32_t dk = 128, dv = 128;
  int32_t block_tokens = 16;
  int32_t window = 0;
  float softcap = 0.0f;
  bool causal = true;
  int32_t n_heads() const { return n_kv_heads * group; }
  std::string name() const {
    return std::string(quant::type_name(type)) + " kv_heads " + std::to_string(n_kv_heads) +
           " group " + std::to_string(group) + " dk " + std::to_string(dk) + " dv " +
           std::to_string(dv) + " bt " + std::to_string(block_tokens) + " window " +
           std::to_string(window) + " softcap " + std::to_string(softcap) +
           (causal ? "" : " not causal");
  }
};

struct SeqSpec {
  int32_t len;        // kv_len after this step
  int32_t n_queries;  // the last n_queries positions are this step's query rows
};

// A batch over a paged cache of scattered blocks, and the CPU cache written by cpu::kv_write.
struct PagedCase {
  Shape sh;
  int32_t n_blocks = 0;
  int32_t max_q_len = 0;
  // The query step and the write batch (every position of every sequence, one kv_write).
  std::vector<int32_t> qo{0}, kv_ptr{0}, kv_idx, kv_len, pos, w_qo{0}, w_pos;
  std::vector<float> kf, vf, q;  // [write rows, kv heads, dk], [.., dv], [rows, heads, dk]
  std::vector<uint8_t> cpu_k, cpu_v;
  cpu::KvLayerView cpu_kv;

  int64_t n_rows() const { return qo.back(); }
  int32_t num_seqs() const { return static_cast<int32_t>(kv_len.size()); }
  AttnBatch write_batch() const {
    return {num_seqs(), w_qo.data(), kv_ptr.data(), kv_idx.data(), kv_len.data(), w_pos.data()};
  }
  AttnBatch query_batch() const {
    return {num_seqs(), qo.data(), kv_ptr.data(), kv_idx.data(), kv_len.data(), pos.data()};
  }
};

// Values that exercise the conversions: f16 rounding ties, overflow, subnormals; Q8_0 groups
// of zeros and scales clamped to the largest f16.
void add_special_values(std::vector<float>& x, int32_t dim) {
  const float special[] = {0.0f,     -0.0f,    65504.0f, 65520.0f, -1e9f,
                           5.96e-8f, 2.98e-8f, 1e-5f,    -3e-6f,   1.00048828125f /* f16 tie */,
                           0.5f,     -127.5f,  3e-38f};
  const size_t n = std::min<size_t>(x.size(), static_cast<size_t>(dim) * 3);
  for (size_t i = 0; i < n && i < std::size(special) * 3; ++i)
    x[i] = special[i % std::size(special)];
  if (x.size() >= static_cast<size_t>(dim) * 4)  // a row of zeros (Q8_0: d = 0)
    std::fill(x.begin() + dim * 3, x.begin() + dim * 4, 0.0f);
  if (x.size() >= static_cast<size_t>(dim) * 5)  // a huge row (Q8_0: d clamped to 65504)
    for (int32_t i = 0; i < dim; ++i) x[dim * 4 + i] = (i % 2 ? 1e8f : -3e7f) * (1 + i);
}

PagedCase make_case(std::mt19937& rng, const Shape& sh, const std::vector<SeqSpec>& seqs,
                    bool special = false) {
  PagedCase c;
  c.sh = sh;
  const int32_t bt = sh.block_tokens;
  for (const SeqSpec& s : seqs) c.n_blocks += (s.len + bt - 1) / bt;
  c.n_blocks += 5;  // spare blocks, never read (poisoned on the device)
  std::vector<int32_t> perm(static_cast<size_t>(c.n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  size_t next = 0;
  for (const SeqSpec& s : seqs) {
    for (int32_t b = 0; b < (s.len + bt - 1) / bt; ++b) c.kv_idx.push_back(perm[next++]);
    c.kv_ptr.push_back(static_cast<int32_t>(c.kv_idx.size()));
    c.kv_len.push_back(s.len);
    c.qo.push_back(c.qo.back() + s.n_queries);
    for (int32_t p = s.len - s.n_queries; p < s.len; ++p) c.pos.push_back(p);
    c.w_qo.push_back(c.w_qo.back() + s.len);
    for (int32_t p = 0; p < s.len; ++p) c.w_pos.push_back(p);
    c.max_q_len = std::max(c.max_q_len, s.n_queries);
  }
  const int64_t n_w = c.w_qo.back();
  c.kf = random_vec(rng, n_w * sh.n_kv_heads * sh.dk, -1, 1);
  c.vf = random_vec(rng, n_w * sh.n_kv_heads * sh.dv, -1, 1);
  if (special) {
    add_special_values(c.kf, sh.dk);
    add_special_values(c.vf, sh.dv);
  }
  c.q = random_vec(rng, c.n_rows() * sh.n_heads() * sh.dk, -1, 1);
  c.cpu_k.assign(
      static_cast<size_t>(c.n_blocks * cuda::kv_block_bytes(sh.type, bt, sh.n_kv_heads, sh.dk)), 0);
  c.cpu_v.assign(
      static_cast<size_t>(c.n_blocks * cuda::kv_block_bytes(sh.type, bt, sh.n_kv_heads, sh.dv)), 0);
  c.cpu_kv =
      cpu::make_kv_view(sh.type, c.cpu_k.data(), c.cpu_v.data(), bt, sh.n_kv_heads, sh.dk, sh.dv);
  cpu::kv_write(c.cpu_kv, c.write_batch(), c.kf.data(), c.vf.data());
  return c;
}

// The same case on the device: a poisoned cache written by cuda::kv_write.
struct DeviceCase {
  explicit DeviceCase(const PagedCase& c)
      : k(static_cast<size_t>(c.cpu_kv.k_block_bytes * c.n_blocks)),
        v(static_cast<size_t>(c.cpu_kv.v_block_bytes * c.n_blocks)),
        qo(c.qo),
        kv_ptr(c.kv_ptr),
        kv_idx(c.kv_idx),
        kv_len(c.kv_len),
        pos(c.pos),
        w_qo(c.w_qo),
        w_pos(c.w_pos),
        kf(c.kf),
        vf(c.vf),
        q(c.q),
        out(static_cast<size_t>(c.n_rows() * c.sh.n_heads() * c.sh.dv)),
        ws(static_cast<size_t>(cuda::attention_workspace_bytes(c.sh.n_heads(), c.sh.dv))) {
    const Shape& sh = c.sh;
    kv = cuda::make_kv_layer(sh.type, k.get(), v.get(), sh.block_tokens, sh.n_kv_heads, sh.dk,
                             sh.dv);
    EXPECT_EQ(kv.k_block_bytes, c.cpu_kv.k_block_bytes);
    EXPECT_EQ(kv.v_block_bytes, c.cpu_kv.v_block_bytes);
    EXPECT_EQ(cudaSuccess, cudaMemset(k.get(), 0xFF, kv.k_block_bytes * c.n_blocks));
    EXPECT_EQ(cudaSuccess, cudaMemset(v.get(), 0xFF, kv.v_block_bytes * c.n_blocks));
    const AttnBatch wb{c.num_seqs(), w_qo.get(),   kv_ptr.get(),
                       kv_idx.get(), kv_len.get(), w_pos.get()};
    cuda::kv_write(kv, wb, c.w_qo.back(), kf.get(), vf.get(), nullptr);
    EXPECT_EQ(cudaSuccess, cudaGetLastError());
    EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
  }
  AttnBatch query_batch(const PagedCase& c) const {
    return {c.num_seqs(), qo.get(), kv_ptr.get(), kv_idx.get(), kv_len.get(), pos.get()};
  }

  test::DeviceVec<uint8_t> k, v;
  test::DeviceVec<int32_t> qo, kv_ptr, kv_idx, kv_len, pos, w_qo, w_pos;
  test::DeviceVec<float> kf, vf, q, out;
  test::DeviceVec<uint8_t> ws;
  cuda::KvLayer kv;
};

// Every stored row of every sequence: the CUDA cache decodes to the CPU's bits.
void expect_same_cache(const PagedCase& c, const cuda::KvLayer& kv) {
  const Shape& sh = c.sh;
  std::vector<float> a(static_cast<size_t>(std::max(sh.dk, sh.dv)));
  std::vector<float> b(a.size());
  int failures = 0;
  for (int32_t s = 0; s < c.num_seqs(); ++s) {
    for (int32_t p = 0; p < c.kv_len[s]; ++p) {
      const int64_t block = c.kv_idx[c.kv_ptr[s] + p / sh.block_tokens];
      const int32_t j = p % sh.block_tokens;
      for (int32_t h = 0; h < sh.n_kv_heads; ++h) {
        for (bool is_k : {true, false}) {
          const int32_t dim = is_k ? sh.dk : sh.dv;
          if (is_k) {
            cpu::kv_read_k(c.cpu_kv, block, j, h, a.data());
          } else {
            cpu::kv_read_v(c.cpu_kv, block, j, h, a.data());
          }
          cuda::kv_read(kv, is_k, block, j, h, b.data());
          if (std::memcmp(a.data(), b.data(), static_cast<size_t>(dim) * 4) != 0 &&
              failures++ < 5) {
            int32_t d = 0;
            while (std::memcmp(&a[d], &b[d], 4) == 0) ++d;
            ADD_FAILURE() << sh.name() << ": " << (is_k ? "K" : "V") << " seq " << s << " pos " << p
                          << " head " << h << " dim " << d << ": cpu " << a[d] << " cuda " << b[d];
          }
        }
      }
    }
  }
  EXPECT_EQ(failures, 0) << sh.name();
}

enum class Variant {
  Prefill,
  PrefillTc,
  DecodeNoSplit,
  DecodeSplit,
  DecodeTcNoSplit,
  DecodeTcSplit,
  Auto
};

bool is_decode(Variant v) {
  return v == Variant::DecodeNoSplit || v == Variant::DecodeSplit ||
         v == Variant::DecodeTcNoSplit || v == Variant::DecodeTcSplit;
}
bool is_split(Variant v) {
  return v == Variant::DecodeSplit || v == Variant::DecodeTcSplit || v == Variant::Auto;
}

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::Prefill:
      return "prefill";
    case Variant::PrefillTc:
      return "prefill (tensor cores)";
    case Variant::DecodeNoSplit:
      return "decode";
    case Variant::DecodeSplit:
      return "decode split-K";
    case Variant::DecodeTcNoSplit:
      return "decode (tensor cores)";
    case Variant::DecodeTcSplit:
      return "decode split-K (tensor cores)";
    default:
      return "auto";
  }
}

std::vector<float> run_cuda(DeviceCase& d, const PagedCase& c, Variant variant) {
  const Shape& sh = c.sh;
  const size_t out_n = static_cast<size_t>(c.n_rows() * sh.n_heads() * sh.dv);
  EXPECT_EQ(cudaSuccess, cudaMemset(d.out.get(), 0xFF, out_n * sizeof(float)));  // NaN
  cuda::AttnParams p;
  p.n_heads = sh.n_heads();
  p.scale = 1.0f / std::sqrt(static_cast<float>(sh.dk));
  p.softcap = sh.softcap;
  p.sliding_window = sh.window;
  p.causal = sh.causal;
  if (is_split(variant)) {
    p.workspace = d.ws.get();
    p.workspace_bytes = cuda::attention_workspace_bytes(sh.n_heads(), sh.dv);
  }
  const cuda::AttnKernel kernel =
      variant == Variant::Prefill     ? cuda::AttnKernel::Prefill
      : variant == Variant::PrefillTc ? cuda::AttnKernel::PrefillTc
      : variant == Variant::Auto      ? cuda::AttnKernel::Auto
      : variant == Variant::DecodeTcNoSplit || variant == Variant::DecodeTcSplit
          ? cuda::AttnKernel::DecodeTc
          : cuda::AttnKernel::Decode;
  // The decode kernel's int8 copy of its output (for the o projection's matvec): bit for bit
  // what quantize_q8_32 makes of the output, whoever wrote the row (split 0 alone, or the
  // last split to finish after merging).
  const bool q8 = is_decode(variant) && sh.dv % 32 == 0;
  const int64_t width = int64_t{sh.n_heads()} * sh.dv;
  test::DeviceVec<int8_t> xq(q8 ? out_n : 0), want_q(q8 ? out_n : 0);
  test::DeviceVec<float2> xds(q8 ? out_n / 32 : 0), want_ds(q8 ? out_n / 32 : 0);
  if (q8) p.xq = xq.get(), p.xds = xds.get();
  const bool quantized = cuda::attention_with(kernel, d.kv, d.query_batch(c), c.n_rows(),
                                              c.max_q_len, d.q.get(), d.out.get(), p, nullptr);
  EXPECT_EQ(cudaSuccess, cudaGetLastError());
  EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
  EXPECT_EQ(quantized, q8) << sh.name() << " " << variant_name(variant);
  if (q8) {
    cuda::quantize_q8_32(d.out.get(), c.n_rows(), width, want_q.get(), want_ds.get(), nullptr);
    EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
    EXPECT_EQ(xq.to_host(), want_q.to_host()) << sh.name() << " " << variant_name(variant);
    const std::vector<float2> a = xds.to_host(), b = want_ds.to_host();
    size_t bad = 0;
    while (bad < a.size() && a[bad].x == b[bad].x && a[bad].y == b[bad].y) ++bad;
    EXPECT_EQ(bad, a.size()) << sh.name() << " " << variant_name(variant) << ": group " << bad
                             << " differs";
  }
  return d.out.to_host();
}

// cpu::attention_reference on the case's cache, causal or not.
std::vector<float> run_cpu(const PagedCase& c, bool causal) {
  const Shape& sh = c.sh;
  std::vector<float> out(static_cast<size_t>(c.n_rows() * sh.n_heads() * sh.dv));
  cpu::AttnParams p;
  p.n_heads = sh.n_heads();
  p.scale = 1.0f / std::sqrt(static_cast<float>(sh.dk));
  p.softcap = sh.softcap;
  p.sliding_window = sh.window;
  p.causal = causal;
  cpu::attention_reference(c.cpu_kv, c.query_batch(), c.q.data(), out.data(), p, &pool());
  return out;
}

std::vector<float> run_cpu(const PagedCase& c) {
  return run_cpu(c, c.sh.causal);
}

// Worst |cuda - cpu| / max|V| over every variant; fails past kTol or on a non-finite output.
double check_case(const PagedCase& c, bool check_cache = true) {
  DeviceCase d(c);
  if (check_cache) expect_same_cache(c, d.kv);
  const std::vector<float> want = run_cpu(c);
  float v_max = 0;
  for (float x : c.vf) v_max = std::max(v_max, std::fabs(x));
  double worst = 0;
  const bool tc = cuda::attention_prefill_tc_supports(d.kv);
  const bool decode_tc = cuda::attention_decode_tc_supports(d.kv);
  for (Variant variant :
       {Variant::Prefill, Variant::PrefillTc, Variant::DecodeNoSplit, Variant::DecodeSplit,
        Variant::DecodeTcNoSplit, Variant::DecodeTcSplit, Variant::Auto}) {
    if (variant == Variant::PrefillTc && !tc) continue;
    const bool on_decode_tc = variant == Variant::DecodeTcNoSplit ||
                              variant == Variant::DecodeTcSplit ||
                              (variant == Variant::Auto && c.max_q_len <= 1);
    if (on_decode_tc && variant != Variant::Auto && !decode_tc) continue;
    const std::vector<float> got = run_cuda(d, c, variant);
    // The tensor-core kernels (also what Auto runs for their caches) round Q and P to fp16.
    const bool on_tc =
        (tc && (variant == Variant::PrefillTc || (variant == Variant::Auto && c.max_q_len > 1))) ||
        (decode_tc && on_decode_tc);
    const double tol = on_tc ? kTcTol : kTol;
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
      if (!(err <= tol * v_max)) {
        if (bad++ < 5)
          ADD_FAILURE() << c.sh.name() << " " << variant_name(variant) << ": out[" << i << "] (row "
                        << i / (c.sh.n_heads() * c.sh.dv) << ") cuda " << got[i] << " cpu "
                        << want[i];
      } else {
        worst = std::max(worst, err / v_max);
      }
    }
    EXPECT_EQ(bad, 0) << c.sh.name() << " " << variant_name(variant);
  }
  return worst;
}

const std::vector<SeqSpec> kDecodeSeqs = {{1, 1}, {17, 1}, {100, 1}, {16, 1}, {333, 1}, {64, 1}};
// Prefill from empty, chunked prefill, decode rows and a 1-token sequence in one batch.
const std::vector<SeqSpec> kMixedSeqs = {{1, 1},   {37, 37},  {100, 13}, {16, 16},
                                         {300, 1}, {129, 64}, {48, 2}};

TEST(CudaKvCache, WriteStoresTheCpuValuesBitForBit) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(11);
  for (Type type : {Type::F32, Type::F16, Type::Q8_0}) {
    for (int32_t dim : {64, 96, 128, 256}) {
      Shape sh;
      sh.type = type;
      sh.n_kv_heads = 3;
      sh.dk = dim;
      sh.dv = dim == 96 ? 64 : dim;
      const PagedCase c = make_case(rng, sh, {{1, 1}, {37, 5}, {16, 16}, {50, 1}}, true);
      DeviceCase d(c);
      expect_same_cache(c, d.kv);
    }
  }
}

TEST(CudaKvCache, BlockBytesMatchTheCpuView) {
  for (Type type : {Type::F32, Type::F16, Type::Q8_0}) {
    const cpu::KvLayerView view = cpu::make_kv_view(type, nullptr, nullptr, 16, 8, 128, 64);
    EXPECT_EQ(cuda::kv_block_bytes(type, 16, 8, 128), view.k_block_bytes);
    EXPECT_EQ(cuda::kv_block_bytes(type, 16, 8, 64), view.v_block_bytes);
  }
}

TEST(CudaAttention, DecodeBatchesMatchReference) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(21);
  double worst = 0;
  for (Type type : {Type::F32, Type::F16, Type::Q8_0}) {
    for (int32_t dim : {64, 128, 256}) {
      for (int32_t group : {1, 4, 8}) {
        Shape sh;
        sh.type = type;
        sh.group = group;
        sh.dk = sh.dv = dim;
        worst = std::max(worst, check_case(make_case(rng, sh, kDecodeSeqs)));
      }
    }
  }
  std::printf("decode batches: worst |cuda - cpu| = %.3g of max |V|\n", worst);
}

TEST(CudaAttention, MixedPrefillDecodeBatchesMatchReference) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(22);
  double worst = 0;
  for (Type type : {Type::F32, Type::F16, Type::Q8_0}) {
    for (int32_t dim : {64, 128, 256}) {
      for (int32_t group : {1, 4, 8}) {
        Shape sh;
        sh.type = type;
        sh.group = group;
        sh.dk = sh.dv = dim;
        worst = std::max(worst, check_case(make_case(rng, sh, kMixedSeqs)));
      }
    }
  }
  std::printf("mixed batches: worst |cuda - cpu| = %.3g of max |V|\n", worst);
}

TEST(CudaAttention, SlidingWindowAndSoftcapMatchReference) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(23);
  double worst = 0;
  for (Type type : {Type::F16, Type::Q8_0}) {
    for (int32_t window : {0, 1, 7, 32, 100}) {
      for (float softcap : {0.0f, 5.0f}) {
        Shape sh;
        sh.type = type;
        sh.group = 4;
        sh.window = window;
        sh.softcap = softcap;
        worst = std::max(worst, check_case(make_case(rng, sh, kMixedSeqs), false));
      }
    }
  }
  std::printf("window/softcap: worst |cuda - cpu| = %.3g of max |V|\n", worst);
}

TEST(CudaAttention, OtherHeadDimsGroupsAndBlockSizes) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(24);
  double worst = 0;
  struct Geo {
    Type type;
    int32_t dk, dv, group, n_kv_heads, block_tokens;
  };
  const Geo geos[] = {
      {Type::F16, 80, 80, 4, 2, 16},    {Type::F32, 96, 96, 2, 2, 16},
      {Type::Q8_0, 96, 64, 3, 2, 16},   {Type::F16, 128, 128, 16, 2, 16},  // two head chunks
      {Type::F16, 64, 64, 6, 1, 16},    {Type::F16, 128, 128, 7, 2, 16},
      {Type::F16, 256, 256, 12, 1, 16}, {Type::F16, 128, 128, 4, 2, 32},
      {Type::Q8_0, 128, 128, 2, 4, 8},
  };
  for (const Geo& g : geos) {
    Shape sh;
    sh.type = g.type;
    sh.dk = g.dk;
    sh.dv = g.dv;
    sh.group = g.group;
    sh.n_kv_heads = g.n_kv_heads;
    sh.block_tokens = g.block_tokens;
    worst = std::max(worst, check_case(make_case(rng, sh, kMixedSeqs)));
    worst = std::max(worst, check_case(make_case(rng, sh, kDecodeSeqs), false));
  }
  std::printf("other shapes: worst |cuda - cpu| = %.3g of max |V|\n", worst);
}

TEST(CudaAttention, LongContextSplitKMatchesReference) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(25);
  Shape sh;
  sh.group = 8;
  const PagedCase c = make_case(rng, sh, {{5000, 1}, {3, 1}});
  cuda::AttnParams p;
  p.n_heads = sh.n_heads();
  p.workspace = reinterpret_cast<void*>(1);  // only the size matters to the split count
  p.workspace_bytes = cuda::attention_workspace_bytes(sh.n_heads(), sh.dv);
  cuda::KvLayer kv = cuda::make_kv_layer(sh.type, nullptr, nullptr, 16, sh.n_kv_heads, 128, 128);
  EXPECT_GT(cuda::attention_decode_splits(kv, 2, p), 1);
  EXPECT_EQ(cuda::attention_decode_splits(kv, 4096, p), 1);
  p.workspace = nullptr;
  EXPECT_EQ(cuda::attention_decode_splits(kv, 2, p), 1);
  const double worst = check_case(c, false);
  std::printf("long context: worst |cuda - cpu| = %.3g of max |V|\n", worst);
  // A long prefill run too (many query tiles, chunks of keys past the first).
  const double worst2 = check_case(make_case(rng, sh, {{700, 650}, {90, 1}}), false);
  std::printf("long prefill: worst |cuda - cpu| = %.3g of max |V|\n", worst2);
}

// causal = false (an encoder): every kernel (fp32 prefill, tensor-core prefill, decode with and
// without split-K, auto) against cpu::attention_reference with causal = false, on batches of
// whole sequences (1 token, off the block size, block-exact, several tiles), a query chunk
// after cached keys (rows before the end of their sequence, whose keys after them count) and a
// decode row; the decode kernels run every row of the batch too. F32, F16 and Q8_0 caches, head
// dims 64, 128 and 256, GQA (one and two head chunks). The data tells the masks apart: the causal
// reference differs from the non-causal one by far more than the bound.
TEST(CudaAttention, NonCausalMatchesReference) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(27);
  const std::vector<SeqSpec> seqs = {{1, 1},    {37, 37}, {16, 16},  {129, 129},
                                     {200, 13}, {48, 1},  {100, 100}};
  double worst = 0;
  for (Type type : {Type::F32, Type::F16, Type::Q8_0}) {
    for (int32_t dim : {64, 128, 256}) {
      for (int32_t group : {1, 4, 16}) {
        Shape sh;
        sh.type = type;
        sh.group = group;
        sh.dk = sh.dv = dim;
        sh.causal = false;
        const PagedCase c = make_case(rng, sh, seqs);
        const std::vector<float> a = run_cpu(c, false), b = run_cpu(c, true);
        float diff = 0;
        for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(a[i] - b[i]));
        EXPECT_GT(diff, 10 * kTcTol) << sh.name();
        worst = std::max(worst, check_case(c, false));
      }
    }
  }
  // A long encoder input: many query tiles and key chunks.
  Shape sh;
  sh.group = 8;
  sh.causal = false;
  worst = std::max(worst, check_case(make_case(rng, sh, {{700, 700}, {90, 90}, {3, 1}}), false));
  std::printf("not causal: worst |cuda - cpu| = %.3g of max |V|\n", worst);
}

// The fused rope + KV write equals rope_apply2 then kv_write, bit for bit: q and k rotated in
// place and every byte of the cache, for each cache type, both rope layouts and a partial
// rotation (fewer pairs than head_dim / 2). With per-head norms (qwen3), it equals rmsnorm of
// the q and k head rows first, at head dims 64, 128 and 256 (one and two warps of values).
TEST(CudaAttention, RopeKvWriteEqualsRopeThenKvWrite) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(31);
  struct Form {
    bool normed;
    int32_t dim;
  };
  for (Form form : {Form{false, 64}, Form{true, 64}, Form{true, 128}, Form{true, 256}}) {
    for (Type type : {Type::F32, Type::F16, Type::Q8_0}) {
      for (bool neox : {false, true}) {
        for (bool partial : {false, true}) {
          Shape sh;
          sh.type = type;
          sh.n_kv_heads = 2;
          sh.group = 3;
          sh.dk = sh.dv = form.dim;
          const PagedCase c = make_case(rng, sh, {{37, 5}, {3, 3}, {20, 1}});
          const int64_t n = c.w_qo.back();
          const int32_t n_pairs = partial ? sh.dk / 4 : sh.dk / 2;
          const std::vector<float> q = random_vec(rng, n * sh.n_heads() * sh.dk, -2, 2);
          const std::vector<float> cs = random_vec(rng, n * n_pairs, -1, 1);
          const std::vector<float> sn = random_vec(rng, n * n_pairs, -1, 1);
          const uint64_t kb = cuda::kv_block_bytes(type, sh.block_tokens, sh.n_kv_heads, sh.dk);
          const uint64_t vb = cuda::kv_block_bytes(type, sh.block_tokens, sh.n_kv_heads, sh.dv);
          test::DeviceVec<uint8_t> k1(kb * c.n_blocks), v1(vb * c.n_blocks);
          test::DeviceVec<uint8_t> k2(kb * c.n_blocks), v2(vb * c.n_blocks);
          for (auto* d : {&k1, &k2}) cudaMemset(d->get(), 0xFF, kb * c.n_blocks);
          for (auto* d : {&v1, &v2}) cudaMemset(d->get(), 0xFF, vb * c.n_blocks);
          test::DeviceVec<float> q1(q), q2(q), kf1(c.kf), kf2(c.kf), vf(c.vf), dc(cs), ds(sn);
          test::DeviceVec<int32_t> w_qo(c.w_qo), kv_ptr(c.kv_ptr), kv_idx(c.kv_idx),
              kv_len(c.kv_len), w_pos(c.w_pos);
          const AttnBatch wb{c.num_seqs(), w_qo.get(),   kv_ptr.get(),
                             kv_idx.get(), kv_len.get(), w_pos.get()};
          const cuda::KvLayer l1 = cuda::make_kv_layer(type, k1.get(), v1.get(), sh.block_tokens,
                                                       sh.n_kv_heads, sh.dk, sh.dv);
          const cuda::KvLayer l2 = cuda::make_kv_layer(type, k2.get(), v2.get(), sh.block_tokens,
                                                       sh.n_kv_heads, sh.dk, sh.dv);
          const float eps = 1e-6f;
          test::DeviceVec<float> qn(random_vec(rng, sh.dk, 0.5f, 1.5f)),
              kn(random_vec(rng, sh.dk, 0.5f, 1.5f));
          if (form.normed) {
            ASSERT_TRUE(
                cuda::rope_kv_write_norms_fuse(l2, q2.get(), kf2.get(), qn.get(), kn.get()));
            cuda::rmsnorm(q1.get(), qn.get(), q1.get(), n * sh.n_heads(), sh.dk, eps, nullptr);
            cuda::rmsnorm(kf1.get(), kn.get(), kf1.get(), n * sh.n_kv_heads, sh.dk, eps, nullptr);
          }
          cuda::rope_apply2(q1.get(), sh.n_heads(), kf1.get(), sh.n_kv_heads, n, sh.dk, n_pairs,
                            neox, dc.get(), ds.get(), nullptr);
          cuda::kv_write(l1, wb, n, kf1.get(), vf.get(), nullptr);
          cuda::rope_kv_write(l2, wb, n, q2.get(), sh.n_heads(), kf2.get(), vf.get(), n_pairs, neox,
                              dc.get(), ds.get(), nullptr, form.normed ? qn.get() : nullptr,
                              form.normed ? kn.get() : nullptr, eps);
          ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
          const std::string what = sh.name() + (neox ? " neox" : " normal") +
                                   (partial ? " partial" : " full") +
                                   (form.normed ? " normed" : "");
          const std::vector<float> qa = q1.to_host(), qb = q2.to_host();
          const std::vector<float> ka = kf1.to_host(), kb2 = kf2.to_host();
          EXPECT_EQ(0, std::memcmp(qa.data(), qb.data(), qa.size() * 4)) << what << ": q";
          EXPECT_EQ(0, std::memcmp(ka.data(), kb2.data(), ka.size() * 4)) << what << ": k";
          EXPECT_NE(0, std::memcmp(ka.data(), c.kf.data(), ka.size() * 4)) << what << ": k rotated";
          EXPECT_EQ(k1.to_host(), k2.to_host()) << what << ": K cache";
          EXPECT_EQ(v1.to_host(), v2.to_host()) << what << ": V cache";
        }
      }
    }
  }
}

// ---- benchmark -------------------------------------------------------------------------------

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    cudaEventCreate(&a);
    cudaEventCreate(&b);
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  // Median milliseconds of fn over `reps` runs after two warm-ups.
  template <typename F>
  double median_ms(F&& fn, int reps = 15) {
    fn();
    fn();
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      cudaEventRecord(a);
      fn();
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float t = 0;
      cudaEventElapsedTime(&t, a, b);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
};

// Fills n bytes of device memory with f16 values uniform in [-1, 1] (a repeated 8 MiB pattern).
void fill_f16(uint8_t* dst, size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<uint16_t> pat(4u << 20);
  for (uint16_t& x : pat) x = quant::fp32_to_fp16(d(rng));
  for (size_t off = 0; off < n; off += pat.size() * 2)
    cudaMemcpy(dst + off, pat.data(), std::min(n - off, pat.size() * 2), cudaMemcpyHostToDevice);
}

TEST(CudaAttentionBench, DISABLED_Throughput) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(99);
  Timer timer;
  // Ceiling: a 1 GiB device-to-device copy (bytes read + written).
  const size_t copy_bytes = size_t{1} << 30;
  test::DeviceVec<uint8_t> src(copy_bytes), dst(copy_bytes);
  cudaMemset(src.get(), 1, copy_bytes);
  const double copy_ms = timer.median_ms(
      [&] { cudaMemcpyAsync(dst.get(), src.get(), copy_bytes, cudaMemcpyDeviceToDevice); });
  const double ceiling = 2.0 * copy_bytes / copy_ms / 1e6;
  std::printf("ceiling: device copy %.0f GB/s\n", ceiling);

  // Llama-3-8B-shaped layer: 32 query heads, 8 kv heads, head dim 128 (KILN_BENCH_ATTN_DIM=64
  // or 256: another head dim), F16 cache.
  const char* dim_env = std::getenv("KILN_BENCH_ATTN_DIM");
  const int32_t n_kv = 8, n_heads = 32, bt = 16;
  const int32_t dim = dim_env != nullptr && (std::atoi(dim_env) == 64 || std::atoi(dim_env) == 256)
                          ? std::atoi(dim_env)
                          : 128;
  const int64_t max_tokens = 256 * 1024;
  const int64_t block_bytes = cuda::kv_block_bytes(Type::F16, bt, n_kv, dim);
  const int64_t n_blocks = max_tokens / bt + 64;
  test::DeviceVec<uint8_t> kc(static_cast<size_t>(n_blocks * block_bytes)),
      vc(static_cast<size_t>(n_blocks * block_bytes));
  fill_f16(kc.get(), static_cast<size_t>(n_blocks * block_bytes), rng);
  fill_f16(vc.get(), static_cast<size_t>(n_blocks * block_bytes), rng);
  const cuda::KvLayer kv = cuda::make_kv_layer(Type::F16, kc.get(), vc.get(), bt, n_kv, dim, dim);
  test::DeviceVec<uint8_t> ws(static_cast<size_t>(cuda::attention_workspace_bytes(n_heads, dim)));

  struct Step {
    std::vector<int32_t> qo{0}, kv_ptr{0}, kv_idx, kv_len, pos;
    int32_t max_q = 0;
    double kv_bytes = 0, flops = 0;
  };
  // n_seqs sequences of context len, the last q_len positions queried.
  const auto make_step = [&](int32_t n_seqs, int32_t len, int32_t q_len) {
    Step st;
    std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    size_t next = 0;
    for (int32_t s = 0; s < n_seqs; ++s) {
      for (int32_t b = 0; b < (len + bt - 1) / bt; ++b) st.kv_idx.push_back(perm[next++]);
      st.kv_ptr.push_back(static_cast<int32_t>(st.kv_idx.size()));
      st.kv_len.push_back(len);
      st.qo.push_back(st.qo.back() + q_len);
      for (int32_t p = len - q_len; p < len; ++p) {
        st.pos.push_back(p);
        st.flops += 4.0 * dim * n_heads * (p + 1);  // QK and PV
      }
      st.kv_bytes += 2.0 * len * n_kv * dim * 2;  // K and V, f16
    }
    st.max_q = q_len;
    return st;
  };
  const auto run = [&](const Step& st, cuda::AttnKernel kernel, bool split, double* ms_out) -> int {
    test::DeviceVec<int32_t> qo(st.qo), kv_ptr(st.kv_ptr), kv_idx(st.kv_idx), kv_len(st.kv_len),
        pos(st.pos);
    const int64_t n_tokens = st.qo.back();
    const std::vector<float> qh =
        random_vec(rng, static_cast<size_t>(n_tokens * n_heads * dim), -1, 1);
    test::DeviceVec<float> q(qh), out(static_cast<size_t>(n_tokens * n_heads * dim));
    const AttnBatch b{static_cast<int32_t>(st.kv_len.size()),
                      qo.get(),
                      kv_ptr.get(),
                      kv_idx.get(),
                      kv_len.get(),
                      pos.get()};
    cuda::AttnParams p;
    p.n_heads = n_heads;
    p.scale = 0.088f;
    if (split) {
      p.workspace = ws.get();
      p.workspace_bytes = cuda::attention_workspace_bytes(n_heads, dim);
    }
    *ms_out = timer.median_ms([&] {
      cuda::attention_with(kernel, kv, b, n_tokens, st.max_q, q.get(), out.get(), p, nullptr);
    });
    EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
    const std::vector<float> o = out.to_host();
    EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](float x) { return std::isfinite(x); }));
    return cuda::attention_decode_splits(kv, n_tokens, p, kernel);
  };

  std::printf("decode (F16 cache, 32 heads / 8 kv heads, dim %d): K+V bytes read per call\n", dim);
  const std::pair<int32_t, int32_t> decode_shapes[] = {{1, 4096},  {1, 32768}, {8, 32768},
                                                       {16, 4096}, {64, 2048}, {256, 1024}};
  for (auto [n_seqs, len] : decode_shapes) {
    const Step st = make_step(n_seqs, len, 1);
    for (cuda::AttnKernel kernel : {cuda::AttnKernel::Decode, cuda::AttnKernel::DecodeTc}) {
      for (bool split : {false, true}) {
        double ms = 0;
        const int splits = run(st, kernel, split, &ms);
        std::printf("  %-9s batch %4d ctx %6d splits %2d: %8.3f ms %7.0f GB/s (%.0f%% of copy)\n",
                    kernel == cuda::AttnKernel::Decode ? "fp32" : "tensor", n_seqs, len, splits, ms,
                    st.kv_bytes / ms / 1e6, 100.0 * st.kv_bytes / ms / 1e6 / ceiling);
      }
    }
  }
  std::printf("prefill (causal, F16 cache, fp32 CUDA-core math; H200 fp32 peak ~67 TFLOP/s)\n");
  const std::pair<int32_t, int32_t> prefill_shapes[] = {{1, 4096}, {8, 512}, {4, 1024}};
  for (auto [n_seqs, len] : prefill_shapes) {
    const Step st = make_step(n_seqs, len, len);
    double ms = 0, ms_tc = 0;
    run(st, cuda::AttnKernel::Prefill, false, &ms);
    run(st, cuda::AttnKernel::PrefillTc, false, &ms_tc);
    std::printf(
        "  %d x %5d tokens: fp32 %8.3f ms %6.2f TFLOP/s, tensor cores %8.3f ms %6.2f "
        "TFLOP/s\n",
        n_seqs, len, ms, st.flops / ms / 1e9, ms_tc, st.flops / ms_tc / 1e9);
  }

  // kv_write: 4096 rows of K and V (fp32 in, f16 out).
  {
    const Step st = make_step(1, 4096, 4096);
    test::DeviceVec<int32_t> qo(st.qo), kv_ptr(st.kv_ptr), kv_idx(st.kv_idx), kv_len(st.kv_len),
        pos(st.pos);
    const int64_t n = 4096LL * n_kv * dim;
    test::DeviceVec<float> kf(random_vec(rng, static_cast<size_t>(n), -1, 1)),
        vf(random_vec(rng, static_cast<size_t>(n), -1, 1));
    const AttnBatch b{1, qo.get(), kv_ptr.get(), kv_idx.get(), kv_len.get(), pos.get()};
    const double ms =
        timer.median_ms([&] { cuda::kv_write(kv, b, 4096, kf.get(), vf.get(), nullptr); });
    const double bytes = 2.0 * n * 4 + 2.0 * n * 2;
    std::printf("kv_write 4096 rows: %.3f ms %.0f GB/s\n", ms, bytes / ms / 1e6);
  }
  EXPECT_EQ(cudaSuccess, cudaGetLastError());
}

}  // namespace
}  // namespace kiln::backend
