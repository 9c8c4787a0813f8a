// kiln perplexity: llama-perplexity's measure of a model on a text (see
// engine/perplexity.h). Progress goes to stderr as "[chunk]running-ppl,"; the last line on
// stdout is "Final estimate: PPL = x +/- y", the form llama-perplexity prints.
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "kiln/backend/backend.h"
#include "kiln/cli/commands.h"
#include "kiln/cli/flags.h"
#include "kiln/cli/model_files.h"
#include "kiln/engine/perplexity.h"
#include "kiln/kv/kv_cache.h"
#include "kiln/tokenizer/gguf_vocab.h"

namespace kiln::cli {
namespace {

struct PerplexityCliOptions {
  std::string model;
  std::string file;
  int32_t n_ctx = 512;
  int32_t chunks = -1;
  int threads = 0;
  std::string device = "auto";
  std::string kv_type = "f16";
};

Status run_perplexity(const PerplexityCliOptions& o) {
  KILN_TRY(std::string path, model_path_or_default(o.model));
  KILN_TRY(std::unique_ptr<model::Model> m, model::Model::load(path));
  KILN_TRY(tokenizer::VocabData vocab, tokenizer::load_vocab(m->file()));
  KILN_TRY(tokenizer::Tokenizer tok, tokenizer::Tokenizer::create(std::move(vocab)));
  KILN_TRY(std::string text, read_text_file(o.file));
  KILN_TRY(std::unique_ptr<backend::Backend> be, backend::create_backend({o.device, o.threads}));
  engine::PerplexityOptions po;
  po.n_ctx = o.n_ctx;
  po.max_chunks = o.chunks;
  KILN_TRY(po.kv_type, kv::parse_kv_type(o.kv_type));
  KILN_TRY(engine::PerplexityResult r,
           engine::perplexity(*m, tok, text, po, *be, [](int32_t i, double ppl) {
             fmt::print(stderr, "[{}]{:.4f},", i + 1, ppl);
             std::fflush(stderr);
           }));
  fmt::print(stderr, "\n");
  fmt::print("tokens {}, chunks {} of {} tokens, scored {}, mean nll {:.6f}\n", r.num_tokens,
             r.num_chunks, o.n_ctx, r.num_scored, r.mean_nll);
  fmt::print("Final estimate: PPL = {:.4f} +/- {:.5f}\n", r.ppl, r.ppl_err);
  return {};
}

}  // namespace

RunFn add_perplexity(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "perplexity",
      "Perplexity of a text, as llama-perplexity measures it (chunks of -c tokens, the second "
      "half of each scored)");
  auto o = std::make_shared<PerplexityCliOptions>();
  cmd->add_option("-m,--model", o->model, kDefaultModelHelp);
  cmd->add_option("-f,--file", o->file, "text file ('-': stdin)")->required();
  cmd->add_option("--device", o->device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  add_ranged(cmd, "-c,--ctx", o->n_ctx, 4, kMaxContext, "tokens per chunk");
  add_ranged(cmd, "--chunks", o->chunks, -1, INT32_MAX, "score at most this many chunks (-1: all)");
  add_threads_flag(cmd, o->threads);
  cmd->add_option("--kv-type", o->kv_type, "KV cache type: f16, f32 or q8_0")
      ->capture_default_str();
  return [o]() {
    Status st = run_perplexity(*o);
    if (!st.ok()) {
      fmt::print(stderr, "kiln perplexity: {}\n", st.error().message);
      return 1;
    }
    return 0;
  };
}

}  // namespace kiln::cli
