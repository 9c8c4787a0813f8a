// The CUDA backend's copy op (device to device, on its stream) and its profiling seam: a timed
// matmul or matmuls group reports its label, its weights' bytes and a positive device time;
// nothing is timed while profiling is off or while a graph is captured.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kiln/backend/backend.h"
#include "test_util.h"

namespace kiln::backend {
namespace {

std::unique_ptr<Backend> cuda_backend() {
  BackendOptions o;
  o.device = "cuda";
  auto be = create_backend(o);
  EXPECT_TRUE(be.ok()) << be.error().message;
  return be.ok() ? std::move(be).value() : nullptr;
}

TEST(CudaBackendCopy, EqualsTheSource) {
  KILN_REQUIRE_GPU();
  auto be = cuda_backend();
  ASSERT_NE(be, nullptr);
  std::mt19937 rng(5);
  for (uint64_t n : {uint64_t{1}, uint64_t{1000}, (uint64_t{8} << 20) + 3}) {
    std::vector<uint8_t> host(n), back(n + 1);
    for (auto& b : host) b = static_cast<uint8_t>(rng());
    auto src = be->alloc(n);
    auto dst = be->alloc(n + 1);
    ASSERT_TRUE(src.ok() && dst.ok());
    KILN_CUDA_OK(cudaMemset((*dst)->data(), 0xAA, n + 1));
    be->upload((*src)->data(), host.data(), n);
    be->copy((*dst)->data(), (*src)->data(), n);
    be->download(back.data(), (*dst)->data(), n + 1);
    EXPECT_EQ(std::memcmp(back.data(), host.data(), n), 0) << n << " bytes";
    EXPECT_EQ(back[n], 0xAA) << "wrote past " << n << " bytes";
  }
}

// Two F32 weights sharing an input, prepared on the backend; x [4, n_in], y per weight.
struct TwoWeights {
  std::vector<float> w0, w1;
  Weight p0, p1;
  std::unique_ptr<Buffer> x, y0, y1;
};

void make_weights(Backend& be, TwoWeights* s) {
  const int64_t n_in = 512, n_out0 = 256, n_out1 = 128;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 0.1f);
  s->w0.resize(n_in * n_out0);
  s->w1.resize(n_in * n_out1);
  for (auto& v : s->w0) v = nd(rng);
  for (auto& v : s->w1) v = nd(rng);
  const Weight f0{quant::Type::F32, n_in, n_out0, reinterpret_cast<const uint8_t*>(s->w0.data()),
                  n_in * 4};
  const Weight f1{quant::Type::F32, n_in, n_out1, reinterpret_cast<const uint8_t*>(s->w1.data()),
                  n_in * 4};
  auto a = be.prepare_weight(f0);
  auto b = be.prepare_weight(f1);
  ASSERT_TRUE(a.ok() && b.ok());
  s->p0 = *a;
  s->p1 = *b;
  StepCapacity cap;
  cap.max_tokens = 4;
  cap.max_kv_indices = 4;
  ASSERT_TRUE(be.reserve_step(cap).ok());
  auto x = be.alloc(4 * n_in * 4);
  auto y0 = be.alloc(4 * n_out0 * 4);
  auto y1 = be.alloc(4 * n_out1 * 4);
  ASSERT_TRUE(x.ok() && y0.ok() && y1.ok());
  std::vector<float> hx(4 * n_in, 0.5f);
  be.upload((*x)->data(), hx.data(), hx.size() * 4);
  s->x = std::move(*x);
  s->y0 = std::move(*y0);
  s->y1 = std::move(*y1);
}

TEST(CudaBackendProfile, MatmulLabelBytesAndTime) {
  KILN_REQUIRE_GPU();
  auto be = cuda_backend();
  ASSERT_NE(be, nullptr);
  TwoWeights s;
  make_weights(*be, &s);
  if (HasFatalFailure()) return;
  const Mat x{static_cast<float*>(s.x->data()), 4, 512};
  const Mat y0{static_cast<float*>(s.y0->data()), 4, 256};
  const Mat y1{static_cast<float*>(s.y1->data()), 4, 128};

  be->matmul(s.p0, x, y0);  // off: nothing timed
  EXPECT_TRUE(be->profile_take().empty());

  be->set_profiling(true);
  be->matmul(s.p0, x, y0);
  be->matmul(s.p0, x, y0);
  const Weight* ws[] = {&s.p0, &s.p1};
  const Mat ys[] = {y0, y1};
  be->matmuls(ws, x, ys);
  const std::vector<OpTime> t = be->profile_take();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].label, "f32 256x512");
  EXPECT_EQ(t[0].calls, 2);
  EXPECT_EQ(t[0].bytes, 2 * uint64_t{256} * 512 * 4);
  EXPECT_GT(t[0].us, 0);
  EXPECT_EQ(t[1].label, "f32 256x512 + f32 128x512");
  EXPECT_EQ(t[1].calls, 1);
  EXPECT_EQ(t[1].bytes, uint64_t{384} * 512 * 4);
  EXPECT_GT(t[1].us, 0);

  // A graph's ops are recorded, not run: neither capture nor replay is timed.
  ASSERT_TRUE(be->begin_capture().ok());
  be->matmul(s.p0, x, y0);
  auto g = be->end_capture();
  ASSERT_TRUE(g.ok()) << g.error().message;
  be->replay(*g);
  EXPECT_TRUE(be->profile_take().empty());

  // The copy op is timed too (the copy bandwidth of kiln bench --roofline).
  be->copy(s.y0->data(), s.x->data(), 4 * 256 * 4);
  const std::vector<OpTime> c = be->profile_take();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].label, "copy");
  EXPECT_EQ(c[0].bytes, uint64_t{4} * 256 * 4);
  EXPECT_GT(c[0].us, 0);
  be->set_profiling(false);
  be->matmul(s.p0, x, y0);
  EXPECT_TRUE(be->profile_take().empty());
}

}  // namespace
}  // namespace kiln::backend
