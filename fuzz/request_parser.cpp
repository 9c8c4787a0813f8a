// libFuzzer target for the request parsers: arbitrary bytes as the body of a POST to each
// API surface (chat, completions, tokenize, detokenize, Anthropic messages, responses), dispatched
// through the real router and handlers over an engine stub that finishes every request at once.
// Request input must never produce a 5xx: one traps, as does anything ASan or UBSan sees.
//   make fuzz-requests FUZZ_SECONDS=60
// The first input byte picks the path; the rest is the body. The tokenizer and chat template
// are kiln-tiny's (models/kiln-tiny.gguf, vocab only is read).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kiln/chat/template.h"
#include "kiln/gguf/gguf.h"
#include "kiln/server/context.h"
#include "kiln/server/router.h"
#include "kiln/tokenizer/gguf_vocab.h"
#include "kiln/util/log.h"

namespace {

using namespace kiln;

class InstantEngine final : public engine::EngineApi {
 public:
  std::variant<std::shared_ptr<engine::RequestChannel>, engine::SubmitRefusal> submit(
      engine::GenerationRequest req) override {
    auto ch = std::make_shared<engine::RequestChannel>();
    engine::TokenEvent t;
    t.token = req.prompt_tokens.empty() ? 0 : req.prompt_tokens.back();
    t.text = "ok";
    ch->push(t);
    engine::FinishEvent f;
    f.reason = engine::FinishReason::kLength;
    f.usage.prompt_tokens = static_cast<int32_t>(req.prompt_tokens.size());
    f.usage.completion_tokens = 1;
    ch->push(f);
    return ch;
  }
  engine::EngineState state() const override { return engine::EngineState::kReady; }
  engine::EngineStats stats() const override { return {}; }
  int32_t context_length() const override { return 1024; }
};

class RecordingExchange final : public server::HttpExchange {
 public:
  void add_header(std::string, std::string) override {}
  bool respond(int status, std::string_view, std::string) override {
    if (status_ == 0) status_ = status;
    return true;
  }
  bool begin_stream(int status, std::string_view) override {
    if (status_ == 0) status_ = status;
    return true;
  }
  bool write_chunk(std::string_view) override { return true; }
  bool end_stream() override { return true; }
  server::AbortReason abort_reason() override { return server::AbortReason::kNone; }
  bool responded() const override { return status_ != 0; }
  int status() const override { return status_; }
  bool client_gone() const override { return false; }

 private:
  int status_ = 0;
};

struct Fixture {
  InstantEngine engine;
  std::unique_ptr<server::ServerContext> ctx;
  std::unique_ptr<server::Router> router;
};

Fixture* fixture() {
  static Fixture* f = [] {
    log::set_level("warn");  // no access-log line per input
    auto file = gguf::File::open(std::string(KILN_SOURCE_DIR) + "/models/kiln-tiny.gguf");
    if (!file.ok()) __builtin_trap();
    auto vocab = tokenizer::load_vocab(**file);
    if (!vocab.ok()) __builtin_trap();
    std::string tmpl = chat::template_or_chatml(vocab->chat_template);
    auto tok = tokenizer::Tokenizer::create(std::move(vocab).value());
    if (!tok.ok()) __builtin_trap();
    auto* fx = new Fixture;
    fx->ctx.reset(new server::ServerContext{
        fx->engine, std::move(tok).value(), std::move(tmpl), {}, {}, {}, 0, {}});
    fx->ctx->options.model_name = "kiln";
    fx->ctx->parser_config = chat::config_for_template(fx->ctx->chat_template);
    fx->router = std::make_unique<server::Router>(server::RouterOptions{});
    server::register_chat_routes(*fx->router, *fx->ctx);
    server::register_completions_routes(*fx->router, *fx->ctx);
    server::register_tokenize_routes(*fx->router, *fx->ctx);
    server::register_anthropic_routes(*fx->router, *fx->ctx);
    server::register_responses_routes(*fx->router, *fx->ctx);
    return fx;
  }();
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const char* const kPaths[] = {
      "/v1/chat/completions", "/v1/completions",      "/tokenize",
      "/detokenize",          "/v1/messages",         "/v1/messages/count_tokens",
      "/v1/responses",        "/v1/responses/compact"};
  constexpr size_t kNumPaths = sizeof(kPaths) / sizeof(kPaths[0]);
  Fixture* fx = fixture();
  server::HttpRequest req;
  req.method = "POST";
  req.path = req.target = kPaths[data[0] % kNumPaths];
  req.body.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  RecordingExchange ex;
  fx->router->dispatch(req, ex);
  if (!ex.responded() || ex.status() >= 500) __builtin_trap();
  return 0;
}
