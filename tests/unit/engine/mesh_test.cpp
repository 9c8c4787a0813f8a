// The forward over a device mesh on the CPU's collective backend (threads as ranks), against
// the whole model, for every architecture kiln runs (the Hugging Face fixtures converted to
// F32): a prompt's last logits and those of 6 greedy steps after it (encoders: every hidden
// row). Tensor parallelism (--tp 2, --tp 4 where the model divides) and expert parallelism
// (--ep) sum partial products over the ranks in another order: within 2e-5 of the largest
// logit (seen: 2e-7 .. 3e-6). Pipeline parallelism (--pp 2) does the same arithmetic in the same
// order on two stages: bit for bit, and so the same greedy tokens. A mesh that does not divide the
// model is refused naming the dimension; a rank that fails fails the step and every later one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kiln/backend/cpu/cpu_backend.h"
#include "kiln/backend/cpu/matmul.h"
#include "kiln/engine/executor.h"
#include "kiln/model/shard.h"
#include "unit/model/forward_util.h"

namespace kiln::engine {
namespace {

const std::string kFixtures = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/";
constexpr int kSteps = 6;

struct Outputs {
  std::vector<std::vector<float>> rows;  // per step: the logits (or hidden rows) it returned
  std::vector<int32_t> tokens;           // the greedy tokens fed after the prompt
  std::string error;
};

// An executor of m on `mesh` (rank 0 on be, a thread each): steps of 32 rows of max_seqs
// sequences of 64 tokens, F32 KV.
Expected<std::unique_ptr<Executor>> executor(const model::Model& m, const model::MeshShape& mesh,
                                             backend::Backend& be, int32_t max_seqs) {
  ExecutorOptions eo;
  eo.max_tokens = 32;
  eo.max_seqs = max_seqs;
  eo.max_context = 64;
  eo.max_hidden_rows = m.arch().features.encoder ? 32 : 0;
  eo.kv_type = quant::Type::F32;
  eo.graphs = false;
  eo.mesh = mesh;
  eo.mesh_threads = 1;
  return Executor::create(m, be, eo);
}

// The prompt, then kSteps greedy steps, on `mesh` (a mesh of one: the whole model).
Outputs run(const model::Model& m, const model::MeshShape& mesh) {
  Outputs o;
  backend::cpu::CpuBackend be(1);
  auto ex = executor(m, mesh, be, 1);
  if (!ex.ok()) {
    o.error = ex.error().message;
    return o;
  }
  const bool encoder = m.arch().features.encoder;
  std::vector<int32_t> seq = {1, 17, 42, 99, 3, 250, 7, 64, 128, 5, 77, 31};
  const int steps = encoder ? 1 : 1 + kSteps;
  for (int s = 0; s < steps; ++s) {
    const int32_t len = static_cast<int32_t>(seq.size());
    const int32_t from = s == 0 ? 0 : len - 1;
    std::vector<int32_t> tokens(seq.begin() + from, seq.end()), positions(tokens.size()),
        rows(tokens.size());
    std::iota(positions.begin(), positions.end(), from);
    std::iota(rows.begin(), rows.end(), 0);
    const int32_t n_blocks = (len + kv::kBlockTokens - 1) / kv::kBlockTokens;
    std::vector<int32_t> blocks(static_cast<size_t>(n_blocks));
    std::iota(blocks.begin(), blocks.end(), 0);
    const int32_t qo[2] = {0, static_cast<int32_t>(tokens.size())}, kv_ptr[2] = {0, n_blocks},
                  kv_len[1] = {len}, slots[1] = {0};
    model::StepInput in;
    in.tokens = tokens;
    in.attn = {1, qo, kv_ptr, blocks.data(), kv_len, positions.data()};
    const int32_t last = static_cast<int32_t>(tokens.size()) - 1;
    if (encoder) {
      in.hidden_rows = rows;
    } else {
      in.logit_rows = std::span<const int32_t>(&rows[static_cast<size_t>(last)], 1);
    }
    in.state = (*ex)->state();
    if (in.state != nullptr) in.state_slots = slots;
    if (Status st = (*ex)->run(in, false); !st.ok()) {
      o.error = st.error().message;
      return o;
    }
    const std::span<const float> out = encoder ? (*ex)->hidden() : (*ex)->logits();
    o.rows.emplace_back(out.begin(), out.end());
    if (encoder) break;
    const int32_t next =
        static_cast<int32_t>(std::max_element(out.begin(), out.end()) - out.begin());
    o.tokens.push_back(next);
    seq.push_back(next);
  }
  return o;
}

// The largest difference against the largest reference value, over every step.
float rel_diff(const Outputs& got, const Outputs& want) {
  EXPECT_EQ(got.rows.size(), want.rows.size());
  float d = 0, ref = 0;
  for (size_t s = 0; s < std::min(got.rows.size(), want.rows.size()); ++s) {
    EXPECT_EQ(got.rows[s].size(), want.rows[s].size());
    for (size_t i = 0; i < std::min(got.rows[s].size(), want.rows[s].size()); ++i) {
      d = std::max(d, std::fabs(got.rows[s][i] - want.rows[s][i]));
      ref = std::max(ref, std::fabs(want.rows[s][i]));
    }
  }
  return ref > 0 ? d / ref : d;
}

model::MeshShape shape(int tp, int pp = 1, bool ep = false) {
  model::MeshShape m;
  m.tp = tp;
  m.pp = pp;
  m.ep = ep;
  return m;
}

const char* kArchs[] = {"llama",     "llama_tied", "qwen2",      "qwen3",       "qwen3moe",
                        "gemma2",    "gemma3",     "phi3",       "mistral_swa", "qwen35",
                        "qwen35moe", "qwen3next",  "bert_embed", "nomic_embed"};

TEST(Mesh, TensorAndPipelineParallelMatchTheWholeModel) {
  for (const char* name : kArchs) {
    SCOPED_TRACE(name);
    model::Loaded l = model::convert_and_load(kFixtures + name, "f32");
    ASSERT_NE(l.model, nullptr);
    const model::Model& m = *l.model;
    const Outputs want = run(m, shape(1));
    ASSERT_TRUE(want.error.empty()) << want.error;
    for (int tp : {2, 4}) {
      SCOPED_TRACE(fmt::format("--tp {}", tp));
      const Status fits = model::check_mesh(m.hparams(), shape(tp));
      const Outputs got = run(m, shape(tp));
      if (!fits.ok()) {  // refused at load, naming what does not divide
        EXPECT_EQ(got.error, fits.error().message);
        EXPECT_NE(got.error.find("--tp"), std::string::npos) << got.error;
        continue;
      }
      ASSERT_TRUE(got.error.empty()) << got.error;
      EXPECT_LT(rel_diff(got, want), 2e-5f);
    }
    {
      SCOPED_TRACE("--pp 2");
      const Outputs got = run(m, shape(1, 2));
      ASSERT_TRUE(got.error.empty()) << got.error;
      EXPECT_EQ(got.rows, want.rows);
      EXPECT_EQ(got.tokens, want.tokens);
    }
    {
      SCOPED_TRACE("--tp 2 --pp 2");
      const Outputs got = run(m, shape(2, 2));
      ASSERT_TRUE(got.error.empty()) << got.error;
      EXPECT_LT(rel_diff(got, want), 2e-5f);
    }
  }
}

TEST(Mesh, QuantizedModelWithinItsInt8Rounding) {
  const std::string path = std::string(KILN_SOURCE_DIR) + "/models/kiln-tiny.gguf";
  auto m = model::Model::load(path);
  if (!m.ok()) GTEST_SKIP() << "no " << path << ": " << m.error().message;
  const Outputs want = run(**m, shape(1));
  ASSERT_TRUE(want.error.empty()) << want.error;
  backend::cpu::set_matmul_mode(backend::cpu::MatmulMode::Reference);  // fp32 activations
  const Outputs fp32 = run(**m, shape(1));
  backend::cpu::set_matmul_mode(backend::cpu::MatmulMode::Fast);
  const float rounding = rel_diff(want, fp32);  // 1.6e-2 seen
  EXPECT_GT(rounding, 0.0f);
  for (int tp : {2, 4}) {
    SCOPED_TRACE(fmt::format("--tp {}", tp));
    const Outputs got = run(**m, shape(tp));
    ASSERT_TRUE(got.error.empty()) << got.error;
    EXPECT_LT(rel_diff(got, want), 2 * rounding);  // 1.3e-2, 1.4e-2 seen
    EXPECT_EQ(got.tokens, want.tokens);
  }
}

// Three sequences in each step (their prompts together, then 4 greedy decode steps): a
// pipeline cuts a step into micro-batches of whole sequences, so its stages overlap, and gives
// the same logits bit for bit (each sequence's arithmetic is the same whatever the batch).
// qwen35 at --pp 3 has a last stage of one attention layer: no recurrent state there.
Outputs run_batch(const model::Model& m, const model::MeshShape& mesh) {
  Outputs o;
  backend::cpu::CpuBackend be(1);
  auto ex = executor(m, mesh, be, 3);
  if (!ex.ok()) {
    o.error = ex.error().message;
    return o;
  }
  std::vector<std::vector<int32_t>> seqs = {
      {1, 17, 42, 99, 3}, {7, 64, 128, 5, 77, 31, 200, 11, 9}, {250, 2, 19}};
  const int32_t blocks_per_seq = 4;
  for (int step = 0; step < 5; ++step) {
    std::vector<int32_t> tokens, positions, qo{0}, kv_ptr{0}, kv_idx, kv_len, rows, slots;
    for (int32_t s = 0; s < 3; ++s) {
      const auto& q = seqs[static_cast<size_t>(s)];
      const int32_t len = static_cast<int32_t>(q.size()), from = step == 0 ? 0 : len - 1;
      for (int32_t t = from; t < len; ++t) {
        tokens.push_back(q[static_cast<size_t>(t)]);
        positions.push_back(t);
      }
      rows.push_back(static_cast<int32_t>(tokens.size()) - 1);
      qo.push_back(static_cast<int32_t>(tokens.size()));
      for (int32_t b = 0; b * kv::kBlockTokens < len; ++b) kv_idx.push_back(s * blocks_per_seq + b);
      kv_ptr.push_back(static_cast<int32_t>(kv_idx.size()));
      kv_len.push_back(len);
      slots.push_back(s);
    }
    model::StepInput in;
    in.tokens = tokens;
    in.attn = {3, qo.data(), kv_ptr.data(), kv_idx.data(), kv_len.data(), positions.data()};
    in.logit_rows = rows;
    in.state = (*ex)->state();
    if (in.state != nullptr) in.state_slots = slots;
    if (Status st = (*ex)->run(in, false); !st.ok()) {
      o.error = st.error().message;
      return o;
    }
    const std::span<const float> out = (*ex)->logits();
    o.rows.emplace_back(out.begin(), out.end());
    const size_t v = m.hparams().n_vocab;
    for (size_t s = 0; s < 3; ++s) {
      const auto row = out.subspan(s * v, v);
      const int32_t next =
          static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      o.tokens.push_back(next);
      seqs[s].push_back(next);
    }
  }
  return o;
}

TEST(Mesh, PipelineMicroBatchesMatchTheWholeModel) {
  for (const char* name : {"llama", "qwen35", "qwen3moe"}) {
    SCOPED_TRACE(name);
    model::Loaded l = model::convert_and_load(kFixtures + name, "f32");
    ASSERT_NE(l.model, nullptr);
    const Outputs want = run_batch(*l.model, shape(1));
    ASSERT_TRUE(want.error.empty()) << want.error;
    for (int pp : {2, 3}) {
      SCOPED_TRACE(fmt::format("--pp {}", pp));
      if (!model::check_mesh(l.model->hparams(), shape(1, pp)).ok()) continue;  // 2 layers
      const Outputs got = run_batch(*l.model, shape(1, pp));
      ASSERT_TRUE(got.error.empty()) << got.error;
      EXPECT_EQ(got.rows, want.rows);
      EXPECT_EQ(got.tokens, want.tokens);
    }
    const Outputs got = run_batch(*l.model, shape(2, 2));
    ASSERT_TRUE(got.error.empty()) << got.error;
    EXPECT_LT(rel_diff(got, want), 2e-5f);
  }
}

TEST(Mesh, ExpertParallelMatchesTheWholeModel) {
  for (const char* name : {"qwen3moe", "qwen35moe", "qwen3next"}) {
    SCOPED_TRACE(name);
    model::Loaded l = model::convert_and_load(kFixtures + name, "f32");
    ASSERT_NE(l.model, nullptr);
    const Outputs want = run(*l.model, shape(1));
    ASSERT_TRUE(want.error.empty()) << want.error;
    for (int tp : {2, 4}) {
      SCOPED_TRACE(fmt::format("--tp {} --ep", tp));
      if (!model::check_mesh(l.model->hparams(), shape(tp, 1, true)).ok()) continue;
      const Outputs got = run(*l.model, shape(tp, 1, true));
      ASSERT_TRUE(got.error.empty()) << got.error;
      EXPECT_LT(rel_diff(got, want), 2e-5f);
    }
  }
}

TEST(Mesh, RefusesAMeshThatDoesNotDivideTheModel) {
  model::Loaded l = model::convert_and_load(kFixtures + "llama", "f32");
  ASSERT_NE(l.model, nullptr);
  Outputs got = run(*l.model, shape(3));
  EXPECT_NE(got.error.find("--tp 3 does not divide the model's attention heads (4)"),
            std::string::npos)
      << got.error;
  got = run(*l.model, shape(1, 3));
  EXPECT_NE(got.error.find("--pp 3 stages need at least one layer each"), std::string::npos)
      << got.error;
  // A row-parallel weight cut inside a quantization block: attn_output's 64 inputs over 4
  // ranks are 16 values, half a Q8_0 block.
  model::Loaded q = model::convert_and_load(kFixtures + "llama", "q8_0");
  ASSERT_NE(q.model, nullptr);
  got = run(*q.model, shape(4));
  EXPECT_NE(got.error.find("--tp 4: blk.0.attn_output.weight splits its rows of 64 values at "
                           "16, not a whole number of 32-value q8_0 blocks"),
            std::string::npos)
      << got.error;
  // --tp 2 cuts it into whole blocks and runs.
  got = run(*q.model, shape(2));
  EXPECT_TRUE(got.error.empty()) << got.error;
}

TEST(Mesh, PlacementFollowsTheManifest) {
  model::Loaded l = model::convert_and_load(kFixtures + "qwen35", "f32");
  ASSERT_NE(l.model, nullptr);
  const model::Model& m = *l.model;
  const model::HParams& hp = m.hparams();
  auto place = [&](const std::string& tensor, int rank) {
    for (const model::TensorSpec& s : model::tensor_manifest(m.arch(), hp))
      if (s.name == tensor) return model::place_tensor(m.arch(), hp, s, shape(2), rank);
    ADD_FAILURE() << "no tensor " << tensor;
    return model::Placement{};
  };
  using Runs = std::vector<std::pair<int64_t, int64_t>>;
  // Layer 3 is full attention: 4 query heads of [q | gate] (2 x 32 rows), 2 KV heads of 32.
  const int64_t d = hp.head_dim_k;
  ASSERT_EQ(d, 32);
  EXPECT_EQ(place("blk.3.attn_q.weight", 1).runs, (Runs{{4 * d, 8 * d}}));
  EXPECT_EQ(place("blk.3.attn_k.weight", 1).runs, (Runs{{d, 2 * d}}));
  EXPECT_EQ(place("blk.3.attn_output.weight", 1).split, model::Split::kCols);
  EXPECT_EQ(place("blk.3.attn_norm.weight", 1).split, model::Split::kReplicate);
  // Layer 0 is a Gated DeltaNet: key heads 2 (16 values), value heads 4 (16 values) tiled as
  // the converter stores them (value head h reads key head h % 2): rank 1 has key head 1 and
  // value heads 1 and 3.
  const int64_t dk = hp.linear_head_k_dim, dv = hp.linear_head_v_dim;
  EXPECT_EQ(place("blk.0.attn_qkv.weight", 1).runs, (Runs{{dk, 2 * dk},
                                                          {3 * dk, 4 * dk},
                                                          {4 * dk + dv, 4 * dk + 2 * dv},
                                                          {4 * dk + 3 * dv, 4 * dk + 4 * dv}}));
  EXPECT_EQ(place("blk.0.ssm_a", 1).runs, (Runs{{1, 2}, {3, 4}}));
  EXPECT_EQ(place("blk.0.ssm_out.weight", 0).runs, (Runs{{0, dv}, {2 * dv, 3 * dv}}));
  EXPECT_EQ(place("output.weight", 1).runs, (Runs{{128, 256}}));
  EXPECT_EQ(place("token_embd.weight", 1).split, model::Split::kReplicate);
}

// A CPU mesh shares the cores out to every rank, rank 0 (the caller's backend) included, so
// that the ranks' threads do not outnumber the cores; rank 0 gets its own count back after.
TEST(Mesh, ACpuMeshSharesTheThreadsOutToRankZeroToo) {
  backend::cpu::CpuBackend first(5);
  {
    auto mesh = backend::Mesh::create(first, 2, 1, {"cpu", 3});
    ASSERT_TRUE(mesh.ok()) << mesh.error().message;
    EXPECT_EQ(first.threads(), 3);
    EXPECT_EQ(static_cast<backend::cpu::CpuBackend&>((*mesh)->rank(1)).threads(), 3);
  }
  EXPECT_EQ(first.threads(), 5);
}

}  // namespace
}  // namespace kiln::engine
