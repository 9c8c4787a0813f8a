// EngineOptions come from the command line (kiln serve) and from embedders: their bounds are
// checked here, so that no option reaches an assertion of the scheduler or the thread pool.
#include "kiln/engine/engine.h"

namespace kiln::engine {

Status validate(const EngineOptions& o) {
  if (o.threads < 0 || o.threads > 4096)
    return err("threads must be in [0, 4096], got {}", o.threads);
  if (o.sample_threads < 0 || o.sample_threads > 4096)
    return err("sample_threads must be in [0, 4096], got {}", o.sample_threads);
  if (o.n_ctx < 0) return err("n_ctx must be >= 0 (0: the model's), got {}", o.n_ctx);
  if (o.max_batch_tokens < 1)
    return err("max_batch_tokens must be >= 1, got {}", o.max_batch_tokens);
  if (o.step_prompt_tokens < 0)
    return err("step_prompt_tokens must be >= 0, got {}", o.step_prompt_tokens);
  if (o.max_seqs < 1) return err("max_seqs must be >= 1, got {}", o.max_seqs);
  if (o.max_waiting < 1)
    return err("max_waiting must be >= 1 (0 would refuse every request), got {}", o.max_waiting);
  if (o.state_checkpoint_blocks < 1)
    return err("state_checkpoint_blocks must be >= 1, got {}", o.state_checkpoint_blocks);
  if (o.state_snapshots < -1)
    return err("state_snapshots must be >= 0 (or -1: 2 x max_seqs), got {}", o.state_snapshots);
  if (o.pooling == model::Pooling::kRank)
    return err("pooling 'rank' (rerankers) is not supported; use none, mean, cls or last");
  return {};
}

}  // namespace kiln::engine
