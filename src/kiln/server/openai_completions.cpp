// POST /v1/completions (OpenAI legacy Completions): a prompt string, a token array, or a list
// of either (one choice per prompt, times n), echo, legacy logprobs (tokens, token_logprobs,
// top_logprobs, text_offset), stream.
#include <fmt/format.h>

#include <ctime>

#include "kiln/engine/sampler.h"
#include "kiln/server/constraint.h"
#include "kiln/server/generation.h"
#include "kiln/server/openai_common.h"
#include "kiln/util/utf8.h"

namespace kiln::server {

namespace {

using engine::FinishEvent;
using engine::TokenEvent;

struct Prompt {
  std::vector<int32_t> tokens;
  std::string text;  // what echo prints
};

size_t num_code_points(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::variant<std::vector<Prompt>, ApiError> read_prompts(const Json& body,
                                                         const ServerContext& ctx) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return invalid_request("'prompt' is required", "prompt");
  const tokenizer::Tokenizer& tok = ctx.tokenizer;
  auto from_text = [&](const std::string& text) -> std::variant<Prompt, ApiError> {
    auto ids = tok.encode(text, /*add_special=*/true, /*parse_special=*/true);
    if (!ids.ok()) return invalid_request(ids.error().message, "prompt");
    return Prompt{std::move(ids).value(), text};
  };
  auto from_ids = [&](const Json& arr) -> std::variant<Prompt, ApiError> {
    Prompt p;
    for (const Json& v : arr) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= tok.num_tokens())
        return invalid_request(
            fmt::format("'prompt' token ids must be integers in [0, {})", tok.num_tokens()),
            "prompt");
      p.tokens.push_back(v.get<int32_t>());
    }
    p.text = tok.decode(p.tokens);
    return p;
  };
  std::vector<std::variant<Prompt, ApiError>> made;
  if (it->is_string()) {
    made.push_back(from_text(it->get<std::string>()));
  } else if (it->is_array() && !it->empty() && (*it)[0].is_number()) {
    made.push_back(from_ids(*it));
  } else if (it->is_array() && !it->empty()) {
    for (const Json& p : *it) {
      if (p.is_string())
        made.push_back(from_text(p.get<std::string>()));
      else if (p.is_array() && !p.empty())
        made.push_back(from_ids(p));
      else
        return invalid_request(
            "'prompt' must be a string, an array of token ids, or a list of "
            "either",
            "prompt");
    }
  } else {
    return invalid_request("'prompt' must be a string, an array of token ids, or a list of either",
                           "prompt");
  }
  std::vector<Prompt> prompts;
  for (auto& m : made) {
    if (auto* e = std::get_if<ApiError>(&m)) return *e;
    Prompt p = std::get<Prompt>(std::move(m));
    if (p.tokens.empty()) return invalid_request("'prompt' is empty", "prompt");
    prompts.push_back(std::move(p));
  }
  return prompts;
}

// Legacy logprobs of one choice, built as tokens arrive.
struct LegacyLogprobs {
  Json tokens = Json::array();
  Json token_logprobs = Json::array();
  Json top_logprobs = Json::array();
  Json text_offset = Json::array();

  void add_prompt(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& ids) {
    size_t offset = 0;
    for (int32_t id : ids) {
      const int32_t one[1] = {id};
      const std::string text = tok.decode(one);
      tokens.push_back(text);
      token_logprobs.push_back(nullptr);  // prompt logprobs are not computed
      top_logprobs.push_back(nullptr);
      text_offset.push_back(offset);
      offset += num_code_points(text);
    }
  }
  void add(const tokenizer::Tokenizer& tok, const TokenEvent& t, size_t offset, bool with_top) {
    const int32_t one[1] = {t.token};
    tokens.push_back(tok.decode(one));
    token_logprobs.push_back(std::isfinite(t.logprob) ? t.logprob : -9999.0f);
    if (with_top) {
      Json top = Json::object();
      for (const auto& [id, lp] : t.top) {
        const int32_t other[1] = {id};
        top[tok.decode(other)] = std::isfinite(lp) ? lp : -9999.0f;
      }
      top_logprobs.push_back(std::move(top));
    } else {
      top_logprobs.push_back(nullptr);
    }
    text_offset.push_back(offset);
  }
  Json take() {
    Json j = Json::object();
    j["tokens"] = std::move(tokens);
    j["token_logprobs"] = std::move(token_logprobs);
    j["top_logprobs"] = std::move(top_logprobs);
    j["text_offset"] = std::move(text_offset);
    *this = LegacyLogprobs{};
    return j;
  }
};

struct CompletionJob {
  ServerContext& ctx;
  std::string id;
  int64_t created = 0;
  bool echo = false;
  bool logprobs = false;
  bool top = false;
  bool include_usage = false;
  int32_t num_prompt_tokens = 0;             // all prompts
  int32_t n = 1;                             // choices per prompt
  std::vector<const Prompt*> choice_prompt;  // per choice

  Json base() const { return openai_base(id, "text_completion", created, ctx.options.model_name); }
  Json usage(int32_t num_completion, int32_t num_cached) const {
    return openai_usage(num_prompt_tokens, num_completion, num_cached);
  }
};

struct ChoiceState {
  std::string text;  // includes the echoed prompt
  LegacyLogprobs logprobs;
  size_t num_chars = 0;  // code points of text
  FinishEvent finish;
};

HandlerResult respond_whole(CompletionJob& job, MultiRun& run, HttpExchange& ex) {
  std::vector<ChoiceState> states(run.size());
  for (size_t i = 0; i < states.size(); ++i) {
    if (!job.echo) continue;
    states[i].text = job.choice_prompt[i]->text;
    states[i].num_chars = num_code_points(states[i].text);
    if (job.logprobs)
      states[i].logprobs.add_prompt(job.ctx.tokenizer, job.choice_prompt[i]->tokens);
  }
  while (auto ev = run.next(ex)) {
    ChoiceState& s = states[static_cast<size_t>(ev->first)];
    if (auto* t = std::get_if<TokenEvent>(&ev->second)) {
      if (job.logprobs) s.logprobs.add(job.ctx.tokenizer, *t, s.num_chars, job.top);
      s.text += t->text;
      s.num_chars += num_code_points(t->text);
    } else {
      s.finish = std::get<FinishEvent>(std::move(ev->second));
      s.text += s.finish.text;
      if (s.finish.reason == engine::FinishReason::kError ||
          s.finish.reason == engine::FinishReason::kCancelled)
        return generation_error(s.finish);
    }
  }
  if (run.abort_reason() == AbortReason::kServerShutdown)
    return unavailable("The server is shutting down");
  if (run.abort_reason() == AbortReason::kClientGone) return Streamed{};
  Json choices = Json::array();
  int32_t num_completion = 0;
  int32_t num_cached = 0;
  for (size_t i = 0; i < states.size(); ++i) {
    ChoiceState& s = states[i];
    Json c = Json::object();
    c["text"] = s.text;
    c["index"] = i;
    c["logprobs"] = job.logprobs ? s.logprobs.take() : Json(nullptr);
    c["finish_reason"] = finish_reason_name(s.finish.reason);
    choices.push_back(std::move(c));
    num_completion += s.finish.usage.completion_tokens;
    if (i % static_cast<size_t>(job.n) == 0) num_cached += s.finish.usage.cached_tokens;
  }
  Json body = job.base();
  body["choices"] = std::move(choices);
  body["usage"] = job.usage(num_completion, num_cached);
  job.ctx.metrics.add_tokens(job.num_prompt_tokens, num_completion);
  return json_response(body);
}

HandlerResult respond_stream(CompletionJob& job, MultiRun& run, HttpExchange& ex) {
  ex.begin_stream(200, "text/event-stream");
  std::vector<ChoiceState> states(run.size());
  auto send = [&](size_t index, std::string text, Json logprobs, const char* finish) {
    Json c = Json::object();
    c["text"] = std::move(text);
    c["index"] = index;
    c["logprobs"] = std::move(logprobs);
    c["finish_reason"] = finish ? Json(finish) : Json(nullptr);
    Json chunk = job.base();
    chunk["choices"] = Json::array({std::move(c)});
    if (job.include_usage) chunk["usage"] = nullptr;
    ex.write_chunk(sse_data(dump_json(chunk)));
  };
  for (size_t i = 0; i < states.size() && job.echo; ++i) {
    ChoiceState& s = states[i];
    s.num_chars = num_code_points(job.choice_prompt[i]->text);
    if (job.logprobs) s.logprobs.add_prompt(job.ctx.tokenizer, job.choice_prompt[i]->tokens);
    send(i, job.choice_prompt[i]->text, job.logprobs ? s.logprobs.take() : Json(nullptr), nullptr);
  }
  int32_t num_completion = 0;
  int32_t num_cached = 0;
  while (auto ev = run.next(ex)) {
    const size_t index = static_cast<size_t>(ev->first);
    ChoiceState& s = states[index];
    if (auto* t = std::get_if<TokenEvent>(&ev->second)) {
      if (job.logprobs) s.logprobs.add(job.ctx.tokenizer, *t, s.num_chars, job.top);
      s.num_chars += num_code_points(t->text);
      if (!t->text.empty() || job.logprobs)
        send(index, t->text, job.logprobs ? s.logprobs.take() : Json(nullptr), nullptr);
      continue;
    }
    const FinishEvent& f = std::get<FinishEvent>(ev->second);
    if (f.reason == engine::FinishReason::kError || f.reason == engine::FinishReason::kCancelled) {
      write_openai_stream_error(ex, generation_error(f));
      return Streamed{};
    }
    send(index, f.text, job.logprobs ? s.logprobs.take() : Json(nullptr),
         finish_reason_name(f.reason));
    num_completion += f.usage.completion_tokens;
    // Like prompt_tokens, a prompt's cached tokens count once however many choices it has.
    if (index % static_cast<size_t>(job.n) == 0) num_cached += f.usage.cached_tokens;
  }
  if (run.abort_reason() == AbortReason::kServerShutdown) {
    write_openai_stream_error(ex, unavailable("The server is shutting down"));
    return Streamed{};
  }
  if (run.abort_reason() == AbortReason::kClientGone) return Streamed{};
  if (job.include_usage) {
    Json chunk = job.base();
    chunk["choices"] = Json::array();
    chunk["usage"] = job.usage(num_completion, num_cached);
    ex.write_chunk(sse_data(dump_json(chunk)));
  }
  ex.write_chunk(kSseDone);
  job.ctx.metrics.add_tokens(job.num_prompt_tokens, num_completion);
  return Streamed{};
}

HandlerResult handle_completions(ServerContext& ctx, const HttpRequest& req, HttpExchange& ex) {
  auto parsed = parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& body = std::get<Json>(parsed);
  if (auto e = check_model(body, ctx)) return *e;
  CommonParams params;
  if (auto e = parse_common(body, Api::kCompletions, ctx, &params)) return *e;
  if (auto e = read_constraint(body, ctx, &params.request)) return *e;
  CompletionJob job{ctx};
  if (auto it = body.find("echo"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return invalid_request("'echo' must be a boolean", "echo");
    job.echo = it->get<bool>();
  }
  if (auto it = body.find("suffix"); it != body.end() && !it->is_null())
    return not_supported("'suffix' (insertion) is not supported", "suffix");
  if (auto it = body.find("best_of");
      it != body.end() && !it->is_null() && !(it->is_number_integer() && it->get<int64_t>() == 1))
    return not_supported("'best_of' other than 1 is not supported", "best_of");
  if (auto e = check_ready(ctx)) return *e;
  auto read = read_prompts(body, ctx);
  if (auto* e = std::get_if<ApiError>(&read)) return *e;
  const std::vector<Prompt>& prompts = std::get<std::vector<Prompt>>(read);
  if (auto e = check_num_choices(ctx, prompts.size(), params.n)) return *e;

  job.id = random_id("cmpl-");
  job.created = static_cast<int64_t>(std::time(nullptr));
  job.logprobs = params.legacy_logprobs >= 0;
  job.top = params.legacy_logprobs > 0;
  job.include_usage = params.include_usage;
  job.n = params.n;
  std::vector<engine::GenerationRequest> requests;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const int32_t num_prompt = static_cast<int32_t>(prompts[p].tokens.size());
    if (auto e = finalize_request(ctx, num_prompt, &params)) return *e;
    job.num_prompt_tokens += num_prompt;
    for (int32_t i = 0; i < params.n; ++i) {
      engine::GenerationRequest r = params.request;
      const size_t index = p * static_cast<size_t>(params.n) + static_cast<size_t>(i);
      r.request_id = index == 0 && prompts.size() == 1 && params.n == 1
                         ? req.request_id
                         : fmt::format("{}-{}", req.request_id, index);
      r.prompt_tokens = prompts[p].tokens;
      r.sampling.seed = engine::choice_seed(params.request.sampling.seed, i);
      requests.push_back(std::move(r));
      job.choice_prompt.push_back(&prompts[p]);
    }
  }
  MultiRun run(ctx);
  if (auto e = run.submit(std::move(requests))) return *e;
  return params.stream ? respond_stream(job, run, ex) : respond_whole(job, run, ex);
}

}  // namespace

void register_completions_routes(Router& router, ServerContext& ctx) {
  router.add("POST", "/v1/completions", [&ctx](const HttpRequest& req, HttpExchange& ex) {
    return handle_completions(ctx, req, ex);
  });
}

}  // namespace kiln::server
