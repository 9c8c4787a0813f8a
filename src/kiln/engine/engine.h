// The engine loop: one thread owns the model, the KV cache and the scheduler. Each step is
// schedule -> execute (one forward over the flat batch) -> update (sample, detokenize, stop
// strings, events to each request's channel). HTTP threads only call submit() and read
// channels. A failed step fails its requests and the loop goes on.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kiln/engine/api.h"
#include "kiln/model/model.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::engine {

class Executor;

struct EngineOptions {
  std::string model_path;
  std::string device = "auto";  // cpu, cuda, cuda:N, auto (backend::create_backend)
  int threads = 0;              // CPU threads; 0: physical cores
  // Host threads that sample a step's rows in parallel (each row's sampler is its own: the
  // same tokens whatever the count; the step waits for them). 0: on a GPU the physical cores,
  // on the CPU the forward's threads (`threads`, idle while the rows are drawn), at most 16,
  // for vocabularies of 16,384+ tokens (smaller rows take less than waking the threads).
  // KILN_ENGINE_SAMPLE_THREADS=N overrides it (1: one after another).
  int sample_threads = 0;
  double gpu_memory_fraction = 0.9;        // of the GPU's memory, for weights + activations + KV
  int32_t n_ctx = 0;                       // context per sequence (prompt + generated);
                                           // 0: the model's trained context
  uint64_t kv_memory_bytes = 0;            // KV cache budget; 0: enough for max_seqs full contexts,
                                           // capped at 2 GiB
  quant::Type kv_type = quant::Type::F16;  // KV cache storage: F16, F32 or Q8_0
  int32_t max_batch_tokens = 512;          // tokens per step (prefill chunks + decodes)
  int32_t step_prompt_tokens = 64;         // a step takes no further prompt once it holds
                                           // this many prompt tokens (0: up to the budget)
  int32_t max_seqs = 16;                   // running sequences at most
  int32_t max_waiting = 256;               // queued requests beyond this are refused (429)
  bool enable_prefix_cache = true;
  // Hybrid models' prefix reuse (scheduler.h): the recurrent state is saved every
  // state_checkpoint_blocks KV blocks into one of state_snapshots snapshot slots (-1:
  // 2 x max_seqs; 0: none, and then no prefix is reused for these models).
  int32_t state_checkpoint_blocks = 8;
  int32_t state_snapshots = -1;
  // Embeddings: the pooling of embed requests, overriding the model's `<arch>.pooling_type`
  // (llama-server's --pooling); unset: the model's. kNone: no embeddings.
  std::optional<model::Pooling> pooling;
  // A device mesh (--tp, --pp, --ep): the model over tp x pp ranks (ExecutorOptions::mesh).
  model::MeshShape mesh;
  // Backend::set_deterministic: a request's output independent of the other requests in its
  // steps, of how its prompt was chunked and of prefix-cache hits.
  bool deterministic = false;
  // Tests: called before each step's forward with the step's number and the executor; an
  // exception thrown from it is a failed step (its requests fail, the engine goes on).
  std::function<void(int64_t, Executor&)> before_step;
};

// The options' bounds (threads in [0, 4096], n_ctx >= 0, max_batch_tokens, max_seqs,
// max_waiting, state_checkpoint_blocks >= 1, step_prompt_tokens >= 0, state_snapshots >= -1): an
// error naming the option. Engine::start() refuses bad options this way (state kFailed,
// wait_ready() returns the error); the command line checks the same ranges at parse time.
Status validate(const EngineOptions& opts);

class Engine final : public EngineApi {
 public:
  explicit Engine(EngineOptions opts);  // the options' n_ctx, when given, is context_length()
  ~Engine() override;

  // Starts the engine thread, which loads the model (state kLoading -> kReady or kFailed).
  void start();
  // Blocks until the model is loaded (or failed); the error when it failed.
  Status wait_ready();
  // Stops the loop: queued and running requests finish with kCancelled.
  void stop();

  std::variant<std::shared_ptr<RequestChannel>, SubmitRefusal> submit(
      GenerationRequest req) override;
  EngineState state() const override { return state_.load(); }
  EngineStats stats() const override;
  // The context per sequence: the configured one, or once loaded the model's (0 before).
  int32_t context_length() const override { return context_length_.load(); }
  model::Pooling pooling() const override { return pooling_.load(); }
  int32_t embedding_width() const override { return embedding_width_.load(); }

  // Valid once ready.
  const model::Model& model() const { return *model_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  const std::string& chat_template() const { return chat_template_; }
  // The memory plan of the loaded model (valid once ready).
  const std::string& memory_plan() const { return memory_plan_; }

 private:
  struct Impl;  // the loop's state, owned by the engine thread
  std::variant<std::shared_ptr<RequestChannel>, SubmitRefusal> submit_embed(GenerationRequest req);
  // A checked request into the inbox, or kQueueFull past max_waiting.
  std::variant<std::shared_ptr<RequestChannel>, SubmitRefusal> enqueue(GenerationRequest req);
  void thread_main();
  // A rank of the device mesh failed: state kFailed with `why` (the engine thread).
  void device_failed(const std::string& why);

  EngineOptions opts_;
  std::atomic<EngineState> state_{EngineState::kLoading};
  std::atomic<int32_t> context_length_{0};
  std::atomic<model::Pooling> pooling_{model::Pooling::kNone};
  std::atomic<int32_t> embedding_width_{0};
  std::string load_error_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::string chat_template_;
  std::string memory_plan_;
  std::thread thread_;
  std::atomic<bool> stop_{false};

  // Inbox: submitted requests waiting for the engine thread.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Pending {
    GenerationRequest req;
    std::shared_ptr<RequestChannel> channel;
  };
  std::vector<Pending> inbox_;
  std::condition_variable ready_cv_;

  // Counters published by the engine thread.
  std::atomic<int64_t> num_queued_{0};  // inbox + scheduler waiting
  mutable std::mutex stats_mu_;
  EngineStats stats_;
  std::atomic<int64_t> heartbeat_ns_{0};
};

}  // namespace kiln::engine
