// kiln serve: the OpenAI-compatible HTTP server. The listener is up (answering /health with
// 503 "loading") before the weights finish loading; SIGTERM/SIGINT stop accepting, let
// in-flight requests finish for --drain-timeout, then cut them.
#include <csignal>
#include <memory>

#include <fmt/format.h>

#include "kiln/backend/backend.h"
#include "kiln/cli/commands.h"
#include "kiln/cli/flags.h"
#include "kiln/cli/model_files.h"
#include "kiln/engine/engine.h"
#include "kiln/kv/kv_cache.h"
#include "kiln/server/server.h"
#include "kiln/util/log.h"

namespace kiln::cli {
namespace {

struct ServeOptions {
  engine::EngineOptions engine;
  server::ServerOptions server;
  int drain_timeout_s = 30;
  int request_timeout_s = 0;
  int header_timeout_s = 5;
  int max_tokens = 0;  // 0: unset (request_controls.h)
  int max_tokens_cap = 0;
  int max_thinking_tokens = 0;
  std::string kv_memory;  // "512M", "2G", bytes
  std::string kv_type = "f16";
  std::string pooling;  // "": the model's <arch>.pooling_type
};

// "1024", "512K", "64M", "2G" -> bytes.
Expected<uint64_t> parse_bytes(const std::string& s) {
  if (s.empty()) return uint64_t{0};
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (...) {
    return err("'{}' is not a size (e.g. 512M, 2G)", s);
  }
  const std::string unit = s.substr(pos);
  uint64_t mul = 1;
  if (unit == "K" || unit == "k" || unit == "KiB")
    mul = 1ull << 10;
  else if (unit == "M" || unit == "m" || unit == "MiB")
    mul = 1ull << 20;
  else if (unit == "G" || unit == "g" || unit == "GiB")
    mul = 1ull << 30;
  else if (!unit.empty())
    return err("'{}' is not a size (e.g. 512M, 2G)", s);
  if (v > (uint64_t{1} << 50) / mul) return err("size '{}' is too large", s);
  return v * mul;
}

volatile std::sig_atomic_t g_signal = 0;
void on_signal(int sig) {
  g_signal = sig;
}

// The step flags a GPU gets unless given (the engine's defaults suit the CPU): 64 sequences at
// once and 1,024-token steps that take prompts up to the budget. Measured on an H200 with an 8B
// Q4_K_M model, 400-token prompts (docs/performance.md, session 20): at 16 streams TTFT p50
// 84 ms and 2,543 tok/s against 54 ms and 2,398 with the CPU's 512 / 64, at 64 streams 5,039
// tok/s against 4,248 (2,048-token steps: 5,251, but a TTFT p50 of 132 ms at 16 streams).
void apply_gpu_defaults(engine::EngineOptions* e, bool seqs_given, bool batch_given,
                        bool prompt_given) {
  if (!seqs_given) e->max_seqs = 64;
  if (!batch_given) e->max_batch_tokens = 1024;
  if (!prompt_given) e->step_prompt_tokens = 0;
  if (!seqs_given || !batch_given || !prompt_given)
    log::info("on a GPU: --max-seqs {} --max-batch-tokens {} --step-prompt-tokens {}", e->max_seqs,
              e->max_batch_tokens, e->step_prompt_tokens);
}

int run_serve(ServeOptions o) {
  auto kv_bytes = parse_bytes(o.kv_memory);
  if (!kv_bytes.ok()) {
    fmt::print(stderr, "kiln serve: --kv-memory: {}\n", kv_bytes.error().message);
    return 2;
  }
  o.engine.kv_memory_bytes = *kv_bytes;
  auto kv_type = kv::parse_kv_type(o.kv_type);
  if (!kv_type.ok()) {
    fmt::print(stderr, "kiln serve: --kv-type: {}\n", kv_type.error().message);
    return 2;
  }
  o.engine.kv_type = *kv_type;
  if (!o.pooling.empty()) {
    auto pooling = model::parse_pooling(o.pooling);
    if (!pooling.ok() || *pooling == model::Pooling::kRank) {
      fmt::print(stderr, "kiln serve: --pooling: {}\n",
                 pooling.ok() ? "rank (rerankers) is not supported" : pooling.error().message);
      return 2;
    }
    o.engine.pooling = *pooling;
  }
  o.server.drain_timeout = std::chrono::seconds(o.drain_timeout_s);
  o.server.request_timeout = std::chrono::seconds(o.request_timeout_s);
  if (o.max_tokens > 0 && o.max_tokens_cap > 0 && o.max_tokens > o.max_tokens_cap) {
    fmt::print(stderr, "kiln serve: --max-tokens {} is above --max-tokens-cap {}\n", o.max_tokens,
               o.max_tokens_cap);
    return 2;
  }
  auto positive = [](int v) { return v > 0 ? std::optional<int32_t>(v) : std::nullopt; };
  o.server.token_limits = {positive(o.max_tokens), positive(o.max_tokens_cap),
                           positive(o.max_thinking_tokens)};
  o.server.first_request_timeout = std::chrono::seconds(o.header_timeout_s);
  // A request asking for more generations than the queue holds would be refused forever.
  o.server.max_choices = o.engine.max_waiting;
  auto path = model_path_or_default(o.engine.model_path);
  if (!path.ok()) {
    fmt::print(stderr, "kiln serve: {}\n", path.error().message);
    return 1;
  }
  o.engine.model_path = *path;
  // The tokenizer and template come from the metadata, which loads in moments.
  auto tm = load_text_model(o.engine.model_path);
  if (!tm.ok()) {
    fmt::print(stderr, "kiln serve: {}\n", tm.error().message);
    return 1;
  }
  engine::Engine engine(o.engine);
  server::Server srv(engine, tm->tokenizer, tm->chat_template, o.server);
  auto port = srv.start();
  if (!port.ok()) {
    fmt::print(stderr, "kiln serve: {}\n", port.error().message);
    return 1;
  }
  log::info("listening on http://{}:{} (model '{}' loading)", o.server.host, *port,
            o.server.model_name);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  engine.start();
  Status ready = engine.wait_ready();
  if (!ready.ok()) {
    log::error("model failed to load: {}", ready.error().message);
    srv.shutdown(std::chrono::milliseconds(0));
    return 1;
  }
  log::info("ready: http://{}:{}/v1 serves '{}'", o.server.host, *port, o.server.model_name);
  while (g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  log::info("signal {}: draining (up to {} s)", static_cast<int>(g_signal), o.drain_timeout_s);
  srv.shutdown();
  engine.stop();
  return 0;
}

}  // namespace

RunFn add_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  auto o = std::make_shared<ServeOptions>();
  cmd->add_option("-m,--model", o->engine.model_path, kDefaultModelHelp);
  cmd->add_option("--host", o->server.host, "listen address")->capture_default_str();
  add_ranged(cmd, "--port", o->server.port, 0, 65535, "listen port (0: any free port)");
  cmd->add_option("--api-key", o->server.api_key,
                  "require 'Authorization: Bearer KEY' (or 'x-api-key: KEY')")
      ->check(CLI::Validator(
          [](std::string& key) -> std::string {
            return key.empty() ? "an empty key would turn authentication off; leave the flag "
                                 "out to serve without a key"
                               : "";
          },
          "KEY"));
  cmd->add_option("--model-name", o->server.model_name,
                  "model id clients send and /v1/models lists")
      ->capture_default_str();
  add_threads_flag(cmd, o->engine.threads);
  add_ranged(cmd, "--sample-threads", o->engine.sample_threads, 0, 4096,
             "host threads sampling a step's rows in parallel (0: on a GPU the physical cores, "
             "on the CPU --threads; at most 16)");
  cmd->add_option("--device", o->engine.device,
                  "cpu, cuda, cuda:N or auto (cuda when a GPU is found)")
      ->capture_default_str();
  add_mesh_flags(cmd, o->engine.mesh);
  add_deterministic_flag(cmd, o->engine.deterministic);
  cmd->add_option("--gpu-memory-fraction", o->engine.gpu_memory_fraction,
                  "share of the GPU's memory for weights, activations and the KV cache")
      ->capture_default_str()
      ->check(real_range(0.05, 1.0));
  cmd->add_option("-c,--ctx", o->engine.n_ctx,
                  "context length per request (default: the model's trained context)")
      ->check(int_range(1, kMaxContext));
  cmd->add_option("--kv-memory", o->kv_memory,
                  "KV cache budget, e.g. 512M or 2G (default: max-seqs full contexts, <= 2G)");
  cmd->add_option("--kv-type", o->kv_type,
                  "KV cache type: f16, f32 or q8_0 (q8_0 needs head dims that are multiples of 32)")
      ->capture_default_str();
  CLI::Option* batch =
      add_ranged(cmd, "--max-batch-tokens", o->engine.max_batch_tokens, 1, kMaxTokens,
                 "tokens computed per engine step (prefill chunks + decodes; on a GPU 1024)");
  CLI::Option* prompt =
      add_ranged(cmd, "--step-prompt-tokens", o->engine.step_prompt_tokens, 0, kMaxTokens,
                 "a step takes no further prompt once it holds this many prompt tokens, so prompts "
                 "arriving together get first tokens in turn (0: fill the budget; on a GPU 0)");
  CLI::Option* seqs = add_ranged(cmd, "--max-seqs", o->engine.max_seqs, 1, 4096,
                                 "concurrently running sequences (on a GPU 64)");
  add_ranged(cmd, "--max-waiting", o->engine.max_waiting, 1, 1 << 20,
             "queued requests beyond which new ones get 429; also the most generations "
             "(prompts x n) one request may ask for");
  cmd->add_flag("!--no-prefix-cache", o->engine.enable_prefix_cache,
                "do not reuse cached prompt prefixes");
  add_ranged(cmd, "--state-checkpoint-blocks", o->engine.state_checkpoint_blocks, 1, 1 << 16,
             "hybrid models (qwen35, qwen3next): save the recurrent state every this many "
             "16-token KV blocks of a prompt, where a later prompt with that prefix resumes");
  cmd->add_option("--state-snapshots", o->engine.state_snapshots,
                  "hybrid models: recurrent-state snapshots kept for prefix reuse, each the "
                  "size of one sequence's state (default: 2 x --max-seqs; 0: no prefix reuse)")
      ->check(int_range(0, 1 << 16));
  cmd->add_option("--pooling", o->pooling,
                  "how /v1/embeddings pools the final hidden states: none, mean, cls or last "
                  "(default: the model's <arch>.pooling_type; none serves no embeddings)")
      ->check(CLI::IsMember({"none", "mean", "cls", "last"}));
  add_ranged(cmd, "--max-body", o->server.max_body_bytes, 1, int64_t{1} << 30,
             "request body limit in bytes (larger: 413)");
  add_ranged(cmd, "--max-connections", o->server.max_connections, 1, 1 << 16,
             "open connections at most; beyond it a connection may still ask /health and "
             "/metrics, anything else gets 503");
  add_ranged(cmd, "--max-connections-per-client", o->server.max_connections_per_client, 1, 1 << 16,
             "open connections per client address at most (beyond it: as above)");
  add_ranged(cmd, "--header-timeout", o->header_timeout_s, 1, 3600,
             "seconds a new connection may take to send its first request's headers");
  add_ranged(cmd, "--drain-timeout", o->drain_timeout_s, 0, 86400,
             "seconds in-flight requests may finish after SIGTERM");
  add_ranged(cmd, "--request-timeout", o->request_timeout_s, 0, 7 * 86400,
             "seconds a generation may take (0: no limit)");
  cmd->add_flag("--parse-special-in-content", o->server.parse_special_in_content,
                "tokenize control-token text in message content as control tokens (default: "
                "as plain text; only the chat template's own markup makes control tokens)");
  cmd->add_flag("--cors", o->server.cors, "send Access-Control-Allow-Origin: *");
  add_ranged(cmd, "--max-tokens", o->max_tokens, 0, kMaxTokens,
             "output tokens of a request that names no max_tokens (0: chat takes what the "
             "context leaves, completions 16)");
  add_ranged(cmd, "--max-tokens-cap", o->max_tokens_cap, 0, kMaxTokens,
             "refuse (400) a request asking for more output tokens than this (0: no cap)");
  add_ranged(cmd, "--max-thinking-tokens", o->max_thinking_tokens, 0, kMaxTokens,
             "thinking budget of a request that names none (0: none)");
  add_ranged(cmd, "--responses-store", o->server.responses_store_max_count, 0, 1 << 24,
             "/v1/responses kept in memory for GET and previous_response_id, at most (0: none)");
  add_ranged(cmd, "--responses-store-bytes", o->server.responses_store_max_bytes, 0,
             int64_t{1} << 40, "... and at most this many bytes of them (least recently used go)");
  cmd->add_flag("!--keep-volatile-system-lines", o->server.normalize_volatile_prompt,
                "keep per-request lines such as Claude Code's 'x-anthropic-billing-header: ...' "
                "in system prompts (default: removed, so that turns share their cached prefix)");
  return [o, batch, prompt, seqs]() {
    ServeOptions run = *o;
    if (backend::device_is_gpu(run.engine.device))
      apply_gpu_defaults(&run.engine, seqs->count() > 0, batch->count() > 0, prompt->count() > 0);
    return run_serve(std::move(run));
  };
}

}  // namespace kiln::cli
