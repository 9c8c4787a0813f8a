// Decode steps replayed from CUDA graphs give the tokens of eager steps: a 512-token greedy
// run on stories260K both ways. Skipped on a backend without graphs (the CPU). And the argmax
// taken where the logits are (SequenceRunner::append_argmax) equals the host's argmax of the
// logits brought back, on every backend (the CUDA one from graph replays).
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

}  // namespace
}  // namespace kiln::model
