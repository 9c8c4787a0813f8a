// The grammar front ends at the level of strings: GBNF, regex, choice and JSON Schema accept
// what they should and reject what they should not; errors name the place.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "helpers.h"
#include "kiln/grammar/constraint.h"
#include "kiln/grammar/gbnf.h"
#include "kiln/grammar/json_schema.h"
#include "kiln/grammar/regex.h"
#include "kiln/util/utf8.h"

namespace kiln::grammar {
namespace {

using testing::matches;
using Json = nlohmann::ordered_json;

Grammar gbnf(std::string_view text) {
  auto g = parse_gbnf(text);
  EXPECT_TRUE(g.ok()) << g.error().message;
  return std::move(g).value();
}

Grammar schema(std::string_view text) {
  auto g = compile_json_schema(text);
  EXPECT_TRUE(g.ok()) << text << ": " << g.error().message;
  return std::move(g).value();
}

Grammar regex(std::string_view text) {
  auto g = compile_regex(text);
  EXPECT_TRUE(g.ok()) << g.error().message;
  return std::move(g).value();
}

TEST(Utf8Sequences, CoverRangesExactly) {
  // Every code point of a range encodes into exactly one sequence of the result.
  for (auto [lo, hi] : std::vector<std::pair<uint32_t, uint32_t>>{
           {0, 0x10FFFF}, {0x7F, 0x801}, {0xD000, 0xE100}, {0x10000, 0x10FFFF}, {0x41, 0x41}}) {
    const auto seqs = utf8_sequences(lo, hi);
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp += (cp < 0x20000 ? 1 : 97)) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      std::string enc;
      utf8::append(enc, static_cast<char32_t>(cp));
      int hits = 0;
      for (const auto& s : seqs) {
        if (s.size() != enc.size()) continue;
        bool all = true;
        for (size_t i = 0; i < s.size(); ++i) {
          const uint8_t b = static_cast<uint8_t>(enc[i]);
          all &= b >= s[i].first && b <= s[i].second;
        }
        hits += all;
      }
      ASSERT_EQ(hits, (cp >= lo && cp <= hi) ? 1 : 0) << std::hex << cp;
    }
  }
}

TEST(Gbnf, AcceptsAndRejects) {
  const Grammar g = gbnf(R"g(
# arithmetic
root  ::= expr
expr  ::= term (("+" | "-") term)*
term  ::= num | "(" expr ")"
num   ::= [0-9]+
)g");
  EXPECT_TRUE(matches(g, "1+2"));
  EXPECT_TRUE(matches(g, "(1+(22-3))-4"));
  EXPECT_FALSE(matches(g, "1+"));
  EXPECT_FALSE(matches(g, "(1"));
  EXPECT_FALSE(matches(g, "a"));
  EXPECT_FALSE(matches(g, ""));
}

TEST(Gbnf, ClassesEscapesRepetitionAndUnicode) {
  const Grammar g = gbnf(
      "root ::= [^\"\\\\]{2,3} \"\\x41\" \"é\" [α-ω]? .\n"
      "  # trailing comment\n");
  EXPECT_TRUE(matches(g, "xyAéz"));
  EXPECT_TRUE(matches(g, "日本語Aéβ!"));
  EXPECT_TRUE(matches(g,
                      "ab"
                      "A"
                      "é"
                      "😀"));
  EXPECT_FALSE(matches(g, "xAé."));      // one char before A
  EXPECT_FALSE(matches(g, "wxyzAéz"));   // four
  EXPECT_FALSE(matches(g, "x\"Aé."));    // quote excluded
  EXPECT_FALSE(matches(g, "xyAé\xff"));  // not UTF-8
  EXPECT_FALSE(matches(g, "xyAé\xce"));  // truncated code point
}

TEST(Gbnf, MultiLineRulesAndParens) {
  const Grammar g = gbnf(R"(root ::=
  "{" ws (
     pair
     ("," ws pair)*
  )? "}"
pair ::= [a-z]+ ":" ws ("true" |
  "false")
ws ::= [ ]*
)");
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_TRUE(matches(g, "{ a: true, bc:false}"));
  EXPECT_FALSE(matches(g, "{a:maybe}"));
}

TEST(Gbnf, ErrorsNameLineAndColumn) {
  auto e1 = parse_gbnf("root ::= \"a\" foo\n");
  ASSERT_TRUE(testing::fails_with(e1, "line 1 column 14"));
  EXPECT_TRUE(testing::fails_with(e1, "'foo'"));
  auto e2 = parse_gbnf("root ::= a\na ::= \"x\n");
  ASSERT_TRUE(testing::fails_with(e2, "line 2"));
  EXPECT_TRUE(testing::fails_with(e2, "unterminated"));
  auto e3 = parse_gbnf("root ::= [a-\n");
  ASSERT_FALSE(e3.ok());
  auto e4 = parse_gbnf("foo ::= \"x\"\n");
  ASSERT_TRUE(testing::fails_with(e4, "root"));
  auto e5 = parse_gbnf("root ::= \"a\"{3,1}\n");
  ASSERT_TRUE(testing::fails_with(e5, "column 13"));
}

TEST(Gbnf, RejectsLeftRecursion) {
  auto e = parse_gbnf("root ::= x\nx ::= y \"a\" | \"b\"\ny ::= \"\" | x\n");
  ASSERT_TRUE(testing::fails_with(e, "left-recursive"));
  for (const char* text : {"root ::= root \"a\" | \"b\"\n", "root ::= (\"a\"? root \"b\")?\n",
                           "root ::= x \"c\"\nx ::= \"\" | y\ny ::= x \"d\"\n"}) {
    auto r = parse_gbnf(text);
    ASSERT_TRUE(testing::fails_with(r, "left-recursive")) << text;
  }
}

// A repetition of something that may match nothing ((a*)*, ("a"?)*) is R ::= x R | "": R
// reaches itself before matching anything, but in tail position, where the automaton pushes no
// return position; it was refused as left recursion, though a valid pattern.
TEST(Grammar, RepetitionsOfNullableItemsRun) {
  const Grammar star_of_star = regex("(a*)*b");
  EXPECT_TRUE(matches(star_of_star, "b"));
  EXPECT_TRUE(matches(star_of_star, "aaab"));
  EXPECT_FALSE(matches(star_of_star, "aaa"));
  const Grammar words = regex("^(\\s*[a-z]*,?)*$");
  EXPECT_TRUE(matches(words, "ab, cd,ef"));
  EXPECT_TRUE(matches(words, ""));
  EXPECT_FALSE(matches(words, "ab;"));
  const Grammar g = gbnf("root ::= (\"a\"? \"b\"?)* \"c\"\n");
  EXPECT_TRUE(matches(g, "abbac"));
  EXPECT_TRUE(matches(g, "c"));
  EXPECT_FALSE(matches(g, "abd"));
  // Tail calls in a cycle that matches nothing: the empty language's rules, not a hang.
  const Grammar loop = gbnf("root ::= x | \"z\"\nx ::= y\ny ::= x\n");
  EXPECT_TRUE(matches(loop, "z"));
  EXPECT_FALSE(matches(loop, ""));
}

// Bounded repetitions expand into elements and helper rules: a few bytes of pattern can ask
// for millions, so lowering counts them first and fails past kMaxLoweredSize (in about the time
// the limit's worth takes), while a single large count still builds.
TEST(GrammarLimits, RepetitionsThatExpandPastTheLimitAreErrors) {
  std::string pattern;
  for (int i = 0; i < 11; ++i) pattern += "a{0,100000}";
  auto r = compile_regex(pattern);
  ASSERT_TRUE(testing::fails_with(r, "too large"));
  std::string rules = "root ::= x x x x x x x x x x x\nx ::= \"a\"{100000}\n";
  EXPECT_TRUE(parse_gbnf(rules).ok());  // x is one rule, referenced 11 times
  auto g = parse_gbnf("root ::= (\"a\"{0,99999}){0,99999}\n");
  ASSERT_TRUE(g.ok()) << g.error().message;  // 200,000 rules: within the limit
  auto big = parse_gbnf(
      "root ::= (\"a\"{0,99999}){0,99999} \"b\"{0,99999} \"c\"{0,99999} "
      "\"d\"{0,99999} \"e\"{0,99999} \"f\"{0,99999} \"g\"{0,99999} "
      "\"h\"{0,99999} \"i\"{0,99999} \"j\"{0,99999} \"k\"{0,99999}\n");
  ASSERT_TRUE(testing::fails_with(big, "too large"));
  const Grammar many = regex("a{100000}");
  EXPECT_TRUE(matches(many, std::string(100000, 'a')));
  EXPECT_FALSE(matches(many, std::string(99999, 'a')));
}

// Nullable rules are found by propagation: a chain of 100,000 rules written so that each
// becomes nullable only after the one below it (a fixed-point loop over the rules would make a
// pass per link) is checked at once, and left recursion through the chain is still caught.
TEST(GrammarLimits, LongNullableChainsAreCheckedInLinearTime) {
  constexpr int kLinks = 100000;
  std::string text = "root ::= r0 \"x\"\n";
  for (int i = 0; i < kLinks; ++i) text += fmt::format("r{} ::= r{}\n", i, i + 1);
  std::string ok = text + fmt::format("r{} ::= \"\"\n", kLinks);
  const Grammar g = gbnf(ok);
  EXPECT_TRUE(matches(g, "x"));
  EXPECT_FALSE(matches(g, "xx"));
  // The end of the chain calls its head: nullable all the way, so r0 reaches itself.
  auto looped = parse_gbnf(text + fmt::format("r{} ::= \"\" | r0 \"y\"\n", kLinks));
  ASSERT_TRUE(testing::fails_with(looped, "left-recursive"));
}

// Input nested or chained past kMaxNesting is an error naming it, not a stack overflow: the
// parsers and the JSON Schema compiler recursed once per level (50,000 parentheses, or a $defs
// chain of 20,000 refs each to the next, crashed the server).
TEST(GrammarLimits, DeepNestingIsAnErrorNotACrash) {
  const std::string deep = std::string(50000, '(') + "a" + std::string(50000, ')');
  auto r = compile_regex(deep);
  ASSERT_TRUE(testing::fails_with(r, "nested deeper than 256"));
  auto g = parse_gbnf("root ::= " + std::string(50000, '(') + "\"a\"" + std::string(50000, ')'));
  ASSERT_TRUE(testing::fails_with(g, "nested deeper than 256"));
  auto p = compile_json_schema(R"({"type":"string","pattern":")" + deep + R"("})");
  ASSERT_TRUE(testing::fails_with(p, "nested deeper"));
  Json defs = Json::object();
  for (int i = 0; i < 20000; ++i) {
    defs["a" + std::to_string(i)] = {{"type", "array"},
                                     {"items", {{"$ref", "#/$defs/a" + std::to_string(i + 1)}}}};
  }
  defs["a20000"] = {{"type", "string"}};
  const Json chain = {{"$defs", defs}, {"$ref", "#/$defs/a0"}};
  auto c = compile_json_schema(chain.dump());
  ASSERT_TRUE(testing::fails_with(c, "nested deeper than 256"));
  // Within the bound nesting still works.
  const std::string ok = std::string(200, '(') + "ab" + std::string(200, ')') + "+";
  EXPECT_TRUE(matches(regex(ok), "abab"));
}

// An object of 8,000 optional properties (written order, any subset): the compiler made the
// rules for properties i.. by recursing once per property (it ran out of stack), and copied
// each optional value's expression twice.
TEST(JsonSchema, WideObjectsCompile) {
  Json props = Json::object();
  for (int i = 0; i < 8000; ++i) props["p" + std::to_string(i)] = {{"type", "integer"}};
  const Grammar g = schema(Json{{"type", "object"}, {"properties", props}}.dump());
  EXPECT_TRUE(matches(g, R"({"p0":1,"p7999":-5})"));
  EXPECT_TRUE(matches(g, R"({})"));
  EXPECT_TRUE(matches(g, R"({"p17":0,"p18":12})"));
  EXPECT_FALSE(matches(g, R"({"p7999":1,"p0":2})"));  // written order
  EXPECT_FALSE(matches(g, R"({"p1":1,"p1":2})"));
  EXPECT_FALSE(matches(g, R"({"p8000":1})"));
}

TEST(Regex, AcceptsAndRejects) {
  const Grammar g = regex("(ab|c)+[0-9]{2,3}\\.?x*");
  EXPECT_TRUE(matches(g, "ab12"));
  EXPECT_TRUE(matches(g, "cabc123.xxx"));
  EXPECT_FALSE(matches(g, "ab1"));
  EXPECT_FALSE(matches(g, "12"));
  EXPECT_FALSE(matches(g, "ab1234"));
  const Grammar h = regex("^\\d{3}-\\w+\\s[^a-z]$");
  EXPECT_TRUE(matches(h, "123-a_Z9 Q"));
  EXPECT_FALSE(matches(h, "123-a_Z9 q"));
  const Grammar dot = regex("a.c");
  EXPECT_TRUE(matches(dot, "a€c"));
  EXPECT_FALSE(matches(dot, "a\nc"));
}

TEST(Regex, UnsupportedConstructsAreErrors) {
  for (const char* p : {"(?=a)b", "(a)\\1", "a\\bb", "a^b", "(?i)a", "*a", "[a-"}) {
    auto g = compile_regex(p);
    EXPECT_FALSE(g.ok()) << p;
  }
  auto g = compile_regex("ab(?<=x)");
  ASSERT_TRUE(testing::fails_with(g, "offset 2"));
}

TEST(Choice, ExactlyOneOfTheStrings) {
  auto g = compile_choice({"yes", "no", "maybe so"});
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(matches(*g, "no"));
  EXPECT_TRUE(matches(*g, "maybe so"));
  EXPECT_FALSE(matches(*g, "maybe"));
  EXPECT_FALSE(matches(*g, "yesno"));
  EXPECT_FALSE(compile_choice({}).ok());
}

TEST(JsonSchema, ObjectsInWrittenOrderWithOptionalProperties) {
  const Grammar g = schema(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array",
      "items":{"type":"string"}}},"required":["age"]})");
  EXPECT_TRUE(matches(g, R"({"name":"Al","age":3,"tags":["a","b"]})"));
  EXPECT_TRUE(matches(g, R"({"age":-3})"));
  EXPECT_TRUE(matches(g, R"({"age":0,"tags":[]})"));
  EXPECT_TRUE(matches(g, R"({"name":"\u00e9\n\"","age":3})"));
  EXPECT_FALSE(matches(g, R"({"name":"Al"})"));          // age required
  EXPECT_FALSE(matches(g, R"({"age":3,"name":"Al"})"));  // written order
  EXPECT_FALSE(matches(g, R"({"age":3,"extra":1})"));    // no additional
  EXPECT_FALSE(matches(g, R"({"age":03})"));             // leading zero
  EXPECT_FALSE(matches(g, R"({"age":3.5})"));
  EXPECT_FALSE(matches(g, R"({"age": 3})"));                   // compact
  EXPECT_FALSE(matches(g, "{\"name\":\"a\x01\",\"age\":3}"));  // raw control char
  EXPECT_FALSE(matches(g, R"({"name":"\ud800","age":3})"));    // lone surrogate escape
}

TEST(JsonSchema, FlexibleWhitespace) {
  JsonSchemaOptions o;
  o.compact = false;
  auto g = compile_json_schema(R"({"type":"object","properties":{"a":{"type":"integer"}},
      "required":["a"]})",
                               o);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(matches(*g, "{ \"a\" : 1 }"));
  EXPECT_TRUE(matches(*g, "{\n  \"a\": 1\n}"));
}

TEST(JsonSchema, AdditionalPropertiesAndMaps) {
  const Grammar g = schema(R"({"type":"object","properties":{"a":{"type":"integer"}},
      "additionalProperties":{"type":"boolean"}})");
  EXPECT_TRUE(matches(g, R"({"a":1,"x":true,"y":false})"));
  EXPECT_TRUE(matches(g, R"({"x":true})"));
  EXPECT_TRUE(matches(g, R"({})"));
  EXPECT_FALSE(matches(g, R"({"x":1})"));
  const Grammar any = schema(R"({"type":"object"})");
  EXPECT_TRUE(matches(any, R"({"k":[1,{"z":null}],"s":"x"})"));
  EXPECT_FALSE(matches(any, R"([1])"));
}

TEST(JsonSchema, IntegerBounds) {
  const Grammar g = schema(R"({"type":"integer","minimum":-15,"exclusiveMaximum":130})");
  for (int v = -200; v <= 300; ++v) {
    ASSERT_EQ(matches(g, std::to_string(v)), v >= -15 && v < 130) << v;
  }
  EXPECT_FALSE(matches(g, "-0"));
  const Grammar lo = schema(R"({"type":"integer","minimum":7})");
  EXPECT_TRUE(matches(lo, "7"));
  EXPECT_TRUE(matches(lo, "123456789012"));
  EXPECT_FALSE(matches(lo, "6"));
  EXPECT_FALSE(matches(lo, "-8"));
  const Grammar hi = schema(R"({"type":"integer","maximum":-3})");
  EXPECT_TRUE(matches(hi, "-3"));
  EXPECT_TRUE(matches(hi, "-30000"));
  EXPECT_FALSE(matches(hi, "-2"));
  EXPECT_FALSE(matches(hi, "5"));
}

TEST(JsonSchema, NumberBounds) {
  const Grammar g = schema(R"({"type":"number","minimum":-90,"maximum":90})");
  EXPECT_TRUE(matches(g, "-90"));
  EXPECT_TRUE(matches(g, "-89.99"));
  EXPECT_TRUE(matches(g, "45.5"));
  EXPECT_TRUE(matches(g, "90"));
  EXPECT_FALSE(matches(g, "90.5"));
  EXPECT_FALSE(matches(g, "-90.1"));
  EXPECT_FALSE(matches(g, "1e5"));
  const Grammar any = schema(R"({"type":"number"})");
  EXPECT_TRUE(matches(any, "-0.5e+10"));
  EXPECT_FALSE(matches(any, ".5"));
}

TEST(JsonSchema, ArraysEnumsConstUnions) {
  const Grammar a = schema(R"({"type":"array","items":{"enum":["x",1,null]},"minItems":2,
      "maxItems":3})");
  EXPECT_TRUE(matches(a, R"(["x",1])"));
  EXPECT_TRUE(matches(a, R"([null,null,"x"])"));
  EXPECT_FALSE(matches(a, R"(["x"])"));
  EXPECT_FALSE(matches(a, R"([1,1,1,1])"));
  EXPECT_FALSE(matches(a, R"(["y",1])"));
  const Grammar p = schema(R"({"type":"array","prefixItems":[{"type":"integer"},
      {"const":"k"}],"items":false})");
  EXPECT_TRUE(matches(p, R"([1,"k"])"));
  EXPECT_TRUE(matches(p, R"([1])"));
  EXPECT_TRUE(matches(p, R"([])"));
  EXPECT_FALSE(matches(p, R"([1,"k",2])"));
  const Grammar u = schema(R"({"type":["string","null"],"maxLength":2})");
  EXPECT_TRUE(matches(u, "null"));
  EXPECT_TRUE(matches(u, R"("ab")"));
  EXPECT_TRUE(matches(u, R"("é\n")"));
  EXPECT_FALSE(matches(u, R"("abc")"));
  const Grammar any_of = schema(R"({"anyOf":[{"type":"boolean"},{"type":"object",
      "properties":{"v":{"type":"number"}},"required":["v"]}]})");
  EXPECT_TRUE(matches(any_of, "true"));
  EXPECT_TRUE(matches(any_of, R"({"v":1.5})"));
  EXPECT_FALSE(matches(any_of, R"({})"));
  const Grammar nullable = schema(R"({"type":"integer","nullable":true})");
  EXPECT_TRUE(matches(nullable, "null"));
  EXPECT_TRUE(matches(nullable, "12"));
}

TEST(JsonSchema, RecursiveRefsAndAllOf) {
  const Grammar g = schema(R"({"$defs":{"node":{"type":"object","properties":{
      "v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["v"]}},"$ref":"#/$defs/node"})");
  EXPECT_TRUE(matches(g, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(matches(g, R"({"v":1,"kids":[{"w":2}]})"));
  const Grammar all = schema(R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},
      "required":["a"]},{"properties":{"b":{"type":"string"}},"required":["b"]}]})");
  EXPECT_TRUE(matches(all, R"({"a":1,"b":"x"})"));
  EXPECT_FALSE(matches(all, R"({"a":1})"));
}

TEST(JsonSchema, PatternsAndFormats) {
  const Grammar p = schema(R"({"type":"string","pattern":"^[A-Z]{2}-\\d+$"})");
  EXPECT_TRUE(matches(p, R"("AB-12")"));
  EXPECT_FALSE(matches(p, R"("AB-")"));
  const Grammar unanchored = schema(R"({"type":"string","pattern":"x\"y"})");
  EXPECT_TRUE(matches(unanchored, R"("aax\"ybb")"));
  EXPECT_FALSE(matches(unanchored, R"("aaxybb")"));
  const Grammar d = schema(R"({"type":"string","format":"date"})");
  EXPECT_TRUE(matches(d, R"("2024-12-31")"));
  EXPECT_FALSE(matches(d, R"("2024-02-30")"));
  EXPECT_FALSE(matches(d, R"("2024-13-01")"));
  const Grammar dt = schema(R"({"type":"string","format":"date-time"})");
  EXPECT_TRUE(matches(dt, R"("2024-01-02T03:04:05Z")"));
  EXPECT_TRUE(matches(dt, R"("2024-01-02T03:04:05.123+02:00")"));
  const Grammar uuid = schema(R"({"type":"string","format":"uuid"})");
  EXPECT_TRUE(matches(uuid, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(matches(uuid, R"("123e4567e89b12d3a456426614174000")"));
  const Grammar email = schema(R"({"type":"string","format":"email"})");
  EXPECT_TRUE(matches(email, R"("a.b@example.com")"));
  EXPECT_FALSE(matches(email, R"("ab.example.com")"));
}

TEST(JsonSchema, UnsupportedKeywordsNameThePointer) {
  struct Case {
    const char* schema;
    const char* needle;
  };
  for (const Case& c : {
           Case{R"({"type":"object","properties":{"a":{"not":{"type":"string"}}}})",
                "'not' at #/properties/a/not"},
           Case{R"({"type":"array","uniqueItems":true})", "'uniqueItems'"},
           Case{R"({"type":"number","multipleOf":2})", "'multipleOf' at #/multipleOf"},
           Case{R"({"type":"number","minimum":0.5})", "'minimum'"},
           Case{R"({"type":"object","patternProperties":{"^x":{}}})", "'patternProperties'"},
           Case{R"({"$ref":"#/$defs/missing"})", "cannot resolve $ref"},
           Case{R"({"type":"strnig"})", "unknown type 'strnig'"},
           Case{"{not json", "not valid JSON"},
       }) {
    auto g = compile_json_schema(c.schema);
    ASSERT_TRUE(testing::fails_with(g, c.needle)) << c.schema;
  }
}

TEST(ToolCalls, HermesFramingNamesAnOfferedToolWithValidArguments) {
  const char* tools = R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city"]}}},
    {"type":"function","function":{"name":"now","parameters":{}}}])";
  JsonSchemaOptions o;
  o.prefix = "<tool_call>\n";
  o.suffix = "\n</tool_call>";
  o.separator = "\n";
  o.max_repeats = 2;
  auto g = compile_tool_calls(tools, "arguments", o);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(matches(*g,
                      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                      "{\"city\": \"Paris\"}}\n</tool_call>"));
  EXPECT_TRUE(matches(*g,
                      "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":"
                      "\"x\",\"unit\":\"f\"}}\n</tool_call>"));
  EXPECT_FALSE(matches(*g,
                       "<tool_call>\n{\"name\": \"dictionary\", \"arguments\": "
                       "{\"word\": \"dog\"}}\n</tool_call>"));  // not offered
  EXPECT_FALSE(matches(*g,
                       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                       "{\"unit\": \"c\"}}\n</tool_call>"));  // city required
  EXPECT_FALSE(matches(*g,
                       "Sure! <tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n"
                       "</tool_call>"));
  o.max_repeats = 1;
  auto one = compile_tool_calls(tools, "parameters", o);
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(matches(*one, "<tool_call>\n{\"name\":\"now\",\"parameters\":{}}\n</tool_call>"));
  EXPECT_FALSE(matches(*one,
                       "<tool_call>\n{\"name\":\"now\",\"parameters\":{}}\n</tool_call>\n"
                       "<tool_call>\n{\"name\":\"now\",\"parameters\":{}}\n</tool_call>"));
  auto bad = compile_tool_calls(R"([{"type":"function","function":{"name":"f","parameters":
      {"type":"object","properties":{"a":{"not":{}}}}}}])",
                                "arguments", o);
  ASSERT_TRUE(testing::fails_with(bad, "tools[0] ('f')"));
  EXPECT_TRUE(testing::fails_with(bad, "'not' at #/properties/a/not"));
}

TEST(ToolCalls, SyntaxFramesOpensSeparatorsCloseAndBodies) {
  const char* tools = R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer","minimum":1}},
      "required":["city"]}}}])";
  ToolCallSyntax mistral;  // one opener and close around a JSON array of calls
  mistral.opens = {"[TOOL_CALLS]["};
  mistral.separator = ",";
  mistral.close = "]";
  mistral.max_calls = 2;
  auto m = compile_tool_call_syntax(tools, mistral);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const std::string call = R"({"name": "get_weather", "arguments": {"city": "Oslo"}})";
  EXPECT_TRUE(matches(*m, "[TOOL_CALLS][" + call + "]"));
  EXPECT_TRUE(matches(*m, "[TOOL_CALLS][" + call + ", " + call + "]"));
  EXPECT_FALSE(matches(*m, "[TOOL_CALLS][" + call + "," + call + "," + call + "]"));  // 2 at most
  EXPECT_FALSE(matches(*m, "[TOOL_CALLS][]"));
  EXPECT_FALSE(matches(*m, call));

  ToolCallSyntax named;  // DeepSeek V3.1's body: NAME<sep>ARGS, compact
  named.body = ToolCallSyntax::Body::kNamed;
  named.call_open = "<b>";
  named.after_name = "<s>";
  named.call_close = "<e>";
  auto n = compile_tool_call_syntax(tools, named);
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_TRUE(matches(*n, R"(<b>get_weather<s>{"city":"Oslo","days":3}<e>)"));
  EXPECT_FALSE(matches(*n, R"(<b>get_weather<s>{"city":"Oslo","days":0}<e>)"));  // minimum 1
  EXPECT_FALSE(matches(*n, R"(<b>get_weather<s>{"city":"a<b"}<e>)"));  // raw '<' in a string

  ToolCallSyntax xml;  // Qwen3-Coder's body: parameters in schema order, values as JSON
  xml.body = ToolCallSyntax::Body::kXml;
  auto x = compile_tool_call_syntax(tools, xml);
  ASSERT_TRUE(x.ok()) << x.error().message;
  EXPECT_TRUE(matches(*x,
                      "<function=get_weather>\n<parameter=city>\n\"Oslo\"\n</parameter>\n"
                      "<parameter=days>\n2\n</parameter>\n</function>"));
  EXPECT_TRUE(matches(*x,
                      "<function=get_weather>\n<parameter=city>\n\"Oslo\"\n</parameter>\n"
                      "</function>"));
  EXPECT_FALSE(matches(*x,
                       "<function=get_weather>\n<parameter=days>\n2\n</parameter>\n"
                       "</function>"));  // city required
}

TEST(JsonObject, AnyObject) {
  const Grammar g = json_object_grammar();
  EXPECT_TRUE(matches(g, R"({})"));
  EXPECT_TRUE(matches(g, R"({"a":[1,2,{"b":"c"}],"d":-1.5e3,"e":true,"f":null})"));
  EXPECT_FALSE(matches(g, R"([])"));
  EXPECT_FALSE(matches(g, R"({"a":})"));
}

}  // namespace
}  // namespace kiln::grammar
