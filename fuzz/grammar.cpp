// libFuzzer target for the output constraints: arbitrary bytes as what a request's
// response_format / guided_json, guided_regex, guided_grammar and tools carry, compiled, then
// run over kiln-tiny's vocabulary. Compiling must answer (a grammar or an error) in bounded
// time and memory; a compiled grammar then reads the input's sample text and fills token masks
// along the way, and every mask must equal the token-by-token definition on the tokens it is
// checked against (an allowed token is accepted, a refused one is not). One traps otherwise,
// as does anything ASan or UBSan sees.
//   make fuzz-grammar FUZZ_SECONDS=60
// Input: the first byte picks the kind and whether JSON is compact; the constraint's text runs
// to the first NUL byte, the sample text after it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/gguf/gguf.h"
#include "kiln/grammar/constraint.h"
#include "kiln/grammar/matcher.h"
#include "kiln/grammar/token_index.h"
#include "kiln/tokenizer/gguf_vocab.h"
#include "kiln/tokenizer/tokenizer.h"

namespace {

using namespace kiln;

struct Fixture {
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::shared_ptr<const grammar::TokenIndex> index;
};

const Fixture& fixture() {
  static const Fixture* f = [] {
    auto file = gguf::File::open(std::string(KILN_SOURCE_DIR) + "/models/kiln-tiny.gguf");
    if (!file.ok()) __builtin_trap();
    auto vocab = tokenizer::load_vocab(**file);
    if (!vocab.ok()) __builtin_trap();
    auto tok = tokenizer::Tokenizer::create(std::move(vocab).value());
    if (!tok.ok()) __builtin_trap();
    auto* fx = new Fixture;
    fx->tok = std::make_unique<tokenizer::Tokenizer>(std::move(tok).value());
    fx->index = grammar::TokenIndex::create(*fx->tok);
    return fx;
  }();
  return *f;
}

bool allowed(std::span<const uint64_t> mask, int32_t id) {
  return (mask[id >> 6] >> (id & 63)) & 1;
}

// The mask against accept_token on a spread of ids (a whole vocabulary per mask is too slow
// for a fuzzer): every id allowed must be accepted and every id refused must not be.
void check_mask(grammar::Matcher& m, uint32_t salt) {
  std::vector<uint64_t> mask(m.mask_words());
  m.fill_mask(mask);
  const int32_t n = fixture().index->num_tokens();
  for (int32_t k = 0; k < 24; ++k) {
    const auto id = static_cast<int32_t>((salt + static_cast<uint32_t>(k) * 2654435761u) % n);
    const bool ok = m.accept_token(id);
    if (ok != allowed(mask, id)) __builtin_trap();
    if (ok) m.rollback(1);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t nul = input.find('\0');
  const std::string_view text = input.substr(0, nul);
  const std::string_view sample = nul == std::string_view::npos ? "" : input.substr(nul + 1);

  grammar::ConstraintSpec spec;
  static constexpr grammar::ConstraintSpec::Kind kKinds[] = {
      grammar::ConstraintSpec::Kind::kJsonSchema, grammar::ConstraintSpec::Kind::kRegex,
      grammar::ConstraintSpec::Kind::kGbnf, grammar::ConstraintSpec::Kind::kToolCalls};
  spec.kind = kKinds[data[0] % 4];
  spec.json.compact = (data[0] & 4) == 0;
  spec.text = text;
  auto g = grammar::compile_constraint(spec);
  if (!g.ok()) return 0;
  auto compiled = grammar::CompiledGrammar::create(std::move(g).value(), fixture().index);
  if (!compiled.ok()) return 0;

  grammar::Matcher m(*compiled);
  uint32_t salt = 0x9E3779B9u;
  check_mask(m, salt);
  // The sample in pieces of 1-8 bytes, a mask checked after each piece accepted.
  for (size_t i = 0; i < sample.size() && i < 256;) {
    const size_t len = 1 + (static_cast<uint8_t>(sample[i]) & 7);
    const std::string_view piece = sample.substr(i, len);
    i += len;
    if (!m.accept_bytes(piece)) continue;
    salt = salt * 31 + static_cast<uint32_t>(i);
    if (m.finished()) break;
    check_mask(m, salt);
  }
  return 0;
}
