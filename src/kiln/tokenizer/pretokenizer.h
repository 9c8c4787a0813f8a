// Pre-tokenizers: the regex splits a byte-level BPE vocabulary applies before merging.
//
// GGUF files name the pre-tokenizer (`tokenizer.ggml.pre`); llama.cpp's converter finds
// the name by hashing tokenizer output. kiln keeps one table of known pre-tokenizers, each
// described by the pipeline Hugging Face's tokenizer.json spells out (its Split regexes in
// Oniguruma syntax, Digits, ByteLevel). The importer recognises a tokenizer.json by that
// signature; at run time the same regexes are translated to PCRE2 and compiled with JIT.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/util/status.h"

namespace kiln::tokenizer {

struct PreTokenizerSpec {
  // Names as they appear in tokenizer.ggml.pre; the first is the one kiln writes.
  std::vector<std::string_view> names;
  // The tokenizer.json pre_tokenizer pipeline, in order: "Split:<regex>" (behavior
  // Isolated, not inverted), "Digits" / "Digits:individual", "ByteLevel" (use_regex false)
  // or "ByteLevel:regex" (use_regex true: the GPT-2 regex).
  std::vector<std::string_view> signature;
  // tokenizer.json model.ignore_merges: a word that is itself a token skips merging.
  bool ignore_merges = false;
  // tokenizer.json normalizer is NFC (Hugging Face normalizes; llama.cpp does not).
  bool nfc = false;
  // Default for a GGUF without tokenizer.ggml.add_bos_token (llama.cpp's per-name default).
  bool default_add_bos = false;
};

// The spec for a tokenizer.ggml.pre value, or nullptr when kiln does not know it.
const PreTokenizerSpec* find_pre_tokenizer(std::string_view name);
// All known specs (for tests and error messages).
std::span<const PreTokenizerSpec> known_pre_tokenizers();

// Translates an Oniguruma regex as tokenizer.json writes it into PCRE2 syntax with the
// meaning Hugging Face gives it: `\s` is Unicode White_Space, `(?i:...)` folds ASCII
// letters only, `^`/`$` are line anchors.
Expected<std::string> oniguruma_to_pcre2(std::string_view pattern);

// A compiled pre-tokenizer: splits text into the pieces BPE merges within.
class PreTokenizer {
 public:
  static Expected<PreTokenizer> create(const PreTokenizerSpec& spec);

  // Appends the pieces of `text` (valid UTF-8) to `out` as views into `text`. Each regex
  // in turn splits every piece into its matches and the gaps between them.
  Status split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Compiled;
  std::shared_ptr<const Compiled> compiled_;
};

}  // namespace kiln::tokenizer
