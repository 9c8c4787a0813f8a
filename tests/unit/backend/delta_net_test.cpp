// The gated delta net ops (backend/cpu/delta_net.cpp, CpuBackend) on fresh random inputs:
//  - the scalar reference against the brief's math written out in double (q/k L2 norms, the
//    1/sqrt(dk) query scale, softplus, value heads tiled h % n_k_heads or grouped
//    h / (n_v / n_k)): within 2e-5 of the
//    output's scale (fp32 against double over 150 tokens);
//  - conv1d_silu against the direct formula over the whole zero-padded sequence: bit-identical
//    (the same products summed in the same order), however the rows are split into steps;
//  - the backend's recurrence: bit-identical to the reference; its chunked form (sequences of
//    >= 64 rows): within 2e-5 of the output's scale and of the largest |state| value of the
//    recurrence (measured below 1e-6: the WY form's products and the forward substitution
//    round differently, and the decays are exp of double sums instead of products of exps).
//    An output's scale is the larger of max |output| and 1 / sqrt(dk) (out_floor in
//    delta_net_problem.h: outputs are sums that can cancel);
//  - state carry: one step of T rows, T steps of 1 row and steps of mixed sizes agree;
//    several sequences of different lengths and slots in one step equal each alone; a
//    sequence at position 0 ignores its slot's stale contents; state_copy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cpu/ops.h"
#include "unit/backend/delta_net_problem.h"

namespace kiln::backend::cpu {
namespace {

using test::expect_near_scaled;
using test::params_of;
using test::Part;
using test::Problem;
using test::Shape;
using test::spec_of;
using test::Step;
using test::uniform;

enum class Impl { kReference, kBackend, kRecurrent, kChunked };

// Runs the gated delta rule over the parts (the x of each row as qkv); returns the output rows.
std::vector<float> run_rule(CpuBackend& be, StateCache& st, int32_t layer, const Problem& pr,
                            const std::vector<Part>& parts, Impl impl) {
  Step step(pr, parts);
  auto args = be.upload_step(step.host());
  EXPECT_TRUE(args.ok());
  const Shape& s = pr.shape;
  std::vector<float> out(size_t(step.n) * s.hv * s.dv, NAN);
  const DeltaParams p = params_of(s);
  const DeltaLayerView view = CpuBackend::state_view(st, layer);
  switch (impl) {
    case Impl::kReference:
      gated_delta_rule_reference(view, args->attn, args->state_slots, step.x.data(),
                                 step.alpha.data(), step.beta.data(), pr.ssm_a.data(),
                                 pr.dt_bias.data(), out.data(), p);
      break;
    case Impl::kBackend:
      be.gated_delta_rule(st, layer, *args, {step.x.data(), step.n, s.conv_dim()},
                          {step.alpha.data(), step.n, s.hv}, {step.beta.data(), step.n, s.hv},
                          pr.ssm_a.data(), pr.dt_bias.data(),
                          {out.data(), step.n, int64_t{s.hv} * s.dv}, p);
      break;
    case Impl::kRecurrent:
    case Impl::kChunked:
      gated_delta_rule(view, args->attn, args->state_slots, step.x.data(), step.alpha.data(),
                       step.beta.data(), pr.ssm_a.data(), pr.dt_bias.data(), out.data(), p,
                       be.pool(),
                       impl == Impl::kChunked ? DeltaForm::kChunked : DeltaForm::kRecurrent);
      break;
  }
  return out;
}

std::vector<float> run_conv(CpuBackend& be, StateCache& st, int32_t layer, const Problem& pr,
                            const std::vector<Part>& parts) {
  Step step(pr, parts);
  auto args = be.upload_step(step.host());
  EXPECT_TRUE(args.ok());
  const int64_t c = pr.shape.conv_dim();
  std::vector<float> out(size_t(step.n) * c, NAN);
  be.conv1d_silu(st, layer, *args, {step.x.data(), step.n, c}, pr.conv_w.data(),
                 {out.data(), step.n, c});
  return out;
}

std::vector<float> ssm_of(const StateCache& st, int32_t layer, int32_t slot) {
  std::vector<float> v(st.spec().ssm_values());
  st.read_ssm(layer, slot, v.data());
  return v;
}
std::vector<float> conv_of(const StateCache& st, int32_t layer, int32_t slot) {
  std::vector<float> v(st.spec().conv_values());
  st.read_conv(layer, slot, v.data());
  return v;
}

std::unique_ptr<StateCache> make_state(CpuBackend& be, const Shape& s, int32_t slots = 8) {
  auto st = be.create_state(spec_of(s), slots);
  EXPECT_TRUE(st.ok()) << st.error().message;
  return std::move(st).value();
}

// The brief's math in double, straight from its equations: one sequence from a zero state.
std::vector<float> naive_rule(const Problem& pr, int seq) {
  const Shape& s = pr.shape;
  const Problem::Seq& q = pr.seqs[seq];
  std::vector<double> S(size_t(s.hv) * s.dk * s.dv, 0.0);
  std::vector<float> out(size_t(q.len) * s.hv * s.dv);
  for (int32_t t = 0; t < q.len; ++t) {
    const float* row = q.x.data() + size_t(t) * s.conv_dim();
    for (int32_t h = 0; h < s.hv; ++h) {
      const int32_t hk = s.key_head(h);
      std::vector<double> qv(s.dk), kv(s.dk);
      double qs = 0, ks = 0;
      for (int32_t i = 0; i < s.dk; ++i) {
        qv[i] = row[hk * s.dk + i];
        kv[i] = row[(s.hk + hk) * s.dk + i];
        qs += qv[i] * qv[i];
        ks += kv[i] * kv[i];
      }
      for (int32_t i = 0; i < s.dk; ++i) {
        qv[i] = qv[i] / std::sqrt(qs + 1e-6) / std::sqrt(double(s.dk));
        kv[i] = kv[i] / std::sqrt(ks + 1e-6);
      }
      const double b = 1.0 / (1.0 + std::exp(-double(q.beta[t * s.hv + h])));
      const double x = double(q.alpha[t * s.hv + h]) + pr.dt_bias[h];
      const double g = pr.ssm_a[h] * (x > 20 ? x : std::log1p(std::exp(x)));
      double* Sh = S.data() + size_t(h) * s.dk * s.dv;
      for (int32_t e = 0; e < s.dk * s.dv; ++e) Sh[e] *= std::exp(g);
      for (int32_t j = 0; j < s.dv; ++j) {
        double mem = 0;
        for (int32_t i = 0; i < s.dk; ++i) mem += Sh[i * s.dv + j] * kv[i];
        const double delta = (row[2 * s.hk * s.dk + h * s.dv + j] - mem) * b;
        double o = 0;
        for (int32_t i = 0; i < s.dk; ++i) {
          Sh[i * s.dv + j] += kv[i] * delta;
          o += Sh[i * s.dv + j] * qv[i];
        }
        out[(size_t(t) * s.hv + h) * s.dv + j] = static_cast<float>(o);
      }
    }
  }
  return out;
}

TEST(DeltaNet, ReferenceFollowsTheMath) {
  CpuBackend be(nullptr);
  for (const Shape& s : {Shape{2, 4, 8, 6, 4}, Shape{3, 3, 5, 7, 4}, Shape{1, 4, 16, 16, 4},
                         Shape{2, 4, 8, 6, 4, false}, Shape{2, 6, 8, 8, 4, false}}) {
    const Problem pr(s, {150}, 1);
    auto st = make_state(be, s);
    const std::vector<float> got = run_rule(be, *st, 0, pr, {{0, 2, 0, 150}}, Impl::kReference);
    expect_near_scaled(got, naive_rule(pr, 0), 2e-5,
                       "reference vs double math hk=" + std::to_string(s.hk) +
                           " hv=" + std::to_string(s.hv) + (s.tiled ? " tiled" : " grouped"),
                       test::out_floor(s));
  }
}

TEST(DeltaNet, ConvIsTheDirectFormulaAcrossSteps) {
  CpuBackend be(2);
  const Shape s{2, 4, 8, 6, 4};
  const Problem pr(s, {37}, 2);
  const Problem::Seq& q = pr.seqs[0];
  const int64_t c_n = s.conv_dim(), k = s.conv_k;
  std::vector<float> want(size_t(q.len) * c_n);
  for (int64_t t = 0; t < q.len; ++t)
    for (int64_t c = 0; c < c_n; ++c) {
      float a = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t src = t - (k - 1) + j;
        a += pr.conv_w[c * k + j] * (src >= 0 ? q.x[src * c_n + c] : 0.0f);
      }
      want[t * c_n + c] = a / (1.0f + std::exp(-a));
    }
  for (const std::vector<int32_t>& sizes : std::vector<std::vector<int32_t>>{
           {37}, {1, 1, 1, 34}, {2, 5, 1, 29}, std::vector<int32_t>(37, 1)}) {
    auto st = make_state(be, s);
    std::vector<float> got;
    int32_t pos = 0;
    for (int32_t n : sizes) {
      const std::vector<float> o = run_conv(be, *st, 1, pr, {{0, 3, pos, n}});
      got.insert(got.end(), o.begin(), o.end());
      pos += n;
    }
    EXPECT_EQ(got, want) << sizes.size() << " steps";
    // The slot keeps the last conv_k - 1 inputs, oldest first.
    const std::vector<float> conv = conv_of(*st, 1, 3);
    const std::vector<float> last(q.x.end() - (k - 1) * c_n, q.x.end());
    EXPECT_EQ(conv, last);
  }
}

TEST(DeltaNet, RecurrenceIsTheReferenceBitForBit) {
  CpuBackend be(3);
  const Shape s{2, 4, 8, 6, 4};
  const Problem pr(s, {5, 1, 40, 12}, 3);
  const std::vector<Part> parts = {{0, 1, 0, 5}, {1, 4, 0, 1}, {2, 0, 0, 40}, {3, 7, 0, 12}};
  auto a = make_state(be, s), b = make_state(be, s);
  const std::vector<float> want = run_rule(be, *a, 1, pr, parts, Impl::kReference);
  EXPECT_EQ(run_rule(be, *b, 1, pr, parts, Impl::kBackend), want);
  for (int32_t slot : {0, 1, 4, 7}) EXPECT_EQ(ssm_of(*b, 1, slot), ssm_of(*a, 1, slot));
}

TEST(DeltaNet, ChunkedEqualsRecurrence) {
  CpuBackend be(4);
  for (const Shape& s : {Shape{2, 4, 8, 6, 4}, Shape{1, 2, 128, 128, 4}, Shape{2, 2, 64, 32, 4},
                         Shape{2, 4, 8, 6, 4, false}}) {
    const std::vector<int32_t> lens = {1, 63, 64, 65, 130, 200};
    const Problem pr(s, lens, 4);
    for (size_t i = 0; i < lens.size(); ++i) {
      // A first step from zero, then a continuation from the carried state.
      const int32_t first = lens[i] / 3;
      auto rec = make_state(be, s), chk = make_state(be, s);
      for (const Part& part :
           {Part{int32_t(i), 2, 0, first}, Part{int32_t(i), 2, first, lens[i] - first}}) {
        if (part.n == 0) continue;
        const std::vector<float> want = run_rule(be, *rec, 0, pr, {part}, Impl::kRecurrent);
        const std::vector<float> got = run_rule(be, *chk, 0, pr, {part}, Impl::kChunked);
        const std::string what = "chunked dk=" + std::to_string(s.dk) +
                                 " dv=" + std::to_string(s.dv) + " rows " +
                                 std::to_string(part.pos0) + "+" + std::to_string(part.n);
        expect_near_scaled(got, want, 2e-5, what + " out", test::out_floor(s));
        expect_near_scaled(ssm_of(*chk, 0, 2), ssm_of(*rec, 0, 2), 2e-5, what + " state");
      }
    }
  }
}

// One step of T rows, T steps of one row and steps of mixed sizes give the same outputs and
// state: bitwise through the recurrence, within the chunked bound when a step has >= 64 rows.
TEST(DeltaNet, StepSizesCarryTheState) {
  CpuBackend be(2);
  const Shape s{2, 4, 16, 8, 4};
  const int32_t len = 150;
  const Problem pr(s, {len}, 5);
  const auto run_split = [&](const std::vector<int32_t>& sizes, Impl impl, StateCache& st) {
    std::vector<float> out;
    int32_t pos = 0;
    for (int32_t n : sizes) {
      const std::vector<float> o = run_rule(be, st, 0, pr, {{0, 5, pos, n}}, impl);
      out.insert(out.end(), o.begin(), o.end());
      pos += n;
    }
    return out;
  };
  auto one = make_state(be, s), each = make_state(be, s), mixed = make_state(be, s);
  auto mixed_be = make_state(be, s);
  const std::vector<int32_t> mixed_sizes = {3, 1, 70, 1, 1, 10, 64};
  const std::vector<float> want = run_split({len}, Impl::kReference, *one);
  EXPECT_EQ(run_split(std::vector<int32_t>(len, 1), Impl::kBackend, *each), want);
  EXPECT_EQ(ssm_of(*each, 0, 5), ssm_of(*one, 0, 5));
  EXPECT_EQ(run_split(mixed_sizes, Impl::kReference, *mixed), want);
  EXPECT_EQ(ssm_of(*mixed, 0, 5), ssm_of(*one, 0, 5));
  // The backend takes the chunked form for the steps of 70 and 64 rows.
  expect_near_scaled(run_split(mixed_sizes, Impl::kBackend, *mixed_be), want, 2e-5,
                     "backend mixed steps out", test::out_floor(s));
  expect_near_scaled(ssm_of(*mixed_be, 0, 5), ssm_of(*one, 0, 5), 2e-5,
                     "backend mixed steps state");
}

// Several sequences of different lengths and slots in one step (some continuing from earlier
// steps) equal each sequence run alone.
TEST(DeltaNet, SequencesInOneStepEqualEachAlone) {
  CpuBackend be(3);
  const Shape s{2, 4, 8, 6, 4};
  const Problem pr(s, {90, 7, 1, 80}, 6);
  auto together = make_state(be, s, 10), alone = make_state(be, s, 10);
  // Earlier steps: sequences 0 and 3 already have 20 and 3 tokens in slots 9 and 2.
  for (StateCache* st : {together.get(), alone.get()}) {
    run_conv(be, *st, 1, pr, {{0, 9, 0, 20}, {3, 2, 0, 3}});
    run_rule(be, *st, 1, pr, {{0, 9, 0, 20}, {3, 2, 0, 3}}, Impl::kBackend);
  }
  const std::vector<Part> parts = {{0, 9, 20, 70}, {1, 0, 0, 7}, {2, 6, 0, 1}, {3, 2, 3, 77}};
  const std::vector<float> conv_all = run_conv(be, *together, 1, pr, parts);
  const std::vector<float> rule_all = run_rule(be, *together, 1, pr, parts, Impl::kBackend);
  int64_t row = 0;
  for (const Part& p : parts) {
    const int64_t c = s.conv_dim(), o = int64_t{s.hv} * s.dv;
    const std::vector<float> conv = run_conv(be, *alone, 1, pr, {p});
    const std::vector<float> rule = run_rule(be, *alone, 1, pr, {p}, Impl::kBackend);
    EXPECT_EQ(conv,
              std::vector<float>(conv_all.begin() + row * c, conv_all.begin() + (row + p.n) * c))
        << "seq " << p.seq;
    EXPECT_EQ(rule,
              std::vector<float>(rule_all.begin() + row * o, rule_all.begin() + (row + p.n) * o))
        << "seq " << p.seq;
    EXPECT_EQ(conv_of(*together, 1, p.slot), conv_of(*alone, 1, p.slot));
    EXPECT_EQ(ssm_of(*together, 1, p.slot), ssm_of(*alone, 1, p.slot));
    row += p.n;
  }
  // Layer 0 was never touched.
  EXPECT_EQ(ssm_of(*together, 0, 9), std::vector<float>(s.hv * s.dk * s.dv, 0.0f));
}

TEST(DeltaNet, PositionZeroIgnoresStaleSlot) {
  CpuBackend be(2);
  const Shape s{2, 4, 8, 6, 4};
  const Problem pr(s, {9, 70}, 7);
  std::mt19937 rng(8);
  auto clean = make_state(be, s), stale = make_state(be, s);
  for (int32_t slot : {1, 3}) {
    stale->write_conv(0, slot, uniform(rng, spec_of(s).conv_values(), -5, 5).data());
    stale->write_ssm(0, slot, uniform(rng, spec_of(s).ssm_values(), -5, 5).data());
  }
  const std::vector<Part> parts = {{0, 1, 0, 9}, {1, 3, 0, 70}};  // recurrence and chunked
  EXPECT_EQ(run_conv(be, *stale, 0, pr, parts), run_conv(be, *clean, 0, pr, parts));
  EXPECT_EQ(run_rule(be, *stale, 0, pr, parts, Impl::kBackend),
            run_rule(be, *clean, 0, pr, parts, Impl::kBackend));
  for (int32_t slot : {1, 3}) {
    EXPECT_EQ(conv_of(*stale, 0, slot), conv_of(*clean, 0, slot));
    EXPECT_EQ(ssm_of(*stale, 0, slot), ssm_of(*clean, 0, slot));
  }
}

// A copied slot continues exactly as the original (prefix-cache snapshots), every layer.
TEST(DeltaNet, StateCopyContinuesAsTheSource) {
  CpuBackend be(2);
  const Shape s{2, 4, 8, 6, 4};
  const Problem pr(s, {30}, 9);
  auto st = make_state(be, s);
  for (int32_t layer : {0, 1}) {
    run_conv(be, *st, layer, pr, {{0, 2, 0, 20}});
    run_rule(be, *st, layer, pr, {{0, 2, 0, 20}}, Impl::kBackend);
  }
  be.state_copy(*st, 2, 6);
  for (int32_t layer : {0, 1}) {
    EXPECT_EQ(conv_of(*st, layer, 6), conv_of(*st, layer, 2));
    EXPECT_EQ(ssm_of(*st, layer, 6), ssm_of(*st, layer, 2));
    EXPECT_NE(ssm_of(*st, layer, 6), ssm_of(*st, layer, 0));
  }
  const std::vector<float> a = run_rule(be, *st, 1, pr, {{0, 2, 20, 10}}, Impl::kBackend);
  const std::vector<float> b = run_rule(be, *st, 1, pr, {{0, 6, 20, 10}}, Impl::kBackend);
  EXPECT_EQ(a, b);
}

TEST(DeltaNet, SigmoidMulAndDeinterleave) {
  CpuBackend be(nullptr);
  std::mt19937 rng(10);
  std::vector<float> x = uniform(rng, 3 * 10, -4, 4), g = uniform(rng, 3 * 10, -8, 8);
  std::vector<float> out(x.size());
  be.sigmoid_mul({x.data(), 3, 10}, {g.data(), 3, 10}, {out.data(), 3, 10});
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(out[i], x[i] / (1.0 + std::exp(-double(g[i]))), 1e-6 * std::fabs(x[i]));
  be.sigmoid_mul({x.data(), 3, 10}, {g.data(), 3, 10}, {x.data(), 3, 10});  // in place
  EXPECT_EQ(x, out);
  // Two rows of three heads of [query 4 | gate 4].
  std::vector<float> src(2 * 24);
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i);
  std::vector<float> a(2 * 12), b(2 * 12);
  be.deinterleave({src.data(), 2, 24}, 4, {a.data(), 2, 12}, {b.data(), 2, 12});
  for (int r = 0; r < 2; ++r)
    for (int h = 0; h < 3; ++h)
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(a[r * 12 + h * 4 + i], float(r * 24 + h * 8 + i));
        EXPECT_EQ(b[r * 12 + h * 4 + i], float(r * 24 + h * 8 + 4 + i));
      }
}

TEST(DeltaNet, StateSpecChecksAndSizes) {
  CpuBackend be(nullptr);
  const Shape s{16, 32, 128, 128, 4};  // Qwen3-Next
  const StateSpec sp = spec_of(s, 36);
  EXPECT_TRUE(check_state_spec(sp).ok());
  EXPECT_EQ(be.state_bytes_per_slot(sp), 36ull * (3 * 8192 + 32 * 128 * 128) * 4);
  StateSpec bad = sp;
  bad.n_v_heads = 24;  // not a multiple of 16
  bad.conv_dim = 2 * 16 * 128 + 24 * 128;
  EXPECT_NE(check_state_spec(bad).error().message.find("multiple"), std::string::npos);
  bad = sp;
  bad.conv_dim += 1;
  EXPECT_NE(check_state_spec(bad).error().message.find("conv width"), std::string::npos);
  bad = sp;
  bad.conv_k = 0;
  EXPECT_FALSE(be.create_state(bad, 4).ok());
  EXPECT_EQ(be.state_bytes_per_slot(bad), 0u);
  EXPECT_FALSE(be.create_state(sp, 0).ok());
  // Fresh storage is zero.
  auto st = make_state(be, Shape{});
  EXPECT_EQ(ssm_of(*st, 1, 7), std::vector<float>(spec_of(Shape{}).ssm_values(), 0.0f));
}

}  // namespace
}  // namespace kiln::backend::cpu
