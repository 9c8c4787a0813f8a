// What the OpenAI surfaces (chat and completions) write alike: the response skeleton, the
// usage object, and the end of a stream that failed.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/server/errors.h"
#include "kiln/server/generation.h"

namespace kiln::server {

// {"id", "object", "created", "model", "system_fingerprint"}: the head of every response
// and stream chunk.
Json openai_base(const std::string& id, const char* object, int64_t created,
                 const std::string& model);

// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details":
// {"cached_tokens"}}.
Json openai_usage(int32_t num_prompt, int32_t num_completion, int32_t num_cached);

// An error after the stream began: the envelope as a data frame, then [DONE].
void write_openai_stream_error(HttpExchange& ex, const ApiError& error);

}  // namespace kiln::server
