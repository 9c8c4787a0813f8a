// What every API surface shares: the engine, the tokenizer, the chat template, the options
// and the metrics. Each surface file registers its routes with one register_* function.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "kiln/chat/output_parser.h"
#include "kiln/engine/api.h"
#include "kiln/grammar/constraint.h"
#include "kiln/server/metrics.h"
#include "kiln/server/router.h"
#include "kiln/server/server.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::server {

struct ServerContext {
  engine::EngineApi& engine;
  tokenizer::Tokenizer tokenizer;
  std::string chat_template;
  chat::ParserConfig parser_config;  // from the template (tool format, reasoning tags)
  ServerOptions options;
  Metrics metrics;
  int64_t created_unix = 0;               // the `created` of /v1/models
  std::atomic<uint64_t> num_requests{0};  // per-request tool-call id seeds
  // Compiled output constraints (server/constraint.cpp), built on first use.
  std::once_flag grammar_once;
  std::shared_ptr<grammar::GrammarCache> grammar_cache;
};

void register_chat_routes(Router& router, ServerContext& ctx);         // openai_chat.cpp
void register_completions_routes(Router& router, ServerContext& ctx);  // openai_completions.cpp
void register_anthropic_routes(Router& router, ServerContext& ctx);    // anthropic_messages.cpp
void register_responses_routes(Router& router, ServerContext& ctx);    // openai_responses.cpp
void register_embeddings_routes(Router& router, ServerContext& ctx);   // openai_embeddings.cpp
void register_models_routes(Router& router, ServerContext& ctx);       // models.cpp
void register_tokenize_routes(Router& router, ServerContext& ctx);     // tokenize.cpp
void register_metrics_routes(Router& router, ServerContext& ctx);      // metrics.cpp
void register_health_routes(Router& router, ServerContext& ctx);       // health.cpp

}  // namespace kiln::server
