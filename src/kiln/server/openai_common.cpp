#include "kiln/server/openai_common.h"

namespace kiln::server {

Json openai_base(const std::string& id, const char* object, int64_t created,
                 const std::string& model) {
  Json j = Json::object();
  j["id"] = id;
  j["object"] = object;
  j["created"] = created;
  j["model"] = model;
  j["system_fingerprint"] = "kiln";
  return j;
}

Json openai_usage(int32_t num_prompt, int32_t num_completion, int32_t num_cached) {
  Json u = Json::object();
  u["prompt_tokens"] = num_prompt;
  u["completion_tokens"] = num_completion;
  u["total_tokens"] = num_prompt + num_completion;
  u["prompt_tokens_details"] = Json{{"cached_tokens", num_cached}};
  return u;
}

void write_openai_stream_error(HttpExchange& ex, const ApiError& error) {
  ex.write_chunk(sse_data(error_body(error)));
  ex.write_chunk(kSseDone);
}

}  // namespace kiln::server
