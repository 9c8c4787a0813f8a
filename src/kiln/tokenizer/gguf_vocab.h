// The vocabulary's GGUF form: the tokenizer.ggml.* keys (and tokenizer.chat_template) that
// llama.cpp's converter writes and its loader reads.
#pragma once

#include "kiln/gguf/gguf.h"
#include "kiln/gguf/writer.h"
#include "kiln/tokenizer/vocab.h"
#include "kiln/util/status.h"

namespace kiln::tokenizer {

// Reads the vocabulary; fails naming the key that is missing or has the wrong type.
Expected<VocabData> load_vocab(const gguf::File& file);

// Writes every field of `vocab` that is set (optional ids and flags only when present,
// scores/merges/token_type only when non-empty).
void write_vocab(gguf::Writer& writer, const VocabData& vocab);

}  // namespace kiln::tokenizer
