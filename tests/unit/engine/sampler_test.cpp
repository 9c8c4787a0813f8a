#include "kiln/engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kiln::engine {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

SamplingParams params_with(float temperature, int32_t top_k = 0, float top_p = 1.0f,
                           float min_p = 0.0f, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = seed;
  return p;
}

std::vector<float> log_of(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

// Deterministic test logits: standard normal (Box-Muller over the sampler's own Rng) * scale.
std::vector<float> random_logits(int32_t n, float scale, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> out(static_cast<size_t>(n));
  for (auto& x : out) {
    const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
    x = static_cast<float>(scale * std::sqrt(-2.0 * std::log(u1)) *
                           std::cos(6.283185307179586 * u2));
  }
  return out;
}

// Counts tokens drawn by `num` fresh samplers with seeds 0..num-1 (one draw each) and by one
// sampler drawing `num` times; both must only produce allowed ids with the expected
// frequencies within 5 binomial standard deviations (deterministic: the seeds are fixed).
void expect_frequencies(const std::vector<float>& logits, const SamplingParams& base,
                        const std::map<int32_t, double>& expected, int num = 20000) {
  const auto n_vocab = static_cast<int32_t>(logits.size());
  std::map<int32_t, int> by_seed, by_stream;
  for (int s = 0; s < num; ++s) {
    SamplingParams p = base;
    p.seed = static_cast<uint64_t>(s);
    Sampler sampler(p, n_vocab);
    ++by_seed[sampler.sample(logits, {}).token];
  }
  Sampler stream(base, n_vocab);
  for (int s = 0; s < num; ++s) ++by_stream[stream.sample(logits, {}).token];
  for (const auto* counts : {&by_seed, &by_stream}) {
    for (const auto& [id, c] : *counts) {
      EXPECT_TRUE(expected.count(id)) << "token " << id << " drawn " << c << " times";
    }
    for (const auto& [id, p] : expected) {
      const double f = static_cast<double>(counts->count(id) ? counts->at(id) : 0) / num;
      const double sigma = std::sqrt(p * (1.0 - p) / num);
      EXPECT_NEAR(f, p, 5.0 * sigma + 1e-12) << "token " << id;
    }
  }
}

// ---------------------------------------------------------------------------
// Rng
// ---------------------------------------------------------------------------

TEST(Rng, MatchesReferenceVectors) {
  // splitmix64 from 0: the first output of the reference implementation.
  uint64_t state = 0;
  EXPECT_EQ(splitmix64(&state), 0xe220a8397b1dcdafULL);
  // xoshiro256** from {1, 2, 3, 4}: the reference implementation's first outputs.
  Rng r = Rng::from_state({1, 2, 3, 4});
  EXPECT_EQ(r.next(), 11520u);
  EXPECT_EQ(r.next(), 0u);
  EXPECT_EQ(r.next(), 1509978240u);
  EXPECT_EQ(r.next(), 1215971899390074240ULL);
  // Seeding through splitmix64 (values from an independent Python implementation).
  Rng seeded(42);
  EXPECT_EQ(seeded.next(), 0x15780b2e0c2ec716ULL);
  EXPECT_EQ(seeded.next(), 0x6104d9866d113a7eULL);
  EXPECT_EQ(seeded.next(), 0xae17533239e499a1ULL);
}

TEST(Rng, UniformIsInUnitIntervalWithMeanHalf) {
  Rng r(7);
  double sum = 0.0;
  constexpr int kNum = 100000;
  for (int i = 0; i < kNum; ++i) {
    const double u = r.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / kNum, 0.5, 5.0 * std::sqrt(1.0 / 12.0 / kNum));
  EXPECT_EQ(Rng::from_state({0, 0, 0, 0}).uniform(), 0.0);
}

TEST(Rng, ChoiceSeeds) {
  EXPECT_EQ(choice_seed(123, 0), 123u);
  std::set<uint64_t> seen;
  for (int32_t i = 0; i < 8; ++i) seen.insert(choice_seed(123, i));
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_EQ(choice_seed(123, 3), choice_seed(123, 3));
}

TEST(ExpNonpositive, MatchesStdExpWithinTwoUlpAndUnderflowsToZero) {
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);  // the max logit's weight is exactly 1
  EXPECT_EQ(exp_nonpositive(-0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-kInf), 0.0f);
  EXPECT_EQ(exp_nonpositive(-87.5f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-1e30f), 0.0f);
  double worst = 0.0;
  for (float x = -87.0f; x <= 0.0f; x += 0.000731f) {
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(exp_nonpositive(x) - want) / want);
  }
  EXPECT_LT(worst, 2.4e-7);  // 2 ulp of float
}

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

TEST(Validate, DefaultsAreValid) {
  EXPECT_TRUE(validate(SamplingParams{}, 100).ok());
}

TEST(Validate, RejectsAbsurdValuesNamingTheField) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    void (*mutate)(SamplingParams&, float nan);
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](SamplingParams& p, float) { p.temperature = -0.5f; }, "temperature"},
      {[](SamplingParams& p, float n) { p.temperature = n; }, "temperature"},
      {[](SamplingParams& p, float) { p.temperature = kInf; }, "temperature"},
      {[](SamplingParams& p, float) { p.top_k = -1; }, "top_k"},
      {[](SamplingParams& p, float) { p.top_p = 0.0f; }, "top_p"},
      {[](SamplingParams& p, float) { p.top_p = 1.5f; }, "top_p"},
      {[](SamplingParams& p, float n) { p.top_p = n; }, "top_p"},
      {[](SamplingParams& p, float) { p.min_p = -0.1f; }, "min_p"},
      {[](SamplingParams& p, float) { p.min_p = 1.1f; }, "min_p"},
      {[](SamplingParams& p, float n) { p.min_p = n; }, "min_p"},
      {[](SamplingParams& p, float) { p.repetition_penalty = 0.0f; }, "repetition_penalty"},
      {[](SamplingParams& p, float n) { p.repetition_penalty = n; }, "repetition_penalty"},
      {[](SamplingParams& p, float) { p.presence_penalty = 2.5f; }, "presence_penalty"},
      {[](SamplingParams& p, float n) { p.presence_penalty = n; }, "presence_penalty"},
      {[](SamplingParams& p, float) { p.frequency_penalty = -3.0f; }, "frequency_penalty"},
      {[](SamplingParams& p, float) { p.penalty_last_n = -2; }, "penalty_last_n"},
      {[](SamplingParams& p, float) {
         p.logit_bias = {{100, 1.0f}};
       },
       "logit_bias"},
      {[](SamplingParams& p, float) {
         p.logit_bias = {{-1, 1.0f}};
       },
       "logit_bias"},
      {[](SamplingParams& p, float) {
         p.logit_bias = {{3, 101.0f}};
       },
       "logit_bias"},
      {[](SamplingParams& p, float) {
         p.logit_bias = {{3, kInf}};
       },
       "logit_bias"},
      {[](SamplingParams& p, float n) {
         p.logit_bias = {{3, n}};
       },
       "logit_bias"},
      {[](SamplingParams& p, float) { p.top_logprobs = 21, p.logprobs = true; }, "top_logprobs"},
      {[](SamplingParams& p, float) { p.top_logprobs = -1, p.logprobs = true; }, "top_logprobs"},
      {[](SamplingParams& p, float) { p.top_logprobs = 3; }, "top_logprobs"},
  };
  for (const auto& c : cases) {
    SamplingParams p;
    c.mutate(p, nan);
    const Status s = validate(p, 100);
    ASSERT_FALSE(s.ok()) << c.field;
    EXPECT_NE(s.error().message.find(c.field), std::string::npos) << s.error().message;
    EXPECT_FALSE(Sampler::create(p, 100).ok()) << c.field;
  }
  EXPECT_FALSE(validate(SamplingParams{}, 0).ok());
}

TEST(Validate, AcceptsEdgeValues) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.top_k = 1000000;  // larger than the vocabulary: no truncation
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.penalty_last_n = -1;
  p.logit_bias = {{0, -kInf}, {99, 100.0f}, {5, -100.0f}};
  p.logprobs = true;
  p.top_logprobs = 20;
  EXPECT_TRUE(validate(p, 100).ok());
}

// ---------------------------------------------------------------------------
// Greedy
// ---------------------------------------------------------------------------

TEST(Sampler, GreedyPicksArgmaxAndLowestIdOnTies) {
  Sampler greedy(params_with(0.0f), 6);
  EXPECT_EQ(greedy.sample(std::vector<float>{0.1f, 2.0f, -1.0f, 1.9f, 0.0f, 1.0f}, {}).token, 1);
  EXPECT_EQ(greedy.sample(std::vector<float>{0.1f, 3.0f, -1.0f, 3.0f, 3.0f, 1.0f}, {}).token, 1);
  EXPECT_EQ(greedy.sample(std::vector<float>{-5, -5, -5, -5, -5, -5}, {}).token, 0);
  // NaN is never the argmax.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(greedy.sample(std::vector<float>{nan, 1.0f, nan, 2.0f, nan, nan}, {}).token, 3);
  EXPECT_EQ(greedy.distribution(std::vector<float>{0, 0, 7, 7, 0, 0}, {}),
            (std::vector<std::pair<int32_t, float>>{{2, 1.0f}}));
}

TEST(Sampler, TopK1AndTinyTemperatureEqualGreedy) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const auto logits = random_logits(500, 2.0f, seed);
    const int32_t best =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    Sampler greedy(params_with(0.0f), 500);
    Sampler top1(params_with(1.0f, 1, 1.0f, 0.0f, seed), 500);
    Sampler cold(params_with(1e-6f, 0, 1.0f, 0.0f, seed), 500);
    Sampler cold_top_k(params_with(1e-6f, 50, 0.9f, 0.0f, seed), 500);
    EXPECT_EQ(greedy.sample(logits, {}).token, best);
    EXPECT_EQ(top1.sample(logits, {}).token, best);
    EXPECT_EQ(cold.sample(logits, {}).token, best);
    EXPECT_EQ(cold_top_k.sample(logits, {}).token, best);
  }
}

TEST(Sampler, NonFiniteLogitsAndExtremeTemperatures) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // +inf counts as the largest float (ties with the other +inf), NaN as -inf.
  Sampler s(params_with(1.0f), 4);
  const auto d = s.distribution(std::vector<float>{kInf, 0.0f, nan, kInf}, {});
  EXPECT_EQ(d, (std::vector<std::pair<int32_t, float>>{{0, 0.5f}, {3, 0.5f}}));
  // A huge temperature flattens to uniform; a tiny one keeps only the (tied) maxima.
  Sampler hot(params_with(1e30f), 4);
  for (const auto& [id, p] : hot.distribution(std::vector<float>{5.0f, -3.0f, 0.0f, 9.0f}, {})) {
    EXPECT_NEAR(p, 0.25f, 1e-6f) << id;
  }
  Sampler cold(params_with(1e-30f), 4);
  EXPECT_EQ(cold.distribution(std::vector<float>{7.0f, 1.0f, 7.0f, 6.9999f}, {}),
            (std::vector<std::pair<int32_t, float>>{{0, 0.5f}, {2, 0.5f}}));
}

// ---------------------------------------------------------------------------
// Truncation: allowed sets and frequencies
// ---------------------------------------------------------------------------

const std::vector<double> kProbs = {0.05, 0.5, 0.1, 0.2, 0.15};  // sorted: 1, 3, 4, 2, 0

TEST(Sampler, PlainTemperatureOneFollowsSoftmax) {
  expect_frequencies(log_of(kProbs), params_with(1.0f),
                     {{0, 0.05}, {1, 0.5}, {2, 0.1}, {3, 0.2}, {4, 0.15}});
}

TEST(Sampler, TemperatureSharpensAndFlattens) {
  // p_i ^ (1 / T), renormalized.
  for (const float t : {0.5f, 2.0f}) {
    double z = 0.0;
    for (double p : kProbs) z += std::pow(p, 1.0 / t);
    std::map<int32_t, double> expected;
    for (int32_t i = 0; i < 5; ++i) expected[i] = std::pow(kProbs[i], 1.0 / t) / z;
    expect_frequencies(log_of(kProbs), params_with(t), expected);
  }
}

TEST(Sampler, TopKKeepsTheKBest) {
  expect_frequencies(log_of(kProbs), params_with(1.0f, 2), {{1, 0.5 / 0.7}, {3, 0.2 / 0.7}});
  expect_frequencies(log_of(kProbs), params_with(1.0f, 3),
                     {{1, 0.5 / 0.85}, {3, 0.2 / 0.85}, {4, 0.15 / 0.85}});
}

TEST(Sampler, TopPKeepsSmallestSetReachingP) {
  // Cumulative in order: 0.5, 0.7, 0.85, 0.95, 1.0.
  expect_frequencies(log_of(kProbs), params_with(1.0f, 0, 0.8f),
                     {{1, 0.5 / 0.85}, {3, 0.2 / 0.85}, {4, 0.15 / 0.85}});
  expect_frequencies(log_of(kProbs), params_with(1.0f, 0, 0.6f), {{1, 0.5 / 0.7}, {3, 0.2 / 0.7}});
  // Below the first token's probability: only that one.
  expect_frequencies(log_of(kProbs), params_with(1.0f, 0, 0.3f), {{1, 1.0}});
}

TEST(Sampler, MinPKeepsTokensAboveFractionOfMax) {
  // p_max 0.5: min_p 0.35 keeps p >= 0.175 -> {1, 3}; min_p 0.25 keeps p >= 0.125 -> {1, 3, 4}.
  expect_frequencies(log_of(kProbs), params_with(1.0f, 0, 1.0f, 0.35f),
                     {{1, 0.5 / 0.7}, {3, 0.2 / 0.7}});
  expect_frequencies(log_of(kProbs), params_with(1.0f, 0, 1.0f, 0.25f),
                     {{1, 0.5 / 0.85}, {3, 0.2 / 0.85}, {4, 0.15 / 0.85}});
}

TEST(Sampler, TopKThenTopPRenormalizesWithinK) {
  // top-k 4 leaves {0.5, 0.2, 0.15, 0.1} / 0.95; top-p 0.75 of that: 0.526, 0.737, 0.895 ->
  // keeps three.
  expect_frequencies(log_of(kProbs), params_with(1.0f, 4, 0.75f),
                     {{1, 0.5 / 0.85}, {3, 0.2 / 0.85}, {4, 0.15 / 0.85}});
}

TEST(Sampler, DrawAcrossBlocksFollowsSoftmax) {
  // 1000 ids span four blocks of the block-sum search; the mass sits in ids of each block.
  std::vector<float> logits(1000, 0.0f);
  logits[10] = 4.0f;
  logits[300] = 3.0f;
  logits[700] = 4.0f;
  logits[999] = 2.0f;
  double z = 0.0;
  for (float l : logits) z += std::exp(double(l));
  std::map<int32_t, double> expected;
  for (int32_t i = 0; i < 1000; ++i) expected[i] = std::exp(double(logits[i])) / z;
  expect_frequencies(logits, params_with(1.0f), expected, 10000);
}

TEST(Sampler, GoldenSequenceForSeed42) {
  // Pins the Rng, the exp and the draw order: any change to them changes users' seeded
  // outputs and must be deliberate. Logits are exact binary fractions; the expected strings
  // come from an independent Python implementation of the same pipeline (xoshiro256**, id-order
  // draw for plain and top-p, best-first draw for top-k).
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  Sampler plain(params_with(1.0f, 0, 1.0f, 0.0f, 42), 6);
  Sampler nucleus(params_with(0.75f, 0, 0.9f, 0.0f, 42), 6);
  Sampler top3(params_with(1.25f, 3, 1.0f, 0.0f, 42), 6);
  std::string got_plain, got_nucleus, got_top3;
  for (int i = 0; i < 24; ++i) {
    got_plain += static_cast<char>('0' + plain.sample(logits, {}).token);
    got_nucleus += static_cast<char>('0' + nucleus.sample(logits, {}).token);
    got_top3 += static_cast<char>('0' + top3.sample(logits, {}).token);
  }
  EXPECT_EQ(got_plain, "123555355232523525331122");
  EXPECT_EQ(got_nucleus, "123555355232523525331222");
  EXPECT_EQ(got_top3, "225115515552125151552225");
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedDifferent) {
  const auto logits = random_logits(1000, 0.5f, 3);  // flat: many plausible tokens
  const auto run = [&](uint64_t seed, int32_t top_k, float top_p) {
    Sampler s(params_with(1.0f, top_k, top_p, 0.0f, seed), 1000);
    std::vector<int32_t> ids;
    for (int i = 0; i < 64; ++i) ids.push_back(s.sample(logits, ids).token);
    return ids;
  };
  for (const auto& [k, p] :
       std::vector<std::pair<int32_t, float>>{{0, 1.0f}, {40, 1.0f}, {0, 0.9f}}) {
    EXPECT_EQ(run(5, k, p), run(5, k, p));
    EXPECT_NE(run(5, k, p), run(6, k, p));
  }
}

// The distribution sampled from equals a brute-force one: sort everything, cut, renormalize.
std::map<int32_t, double> oracle_distribution(std::vector<float> logits, const SamplingParams& p) {
  apply_logit_bias(logits, p);
  std::vector<int32_t> order;
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) {
    if (logits[i] != -kInf) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size()) order.resize(p.top_k);
  std::vector<double> w;
  for (int32_t id : order)
    w.push_back(std::exp((logits[id] - logits[order[0]]) / double(p.temperature)));
  const double z = std::accumulate(w.begin(), w.end(), 0.0);
  size_t keep = order.size();
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < order.size(); ++i) {
      cum += w[i] / z;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  std::map<int32_t, double> out;
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    if (w[i] / z >= p.min_p * (w[0] / z) && w[i] > 0) {
      out[order[i]] = w[i];
      total += w[i];
    }
  }
  for (auto& [id, v] : out) v /= total;
  return out;
}

TEST(Sampler, DistributionEqualsBruteForceOracle) {
  int num_cases = 0;
  for (const int32_t n_vocab : {7, 300, 5000, 12000}) {
    for (const float scale : {0.3f, 2.0f, 6.0f}) {
      for (const auto& base :
           {params_with(1.0f, 0, 0.9f), params_with(0.7f, 0, 0.5f),
            params_with(1.3f, 0, 0.99f, 0.01f), params_with(1.0f, 0, 1.0f, 0.05f),
            params_with(1.0f, 40), params_with(0.8f, 100, 0.8f, 0.02f),
            params_with(1.0f, 200, 1.0f, 0.1f), params_with(1.0f, 0, 0.95f, 0.0f)}) {
        const auto logits =
            random_logits(n_vocab, scale, static_cast<uint64_t>(n_vocab + num_cases));
        SamplingParams p = base;
        p.logit_bias = {{0, -kInf}, {static_cast<int32_t>(n_vocab / 2), 3.0f}};
        Sampler sampler(p, n_vocab);
        const auto got = sampler.distribution(logits, {});
        const auto want = oracle_distribution(logits, p);
        ASSERT_EQ(got.size(), want.size()) << "case " << num_cases << " n_vocab " << n_vocab;
        double sum = 0.0;
        for (const auto& [id, prob] : got) {
          ASSERT_TRUE(want.count(id)) << "case " << num_cases << " id " << id;
          EXPECT_NEAR(prob, want.at(id), 1e-5 * std::max(1.0, want.at(id) * 10)) << id;
          sum += prob;
        }
        EXPECT_NEAR(sum, 1.0, 1e-4);
        // Draws come from that set.
        for (int i = 0; i < 5; ++i) ASSERT_TRUE(want.count(sampler.sample(logits, {}).token));
        ++num_cases;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Bias and penalties
// ---------------------------------------------------------------------------

TEST(Penalties, FollowTheFormulaExactly) {
  SamplingParams p;
  p.repetition_penalty = 1.25f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.penalty_last_n = -1;
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.0f, 4.0f, -1.0f};
  const std::vector<int32_t> history = {0, 1, 1, 3, 0, 0, 99, -4};  // 99, -4: out of range
  apply_penalties(logits, history, p);
  // id 0: count 3, positive -> 2 / 1.25 - (3 * 0.25 + 0.5)
  EXPECT_FLOAT_EQ(logits[0], 2.0f / 1.25f - (3 * 0.25f + 0.5f));
  // id 1: count 2, negative -> -2 * 1.25 - (2 * 0.25 + 0.5)
  EXPECT_FLOAT_EQ(logits[1], -2.0f * 1.25f - (2 * 0.25f + 0.5f));
  EXPECT_FLOAT_EQ(logits[2], 1.0f);  // unseen
  EXPECT_FLOAT_EQ(logits[3], 0.0f * 1.25f - (0.25f + 0.5f));
  EXPECT_FLOAT_EQ(logits[4], 4.0f);
  EXPECT_FLOAT_EQ(logits[5], -1.0f);
}

TEST(Penalties, WindowIsTheLastNIds) {
  SamplingParams p;
  p.frequency_penalty = 1.0f;
  p.penalty_last_n = 3;
  std::vector<float> logits(4, 0.0f);
  apply_penalties(logits, std::vector<int32_t>{2, 2, 2, 0, 1, 1}, p);  // window {0, 1, 1}
  EXPECT_EQ(logits, (std::vector<float>{-1.0f, -2.0f, 0.0f, 0.0f}));
  p.penalty_last_n = 0;
  std::vector<float> untouched(4, 0.5f);
  apply_penalties(untouched, std::vector<int32_t>{0, 1, 2, 3}, p);
  EXPECT_EQ(untouched, std::vector<float>(4, 0.5f));
  p.penalty_last_n = 100;  // longer than the history: all of it
  std::vector<float> all(4, 0.0f);
  apply_penalties(all, std::vector<int32_t>{3, 3}, p);
  EXPECT_EQ(all, (std::vector<float>{0.0f, 0.0f, 0.0f, -2.0f}));
  p.penalty_last_n = 1;  // only the last id
  std::vector<float> last(4, 0.0f);
  apply_penalties(last, std::vector<int32_t>{3, 2}, p);
  EXPECT_EQ(last, (std::vector<float>{0.0f, 0.0f, -1.0f, 0.0f}));
}

TEST(Penalties, SamplerAppliesThemFromHistory) {
  // Token 0 leads by 1.0; a frequency penalty of 0.6 over two occurrences hands it to token 1.
  SamplingParams p = params_with(0.0f);
  p.frequency_penalty = 0.6f;
  Sampler s(p, 3);
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f};
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0}).token, 0);
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0, 0}).token, 1);
}

TEST(LogitBias, AddsAndBans) {
  SamplingParams p;
  p.logit_bias = {{0, 1.5f}, {1, -100.0f}, {2, -kInf}, {3, -99.0f}, {0, 0.5f}};
  std::vector<float> logits = {1.0f, 50.0f, 50.0f, 2.0f};
  apply_logit_bias(logits, p);
  EXPECT_EQ(logits, (std::vector<float>{3.0f, -kInf, -kInf, -97.0f}));
}

TEST(LogitBias, BannedTokensAreNeverSampled) {
  const std::vector<float> logits = {0.0f, 5.0f, 0.1f, 0.2f};
  SamplingParams p = params_with(0.0f);
  p.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(Sampler(p, 4).sample(logits, {}).token, 3);
  p.temperature = 1.0f;
  p.logit_bias = {{1, -100.0f}, {3, -kInf}};
  const double z = 1.0 + std::exp(0.1);
  expect_frequencies(logits, p, {{0, 1.0 / z}, {2, std::exp(0.1) / z}}, 5000);
  // Everything banned: the raw argmax, with logprob -inf.
  p.logit_bias = {{0, -kInf}, {1, -kInf}, {2, -kInf}, {3, -100.0f}};
  p.logprobs = true;
  const auto r = Sampler(p, 4).sample(logits, {});
  EXPECT_EQ(r.token, 1);
  EXPECT_EQ(r.logprob, -kInf);
}

// ---------------------------------------------------------------------------
// Logprobs
// ---------------------------------------------------------------------------

TEST(Logprobs, AreLogSoftmaxOfPenalizedLogitsAndSumToOne) {
  const auto logits = random_logits(20, 3.0f, 11);
  SamplingParams p = params_with(0.6f, 5, 0.9f);  // temperature and truncation don't matter
  p.logprobs = true;
  p.top_logprobs = 20;
  p.repetition_penalty = 1.3f;
  p.logit_bias = {{4, -kInf}};
  const std::vector<int32_t> history = {1, 2, 2};
  Sampler s(p, 20);
  const SampleResult r = s.sample(logits, history);

  std::vector<float> expected_logits = logits;
  apply_logit_bias(expected_logits, p);
  apply_penalties(expected_logits, history, p);
  double m = -kInf, z = 0.0;
  for (float l : expected_logits) m = std::max(m, double(l));
  for (float l : expected_logits) z += std::exp(l - m);
  const double lse = m + std::log(z);
  EXPECT_NEAR(r.logprob, expected_logits[r.token] - lse, 1e-5);

  ASSERT_EQ(r.top.size(), 19u);  // token 4 is banned and not listed
  double sum = 0.0;
  for (size_t i = 0; i < r.top.size(); ++i) {
    const auto [id, lp] = r.top[i];
    EXPECT_NE(id, 4);
    EXPECT_NEAR(lp, expected_logits[id] - lse, 1e-5);
    if (i > 0) {
      EXPECT_GE(r.top[i - 1].second, lp);
    }
    sum += std::exp(double(lp));
  }
  EXPECT_NEAR(std::log(sum), 0.0, 1e-5);  // logsumexp of every logprob
  // The chosen token is listed with the same logprob.
  const auto it =
      std::find_if(r.top.begin(), r.top.end(), [&](auto& e) { return e.first == r.token; });
  ASSERT_NE(it, r.top.end());
  EXPECT_FLOAT_EQ(it->second, r.logprob);
}

TEST(Logprobs, TopNSortedWithTiesByIdAndIndependentOfTemperature) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 2.0f};
  SamplingParams p = params_with(0.0f);
  p.logprobs = true;
  p.top_logprobs = 4;
  const SampleResult cold = Sampler(p, 6).sample(logits, {});
  EXPECT_EQ(cold.token, 1);
  ASSERT_EQ(cold.top.size(), 4u);
  EXPECT_EQ(cold.top[0].first, 1);
  EXPECT_EQ(cold.top[1].first, 3);
  EXPECT_EQ(cold.top[2].first, 2);
  EXPECT_EQ(cold.top[3].first, 5);
  EXPECT_EQ(cold.top[0].second, cold.top[1].second);
  EXPECT_FLOAT_EQ(cold.logprob, cold.top[0].second);
  p.temperature = 1.7f;
  const SampleResult warm = Sampler(p, 6).sample(logits, {});
  EXPECT_EQ(warm.top, cold.top);
  // Not requested: not computed.
  const SampleResult none = Sampler(params_with(0.0f), 6).sample(logits, {});
  EXPECT_EQ(none.logprob, 0.0f);
  EXPECT_TRUE(none.top.empty());
}

// ---------------------------------------------------------------------------
// Allowed-id mask
// ---------------------------------------------------------------------------

// The reference of sample(logits, history, allowed): the masked copy the constraint gate used to
// write (grammar::mask_logits before the sampler took the mask), sampled without a mask.
std::vector<float> masked_copy(const std::vector<float>& logits,
                               const std::vector<uint64_t>& allowed) {
  std::vector<float> out(logits.size(), -kInf);
  for (size_t id = 0; id < logits.size() && id / 64 < allowed.size(); ++id) {
    if ((allowed[id / 64] >> (id % 64)) & 1) out[id] = logits[id];
  }
  return out;
}

bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

// Every sampling parameter the sampler has (greedy, temperature, top-k, top-p, min-p,
// penalties, logit_bias with bans, logprobs and top_logprobs), masks from empty to full (words
// with no bit, few bits, most bits, all bits; the tail of the vocabulary past the mask), logits
// with NaN and infinities, several seeds and draws in a row (the Rng must stay in step): the
// masked sample gives the reference's token, logprob and top logprobs, bit for bit.
TEST(AllowedMask, SampleEqualsSampleOfTheMaskedCopy) {
  const std::vector<double> densities = {0.0, 1e-9, 0.01, 0.3, 0.5, 0.7, 0.97, 1.0};
  int num_checked = 0, num_in_mask = 0;
  for (const int32_t n_vocab : {1000, 3001}) {
    // 1000 ids with a mask of 15 words: ids 960.. are padding past the mask.
    const size_t words = n_vocab == 1000 ? 15 : (static_cast<size_t>(n_vocab) + 63) / 64;
    for (size_t d = 0; d < densities.size(); ++d) {
      Rng mask_rng(1000 * static_cast<uint64_t>(n_vocab) + d);
      std::vector<uint64_t> allowed(words, 0);
      for (size_t id = 0; id < words * 64; ++id) {
        if (mask_rng.uniform() < densities[d]) allowed[id / 64] |= uint64_t{1} << (id % 64);
      }
      if (d == 1) allowed[3] = uint64_t{1} << 17;  // a single allowed id
      for (const float temperature : {0.0f, 0.6f, 1.0f, 1.7f}) {
        for (const int32_t top_k : {0, 1, 3, 40}) {
          for (const float top_p : {1.0f, 0.9f, 0.3f}) {
            for (const float min_p : {0.0f, 0.1f}) {
              for (const int penalties : {0, 1}) {
                for (const int bias : {0, 1}) {
                  for (const int logprobs : {0, 1, 2}) {
                    SamplingParams p = params_with(temperature, top_k, top_p, min_p,
                                                   static_cast<uint64_t>(num_checked) * 7919);
                    if (penalties) {
                      p.repetition_penalty = 1.3f;
                      p.presence_penalty = 0.5f;
                      p.frequency_penalty = 0.4f;
                      p.penalty_last_n = 16;
                    }
                    if (bias) p.logit_bias = {{17 + 192, 5.0f}, {5, -100.0f}, {64, -kInf}};
                    p.logprobs = logprobs > 0;
                    p.top_logprobs = logprobs == 2 ? 5 : 0;
                    Sampler masked(p, n_vocab), reference(p, n_vocab);
                    std::vector<int32_t> history = {5, 17 + 192, 64, 3, 3};
                    for (int draw = 0; draw < 3; ++draw) {
                      const uint64_t row_seed = static_cast<uint64_t>(num_checked) * 3 + draw;
                      std::vector<float> logits = random_logits(n_vocab, 3.0f, row_seed);
                      if (draw == 1) {  // non-finite logits (209: the single id's, NaN)
                        logits[192 + 17] = std::numeric_limits<float>::quiet_NaN();
                        logits[100] = kInf;
                        logits[101] = -kInf;
                      }
                      const SampleResult a = masked.sample(logits, history, allowed);
                      const SampleResult b =
                          reference.sample(masked_copy(logits, allowed), history);
                      ASSERT_EQ(a.token, b.token) << "density " << densities[d] << " case "
                                                  << num_checked << " draw " << draw;
                      ASSERT_TRUE(same_bits(a.logprob, b.logprob)) << a.logprob << " " << b.logprob;
                      ASSERT_EQ(a.top.size(), b.top.size());
                      for (size_t i = 0; i < a.top.size(); ++i) {
                        ASSERT_EQ(a.top[i].first, b.top[i].first);
                        ASSERT_TRUE(same_bits(a.top[i].second, b.top[i].second));
                      }
                      const bool in_mask = a.token / 64 < static_cast<int32_t>(words) &&
                                           ((allowed[a.token / 64] >> (a.token % 64)) & 1);
                      num_in_mask += in_mask ? 1 : 0;
                      history.push_back(a.token);
                    }
                    ASSERT_EQ(masked.rng().state(), reference.rng().state());
                    ++num_checked;
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(num_checked, 2 * 8 * 4 * 4 * 3 * 2 * 2 * 2 * 3);
  // Draws from an allowed id were the rule (the rest: empty masks and all-banned fallbacks).
  EXPECT_GT(num_in_mask, num_checked * 3 * 5 / 8);
}

}  // namespace
}  // namespace kiln::engine
