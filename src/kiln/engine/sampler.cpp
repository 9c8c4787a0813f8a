#include "kiln/engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace kiln::engine {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int32_t kMaxTopLogprobs = 20;  // OpenAI's limit
// OpenAI documents -100 as a ban; kiln makes it an exact one.
constexpr float kBanBias = -100.0f;

// The candidate order of every truncation: larger value first, ties by lower id. It is a
// strict total order, so the selected sets and sorted lists are unique (no dependence on the
// standard library's sort or heap algorithms).
bool before(float va, int32_t ia, float vb, int32_t ib) {
  return va > vb || (va == vb && ia < ib);
}

bool finite_in(float v, float lo, float hi) {
  return std::isfinite(v) && v >= lo && v <= hi;
}

// The vocabulary-wide loops run in chunks of kLanes independent lanes so that GCC's -O2
// (very-cheap cost model) vectorizes them; lanes are combined in a fixed order, so results do
// not depend on the vector width. Weights are summed per block of kBlock ids in double.
// On x86-64 they are also compiled for AVX2 and picked at load time (same IEEE operations per
// lane, so the same bits as the SSE2 build; no FMA is enabled).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KILN_VOCAB_LOOP __attribute__((target_clones("avx2", "default")))
#else
#define KILN_VOCAB_LOOP
#endif
constexpr size_t kLanes = 16;
constexpr size_t kBlock = 256;

// dst = src with NaN -> -inf and +inf -> the largest float.
KILN_VOCAB_LOOP void copy_sanitized(const float* __restrict src, float* __restrict dst, size_t n) {
  constexpr float kMax = std::numeric_limits<float>::max();
  const auto clean = [](float x) {
    return select_float(x != x, kNegInf, select_float(x > kMax, kMax, x));
  };
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) dst[i + j] = clean(src[i + j]);
  }
  for (; i < n; ++i) dst[i] = clean(src[i]);
}

// Ids per word of an allowed-id mask (Sampler::sample: bit id % 64 of word id / 64).
constexpr size_t kMaskBits = 64;

// dst = src sanitized (copy_sanitized) at the ids `allowed` has, -inf at the others and at
// every id past the mask: the bits copy_sanitized would write for a copy of src with the
// disallowed ids set to -inf (NaN and +inf only ever come from src). A mask word with no bit
// is a fill, one with most bits a vectorized copy patched at its clear bits, any other one is
// written at its set bits.
void copy_sanitized_allowed(const float* __restrict src, float* __restrict dst, size_t n,
                            std::span<const uint64_t> allowed) {
  constexpr float kMax = std::numeric_limits<float>::max();
  const auto clean = [](float x) {
    return select_float(x != x, kNegInf, select_float(x > kMax, kMax, x));
  };
  size_t begin = 0;
  for (size_t w = 0; w < allowed.size() && begin < n; ++w, begin += kMaskBits) {
    const size_t len = std::min(kMaskBits, n - begin);
    uint64_t bits = allowed[w];
    if (len < kMaskBits) bits &= (uint64_t{1} << len) - 1;
    if (std::popcount(bits) > static_cast<int>(kMaskBits / 2)) {
      copy_sanitized(src + begin, dst + begin, len);
      for (uint64_t off = ~bits; off; off &= off - 1) {
        const size_t j = static_cast<size_t>(std::countr_zero(off));
        if (j >= len) break;
        dst[begin + j] = kNegInf;
      }
    } else {
      std::fill(dst + begin, dst + begin + len, kNegInf);
      for (; bits; bits &= bits - 1) {
        const size_t i = begin + static_cast<size_t>(std::countr_zero(bits));
        dst[i] = clean(src[i]);
      }
    }
  }
  if (begin < n) std::fill(dst + begin, dst + n, kNegInf);
}

KILN_VOCAB_LOOP float max_value(const float* v, size_t n) {
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, kNegInf);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lanes[j] = lanes[j] < v[i + j] ? v[i + j] : lanes[j];
  }
  for (; i < n; ++i) lanes[0] = lanes[0] < v[i] ? v[i] : lanes[0];
  float m = kNegInf;
  for (const float l : lanes) m = m < l ? l : m;
  return m;
}

// Sum of v[0, n) in double: kLanes partial sums, then in lane order.
double sum_lanes(const float* v, size_t n) {
  double lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lanes[j] += static_cast<double>(v[i + j]);
  }
  for (; i < n; ++i) lanes[0] += static_cast<double>(v[i]);
  double s = 0.0;
  for (const double l : lanes) s += l;
  return s;
}

// out[i] = exp((logits[i] - max) / temperature); block_sums[b] = sum of block b; returns the
// sum of the block sums (in block order).
KILN_VOCAB_LOOP double exp_weights(const float* __restrict logits, float* __restrict out, size_t n,
                                   float max_logit, float temperature,
                                   std::vector<double>* block_sums) {
  block_sums->resize((n + kBlock - 1) / kBlock);
  double total = 0.0;
  for (size_t b = 0; b * kBlock < n; ++b) {
    const size_t begin = b * kBlock, len = std::min(kBlock, n - begin);
    const float* __restrict src = logits + begin;
    float* __restrict dst = out + begin;
    if (len == kBlock) {  // a fixed trip count: vectorized
      for (size_t i = 0; i < kBlock; ++i)
        dst[i] = exp_nonpositive((src[i] - max_logit) / temperature);
    } else {
      for (size_t i = 0; i < len; ++i) dst[i] = exp_nonpositive((src[i] - max_logit) / temperature);
    }
    (*block_sums)[b] = sum_lanes(out + begin, len);
    total += (*block_sums)[b];
  }
  return total;
}

// Is any of v[0, kLanes) >= threshold? Branch-free, so a scan can skip 16 ids at a time.
inline bool any_at_least(const float* v, float threshold) {
  int any = 0;
  for (size_t j = 0; j < kLanes; ++j) any |= static_cast<int>(v[j] >= threshold);
  return any != 0;
}

// The k best (value, id) of v by `before`, sorted best first; -inf values are never selected.
// A heap with the worst on top: most ids fail the first compare.
template <typename CandT>
void select_top(std::span<const float> v, size_t k, std::vector<CandT>* out) {
  const auto cmp = [](const CandT& a, const CandT& b) {
    return before(a.weight, a.id, b.weight, b.id);
  };
  out->clear();
  if (k == 0) return;
  float worst = kNegInf;  // the heap top's value once full
  const auto consider = [&](size_t i) {
    const float x = v[i];
    if (x < worst || x == kNegInf) return;
    const CandT c{x, static_cast<int32_t>(i)};
    if (out->size() < k) {
      out->push_back(c);
      std::push_heap(out->begin(), out->end(), cmp);
    } else if (cmp(c, out->front())) {
      std::pop_heap(out->begin(), out->end(), cmp);
      out->back() = c;
      std::push_heap(out->begin(), out->end(), cmp);
    }
    if (out->size() == k) worst = out->front().weight;
  };
  size_t i = 0;
  for (; i + kLanes <= v.size(); i += kLanes) {
    if (!any_at_least(v.data() + i, worst)) continue;  // the common case once the heap is full
    for (size_t j = 0; j < kLanes; ++j) consider(i + j);
  }
  for (; i < v.size(); ++i) consider(i);
  std::sort(out->begin(), out->end(), cmp);
}

}  // namespace

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

Status validate(const SamplingParams& p, int32_t n_vocab) {
  if (n_vocab <= 0) return err("sampling: n_vocab must be positive, got {}", n_vocab);
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f) {
    return err("temperature must be a finite number >= 0, got {}", p.temperature);
  }
  if (p.top_k < 0) return err("top_k must be >= 0 (0 disables it), got {}", p.top_k);
  if (!std::isfinite(p.top_p) || p.top_p <= 0.0f || p.top_p > 1.0f) {
    return err("top_p must be in (0, 1], got {}", p.top_p);
  }
  if (!finite_in(p.min_p, 0.0f, 1.0f)) return err("min_p must be in [0, 1], got {}", p.min_p);
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0.0f) {
    return err("repetition_penalty must be a finite number > 0, got {}", p.repetition_penalty);
  }
  if (!finite_in(p.presence_penalty, -2.0f, 2.0f)) {
    return err("presence_penalty must be in [-2, 2], got {}", p.presence_penalty);
  }
  if (!finite_in(p.frequency_penalty, -2.0f, 2.0f)) {
    return err("frequency_penalty must be in [-2, 2], got {}", p.frequency_penalty);
  }
  if (p.penalty_last_n < -1) {
    return err("penalty_last_n must be >= -1 (-1 = whole context, 0 = off), got {}",
               p.penalty_last_n);
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= n_vocab) {
      return err("logit_bias: token id {} is out of range (vocabulary has {} tokens)", id, n_vocab);
    }
    const bool ban = std::isinf(bias) && bias < 0.0f;
    if (!ban && !finite_in(bias, -100.0f, 100.0f)) {
      return err("logit_bias: bias of token {} must be in [-100, 100], got {}", id, bias);
    }
  }
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs) {
    return err("top_logprobs must be in [0, {}], got {}", kMaxTopLogprobs, p.top_logprobs);
  }
  if (p.top_logprobs > 0 && !p.logprobs) {
    return err("top_logprobs requires logprobs to be true");
  }
  return {};
}

bool is_greedy(const SamplingParams& p) {
  return p.temperature == 0.0f || p.top_k == 1;
}

bool is_plain_greedy(const SamplingParams& p) {
  const bool penalties =
      p.penalty_last_n != 0 &&
      (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f);
  return is_greedy(p) && p.logit_bias.empty() && !penalties && !p.logprobs && p.top_logprobs == 0;
}

// ---------------------------------------------------------------------------
// Bias and penalties
// ---------------------------------------------------------------------------

void apply_logit_bias(std::span<float> logits, const SamplingParams& p) {
  const auto n = static_cast<int64_t>(logits.size());
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= n) continue;
    if (bias <= kBanBias) {
      logits[id] = kNegInf;
    } else {
      logits[id] += bias;
    }
  }
}

void apply_penalties(std::span<float> logits, std::span<const int32_t> history,
                     const SamplingParams& p) {
  if (p.penalty_last_n == 0) return;
  if (p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) {
    return;
  }
  size_t window = history.size();
  if (p.penalty_last_n > 0) window = std::min(window, static_cast<size_t>(p.penalty_last_n));
  std::vector<int32_t> ids(history.end() - static_cast<std::ptrdiff_t>(window), history.end());
  std::sort(ids.begin(), ids.end());
  const auto n = static_cast<int64_t>(logits.size());
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    const int32_t id = ids[i];
    const auto count = static_cast<float>(j - i);
    i = j;
    if (id < 0 || id >= n) continue;
    float& l = logits[id];
    l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= count * p.frequency_penalty + p.presence_penalty;
  }
}

// ---------------------------------------------------------------------------
// Rng
// ---------------------------------------------------------------------------

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

Rng::Rng(uint64_t seed) {
  uint64_t sm = seed;
  for (auto& s : s_) s = splitmix64(&sm);
}

Rng Rng::from_state(const std::array<uint64_t, 4>& state) {
  Rng r;
  r.s_ = state;
  return r;
}

uint64_t Rng::next() {
  const auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

uint64_t choice_seed(uint64_t seed, int32_t index) {
  if (index == 0) return seed;
  uint64_t s = seed ^ (0xd1b54a32d192ed03ULL * static_cast<uint64_t>(index));
  return splitmix64(&s);
}

// ---------------------------------------------------------------------------
// Sampler
// ---------------------------------------------------------------------------

Sampler::Sampler(SamplingParams params, int32_t n_vocab)
    : params_(std::move(params)), n_vocab_(n_vocab), rng_(params_.seed) {
  KILN_ASSERT(validate(params_, n_vocab_).ok());
}

Expected<Sampler> Sampler::create(SamplingParams params, int32_t n_vocab) {
  KILN_TRY_STATUS(validate(params, n_vocab));
  return Sampler(std::move(params), n_vocab);
}

float Sampler::prepare(std::span<const float> logits, std::span<const int32_t> history,
                       std::span<const uint64_t> allowed) {
  KILN_ASSERT(logits.size() == static_cast<size_t>(n_vocab_));
  logits_.resize(logits.size());
  if (allowed.empty()) {
    copy_sanitized(logits.data(), logits_.data(), logits.size());
  } else {
    copy_sanitized_allowed(logits.data(), logits_.data(), logits.size(), allowed);
  }
  apply_logit_bias(logits_, params_);
  apply_penalties(logits_, history, params_);
  return max_value(logits_.data(), logits_.size());
}

// Index of the largest value among the allowed ids (all of them for an empty mask), lowest
// index on ties; -1 when all are -inf or NaN. A disallowed id counts as -inf, which never wins.
static int32_t argmax(std::span<const float> v, std::span<const uint64_t> allowed) {
  int32_t best = -1;
  float best_v = kNegInf;
  for (size_t i = 0; i < v.size(); ++i) {
    const bool in = allowed.empty() || (i / kMaskBits < allowed.size() &&
                                        ((allowed[i / kMaskBits] >> (i % kMaskBits)) & 1));
    if (in && v[i] > best_v) {
      best_v = v[i];
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

// Lowest index holding `value` (present by construction): the greedy token given the max.
static int32_t first_index_of(std::span<const float> v, float value) {
  const auto it = std::find(v.begin(), v.end(), value);
  KILN_ASSERT(it != v.end());
  return static_cast<int32_t>(it - v.begin());
}

double Sampler::truncate_top_k(float max_logit) {
  select_top(std::span<const float>(logits_), static_cast<size_t>(params_.top_k), &cands_);
  // Softmax weights; cands_[0] holds max_logit, so its weight is exactly 1.
  double z = 0.0;
  for (auto& c : cands_) {
    c.weight = std::exp((c.weight - max_logit) / params_.temperature);
    z += c.weight;
  }
  // top-p then min-p: both keep a prefix of this descending list.
  const double target = static_cast<double>(params_.top_p) * z;
  double cum = 0.0;
  size_t keep = 0;
  while (keep < cands_.size()) {
    const Cand& c = cands_[keep];
    if (keep > 0 && c.weight < params_.min_p) break;
    cum += c.weight;
    ++keep;
    if (params_.top_p < 1.0f && cum >= target) break;
  }
  cands_.resize(keep);
  return cum;
}

double Sampler::truncate_top_p(double z) {
  // Pre-filter: a token with weight < (1 - top_p) * z / n_vocab cannot be in the nucleus, since
  // all such tokens together hold less than 1 - top_p of the mass. min-p keeps weight >= min_p
  // (the max weight is 1). Both sets are prefixes of the sorted order, so the answer is the
  // nucleus of what passes, and the pass keeps ascending id order for the draw.
  const double threshold = std::min(
      1.0, std::max((1.0 - params_.top_p) * z / n_vocab_, static_cast<double>(params_.min_p)));
  collect_at_least(threshold);
  // Find the boundary: the last candidate, in descending order, of the smallest prefix whose
  // mass reaches target. A quickselect weighted by mass: expected O(n), no full sort.
  select_.assign(cands_.begin(), cands_.end());
  const auto cmp = [](const Cand& a, const Cand& b) {
    return before(a.weight, a.id, b.weight, b.id);
  };
  double need = static_cast<double>(params_.top_p) * z;
  size_t lo = 0, hi = select_.size();
  const Cand* boundary = nullptr;
  while (hi - lo > 16 && boundary == nullptr) {
    // Median of three as the pivot, moved to hi - 1.
    const size_t mid = lo + (hi - lo) / 2;
    size_t a = lo, b = mid, c = hi - 1;
    if (cmp(select_[b], select_[a])) std::swap(a, b);
    if (cmp(select_[c], select_[b])) std::swap(b, c);
    if (cmp(select_[b], select_[a])) std::swap(a, b);
    std::swap(select_[b], select_[hi - 1]);
    const Cand pivot = select_[hi - 1];
    size_t store = lo;
    double upper = 0.0;  // mass strictly before the pivot
    // Branch-free Lomuto: [lo, store) is before the pivot, [store, i) is not. The outcome
    // of the compare is a coin flip on flat distributions, so a branch would mispredict.
    for (size_t i = lo; i + 1 < hi; ++i) {
      const Cand x = select_[i];
      const bool is_before =
          (x.weight > pivot.weight) | ((x.weight == pivot.weight) & (x.id < pivot.id));
      upper += static_cast<double>(x.weight) * static_cast<double>(is_before);  // + 0 is exact
      select_[i] = select_[store];
      select_[store] = x;
      store += static_cast<size_t>(is_before);
    }
    std::swap(select_[store], select_[hi - 1]);
    if (upper >= need) {
      hi = store;
    } else if (upper + pivot.weight >= need) {
      boundary = &select_[store];
    } else {
      need -= upper + pivot.weight;
      lo = store + 1;
    }
  }
  if (boundary == nullptr && lo < hi) {
    std::sort(select_.begin() + static_cast<std::ptrdiff_t>(lo),
              select_.begin() + static_cast<std::ptrdiff_t>(hi), cmp);
    double cum = 0.0;
    for (size_t i = lo; i < hi && boundary == nullptr; ++i) {
      cum += select_[i].weight;
      if (cum >= need || i + 1 == hi) boundary = &select_[i];
    }
  }
  // lo == hi: everything before lo is in, and select_[lo - 1] (the last pivot) is the worst of
  // it (lo > 0 here: need > 0 keeps hi above lo).
  KILN_ASSERT(!select_.empty());  // the argmax (weight 1) always passes the threshold
  if (boundary == nullptr) boundary = &select_[lo - 1];
  double total = 0.0;
  const Cand last = *boundary;
  size_t keep = 0;
  for (const auto& c : cands_) {
    if (c.id == last.id || cmp(c, last)) {
      cands_[keep++] = c;
      total += c.weight;
    }
  }
  cands_.resize(keep);
  return total;
}

void Sampler::collect_at_least(double threshold) {
  // A block whose sum is below the threshold holds no candidate (weights are >= 0).
  cands_.clear();
  for (size_t b = 0; b < block_sums_.size(); ++b) {
    if (block_sums_[b] < threshold) continue;
    const size_t end = std::min(probs_.size(), (b + 1) * kBlock);
    // (float)threshold is at most the smallest float >= threshold: no candidate is skipped.
    const auto thr = static_cast<float>(threshold);
    for (size_t i = b * kBlock; i < end;) {
      if (i + kLanes <= end && !any_at_least(probs_.data() + i, thr)) {
        i += kLanes;
        continue;
      }
      const size_t chunk_end = std::min(end, i + kLanes);
      for (; i < chunk_end; ++i) {
        const float w = probs_[i];
        if (w > 0.0f && w >= threshold) cands_.push_back({w, static_cast<int32_t>(i)});
      }
    }
  }
}

double Sampler::truncate(float max_logit) {
  all_vocab_ = false;
  if (params_.top_k > 0 && params_.top_k < n_vocab_) return truncate_top_k(max_logit);
  probs_.resize(logits_.size());
  const double z = exp_weights(logits_.data(), probs_.data(), probs_.size(), max_logit,
                               params_.temperature, &block_sums_);
  if (params_.top_p < 1.0f) return truncate_top_p(z);
  if (params_.min_p > 0.0f) {
    collect_at_least(params_.min_p);
    double total = 0.0;
    for (const auto& c : cands_) total += c.weight;
    return total;
  }
  all_vocab_ = true;
  return z;
}

int32_t Sampler::draw(double total) {
  const double u = rng_.uniform() * total;
  double cum = 0.0;
  int32_t last = -1;
  const auto step = [&](float w, int32_t id) {
    if (w <= 0.0f) return false;
    cum += w;
    last = id;
    return u < cum;
  };
  if (all_vocab_) {
    // Find the block by its sum, then the id inside it.
    size_t b = 0;
    for (; b + 1 < block_sums_.size() && u >= cum + block_sums_[b]; ++b) cum += block_sums_[b];
    const size_t end = std::min(probs_.size(), (b + 1) * kBlock);
    for (size_t i = b * kBlock; i < end; ++i) {
      if (step(probs_[i], static_cast<int32_t>(i))) return static_cast<int32_t>(i);
    }
  } else {
    for (const auto& c : cands_) {
      if (step(c.weight, c.id)) return c.id;
    }
  }
  return last;  // u landed past the rounded sum: the last candidate
}

void Sampler::fill_logprobs(int32_t token, float max_logit, SampleResult* result) {
  // log-sum-exp at temperature 1; probs_ is free again once the token is drawn.
  probs_.resize(logits_.size());
  const double z =
      exp_weights(logits_.data(), probs_.data(), probs_.size(), max_logit, 1.0f, &block_sums_);
  const double lse = static_cast<double>(max_logit) + std::log(z);
  result->logprob = static_cast<float>(static_cast<double>(logits_[token]) - lse);
  std::vector<Cand> best;
  select_top(std::span<const float>(logits_), static_cast<size_t>(params_.top_logprobs), &best);
  result->top.clear();
  for (const auto& c : best) {
    result->top.emplace_back(c.id, static_cast<float>(static_cast<double>(c.weight) - lse));
  }
}

SampleResult Sampler::sample(std::span<const float> logits, std::span<const int32_t> history,
                             std::span<const uint64_t> allowed) {
  SampleResult result;
  const float max_logit = prepare(logits, history, allowed);
  if (max_logit == kNegInf) {  // every token banned (or every logit NaN)
    result.token = std::max(argmax(logits, allowed), 0);
    if (params_.logprobs) result.logprob = kNegInf;
    return result;
  }
  if (is_greedy(params_)) {
    result.token = first_index_of(logits_, max_logit);
  } else {
    result.token = draw(truncate(max_logit));
  }
  KILN_ASSERT(result.token >= 0 && result.token < n_vocab_);
  if (params_.logprobs || params_.top_logprobs > 0) {
    fill_logprobs(result.token, max_logit, &result);
  }
  return result;
}

std::vector<std::pair<int32_t, float>> Sampler::distribution(std::span<const float> logits,
                                                             std::span<const int32_t> history) {
  const float max_logit = prepare(logits, history, {});
  if (max_logit == kNegInf) return {{std::max(argmax(logits, {}), 0), 1.0f}};
  if (is_greedy(params_)) return {{first_index_of(logits_, max_logit), 1.0f}};
  const double total = truncate(max_logit);
  std::vector<std::pair<int32_t, float>> out;
  if (all_vocab_) {
    for (int32_t i = 0; i < n_vocab_; ++i) {
      if (probs_[i] > 0.0f) out.emplace_back(i, static_cast<float>(probs_[i] / total));
    }
  } else {
    for (const auto& c : cands_) {
      if (c.weight > 0.0f) out.emplace_back(c.id, static_cast<float>(c.weight / total));
    }
  }
  return out;
}

}  // namespace kiln::engine
