// POST /v1/embeddings (OpenAI): the request's parts as pure functions, tested without an
// engine. Each input becomes its own engine request (GenerationRequest::embed), batched by the
// engine with everything else; the pooled vectors come back in input order, cut to
// `dimensions` (Matryoshka) and L2-normalized here.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/server/errors.h"
#include "kiln/tokenizer/tokenizer.h"

namespace kiln::server {

struct EmbeddingsRequest {
  std::vector<std::vector<int32_t>> inputs;  // token ids of each input, in request order
  std::optional<int32_t> dimensions;         // keep the leading values (Matryoshka)
  bool base64 = false;                       // encoding_format "base64"
};

// Reads `input` (a string, a list of strings, a list of token ids, or a list of lists of
// token ids; strings are tokenized with the vocabulary's BOS/EOS rule), `dimensions` (an
// integer in [1, width]) and `encoding_format` ("float" or "base64"). Errors name the field:
// a missing or empty input, an empty string or token list, a token id outside the
// vocabulary, a bad dimensions or encoding_format.
std::variant<EmbeddingsRequest, ApiError> parse_embeddings_request(
    const nlohmann::ordered_json& body, const tokenizer::Tokenizer& tok, int32_t width);

// The leading `dimensions` values of a pooled vector (all when unset), L2-normalized.
std::vector<float> finish_embedding(std::vector<float> pooled, std::optional<int32_t> dimensions);

// base64 of the little-endian float32 bytes, as OpenAI's encoding_format "base64".
std::string embedding_base64(std::span<const float> values);

// The response body: {"object":"list","data":[{"object":"embedding","index":i,"embedding":
// [...] or "<base64>"}],"model":...,"usage":{"prompt_tokens","total_tokens"}}. Floats are
// written in their shortest round-trip form.
std::string embeddings_response(const std::vector<std::vector<float>>& embeddings, bool base64,
                                const std::string& model, int64_t num_prompt_tokens);

}  // namespace kiln::server
