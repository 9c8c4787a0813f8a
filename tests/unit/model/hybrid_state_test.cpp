// Hybrid models (Gated DeltaNet layers, qwen35 fixture): each sequence's recurrent state
// carries across steps exactly as one long step would compute it. A prompt prefilled in one
// step, in chunks, or token by token gives the same logits; a sequence gives the same logits
// alone and beside others in other state slots; a sequence that starts at position 0 ignores
// whatever its slot held. Bounds: fp32 rounding of different summation orders (the chunked
// delta rule against the recurrence), 1e-4 of the largest |logit|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "forward_util.h"
#include "kiln/model/forward.h"
#include "kiln/model/model.h"

namespace kiln::model {
namespace {

const std::string kFixtures = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/hf/";
constexpr int32_t kBlocksPerSeq = 16;  // 256 tokens of KV per sequence

struct Part {
  const std::vector<int32_t>* tokens;
  int32_t slot;  // also picks the sequence's KV blocks
  int32_t from, to;
};

// One step over the parts (tokens [from, to) of each); the logits of every row, per part.
std::vector<std::vector<float>> step(TestForward& tf, const Model& m,
                                     const std::vector<Part>& parts) {
  std::vector<int32_t> flat, positions, qo{0}, kv_ptr{0}, kv_idx, kv_len, rows, slots;
  for (const Part& p : parts) {
    for (int32_t t = p.from; t < p.to; ++t) {
      flat.push_back((*p.tokens)[static_cast<size_t>(t)]);
      positions.push_back(t);
      rows.push_back(static_cast<int32_t>(rows.size()));
    }
    qo.push_back(static_cast<int32_t>(flat.size()));
    for (int32_t b = 0; b * kv::kBlockTokens < p.to; ++b)
      kv_idx.push_back(p.slot * kBlocksPerSeq + b);
    kv_ptr.push_back(static_cast<int32_t>(kv_idx.size()));
    kv_len.push_back(p.to);
    slots.push_back(p.slot);
  }
  StepInput in;
  in.tokens = flat;
  in.attn = {static_cast<int32_t>(parts.size()),
             qo.data(),
             kv_ptr.data(),
             kv_idx.data(),
             kv_len.data(),
             positions.data()};
  in.logit_rows = rows;
  in.state = tf.state.get();
  in.state_slots = slots;
  const uint32_t v = m.hparams().n_vocab;
  std::vector<float> logits(rows.size() * v);
  const Status st = tf.fwd->run(in, *tf.kv, logits.data());
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
  std::vector<std::vector<float>> out;
  size_t row = 0;
  for (const Part& p : parts) {
    const size_t n = static_cast<size_t>(p.to - p.from);
    out.emplace_back(logits.begin() + row * v, logits.begin() + (row + n) * v);
    row += n;
  }
  return out;
}

float rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0, ref = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::fabs(a[i] - b[i]));
    ref = std::max(ref, std::fabs(b[i]));
  }
  return d / std::max(ref, 1e-30f);
}

class HybridState : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ifstream gf(kFixtures + "qwen35/goldens.json");
    ASSERT_TRUE(gf);
    const nlohmann::json g = nlohmann::json::parse(gf);
    for (const auto& s : g["sequences"]) seqs_.push_back(s.get<std::vector<int32_t>>());
    std::sort(seqs_.begin(), seqs_.end(),
              [](const auto& a, const auto& b) { return a.size() > b.size(); });
    loaded_ = convert_and_load(kFixtures + "qwen35", "f32");
    ASSERT_NE(loaded_.model, nullptr);
    ASSERT_GT(loaded_.model->hparams().n_linear_layers(), 0u);
  }
  TestForward forward(int32_t slots, bool deterministic = false) {
    return make_forward(*loaded_.model, 256, slots * kBlocksPerSeq, quant::Type::F32, nullptr,
                        slots, deterministic);
  }
  std::vector<std::vector<int32_t>> seqs_;  // longest first (150 tokens: three 64-chunks)
  Loaded loaded_;
};

TEST_F(HybridState, ChunkedAndTokenByTokenPrefillEqualOneStep) {
  const Model& m = *loaded_.model;
  const std::vector<int32_t>& seq = seqs_[0];
  const int32_t n = static_cast<int32_t>(seq.size());
  TestForward whole = forward(1);
  ASSERT_TRUE(whole.ok());
  const std::vector<float> ref = step(whole, m, {{&seq, 0, 0, n}})[0];
  for (int32_t chunk : {1, 7, 37, 64, 100}) {
    TestForward tf = forward(1);
    ASSERT_TRUE(tf.ok());
    std::vector<float> got;
    for (int32_t from = 0; from < n; from += chunk) {
      const std::vector<float> part = step(tf, m, {{&seq, 0, from, std::min(n, from + chunk)}})[0];
      got.insert(got.end(), part.begin(), part.end());
    }
    EXPECT_LE(rel_diff(got, ref), 1e-4f) << "chunks of " << chunk;
  }
}

// The deterministic mode (Backend::set_deterministic) takes the recurrence for every run of rows,
// so that chunking (a prefix-cache hit, chunked prefill) and the batch change nothing: bitwise.
TEST_F(HybridState, DeterministicModeChunkedPrefillAndBatchAreBitwise) {
  const Model& m = *loaded_.model;
  const std::vector<int32_t>& seq = seqs_[0];
  const int32_t n = static_cast<int32_t>(seq.size());
  ASSERT_GE(n, 128);  // runs of 64+ rows, which the default mode sends to the chunked form
  TestForward whole = forward(1, true);
  ASSERT_TRUE(whole.ok());
  const std::vector<float> ref = step(whole, m, {{&seq, 0, 0, n}})[0];
  for (int32_t chunk : {1, 37, 64, 100}) {
    TestForward tf = forward(1, true);
    ASSERT_TRUE(tf.ok());
    std::vector<float> got;
    for (int32_t from = 0; from < n; from += chunk) {
      const std::vector<float> part = step(tf, m, {{&seq, 0, from, std::min(n, from + chunk)}})[0];
      got.insert(got.end(), part.begin(), part.end());
    }
    EXPECT_TRUE(got == ref) << "chunks of " << chunk << ": " << rel_diff(got, ref);
  }
  TestForward batch = forward(3, true);
  ASSERT_TRUE(batch.ok());
  const auto s1 = step(batch, m,
                       {{&seqs_[1], 0, 0, static_cast<int32_t>(seqs_[1].size())},
                        {&seq, 2, 0, n},
                        {&seqs_[2], 1, 0, 5}});
  EXPECT_TRUE(s1[1] == ref) << rel_diff(s1[1], ref);
}

TEST_F(HybridState, SequencesInOtherSlotsDoNotDisturbEachOther) {
  const Model& m = *loaded_.model;
  const std::vector<int32_t>& a = seqs_[0];
  const int32_t n = static_cast<int32_t>(a.size());
  TestForward alone = forward(4);
  ASSERT_TRUE(alone.ok());
  const std::vector<float> first = step(alone, m, {{&a, 2, 0, n - 1}})[0];
  const std::vector<float> last = step(alone, m, {{&a, 2, n - 1, n}})[0];
  // The same two steps of `a` in slot 1, beside other sequences in slots 0, 2 and 3 (prefill
  // beside its prefill, decode and prefill beside its decode).
  TestForward batch = forward(4);
  ASSERT_TRUE(batch.ok());
  const auto s1 = step(batch, m,
                       {{&seqs_[1], 0, 0, static_cast<int32_t>(seqs_[1].size())},
                        {&a, 1, 0, n - 1},
                        {&seqs_[2], 3, 0, 5}});
  const auto s2 = step(batch, m,
                       {{&seqs_[2], 3, 5, 6},
                        {&a, 1, n - 1, n},
                        {&seqs_[3], 2, 0, static_cast<int32_t>(seqs_[3].size())}});
  EXPECT_LE(rel_diff(s1[1], first), 1e-4f);
  EXPECT_LE(rel_diff(s2[1], last), 1e-4f);
}

TEST_F(HybridState, APromptAtPositionZeroIgnoresWhatItsSlotHeld) {
  const Model& m = *loaded_.model;
  const std::vector<int32_t>& a = seqs_[0];
  const std::vector<int32_t>& b = seqs_[1];
  const int32_t nb = static_cast<int32_t>(b.size());
  TestForward fresh = forward(1);
  ASSERT_TRUE(fresh.ok());
  const std::vector<float> want = step(fresh, m, {{&b, 0, 0, nb}})[0];
  TestForward used = forward(1);
  ASSERT_TRUE(used.ok());
  step(used, m, {{&a, 0, 0, static_cast<int32_t>(a.size())}});  // leaves a's state in slot 0
  EXPECT_EQ(step(used, m, {{&b, 0, 0, nb}})[0], want);  // bitwise: the same ops on a zero state
}

}  // namespace
}  // namespace kiln::model
