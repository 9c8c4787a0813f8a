// The CPU backend: the ops interface (backend.h) over the CPU kernels (ops.h, matmul.h). Its
// memory is the host's, so uploads and downloads are copies and the step's inputs are read
// where the host wrote them. Weights are packed at preparation (pack.h) unless KILN_PACK=0.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/backend/cpu/ops.h"
#include "kiln/backend/cpu/pack.h"
#include "kiln/util/thread_pool.h"

namespace kiln::backend::cpu {

class CpuBackend final : public Backend {
 public:
  // threads: the pool's size (0: physical cores). The other constructor borrows a pool (may
  // be null: one thread, the caller's).
  explicit CpuBackend(int threads);
  explicit CpuBackend(util::ThreadPool* pool);

  std::string name() const override { return "cpu"; }
  std::string description() const override;
  DeviceMemory memory() const override;

  Expected<std::unique_ptr<Buffer>> alloc(uint64_t bytes) override;
  Expected<std::unique_ptr<Buffer>> alloc_host(uint64_t bytes) override { return alloc(bytes); }
  void upload(void* dst, const void* host_src, uint64_t bytes) override;
  void download(void* host_dst, const void* src, uint64_t bytes) override;
  void copy(void* dst, const void* src, uint64_t bytes) override;
  void sync() override {}
  void set_profiling(bool on) override { profiling_ = on; }
  std::vector<OpTime> profile_take() override { return profile_.take(); }

  Expected<Weight> prepare_weight(const Weight& file_weight, WeightUse use) override;
  Expected<const float*> prepare_vector(const float* host, int64_t n) override;
  Expected<const double*> prepare_doubles(const double* host, int64_t n) override;
  uint64_t prepared_bytes() const override { return packed_.bytes() + vector_bytes_; }

  uint64_t kv_bytes_per_block(const KvSpec& spec) const override;
  Expected<std::unique_ptr<KvCache>> create_kv(const KvSpec& spec, int32_t num_blocks) override;

  uint64_t state_bytes_per_slot(const StateSpec& spec) const override;
  Expected<std::unique_ptr<StateCache>> create_state(const StateSpec& spec,
                                                     int32_t num_slots) override;
  void state_copy(StateCache& st, int32_t src_slot, int32_t dst_slot) override;

  Status reserve_step(const StepCapacity&) override { return {}; }
  Expected<StepArgs> upload_step(const HostStep& step) override;

  void embed(const Weight& table, const int32_t* tokens, Mat out) override;
  void rmsnorm(Mat x, const float* w, Mat y, float eps) override;
  void layernorm(Mat x, const float* w, const float* b, Mat out, float eps) override;
  void add_layernorm(Mat x, Mat y, const float* w, const float* b, Mat out, float eps) override;
  void matmul(const Weight& w, Mat x, Mat y) override;
  void matmuls(std::span<const Weight* const> ws, Mat x, std::span<const Mat> ys) override;
  void add_bias(Mat x, const float* b) override;
  void add(Mat x, Mat y) override;
  void scale(Mat x, float s) override;
  void scale_rows(Mat x, const float* s) override;
  void add_gated_rows(Mat x, Mat y, Mat s) override;
  void softcap(Mat x, float cap) override;
  void swiglu(Mat gate, Mat up, Mat out) override;
  void geglu(Mat gate, Mat up, Mat out) override;
  void gelu(Mat x, Mat out) override;
  void copy_cols(Mat src, int64_t col0, Mat dst) override;
  void gather_rows(Mat src, const int32_t* rows, Mat dst) override;
  void argmax_rows(Mat x, int32_t* out) override;
  void rope_angles(const RopeTable& t, const int32_t* positions, Mat cos, Mat sin) override;
  void rope_apply(Mat x, int32_t n_heads, int32_t head_dim, bool neox, Mat cos, Mat sin) override;
  void kv_write(KvCache& kv, int32_t layer, const StepArgs& step, Mat k, Mat v) override;
  void attention(KvCache& kv, int32_t layer, const StepArgs& step, Mat q, Mat out,
                 const AttnParams& p) override;
  void moe(const MoeWeights& w, Mat xn, Mat out, const MoeScratch& s) override;
  void conv1d_silu(StateCache& st, int32_t layer, const StepArgs& step, Mat x, const float* w,
                   Mat out) override;
  void gated_delta_rule(StateCache& st, int32_t layer, const StepArgs& step, Mat qkv, Mat alpha,
                        Mat beta, const float* ssm_a, const float* dt_bias, Mat out,
                        const DeltaParams& p) override;
  void sigmoid_mul(Mat x, Mat gate, Mat out) override;
  void deinterleave(Mat src, int64_t width, Mat a, Mat b) override;
  // Mesh ops over the host collective (cpu_collective.h: threads as ranks).
  bool supports_mesh() const override { return true; }
  void all_reduce_sum(Mat x) override;
  void all_gather_cols(Mat x, Mat gathered, Mat out) override;
  void send(Mat x, int stage) override;
  void recv(Mat x, int stage) override;

  util::ThreadPool* pool() const { return pool_; }
  int threads() const { return pool_ != nullptr ? pool_->num_threads() : 1; }
  // A pool of n threads in place of the one this backend made (a borrowed pool stays): a CPU
  // mesh shares the cores out, rank 0 (the caller's backend) included. Not during a step.
  void set_threads(int n);
  // The view of one layer of a cache this backend made (tests compare kernels with it).
  static KvLayerView layer_view(KvCache& kv, int32_t layer);
  // The view of one layer of a recurrent state this backend made.
  static DeltaLayerView state_view(StateCache& st, int32_t layer);

 private:
  // Runs op(); while profiling, adds its wall time (the CPU's ops are done when they return)
  // under label() with `bytes`. The label is built only when timed.
  template <typename Op, typename Label>
  void timed(Label&& label, uint64_t bytes, Op&& op) {
    if (!profiling_) return op();
    const auto t0 = std::chrono::steady_clock::now();
    op();
    const std::chrono::duration<double, std::micro> us = std::chrono::steady_clock::now() - t0;
    profile_.add(label(), bytes, us.count());
  }
  // The MoE op's work (moe times it).
  void moe_rows(const MoeWeights& w, Mat xn, Mat out, const MoeScratch& s);

  std::unique_ptr<util::ThreadPool> own_pool_;
  util::ThreadPool* pool_ = nullptr;
  PackedStore packed_;
  // Prepared, by the file's data pointer and the rows (a mesh rank's part of a tied output
  // starts where the embedding table does).
  std::map<std::pair<const uint8_t*, int64_t>, Weight> weights_;
  uint64_t vector_bytes_ = 0;
  std::vector<int32_t> moe_order_;  // [n_expert] scratch of the routing sort
  std::vector<float> moe_probs_;    // [n_expert]
  bool profiling_ = false;
  OpTimeSums profile_;
};

}  // namespace kiln::backend::cpu
