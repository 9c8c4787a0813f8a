// Request and sequence state as the scheduler sees it: token ids and counters, no text, no
// sampling parameters (the engine loop keeps those beside the sequence id).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kiln::engine {

using SeqId = int64_t;

// What a caller submits: the tokenized prompt and the most tokens to generate.
struct Request {
  SeqId id = 0;
  std::vector<int32_t> prompt_tokens;
  int32_t max_tokens = 16;
  // Embeddings: the sequence ends once its prompt is computed (the engine reports a stop with
  // the prompt's last slice), so the context check counts the prompt alone.
  bool prefill_only = false;
  // May start from cached prefix blocks. Off when every prompt row's hidden state is needed
  // (mean or CLS pooling): cached rows would never be computed.
  bool reuse_prefix = true;
  // Every token in one step (encoders: each token sees the whole sequence, so the input cannot
  // be split into chunks): admitted only when the step has room for all of it.
  bool whole_prompt = false;
};

enum class SeqStatus {
  kWaiting,    // queued, never run
  kRunning,    // holds blocks, scheduled each step while budget allows
  kPreempted,  // was running, blocks taken back (recompute): queued again at the front
  kFinished,
};

enum class SeqFinishReason {
  kNone,
  kStop,       // the engine reported a stop (EOS, stop string)
  kLength,     // max_tokens generated (or the context is full)
  kCancelled,  // cancel(): client gone, timeout
};

inline const char* seq_status_name(SeqStatus s) {
  switch (s) {
    case SeqStatus::kWaiting:
      return "waiting";
    case SeqStatus::kRunning:
      return "running";
    case SeqStatus::kPreempted:
      return "preempted";
    case SeqStatus::kFinished:
      return "finished";
  }
  return "?";
}

// The OpenAI finish_reason spelling ("" while running).
inline const char* finish_reason_name(SeqFinishReason r) {
  switch (r) {
    case SeqFinishReason::kNone:
      return "";
    case SeqFinishReason::kStop:
      return "stop";
    case SeqFinishReason::kLength:
      return "length";
    case SeqFinishReason::kCancelled:
      return "cancelled";
  }
  return "?";
}

// One sequence. tokens = prompt then generated output; the first num_computed_tokens of them
// have their KV in the blocks of block_table. The scheduler catches num_computed_tokens up
// to num_tokens(): a prompt, a prompt chunk, or the one decode token are all the same thing.
struct Sequence {
  SeqId id = 0;
  std::vector<int32_t> tokens;  // [num_prompt_tokens + num_output_tokens]
  int32_t num_prompt_tokens = 0;
  int32_t max_tokens = 0;
  int32_t num_computed_tokens = 0;
  std::vector<int32_t> block_table;  // KV blocks in order; covers num_computed_tokens
  SeqStatus status = SeqStatus::kWaiting;
  SeqFinishReason finish_reason = SeqFinishReason::kNone;
  uint64_t arrival = 0;  // arrival order (FCFS, and "newest" for preemption)
  // Blocks of block_table handed to the prefix cache (registered as full blocks).
  int32_t num_registered_blocks = 0;
  // Prompt tokens found in the prefix cache at first admission (usage.cached_tokens).
  int32_t num_cached_prompt_tokens = 0;
  int32_t num_preemptions = 0;
  bool cancel_requested = false;
  bool reuse_prefix = true;   // Request::reuse_prefix
  bool whole_prompt = false;  // Request::whole_prompt
  int32_t state_slot = -1;    // recurrent-state slot while running (hybrid models)

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  std::span<const int32_t> prompt() const {
    return std::span<const int32_t>(tokens).first(static_cast<size_t>(num_prompt_tokens));
  }
  std::span<const int32_t> output() const {
    return std::span<const int32_t>(tokens).subspan(static_cast<size_t>(num_prompt_tokens));
  }
};

}  // namespace kiln::engine
