// Decode steps replayed from CUDA graphs give the tokens of eager steps: a 512-token greedy
// run on stories260K both ways. Skipped on a backend without graphs (the CPU). And the argmax
// taken where the logits are (SequenceRunner::append_argmax) equals the host's argmax of the
// logits brought back, on every backend (the CUDA one from graph replays). And
// Forward::set_eager runs decode steps eagerly while set.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "forward_util.h"
#include "kiln/engine/sequence.h"

namespace kiln::model {
namespace {

const std::string kModels = std::string(KILN_SOURCE_DIR) + "/../shared/models/";

// device_argmax: each token from append_argmax, else the first largest of append's logits.
std::vector<int32_t> greedy(const Model& m, backend::Backend& be, int n, int64_t* replays,
                            bool device_argmax = false) {
  auto seq = engine::SequenceRunner::create(m, be, 1024);
  EXPECT_TRUE(seq.ok()) << seq.error().message;
  if (!seq.ok()) return {};
  std::vector<int32_t> out;
  std::vector<int32_t> next = {1, 403, 407, 261, 378};
  for (int i = 0; i < n; ++i) {
    int32_t tok = 0;
    if (device_argmax) {
      auto id = (*seq)->append_argmax(next);
      EXPECT_TRUE(id.ok());
      if (!id.ok()) break;
      tok = *id;
    } else {
      auto logits = (*seq)->append(next);
      EXPECT_TRUE(logits.ok());
      if (!logits.ok()) break;
      tok =
          static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    }
    out.push_back(tok);
    next = {tok};
  }
  *replays = (*seq)->forward().num_graph_replays();
  return out;
}

TEST(Graphs, DeviceArgmaxEqualsTheHostsArgmaxOfTheLogits) {
  auto model = Model::load(kModels + "stories260K.gguf");
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto be = test_backend();
  int64_t replays = 0;
  const std::vector<int32_t> host = greedy(**model, *be, 200, &replays);
  const std::vector<int32_t> device = greedy(**model, *be, 200, &replays, true);
  EXPECT_EQ(device.size(), 200u);
  EXPECT_EQ(device, host);
}

TEST(Graphs, ReplayEqualsEagerOn512TokenGreedyRun) {
  auto model = Model::load(kModels + "stories260K.gguf");
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto be_graph = test_backend();
  if (!be_graph->supports_graphs()) GTEST_SKIP() << be_graph->name() << " has no step graphs";
  int64_t replays = 0, eager_replays = 0;
  const std::vector<int32_t> with_graphs = greedy(**model, *be_graph, 512, &replays);
  ::setenv("KILN_CUDA_GRAPHS", "0", 1);
  auto be_eager = test_backend();
  const std::vector<int32_t> eager = greedy(**model, *be_eager, 512, &eager_replays);
  ::unsetenv("KILN_CUDA_GRAPHS");
  EXPECT_EQ(with_graphs.size(), 512u);
  EXPECT_EQ(with_graphs, eager);
  EXPECT_GE(replays, 511);  // every decode step after the prompt
  EXPECT_EQ(eager_replays, 0);
}

// Forward::set_eager: while set, decode steps run eagerly, so the backend's profiling times
// their ops (kiln bench --roofline); cleared, they replay the graphs again.
TEST(Graphs, SetEagerRunsDecodeStepsEagerly) {
  auto model = Model::load(kModels + "stories260K.gguf");
  ASSERT_TRUE(model.ok()) << model.error().message;
  TestForward t = make_forward(**model, 8, 4);
  ASSERT_TRUE(t.ok());
  if (!t.be->supports_graphs()) GTEST_SKIP() << t.be->name() << " has no step graphs";
  t.fwd->enable_graphs(3);  // block 3 pads the graphs' rows; the sequence holds block 0
  std::vector<float> logits((*model)->hparams().n_vocab);
  auto decode = [&](int32_t pos) {
    const int32_t token = 1 + pos, qo[2] = {0, 1}, kv_ptr[2] = {0, 1}, kv_idx[1] = {0};
    const int32_t kv_len[1] = {pos + 1}, rows[1] = {0};
    StepInput in;
    in.tokens = std::span<const int32_t>(&token, 1);
    in.attn = {1, qo, kv_ptr, kv_idx, kv_len, &pos};
    in.logit_rows = rows;
    ASSERT_TRUE(t.fwd->run(in, *t.kv, logits.data()).ok());
  };
  decode(0);
  decode(1);
  const int64_t replays = t.fwd->num_graph_replays();
  EXPECT_EQ(replays, 2);
  t.fwd->set_eager(true);
  t.be->set_profiling(true);
  decode(2);
  const std::vector<backend::OpTime> ops = t.be->profile_take();
  t.be->set_profiling(false);
  t.fwd->set_eager(false);
  EXPECT_EQ(t.fwd->num_graph_replays(), replays);
  const auto attn = std::find_if(ops.begin(), ops.end(),
                                 [](const backend::OpTime& o) { return o.label == "attention"; });
  ASSERT_NE(attn, ops.end());
  EXPECT_EQ(attn->calls, static_cast<int64_t>((*model)->hparams().n_layer));
  decode(3);
  EXPECT_EQ(t.fwd->num_graph_replays(), replays + 1);
  EXPECT_TRUE(t.be->profile_take().empty());
}

}  // namespace
}  // namespace kiln::model
