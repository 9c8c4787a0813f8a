// kiln make-model: write a random-weight GGUF of a given architecture and shape.
#include <memory>

#include <fmt/format.h>

#include "kiln/cli/commands.h"
#include "kiln/cli/flags.h"
#include "kiln/model/make_model.h"

namespace kiln::cli {

RunFn add_make_model(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "make-model", "Write a random-weight GGUF model with a real tokenizer (tests, benchmarks)");
  auto o = std::make_shared<model::MakeModelOptions>();
  auto out = std::make_shared<std::string>();
  auto* config = cmd->add_option(
      "--config", o->config_path,
      "a Hugging Face config.json: architecture, every hyperparameter, rope scaling, padded "
      "vocab_size and tied embeddings from it (the shape flags are then refused)");
  cmd->add_option("--tokenizer", o->tokenizer_dir,
                  "folder with a Hugging Face tokenizer.json (+ tokenizer_config.json)")
      ->required();
  CLI::Option* shape[] = {
      cmd->add_option("--arch", o->arch, "llama, qwen2, qwen3, qwen3moe")->capture_default_str(),
      add_ranged(cmd, "--layers", o->n_layer, 1, 1024, "number of blocks"),
      add_ranged(cmd, "--hidden", o->n_embd, 1, 1 << 16, "embedding width"),
      add_ranged(cmd, "--heads", o->n_head, 1, 1024, "attention heads"),
      add_ranged(cmd, "--kv-heads", o->n_head_kv, 1, 1024, "key/value heads (GQA)"),
      cmd->add_option("--head-dim", o->head_dim, "head dimension (default hidden/heads)")
          ->check(int_range(1, 1 << 12)),
      add_ranged(cmd, "--ffn", o->n_ff, 1, 1 << 18, "feed-forward width"),
      add_ranged(cmd, "--ctx", o->n_ctx, 1, kMaxContext, "training context length"),
      cmd->add_option("--experts", o->n_expert, "MoE: experts per layer")
          ->check(int_range(1, 1024)),
      cmd->add_option("--experts-used", o->n_expert_used, "MoE: experts per token")
          ->check(int_range(1, 1024)),
      cmd->add_option("--expert-ffn", o->n_ff_expert, "MoE: expert feed-forward width")
          ->check(int_range(1, 1 << 18)),
      cmd->add_flag("--tied", o->tied_embeddings, "tie output to token embeddings")};
  for (CLI::Option* opt : shape) config->excludes(opt);
  cmd->add_option("--type", o->type,
                  "f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m q5_k_m")
      ->capture_default_str();
  cmd->add_flag("--vocab-only", o->vocab_only, "write only tokenizer and hyperparameters");
  cmd->add_option("--seed", o->seed, "random seed")->capture_default_str();
  cmd->add_option("--distinct-rows", o->distinct_rows,
                  "random rows per tensor, the rest repeating them (fast; benchmarks only)");
  cmd->add_option("-o,--output", *out, "output .gguf path")->required();
  return [o, out]() {
    Status st = model::make_model_file(*o, *out);
    if (!st.ok()) {
      fmt::print(stderr, "kiln make-model: {}\n", st.error().message);
      return 1;
    }
    fmt::print(stderr, "kiln make-model: wrote {}\n", *out);
    return 0;
  };
}

}  // namespace kiln::cli
