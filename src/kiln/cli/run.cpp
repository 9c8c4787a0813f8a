// kiln run: generate text from a prompt, or chat in the terminal. Only the generated text goes
// to stdout (scripts can use it); logs and statistics go to stderr.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/chat/output_parser.h"
#include "kiln/chat/template.h"
#include "kiln/cli/activation_dump.h"
#include "kiln/cli/commands.h"
#include "kiln/cli/flags.h"
#include "kiln/cli/model_files.h"
#include "kiln/engine/constraint_gate.h"
#include "kiln/engine/sampler.h"
#include "kiln/engine/sequence.h"
#include "kiln/engine/stop.h"
#include "kiln/grammar/constraint.h"
#include "kiln/kv/kv_cache.h"
#include "kiln/server/chat_prompt.h"
#include "kiln/server/constraint.h"
#include "kiln/tokenizer/gguf_vocab.h"
#include "kiln/tokenizer/stream_decoder.h"
#include "kiln/util/log.h"

namespace kiln::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Ctrl-C in `kiln run --chat`: the first one during a reply stops the reply (back to the
// prompt); one at the prompt, or a second one during a reply, exits.
volatile std::sig_atomic_t g_in_reply = 0;
volatile std::sig_atomic_t g_stop_reply = 0;
void on_chat_sigint(int) {
  if (g_in_reply != 0 && g_stop_reply == 0) {
    g_stop_reply = 1;
    return;
  }
  static const char kNewline[] = "\n";
  [[maybe_unused]] ssize_t n = ::write(STDOUT_FILENO, kNewline, 1);
  std::_Exit(130);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct RunOptions {
  std::string model;
  std::string prompt;
  std::string prompt_file;
  std::string system;
  int32_t n_predict = 256;
  int32_t n_ctx = 4096;
  int threads = 0;
  std::string device = "auto";
  model::MeshShape mesh;
  bool deterministic = false;
  std::string kv_type = "f16";
  int64_t seed = -1;
  bool chat = false;
  bool ignore_eos = false;
  bool no_stats = false;
  std::string dump_dir;  // --dump-activations: the prompt's intermediates go there
  std::vector<std::string> stops;
  engine::SamplingParams sampling;
  std::string grammar_file;      // --grammar: GBNF
  std::string json_schema_file;  // --json-schema
};

struct Stats {
  int64_t num_prompt_tokens = 0;
  double prompt_seconds = 0;
  int64_t num_generated = 0;
  double generate_seconds = 0;
};

// Everything one generation needs, loaded once.
struct Runtime {
  std::unique_ptr<model::Model> model;
  tokenizer::Tokenizer tokenizer;
  std::shared_ptr<grammar::CompiledGrammar> constraint;  // --grammar / --json-schema
  std::string chat_template;
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<engine::SequenceRunner> seq;
  std::vector<int32_t> eog;
};

Expected<Runtime> load(const RunOptions& o, double* load_seconds) {
  const auto t0 = Clock::now();
  Runtime rt;
  KILN_TRY(rt.model, model::Model::load(o.model));
  KILN_TRY(tokenizer::VocabData vocab, tokenizer::load_vocab(rt.model->file()));
  rt.chat_template = chat::template_or_chatml(vocab.chat_template);
  KILN_TRY(rt.tokenizer, tokenizer::Tokenizer::create(std::move(vocab)));
  KILN_TRY(rt.backend, backend::create_backend({o.device, o.threads, o.deterministic}));
  KILN_TRY(const quant::Type kv_type, kv::parse_kv_type(o.kv_type));
  KILN_TRY(rt.seq, engine::SequenceRunner::create(*rt.model, *rt.backend, o.n_ctx, 512, kv_type,
                                                  /*all_logits=*/!o.dump_dir.empty(), o.mesh));
  log::info("{}", rt.backend->description());
  log::info("{}", rt.seq->plan().to_string());
  rt.eog = engine::end_of_generation_ids(rt.tokenizer);
  *load_seconds = seconds_since(t0);
  return rt;
}

// Appends `tokens` and generates until an end-of-generation token, a stop string or
// n_predict tokens, streaming text through `emit`. Returns the generated text.
// Prefills `tokens` with every intermediate recorded, writes them (and the logits of every
// row) under o.dump_dir, and returns the last row's logits.
Expected<std::span<const float>> append_dumped(Runtime& rt, const RunOptions& o,
                                               std::span<const int32_t> tokens) {
  ActivationRecorder rec;
  rt.seq->set_dump(rec.callback());
  rt.seq->set_keep_all_logits(true);
  const size_t start = rt.seq->tokens().size();
  auto logits = rt.seq->append(tokens);
  rt.seq->set_dump({});
  rt.seq->set_keep_all_logits(false);
  if (!logits.ok()) return logits;
  const model::HParams& hp = rt.model->hparams();
  const std::vector<float>& all = rt.seq->all_logits();
  rec.add("logits", -1, all.data(), static_cast<int64_t>(tokens.size()), hp.n_vocab);
  nlohmann::ordered_json meta;
  meta["format"] = "npy";
  meta["model"] = o.model;
  meta["arch"] = hp.arch;
  meta["first_position"] = start;
  meta["tokens"] = std::vector<int32_t>(tokens.begin(), tokens.end());
  KILN_TRY_STATUS(rec.write(o.dump_dir, std::move(meta)));
  log::info("dumped {} activations of {} tokens to {}", rec.size(), tokens.size(), o.dump_dir);
  return logits;
}

// Where --grammar / --json-schema applies in a reply to `prompt`: as kiln serve does
// (server::exempt_reasoning), a thinking block the template lets the model open is free and the
// grammar starts after it. `templated`: the prompt was rendered by the chat template (--chat);
// else it is the -p text as given, which opens the block only when it ends with the open tag.
engine::GrammarStart grammar_start(const Runtime& rt, std::string_view prompt, bool templated) {
  engine::GenerationRequest request;
  request.grammar = rt.constraint;
  chat::ParserConfig config = chat::config_for_template(rt.chat_template);
  if (!templated) config.reasoning_open_at_start = false;
  chat::adjust_for_prompt(config, prompt);
  server::exempt_reasoning(config, prompt, &request);
  return request.grammar_start;
}

Expected<std::string> generate(Runtime& rt, const RunOptions& o, engine::Sampler& sampler,
                               std::span<const int32_t> tokens, std::string_view prompt,
                               bool templated, Stats& stats) {
  auto t0 = Clock::now();
  // Only the first prompt is dumped (a chat's later turns are not).
  const bool dump = !o.dump_dir.empty() && rt.seq->tokens().empty();
  // A plain greedy reply (no grammar) takes each step's argmax where the logits are: 4 bytes
  // back a token instead of the vocabulary's logits, and no pass over them on the host.
  const bool device_greedy = !rt.constraint && engine::is_plain_greedy(sampler.params());
  std::span<const float> logits;
  int32_t next_id = -1;  // the device's argmax of the last step, when it gave one
  if (device_greedy && !dump) {
    KILN_TRY(next_id, rt.seq->append_argmax(tokens));
  } else {
    KILN_TRY(logits, dump ? append_dumped(rt, o, tokens) : rt.seq->append(tokens));
  }
  stats.num_prompt_tokens += static_cast<int64_t>(tokens.size());
  stats.prompt_seconds += seconds_since(t0);

  tokenizer::StreamDecoder decoder(rt.tokenizer, /*skip_special=*/true);
  engine::StopMatcher stop(o.stops);
  const engine::StopTokens eog(rt.eog);
  std::string out;
  // --grammar / --json-schema: each reply goes through the engine's constraint gate (the
  // thinking block free, the grammar from its end).
  std::unique_ptr<engine::ConstraintGate> gate;
  if (rt.constraint) {
    gate = std::make_unique<engine::ConstraintGate>(
        rt.constraint, grammar_start(rt, prompt, templated),
        [&rt](int32_t id) { return rt.tokenizer.token_piece(id); }, rt.eog);
  }
  auto emit = [&](const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    out += text;
  };
  t0 = Clock::now();
  bool stopped = false;
  for (int32_t i = 0; i < o.n_predict && !stopped; ++i) {
    if (g_stop_reply != 0) break;  // Ctrl-C in a chat
    if (static_cast<int64_t>(rt.seq->tokens().size()) >= o.n_ctx) {
      // On a line of its own, never glued to the reply.
      std::fflush(stdout);
      fmt::print(stderr, "\nkiln: the context ({} tokens) is full; the reply stops here\n",
                 o.n_ctx);
      break;
    }
    engine::SampleResult r;
    if (next_id >= 0) {
      r.token = next_id;
    } else {
      auto draw = [&](std::span<const float> row, std::span<const uint64_t> allowed) {
        return sampler.sample(row, rt.seq->tokens(), allowed);
      };
      if (gate) {
        std::optional<engine::SampleResult> g = gate->sample(logits, draw);
        if (!g) {
          std::fflush(stdout);
          fmt::print(stderr, "\nkiln: the grammar allows no further token; the reply stops here\n");
          break;
        }
        r = std::move(*g);
      } else {
        r = draw(logits, {});
      }
    }
    if (!o.ignore_eos && eog.contains(r.token)) break;
    stats.num_generated++;
    const engine::StopMatcher::Result s = stop.feed(decoder.push(r.token));
    emit(s.text);
    stopped = s.stopped;
    if (stopped || i + 1 == o.n_predict) {
      // The last token is not run through the model: nothing reads its logits.
      break;
    }
    const std::span<const int32_t> step(&r.token, 1);
    if (device_greedy) {
      auto next = rt.seq->append_argmax(step);
      if (!next.ok()) {
        log::warn("{}", next.error().message);
        break;
      }
      next_id = *next;
    } else {
      auto next = rt.seq->append(step);
      if (!next.ok()) {
        log::warn("{}", next.error().message);
        break;
      }
      logits = *next;
    }
  }
  if (!stopped) emit(stop.feed(decoder.flush()).text + stop.flush());
  stats.generate_seconds += seconds_since(t0);
  return out;
}

void print_stats(double load_s, const Stats& s) {
  fmt::print(stderr,
             "\nkiln: load {:.2f} s | prompt {} tokens, {:.2f} s, {:.1f} tok/s | "
             "generation {} tokens, {:.2f} s, {:.1f} tok/s\n",
             load_s, s.num_prompt_tokens, s.prompt_seconds,
             s.prompt_seconds > 0 ? s.num_prompt_tokens / s.prompt_seconds : 0.0, s.num_generated,
             s.generate_seconds,
             s.generate_seconds > 0 ? s.num_generated / s.generate_seconds : 0.0);
}

// Renders the conversation and returns the tokens that are not in the cache yet (the cache
// keeps the longest common prefix, so each turn only prefills what is new).
Expected<std::vector<int32_t>> chat_turn_tokens(Runtime& rt, const nlohmann::ordered_json& msgs,
                                                std::string* rendered) {
  // As kiln serve does: control-token text typed in a message stays text.
  KILN_TRY(server::ChatPrompt prompt,
           server::chat_prompt(rt.tokenizer, rt.chat_template, msgs, {}, false));
  *rendered = prompt.text;
  const std::vector<int32_t>& ids = prompt.tokens;
  const std::vector<int32_t>& cached = rt.seq->tokens();
  size_t common = 0;
  while (common < cached.size() && common < ids.size() && cached[common] == ids[common]) ++common;
  if (common == ids.size() && common > 0) --common;  // always run at least one token
  rt.seq->truncate(static_cast<int32_t>(common));
  return std::vector<int32_t>(ids.begin() + static_cast<long>(common), ids.end());
}

// Drops the oldest turns (keeping a system prompt) until the conversation's prompt leaves room
// for a reply (a quarter of the context, or -n when smaller), with a notice on stderr. Fails
// when the last message alone does not fit.
Status fit_context(Runtime& rt, const RunOptions& o, nlohmann::ordered_json& msgs) {
  const int64_t room = std::min<int64_t>(o.n_predict, std::max<int64_t>(o.n_ctx / 4, 1));
  int num_dropped = 0;
  for (;;) {
    KILN_TRY(server::ChatPrompt prompt,
             server::chat_prompt(rt.tokenizer, rt.chat_template, msgs, {}, false));
    if (static_cast<int64_t>(prompt.tokens.size()) + room <= o.n_ctx) break;
    const size_t first = !msgs.empty() && msgs[0]["role"] == "system" ? 1 : 0;
    if (msgs.size() <= first + 1)
      return err("the message is {} tokens, more than the context ({}) leaves for it",
                 prompt.tokens.size(), o.n_ctx);
    // One turn: a user message and the replies up to the next user message.
    size_t end = first + 1;
    while (end + 1 < msgs.size() && msgs[end]["role"] != "user") ++end;
    msgs.erase(msgs.begin() + static_cast<long>(first), msgs.begin() + static_cast<long>(end));
    ++num_dropped;
  }
  if (num_dropped > 0)
    fmt::print(stderr, "kiln: the context is full: dropped the oldest {} turn(s)\n", num_dropped);
  return {};
}

int run_chat(Runtime& rt, const RunOptions& o, engine::Sampler& sampler, Stats& stats) {
  std::signal(SIGINT, on_chat_sigint);
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  if (!o.system.empty()) msgs.push_back({{"role", "system"}, {"content", o.system}});
  std::string line;
  std::string first = o.prompt;
  for (;;) {
    if (first.empty()) {
      fmt::print(stderr, "\n> ");
      if (!std::getline(std::cin, line)) break;
      if (line == "/exit" || line == "/quit") break;
      if (line.empty()) continue;
    } else {
      line = std::exchange(first, "");
    }
    msgs.push_back({{"role", "user"}, {"content", line}});
    if (Status st = fit_context(rt, o, msgs); !st.ok()) {
      fmt::print(stderr, "kiln run: {}\n", st.error().message);
      msgs.erase(msgs.size() - 1);
      continue;
    }
    std::string rendered;
    auto tokens = chat_turn_tokens(rt, msgs, &rendered);
    if (!tokens.ok()) {
      fmt::print(stderr, "kiln run: {}\n", tokens.error().message);
      return 1;
    }
    g_stop_reply = 0;
    g_in_reply = 1;
    auto reply = generate(rt, o, sampler, *tokens, rendered, /*templated=*/true, stats);
    g_in_reply = 0;
    if (!reply.ok()) {
      fmt::print(stderr, "kiln run: {}\n", reply.error().message);
      return 1;
    }
    msgs.push_back({{"role", "assistant"}, {"content", *reply}});
    fmt::print("\n");
    if (g_stop_reply != 0) {
      fmt::print(stderr, "kiln: reply stopped (Ctrl-C again at the prompt exits)");
      if (!o.no_stats) print_stats(0, stats);
    }
  }
  return 0;
}

int run(RunOptions o) {
  if (!o.chat && o.prompt.empty() && o.prompt_file.empty()) {
    fmt::print(stderr, "kiln run: give a prompt (-p TEXT or -f FILE) or --chat\n");
    return 2;
  }
  // The sampling flags are checked before the model loads (the vocabulary size only
  // matters to logit biases, which the command line does not set).
  if (Status st = engine::validate(o.sampling, 1); !st.ok()) {
    fmt::print(stderr, "kiln run: {}\n", st.error().message);
    return 2;
  }
  if (auto kv_type = kv::parse_kv_type(o.kv_type); !kv_type.ok()) {
    fmt::print(stderr, "kiln run: --kv-type: {}\n", kv_type.error().message);
    return 2;
  }
  if (!o.prompt_file.empty()) {
    auto t = read_text_file(o.prompt_file);
    if (!t.ok()) {
      fmt::print(stderr, "kiln run: {}\n", t.error().message);
      return 1;
    }
    o.prompt = std::move(*t);
  }
  auto path = model_path_or_default(o.model);
  if (!path.ok()) {
    fmt::print(stderr, "kiln run: {}\n", path.error().message);
    return 1;
  }
  o.model = *path;
  o.sampling.seed = o.seed >= 0 ? static_cast<uint64_t>(o.seed) : std::random_device{}();
  double load_s = 0;
  auto rt = load(o, &load_s);
  if (!rt.ok()) {
    fmt::print(stderr, "kiln run: {}\n", rt.error().message);
    return 1;
  }
  if (!o.grammar_file.empty() || !o.json_schema_file.empty()) {
    const bool gbnf = !o.grammar_file.empty();
    const std::string& file = gbnf ? o.grammar_file : o.json_schema_file;
    auto text = read_text_file(file);
    if (!text.ok()) {
      fmt::print(stderr, "kiln run: {}\n", text.error().message);
      return 2;
    }
    grammar::ConstraintSpec spec;
    spec.kind =
        gbnf ? grammar::ConstraintSpec::Kind::kGbnf : grammar::ConstraintSpec::Kind::kJsonSchema;
    spec.text = std::move(*text);
    auto g = grammar::compile_constraint(spec);
    if (!g.ok()) {
      fmt::print(stderr, "kiln run: {}: {}\n", file, g.error().message);
      return 2;
    }
    auto compiled = grammar::CompiledGrammar::create(
        std::move(g).value(), grammar::TokenIndex::create(rt->tokenizer, rt->eog));
    if (!compiled.ok()) {
      fmt::print(stderr, "kiln run: {}: {}\n", file, compiled.error().message);
      return 2;
    }
    rt->constraint = std::move(compiled).value();
  }
  auto sampler =
      engine::Sampler::create(o.sampling, static_cast<int32_t>(rt->model->hparams().n_vocab));
  if (!sampler.ok()) {
    fmt::print(stderr, "kiln run: {}\n", sampler.error().message);
    return 2;
  }
  log::info("seed {}", o.sampling.seed);
  Stats stats;
  int rc = 0;
  if (o.chat) {
    rc = run_chat(*rt, o, *sampler, stats);
  } else {
    auto ids = rt->tokenizer.encode(o.prompt, true, true);
    if (!ids.ok()) {
      fmt::print(stderr, "kiln run: {}\n", ids.error().message);
      return 1;
    }
    auto text = generate(*rt, o, *sampler, *ids, o.prompt, /*templated=*/false, stats);
    if (!text.ok()) {
      fmt::print(stderr, "kiln run: {}\n", text.error().message);
      return 1;
    }
    fmt::print("\n");
  }
  if (!o.no_stats) print_stats(load_s, stats);
  return rc;
}

}  // namespace

RunFn add_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Generate text from a prompt, or chat (--chat)");
  auto o = std::make_shared<RunOptions>();
  // llama-cli's defaults.
  o->sampling.temperature = 0.8f;
  o->sampling.top_k = 40;
  o->sampling.top_p = 0.95f;
  o->sampling.min_p = 0.05f;
  cmd->add_option("-m,--model", o->model, kDefaultModelHelp);
  cmd->add_option("-p,--prompt", o->prompt, "prompt text (with --chat: the first message)");
  cmd->add_option("-f,--file", o->prompt_file, "read the prompt from a file ('-': stdin)");
  add_ranged(cmd, "-n,--n-predict", o->n_predict, 1, kMaxTokens, "tokens to generate");
  add_ranged(cmd, "-c,--ctx", o->n_ctx, 1, kMaxContext, "context length");
  add_threads_flag(cmd, o->threads);
  cmd->add_option("--device", o->device, "cpu, cuda, cuda:N or auto (cuda when a GPU is found)")
      ->capture_default_str();
  add_mesh_flags(cmd, o->mesh);
  add_deterministic_flag(cmd, o->deterministic);
  cmd->add_option("--kv-type", o->kv_type,
                  "KV cache type: f16, f32 or q8_0 (q8_0 needs head dims that are multiples of 32)")
      ->capture_default_str();
  cmd->add_option("--temp", o->sampling.temperature, "temperature (0 = greedy)")
      ->capture_default_str();
  add_ranged(cmd, "--top-k", o->sampling.top_k, 0, INT32_MAX, "top-k (0 = off)");
  cmd->add_option("--top-p", o->sampling.top_p, "top-p (1 = off)")->capture_default_str();
  cmd->add_option("--min-p", o->sampling.min_p, "min-p (0 = off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", o->sampling.repetition_penalty, "1 = off")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", o->sampling.presence_penalty)->capture_default_str();
  cmd->add_option("--frequency-penalty", o->sampling.frequency_penalty)->capture_default_str();
  add_ranged(cmd, "--seed", o->seed, -1, INT64_MAX, "random seed (-1: random)");
  cmd->add_option("--stop", o->stops, "stop string (repeatable)");
  cmd->add_flag("--chat", o->chat, "chat with the model's template; /exit ends");
  cmd->add_option("--system", o->system, "system prompt for --chat");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "keep generating past end-of-generation tokens");
  cmd->add_flag("--no-stats", o->no_stats, "do not print timings");
  auto* grammar_opt = cmd->add_option("--grammar", o->grammar_file,
                                      "constrain the output to a GBNF grammar read from FILE");
  cmd->add_option("--json-schema", o->json_schema_file,
                  "constrain the output to JSON valid against the schema in FILE")
      ->excludes(grammar_opt);
  cmd->add_option("--dump-activations", o->dump_dir,
                  "write the prompt's intermediates (.npy per tensor + index.json) to DIR");
  return [o]() { return run(*o); };
}

}  // namespace kiln::cli
