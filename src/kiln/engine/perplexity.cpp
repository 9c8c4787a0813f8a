#include "kiln/engine/perplexity.h"

#include <algorithm>
#include <cmath>

#include "kiln/engine/sequence.h"

namespace kiln::engine {

Expected<PerplexityResult> perplexity_of_tokens(
    const model::Model& model, std::vector<int32_t> tokens, const PerplexityOptions& opts,
    std::optional<int32_t> bos, backend::Backend& be,
    const std::function<void(int32_t, double)>& on_chunk) {
  const int32_t n_ctx = opts.n_ctx;
  if (n_ctx < 4) return err("perplexity: context {} is too small (at least 4)", n_ctx);
  if (static_cast<int64_t>(tokens.size()) < 2 * static_cast<int64_t>(n_ctx))
    return err("perplexity: the text has {} tokens; a context of {} needs at least {} (two chunks)",
               tokens.size(), n_ctx, 2 * static_cast<int64_t>(n_ctx));
  int32_t n_chunk = static_cast<int32_t>(tokens.size() / static_cast<size_t>(n_ctx));
  if (opts.max_chunks >= 0) n_chunk = std::min(n_chunk, opts.max_chunks);
  if (n_chunk <= 0) return err("perplexity: no chunk to score (--chunks 0)");
  const uint32_t n_vocab = model.hparams().n_vocab;
  for (int32_t t : tokens)
    if (t < 0 || static_cast<uint32_t>(t) >= n_vocab)
      return err("perplexity: token id {} is outside the model's vocabulary of {}", t, n_vocab);

  KILN_TRY(std::unique_ptr<SequenceRunner> seq,
           SequenceRunner::create(model, be, n_ctx, std::min(n_ctx, 512), opts.kv_type,
                                  /*all_logits=*/true));
  seq->set_keep_all_logits(true);
  const int32_t first = n_ctx / 2;
  PerplexityResult r;
  r.num_tokens = static_cast<int64_t>(tokens.size());
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  std::vector<int32_t> chunk(static_cast<size_t>(n_ctx));
  for (int32_t c = 0; c < n_chunk; ++c) {
    const auto begin = tokens.begin() + static_cast<int64_t>(c) * n_ctx;
    std::copy(begin, begin + n_ctx, chunk.begin());
    if (bos) chunk[0] = *bos;
    seq->truncate(0);
    KILN_TRY(std::span<const float> last, seq->append(chunk));
    (void)last;
    const std::vector<float>& logits = seq->all_logits();
    for (int32_t j = first; j < n_ctx - 1; ++j) {
      const float* row = logits.data() + static_cast<size_t>(j) * n_vocab;
      const float mx = *std::max_element(row, row + n_vocab);
      double sum = 0;
      for (uint32_t v = 0; v < n_vocab; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
      // The token predicted at position j is the text's own next token, not the BOS swap.
      const int32_t target = *(begin + j + 1);
      const double lp = static_cast<double>(row[target] - mx) - std::log(sum);
      nll -= lp;
      nll2 += lp * lp;
      ++count;
    }
    r.running_ppl.push_back(std::exp(nll / static_cast<double>(count)));
    if (on_chunk) on_chunk(c, r.running_ppl.back());
  }
  r.num_chunks = n_chunk;
  r.num_scored = count;
  r.mean_nll = nll / static_cast<double>(count);
  r.ppl = std::exp(r.mean_nll);
  const double var = nll2 / static_cast<double>(count) - r.mean_nll * r.mean_nll;
  r.ppl_err = var > 0 && count > 1 ? std::sqrt(var / static_cast<double>(count - 1)) * r.ppl : 0.0;
  return r;
}

Expected<PerplexityResult> perplexity(const model::Model& model, const tokenizer::Tokenizer& tok,
                                      std::string_view text, const PerplexityOptions& opts,
                                      backend::Backend& be,
                                      const std::function<void(int32_t, double)>& on_chunk) {
  KILN_TRY(std::vector<int32_t> ids, tok.encode(text, /*add_special=*/true,
                                                /*parse_special=*/false));
  std::optional<int32_t> bos;
  if (tok.add_bos()) bos = tok.bos_id();
  return perplexity_of_tokens(model, std::move(ids), opts, bos, be, on_chunk);
}

}  // namespace kiln::engine
