// Vocabulary from a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json,
// optional config.json and chat_template.jinja), converted the way llama.cpp's
// convert_hf_to_gguf.py does, so the result is what a GGUF made from the same directory
// holds. Where the converter guesses, kiln reads tokenizer.json instead:
//   - the pre-tokenizer name comes from recognising tokenizer.json's pre_tokenizer pipeline
//     (its Split regexes) in kiln's table, not from hashing tokenizer output;
//   - add_bos/add_eos follow the post_processor template (what HF's encode does), unless
//     tokenizer_config.json sets add_bos_token/add_eos_token;
//   - SentencePiece-style vocabularies keep their merges, and get scores = -(rank of the
//     first merge producing the token), so a score-only reader merges in the same order.
#pragma once

#include <filesystem>
#include <optional>
#include <string_view>

#include "kiln/tokenizer/vocab.h"
#include "kiln/util/status.h"

namespace kiln::tokenizer {

// config_path: the model's config.json (its vocab_size pads the vocabulary, its bos/eos ids
// fill what tokenizer_config.json leaves unset); empty: dir/config.json when there is one.
Expected<VocabData> import_hf_tokenizer(const std::filesystem::path& dir,
                                        const std::filesystem::path& config_path = {});

// The same from the files' contents. config_json may be empty ("{}" is assumed).
// vocab_size: config.json's vocab_size when known (the vocabulary is padded to it with
// "[PAD<id>]" unused tokens, as the converter does).
Expected<VocabData> import_hf_tokenizer_json(std::string_view tokenizer_json,
                                             std::string_view config_json,
                                             std::optional<size_t> vocab_size = std::nullopt);

}  // namespace kiln::tokenizer
