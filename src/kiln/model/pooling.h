// Pooling of the final-norm hidden states into one vector per sequence (embedding models).
// The enum is llama.cpp's `<arch>.pooling_type` (llama_pooling_type, written to disk:
// append-only). The pooled vectors follow sentence-transformers' Pooling module (mean over
// the sequence's tokens, the first token, the last token) and its Normalize module (L2).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/util/status.h"

namespace kiln::model {

enum class Pooling : uint32_t {
  kNone = 0,  // no pooling: not an embedding model (generation)
  kMean = 1,  // mean over every token of the sequence
  kCls = 2,   // the first token's state (BERT's [CLS])
  kLast = 3,  // the last token's state (Qwen3-Embedding, decoder embedders)
  kRank = 4,  // reranker scores (not served by kiln yet)
};
inline constexpr uint32_t kMaxPooling = 4;

// "none", "mean", "cls", "last", "rank" (llama-server's --pooling spellings).
std::string_view pooling_name(Pooling p);
Expected<Pooling> parse_pooling(std::string_view name);

// Sums the hidden rows of one sequence as chunks of it arrive (chunked prefill), in position
// order, and gives the pooled vector (not normalized). Sums in double: a mean over thousands
// of rows keeps fp32 precision.
class PoolAccumulator {
 public:
  PoolAccumulator() = default;
  PoolAccumulator(Pooling pooling, int64_t width) : pooling_(pooling), width_(width) {}
  // Which rows of a slice [first, first + n) of a sequence of num_tokens tokens are wanted:
  // every row (mean), the row at position 0 (cls), the row at num_tokens - 1 (last).
  // Appends the flat rows (row0 + index in the slice) to `rows`.
  static void wanted_rows(Pooling pooling, int32_t first, int32_t n, int32_t num_tokens,
                          int32_t row0, std::vector<int32_t>* rows);
  // Starts over (the sequence is recomputed from position 0 after a preemption).
  void reset();
  // One wanted row's final-norm hidden state, [width].
  void add(std::span<const float> row);
  // The pooled vector [width]; empty when no row was added.
  std::vector<float> result() const;
  int64_t num_rows() const { return num_rows_; }

 private:
  Pooling pooling_ = Pooling::kNone;
  int64_t width_ = 0;
  std::vector<double> sum_;  // mean: the sum of rows; cls/last: the row
  int64_t num_rows_ = 0;
};

// x / max(||x||_2, 1e-12), as torch.nn.functional.normalize (sentence-transformers'
// Normalize module).
void l2_normalize(std::span<float> x);

}  // namespace kiln::model
