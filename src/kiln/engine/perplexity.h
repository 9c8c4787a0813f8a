// Perplexity of a text under a model, measured as llama.cpp's llama-perplexity measures it:
// the whole text is tokenized once (BOS per the vocabulary, control-token text not parsed),
// cut into non-overlapping chunks of n_ctx tokens, each evaluated from position 0 (with its
// first token replaced by BOS when the vocabulary adds one), and only the predictions of
// the chunk's second half are scored: the logits at positions n_ctx/2 .. n_ctx-2 against
// the tokens that follow them. `kiln perplexity` prints it; tools/tiny/train.py computes the
// same number in PyTorch.
#pragma once

#include <functional>
#include <string_view>
#include <vector>

#include "kiln/backend/backend.h"
#include "kiln/model/model.h"
#include "kiln/quant/types.h"
#include "kiln/tokenizer/tokenizer.h"
#include "kiln/util/status.h"

namespace kiln::engine {

struct PerplexityOptions {
  int32_t n_ctx = 512;
  int32_t max_chunks = -1;                 // < 0: every whole chunk of the text
  quant::Type kv_type = quant::Type::F16;  // KV cache storage (F16, F32 or Q8_0)
};

struct PerplexityResult {
  double ppl = 0;      // exp(mean negative log-likelihood)
  double ppl_err = 0;  // llama-perplexity's +/-: ppl * stddev(nll) / sqrt(count - 1)
  double mean_nll = 0;
  int64_t num_tokens = 0;  // tokens in the whole text
  int64_t num_scored = 0;
  int32_t num_chunks = 0;
  std::vector<double> running_ppl;  // after each chunk
};

// `on_chunk(i, running_ppl)` is called after each chunk (progress output); may be empty.
Expected<PerplexityResult> perplexity(const model::Model& model, const tokenizer::Tokenizer& tok,
                                      std::string_view text, const PerplexityOptions& opts,
                                      backend::Backend& be,
                                      const std::function<void(int32_t, double)>& on_chunk = {});

// The same measure over token ids already cut (no tokenizer, no BOS handling).
Expected<PerplexityResult> perplexity_of_tokens(
    const model::Model& model, std::vector<int32_t> tokens, const PerplexityOptions& opts,
    std::optional<int32_t> bos, backend::Backend& be,
    const std::function<void(int32_t, double)>& on_chunk = {});

}  // namespace kiln::engine
