// The CUDA gated delta net ops (delta_net.cu, sigmoid_mul and deinterleave in
// ops_elementwise.cu), through the CUDA backend (its state storage, step upload and
// state_copy), against the CPU reference ops on the same inputs and states. Bounds:
//  - conv1d_silu: 1e-6 relative (the same products summed in the same order; expf within
//    2 ulp); the conv state: bit-identical (copies of inputs);
//  - gated_delta_rule: outputs and SSM state within 1e-5 of the largest |value| of the
//    reference (the recurrence's dot products summed in partial sums per warp, FMA-contracted;
//    the norms' double sums in another order and expf/log1pf's ulps feed it); where a run of 64+
//    rows takes the chunked form, 2e-5 (the CPU's chunked form is held to the same against the
//    recurrence: the products summed in other orders);
//  - sigmoid_mul: 1e-6 relative; deinterleave: bit-identical.
// Steps mix sequences starting at position 0 (one in a slot holding stale values) with
// continuations, decode rows with long prefill runs, and dk, dv that are not multiples of 32.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cpu/ops.h"
#include "ops_test_util.h"
#include "test_util.h"
#include "unit/backend/delta_net_problem.h"

namespace kiln {
namespace {

using backend::Backend;
using backend::Mat;
using backend::StateCache;
using test::expect_near_scaled;
using test::Part;
using test::Problem;
using test::Shape;
using test::Step;

// Device copies of host vectors, owned by the backend's buffers.
class DeviceArena {
 public:
  explicit DeviceArena(Backend& be) : be_(be) {}
  float* put(const std::vector<float>& host) {
    float* p = alloc(host.size());
    be_.upload(p, host.data(), host.size() * sizeof(float));
    return p;
  }
  float* alloc(size_t n) {
    auto b = be_.alloc(std::max<size_t>(n, 1) * sizeof(float));
    EXPECT_TRUE(b.ok());
    bufs_.push_back(std::move(b).value());
    return static_cast<float*>(bufs_.back()->data());
  }
  std::vector<float> get(const float* p, size_t n) {
    std::vector<float> h(n);
    be_.download(h.data(), p, n * sizeof(float));
    return h;
  }

 private:
  Backend& be_;
  std::vector<std::unique_ptr<backend::Buffer>> bufs_;
};

// delta: KILN_CUDA_DELTA while the backend is made (the form it takes; empty: the default).
std::unique_ptr<Backend> cuda_backend(const char* delta = "", int64_t max_tokens = 512) {
  backend::BackendOptions o;
  o.device = "cuda";
  if (*delta != 0) setenv("KILN_CUDA_DELTA", delta, 1);
  auto be = backend::create_backend(o);
  unsetenv("KILN_CUDA_DELTA");
  EXPECT_TRUE(be.ok()) << be.error().message;
  backend::StepCapacity cap;
  cap.max_tokens = max_tokens;
  cap.max_kv_indices = 64;
  EXPECT_TRUE((*be)->reserve_step(cap).ok());
  return std::move(be).value();
}

// One layer on both backends: the CPU reference ops on a CPU state, the CUDA backend's ops on
// its own; each step's outputs and the touched slots' states compared.
class Pair {
 public:
  Pair(const Problem& pr, int32_t num_slots, const char* delta = "")
      : pr_(pr), cuda_(cuda_backend(delta)), cpu_(nullptr), dev_(*cuda_) {
    chunked_ = std::string(delta) != "recurrent";
    auto c = cpu_.create_state(test::spec_of(pr.shape), num_slots);
    auto g = cuda_->create_state(test::spec_of(pr.shape), num_slots);
    EXPECT_TRUE(c.ok() && g.ok());
    cpu_st_ = std::move(c).value();
    gpu_st_ = std::move(g).value();
    conv_w_ = dev_.put(pr.conv_w);
    ssm_a_ = dev_.put(pr.ssm_a);
    dt_bias_ = dev_.put(pr.dt_bias);
  }

  // The same values in a slot of both states (stale contents).
  void fill_slot(int32_t layer, int32_t slot, std::mt19937& rng) {
    const std::vector<float> c = test::uniform(rng, cpu_st_->spec().conv_values(), -5, 5);
    const std::vector<float> s = test::uniform(rng, cpu_st_->spec().ssm_values(), -5, 5);
    cpu_st_->write_conv(layer, slot, c.data());
    gpu_st_->write_conv(layer, slot, c.data());
    cpu_st_->write_ssm(layer, slot, s.data());
    gpu_st_->write_ssm(layer, slot, s.data());
  }

  void state_copy(int32_t src, int32_t dst) {
    cpu_.state_copy(*cpu_st_, src, dst);
    cuda_->state_copy(*gpu_st_, src, dst);
  }

  // conv1d_silu then gated_delta_rule on the conv's output, as the forward runs them.
  void step(int32_t layer, const std::vector<Part>& parts, const std::string& what) {
    const Shape& s = pr_.shape;
    const Step st(pr_, parts);
    const int64_t n = st.n, c = s.conv_dim(), o = int64_t{s.hv} * s.dv;
    bool long_run = false;
    for (const Part& p : parts) long_run |= p.n >= 64;
    const double tol = chunked_ && long_run ? 2e-5 : 1e-5;
    auto cpu_args = cpu_.upload_step(st.host());
    auto gpu_args = cuda_->upload_step(st.host());
    ASSERT_TRUE(cpu_args.ok() && gpu_args.ok());
    // CPU reference.
    const backend::cpu::DeltaLayerView view = backend::cpu::CpuBackend::state_view(*cpu_st_, layer);
    std::vector<float> conv(n * c), out(n * o);
    backend::cpu::conv1d_silu(view, cpu_args->attn, cpu_args->state_slots, st.x.data(),
                              pr_.conv_w.data(), conv.data());
    backend::cpu::gated_delta_rule_reference(
        view, cpu_args->attn, cpu_args->state_slots, conv.data(), st.alpha.data(), st.beta.data(),
        pr_.ssm_a.data(), pr_.dt_bias.data(), out.data(), test::params_of(s));
    // CUDA.
    float* x = dev_.put(st.x);
    float* alpha = dev_.put(st.alpha);
    float* beta = dev_.put(st.beta);
    float* g_conv = dev_.alloc(n * c);
    float* g_out = dev_.alloc(n * o);
    cuda_->conv1d_silu(*gpu_st_, layer, *gpu_args, {x, n, c}, conv_w_, {g_conv, n, c});
    cuda_->gated_delta_rule(*gpu_st_, layer, *gpu_args, {g_conv, n, c}, {alpha, n, s.hv},
                            {beta, n, s.hv}, ssm_a_, dt_bias_, {g_out, n, o}, test::params_of(s));
    test::expect_close(
        dev_.get(g_conv, n * c), conv, [&](size_t i) { return 1e-6 * std::fabs(conv[i]) + 1e-30; },
        what + " conv");
    expect_near_scaled(dev_.get(g_out, n * o), out, tol, what + " out", test::out_floor(s));
    for (const Part& p : parts) {
      std::vector<float> a(cpu_st_->spec().conv_values()), b(a.size());
      cpu_st_->read_conv(layer, p.slot, a.data());
      gpu_st_->read_conv(layer, p.slot, b.data());
      EXPECT_EQ(b, a) << what << " conv state of slot " << p.slot;
      std::vector<float> sa(cpu_st_->spec().ssm_values()), sb(sa.size());
      cpu_st_->read_ssm(layer, p.slot, sa.data());
      gpu_st_->read_ssm(layer, p.slot, sb.data());
      expect_near_scaled(sb, sa, tol, what + " state of slot " + std::to_string(p.slot));
    }
  }

 private:
  const Problem& pr_;
  std::unique_ptr<Backend> cuda_;
  backend::cpu::CpuBackend cpu_;
  DeviceArena dev_;
  std::unique_ptr<StateCache> cpu_st_, gpu_st_;
  float* conv_w_ = nullptr;
  float* ssm_a_ = nullptr;
  float* dt_bias_ = nullptr;
  bool chunked_ = true;
};

void mixed_steps(const char* delta) {
  // Qwen3-Next's heads (dk = dv = 128, tiled value heads), 64, and odd small sizes.
  for (const Shape& s :
       {Shape{1, 2, 128, 128, 4}, Shape{2, 4, 64, 64, 4}, Shape{2, 4, 8, 6, 4},
        Shape{3, 6, 20, 40, 4}, Shape{2, 2, 33, 70, 3}, Shape{2, 4, 16, 16, 4, false}}) {
    const std::string name = "dk=" + std::to_string(s.dk) + " dv=" + std::to_string(s.dv) +
                             " hv=" + std::to_string(s.hv);
    const Problem pr(s, {150, 1, 9, 70, 40}, 21);
    Pair pair(pr, 8, delta);
    std::mt19937 rng(22);
    pair.fill_slot(1, 5, rng);  // stale: sequence 2 starts there at position 0
    // Prefill runs of mixed lengths; a mixed step (continuations, a decode row, an empty
    // sequence, a new one); then sequence 0 goes on from slot 3 and from a copy of it in slot 6.
    pair.step(1, {{0, 3, 0, 100}, {1, 0, 0, 1}, {2, 5, 0, 5}, {3, 7, 0, 60}}, name + " step 1");
    pair.step(1, {{0, 3, 100, 40}, {1, 0, 1, 0}, {2, 5, 5, 1}, {3, 7, 60, 10}, {4, 1, 0, 40}},
              name + " step 2");
    pair.state_copy(3, 6);
    pair.step(1, {{0, 3, 140, 1}, {0, 6, 140, 1}, {2, 5, 6, 1}}, name + " step 3");
    pair.step(1, {{0, 6, 141, 9}, {0, 3, 141, 9}}, name + " step 4");
    pair.step(0, {{0, 2, 0, 3}}, name + " layer 0");
  }
}

TEST(CudaDeltaNet, MatchesTheCpuReference) {
  KILN_REQUIRE_GPU();
  mixed_steps("");
}

// The recurrence alone on every run (the long ones included).
TEST(CudaDeltaNet, RecurrenceMatchesTheCpuReferenceOnLongRuns) {
  KILN_REQUIRE_GPU();
  mixed_steps("recurrent");
}

// Long prefill runs in the chunked form: several chunks and a partial one, from a zero state
// and from a carried one, beside decode rows and a run one row short of a chunk; then every
// run chunked (kChunked: short runs and single rows too).
TEST(CudaDeltaNet, ChunkedLongRunsMatchTheCpuReference) {
  KILN_REQUIRE_GPU();
  for (const Shape& s : {Shape{16, 32, 128, 128, 4}, Shape{1, 2, 128, 128, 4, false},
                         Shape{2, 4, 40, 70, 4}, Shape{3, 6, 33, 8, 3}}) {
    const std::string name = "dk=" + std::to_string(s.dk) + " dv=" + std::to_string(s.dv) +
                             " hv=" + std::to_string(s.hv);
    const Problem pr(s, {460, 63, 200}, 31);
    {
      Pair pair(pr, 4);
      pair.step(0, {{0, 1, 0, 300}, {1, 2, 0, 63}, {2, 3, 0, 130}}, name + " step 1");
      pair.step(0, {{0, 1, 300, 160}, {2, 3, 130, 1}}, name + " step 2");
      pair.step(0, {{2, 3, 131, 69}}, name + " step 3");
    }
    Pair all(pr, 4, "chunked");
    all.step(0, {{0, 1, 0, 129}, {1, 2, 0, 1}, {2, 3, 0, 5}}, name + " chunked step 1");
    all.step(0, {{0, 1, 129, 1}, {1, 2, 1, 62}, {2, 3, 5, 64}}, name + " chunked step 2");
  }
}

// KILN_CUDA_BENCH=1: the gated delta rule of one Qwen3.5-9B-shaped layer (16 key heads, 32
// value heads of 128 x 128) over prompts of 512 and 4096 rows and 4 x 1024, in each form.
TEST(CudaDeltaNetBench, PrefillForms) {
  KILN_REQUIRE_GPU();
  if (std::getenv("KILN_CUDA_BENCH") == nullptr) GTEST_SKIP() << "benchmark: set KILN_CUDA_BENCH=1";
  const Shape s{16, 32, 128, 128, 4};
  for (const std::vector<int32_t>& lens :
       {std::vector<int32_t>{512}, std::vector<int32_t>{4096}, std::vector<int32_t>(4, 1024)}) {
    const Problem pr(s, lens, 41);
    std::vector<Part> parts;
    for (int32_t i = 0; i < static_cast<int32_t>(lens.size()); ++i)
      parts.push_back({i, i, 0, lens[i]});
    const Step st(pr, parts);
    const int64_t n = st.n, c = s.conv_dim(), o = int64_t{s.hv} * s.dv;
    for (const char* form : {"recurrent", "chunked"}) {
      auto be = cuda_backend(form, n);
      auto state = be->create_state(test::spec_of(s, 1), static_cast<int32_t>(lens.size()));
      ASSERT_TRUE(state.ok());
      auto args = be->upload_step(st.host());
      ASSERT_TRUE(args.ok());
      DeviceArena dev(*be);
      float* x = dev.put(st.x);
      float* alpha = dev.put(st.alpha);
      float* beta = dev.put(st.beta);
      float* ssm_a = dev.put(pr.ssm_a);
      float* dt_bias = dev.put(pr.dt_bias);
      float* g_out = dev.alloc(n * o);
      auto run = [&] {
        be->gated_delta_rule(**state, 0, *args, {x, n, c}, {alpha, n, s.hv}, {beta, n, s.hv}, ssm_a,
                             dt_bias, {g_out, n, o}, test::params_of(s));
      };
      run();
      be->sync();
      const int reps = 5;
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) run();
      be->sync();
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          reps;
      std::printf("delta rule %-9s seqs %zu x %d rows: %9.1f us per layer (%.0f rows/s)\n", form,
                  lens.size(), lens[0], us, n / us * 1e6);
    }
  }
}

TEST(CudaDeltaNet, SigmoidMulAndDeinterleave) {
  KILN_REQUIRE_GPU();
  auto be = cuda_backend();
  DeviceArena dev(*be);
  std::mt19937 rng(23);
  for (int64_t n : {1, 7, 4096, 4099}) {
    const std::vector<float> x = test::uniform(rng, n, -4, 4), g = test::uniform(rng, n, -9, 9);
    std::vector<float> want(n);
    backend::cpu::sigmoid_mul(x.data(), g.data(), want.data(), n);
    float* dx = dev.put(x);
    float* dg = dev.put(g);
    float* dout = dev.alloc(n);
    be->sigmoid_mul({dx, 1, n}, {dg, 1, n}, {dout, 1, n});
    const auto bound = [&](size_t i) { return 1e-6 * std::fabs(want[i]) + 1e-30; };
    test::expect_close(dev.get(dout, n), want, bound, "sigmoid_mul " + std::to_string(n));
    be->sigmoid_mul({dx, 1, n}, {dg, 1, n}, {dx, 1, n});  // in place
    test::expect_close(dev.get(dx, n), want, bound, "sigmoid_mul in place " + std::to_string(n));
  }
  for (const auto& [rows, groups, width] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 1}, {3, 16, 128}, {5, 3, 7}}) {
    const std::vector<float> src = test::uniform(rng, rows * groups * 2 * width, -1, 1);
    std::vector<float> a(rows * groups * width), b(a.size());
    backend::cpu::deinterleave(src.data(), rows, groups, width, a.data(), b.data());
    float* ds = dev.put(src);
    float* da = dev.alloc(a.size());
    float* db = dev.alloc(b.size());
    const int64_t cols = groups * width;
    be->deinterleave({ds, rows, 2 * cols}, width, {da, rows, cols}, {db, rows, cols});
    const std::string what = "deinterleave " + std::to_string(rows) + "x" + std::to_string(groups) +
                             "x" + std::to_string(width);
    test::expect_bitwise(dev.get(da, a.size()), a, what + " a");
    test::expect_bitwise(dev.get(db, b.size()), b, what + " b");
  }
  // add_gated_rows (the shared expert's gate): the CPU backend's result, 1e-6 relative.
  backend::cpu::CpuBackend cpu(nullptr);
  for (const auto& [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 64}, {33, 130}}) {
    std::vector<float> x = test::uniform(rng, rows * cols, -2, 2);
    const std::vector<float> y = test::uniform(rng, rows * cols, -2, 2);
    const std::vector<float> sg = test::uniform(rng, rows, -6, 6);
    float* dx = dev.put(x);
    float* dy = dev.put(y);
    float* ds = dev.put(sg);
    be->add_gated_rows({dx, rows, cols}, {dy, rows, cols}, {ds, rows, 1});
    std::vector<float> yc = y, sc = sg;
    cpu.add_gated_rows({x.data(), rows, cols}, {yc.data(), rows, cols}, {sc.data(), rows, 1});
    const auto bound = [&](size_t i) { return 1e-6 * std::fabs(x[i]) + 1e-6; };
    test::expect_close(dev.get(dx, x.size()), x, bound,
                       "add_gated_rows " + std::to_string(rows) + "x" + std::to_string(cols));
  }
}

}  // namespace
}  // namespace kiln
