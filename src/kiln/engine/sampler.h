// Token sampling: logits of one sequence -> one token id, with the OpenAI/vLLM/llama.cpp
// parameters (temperature, top_k, top_p, min_p, repetition/presence/frequency penalties,
// logit_bias, seed, logprobs/top_logprobs).
//
// The pipeline of Sampler::sample, in this order:
//   0. with an allowed-id mask (a grammar's): every other id's logit is -inf.
//   1. logit_bias: logits[id] += bias (a bias <= -100 bans the token: -inf).
//   2. penalties over the last penalty_last_n ids of `history` (apply_penalties).
//   3. temperature == 0 or top_k == 1: greedy argmax (lowest id on ties). Otherwise:
//   4. top-k: keep the k largest logits (ties by lower id).
//   5. softmax of logits / temperature over what is left.
//   6. top-p: keep the smallest prefix (descending probability, ties by lower id) whose
//      cumulative probability is >= top_p; at least one token.
//   7. min-p: keep tokens with p >= min_p * p_max.
//   8. renormalize and draw with the seeded Rng (one 64-bit output per non-greedy draw).
//
// Logprobs: reported from log_softmax of the logits after steps 0-2 (mask, bias, penalties) and
// before temperature and truncation (steps 3-7). This is what OpenAI reports (logprobs do not
// move with temperature or top_p) and it keeps the logprob of every token finite unless it was
// banned. The chosen token's logprob is therefore not the log of the probability it was drawn
// with; `distribution()` gives that one when needed (e.g. speculative decoding).
//
// Determinism: the Rng is xoshiro256** seeded through splitmix64, fully specified here; the
// softmax weights come from exp_nonpositive (plain IEEE float arithmetic, no libm); sums run
// in a fixed order (kLanes partial sums per block, blocks in id order) and the draw walks the
// candidates in a fixed order (ascending id, or best-first after top-k). So the same seed and
// the same logits give the same tokens on every platform, as long as the compiler does not
// contract a*b+c into an FMA (GCC with -std=c++20 does not; clang needs -ffp-contract=off).
// Only the reported logprobs use libm (std::log).
//
// Cost per token (bench/sampler_bench.cpp): a few vectorized passes over the vocabulary (copy,
// max, exp); top-k by a k-heap; top-p by a threshold pre-filter and a mass-weighted
// quickselect (expected linear, no sort of the vocabulary).
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kiln/util/status.h"

namespace kiln::engine {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // (0, 1]; 1 = off
  float min_p = 0.0f;        // [0, 1]; 0 = off
  // > 0; 1 = off (HF/llama.cpp: divide positive logits, multiply negative ones)
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;   // [-2, 2] (OpenAI)
  float frequency_penalty = 0.0f;  // [-2, 2] (OpenAI)
  int32_t penalty_last_n = 64;     // ids of history the penalties look at; -1 = all, 0 = off
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias in [-100, 100] or -inf)
  uint64_t seed = 0;         // the server draws a random one when the request has none
  int32_t top_logprobs = 0;  // 0..20 alternatives reported per token
  bool logprobs = false;     // report the chosen token's logprob
};

// Checks every field against its range; the message names the field and the value, fit for a
// 400 response. n_vocab is the model's vocabulary size (logit_bias ids must be below it).
Status validate(const SamplingParams& params, int32_t n_vocab);

// Is this sampler deterministic argmax (temperature 0 or top_k 1)?
bool is_greedy(const SamplingParams& params);
// Greedy with nothing that moves the argmax or reads the distribution (no logit_bias, no
// penalty, no logprobs): its token is the first largest raw logit, which the backend can
// find where the logits are (Executor::run with argmax), so the logits need not come back.
bool is_plain_greedy(const SamplingParams& params);

// logits[id] += bias for each logit_bias entry; a bias <= -100 sets the logit to -inf (a ban,
// as OpenAI documents -100). Ids out of range are ignored (validate() rejects them).
void apply_logit_bias(std::span<float> logits, const SamplingParams& params);

// Penalties over the window = the last penalty_last_n ids of history (all of it for -1, none
// for 0); ids outside [0, logits.size()) are ignored. For each distinct id t in the window
// with count c (llama.cpp `llama_sampler_penalties`, OpenAI's formula for presence/frequency):
//   logit[t] = logit[t] > 0 ? logit[t] / repetition_penalty : logit[t] * repetition_penalty
//   logit[t] -= c * frequency_penalty + presence_penalty
// history is the prompt followed by the generated ids (llama.cpp and vLLM's repetition penalty
// look at both; kiln applies presence/frequency over the same window).
void apply_penalties(std::span<float> logits, std::span<const int32_t> history,
                     const SamplingParams& params);

// Seed -> seed of choice `index` of a request with n choices. Choice 0 keeps the seed, so
// n = 1 and n > 1 agree on the first choice; the others are well separated streams.
uint64_t choice_seed(uint64_t seed, int32_t index);

// xoshiro256** 1.0 (Blackman and Vigna, https://prng.di.unimi.it/xoshiro256starstar.c),
// state filled from the seed by splitmix64 (https://prng.di.unimi.it/splitmix64.c).
class Rng {
 public:
  explicit Rng(uint64_t seed);
  static Rng from_state(const std::array<uint64_t, 4>& state);

  uint64_t next();
  // Uniform in [0, 1) with 53 random bits: (next() >> 11) * 2^-53.
  double uniform();
  const std::array<uint64_t, 4>& state() const { return s_; }

 private:
  Rng() = default;
  std::array<uint64_t, 4> s_{};
};

// exp(x) for x <= 0 (softmax weights are exp((logit - max) / T)): Cephes expf's range
// reduction and polynomial (relative error < 2e-7), 0 below -87 and for -inf. Plain float
// arithmetic, so it vectorizes and gives the same bits wherever floats are IEEE and the
// compiler does not contract a*b+c into an FMA (the default for -std=c++20 in GCC).
// c ? a : b without a branch (bit masks), so loops that use it vectorize at -O2.
inline float select_float(bool c, float a, float b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & mask) |
                              (std::bit_cast<uint32_t>(b) & ~mask));
}

inline float exp_nonpositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 = kLn2Hi + kLn2Lo (Cody-Waite)
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  constexpr float kLowest = -87.0f;      // exp(-87) ~ 1.6e-38, still a normal float
  const bool underflow = x < kLowest;    // also -inf
  const float xc = select_float(underflow, kLowest, x);
  const float t = xc * kLog2e + kRound;
  const float k = t - kRound;  // round(x / ln 2)
  const float r = (xc - k * kLn2Hi) - k * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t ki = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);
  const float scale = std::bit_cast<float>((ki + 127) << 23);  // 2^k, k >= -126
  return select_float(underflow, 0.0f, p * scale);
}

// splitmix64: returns the next output and advances *state.
uint64_t splitmix64(uint64_t* state);

struct SampleResult {
  int32_t token = -1;
  // log_softmax of the biased and penalized logits at `token` (see the top of this file);
  // 0 unless params.logprobs or top_logprobs > 0.
  float logprob = 0.0f;
  // The top_logprobs most likely tokens by that same log_softmax: (id, logprob), sorted by
  // logprob descending, ties by lower id. Banned (-inf) tokens are never listed.
  std::vector<std::pair<int32_t, float>> top;
};

// One sequence's sampler: owns its Rng (so a sequence's tokens depend only on its seed and its
// logits, never on the batch it ran in) and scratch buffers of n_vocab floats, allocated on
// first use and reused for every token.
class Sampler {
 public:
  // params must pass validate(params, n_vocab) (asserted); use create() on untrusted input.
  Sampler(SamplingParams params, int32_t n_vocab);
  static Expected<Sampler> create(SamplingParams params, int32_t n_vocab);

  // logits: [n_vocab] of this sequence's last position. history: prompt + generated ids so far
  // (for the penalties). NaN logits count as -inf, +inf as the largest float. When every token
  // is banned, falls back to the argmax of the raw logits (logprob -inf).
  //
  // allowed: the ids that may be drawn, a bit mask (bit id % 64 of word id / 64; ids past its
  // last word are not allowed), as a grammar's mask (grammar::Matcher::fill_mask); empty: every
  // id. The result, the Rng's draws and the logprobs are those of sample() over a copy of the
  // logits with every other id set to -inf, without writing that copy (step 0 of the pipeline,
  // fused into the pass that copies the logits).
  SampleResult sample(std::span<const float> logits, std::span<const int32_t> history,
                      std::span<const uint64_t> allowed = {});

  // The distribution step 8 draws from: (id, probability) in draw order, summing to 1. For a
  // greedy sampler it is the single argmax with probability 1. Does not touch the Rng.
  std::vector<std::pair<int32_t, float>> distribution(std::span<const float> logits,
                                                      std::span<const int32_t> history);

  const SamplingParams& params() const { return params_; }
  Rng& rng() { return rng_; }

 private:
  struct Cand {
    float weight;  // exp((logit - max) / temperature), unnormalized
    int32_t id;
  };
  // Steps 0-2 (0: ids outside `allowed` -> -inf) into logits_; returns the max logit (-inf
  // when every token is banned).
  float prepare(std::span<const float> logits, std::span<const int32_t> history,
                std::span<const uint64_t> allowed);
  // Steps 4-7 into cands_ (draw order) and returns the sum of their weights; sets all_vocab_
  // instead when nothing is truncated (every token of probs_ in ascending id).
  double truncate(float max_logit);
  double truncate_top_k(float max_logit);
  double truncate_top_p(double z);
  int32_t draw(double total);
  // cands_ = every id of probs_ with weight >= threshold (> 0), ascending id.
  void collect_at_least(double threshold);
  void fill_logprobs(int32_t token, float max_logit, SampleResult* result);

  SamplingParams params_;
  int32_t n_vocab_;
  Rng rng_;
  std::vector<float> logits_;       // [n_vocab] after bias and penalties
  std::vector<float> probs_;        // [n_vocab] unnormalized softmax weights (no top-k path)
  std::vector<Cand> cands_;         // surviving candidates, in draw order
  std::vector<Cand> select_;        // scratch for the top-p selection
  std::vector<double> block_sums_;  // sums of probs_ per block of kBlock ids (fast draw, skips)
  bool all_vocab_ = false;          // no truncation: draw over probs_ in id order, not cands_
};

}  // namespace kiln::engine
