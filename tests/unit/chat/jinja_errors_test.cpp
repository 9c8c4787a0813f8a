// Errors of kiln's Jinja: anything unsupported or wrong fails naming the construct and the
// template line, never renders silently; a template's raise_exception message surfaces.
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "kiln/chat/jinja/jinja.h"

namespace {

using kiln::chat::jinja::RenderContext;
using kiln::chat::jinja::Value;

std::string render_error(const std::string& source, RenderContext ctx = {}) {
  auto out = kiln::chat::jinja::render(source, ctx);
  if (out.ok()) return "(rendered: " + *out + ")";
  return out.error().message;
}

#define EXPECT_ERROR_HAS(msg, needle) \
  EXPECT_NE((msg).find(needle), std::string::npos) << "error was: " << (msg)

TEST(JinjaErrors, UnknownFilterNamesFilterAndLine) {
  std::string e = render_error("a\n{{ 'x' }}\n{{ 'x'|frobnicate }}");
  EXPECT_ERROR_HAS(e, "frobnicate");
  EXPECT_ERROR_HAS(e, "line 3");
}

TEST(JinjaErrors, UnknownTestNamesTest) {
  std::string e = render_error("{% if 1 is prime %}{% endif %}");
  EXPECT_ERROR_HAS(e, "prime");
  EXPECT_ERROR_HAS(e, "line 1");
}

TEST(JinjaErrors, UnsupportedTagsNamed) {
  EXPECT_ERROR_HAS(render_error("x\n{% include 'other.jinja' %}"), "'include'");
  EXPECT_ERROR_HAS(render_error("x\n{% include 'other.jinja' %}"), "line 2");
  EXPECT_ERROR_HAS(render_error("{% extends 'base' %}"), "'extends'");
}

TEST(JinjaErrors, UnsupportedMethodNamed) {
  EXPECT_ERROR_HAS(render_error("{{ 'abc'.zfill(5) }}"), "zfill");
  EXPECT_ERROR_HAS(render_error("{{ 'x'.format(1) ~ '{:>4}'.format(1) }}"), "{:>4}");
}

TEST(JinjaErrors, RaiseExceptionMessageSurfaces) {
  std::string e = render_error("ok\n\n{{ raise_exception('Conversation roles must alternate') }}");
  EXPECT_ERROR_HAS(e, "Conversation roles must alternate");
  EXPECT_ERROR_HAS(e, "line 3");
}

TEST(JinjaErrors, SyntaxErrors) {
  EXPECT_ERROR_HAS(render_error("{% if true %}x"), "endif");
  EXPECT_ERROR_HAS(render_error("{{ 'unterminated }}"), "unterminated string");
  EXPECT_ERROR_HAS(render_error("{{ 1 +  }}"), "line 1");
  EXPECT_ERROR_HAS(render_error("{% break %}"), "outside of a loop");
  EXPECT_ERROR_HAS(render_error("{{ x"), "end of template");
  EXPECT_ERROR_HAS(render_error("{# never closed"), "unterminated comment");
  EXPECT_ERROR_HAS(render_error("a\nb\n{% endfor %}"), "line 3");
}

TEST(JinjaErrors, UndefinedMisuse) {
  EXPECT_ERROR_HAS(render_error("{{ missing.attr }}"), "'missing' is undefined");
  EXPECT_ERROR_HAS(render_error("{{ missing() }}"), "'missing' is undefined");
  EXPECT_ERROR_HAS(render_error("{{ missing + 1 }}"), "'missing' is undefined");
  RenderContext ctx;
  Value d = Value::dict();
  ctx.vars.emplace_back("d", d);
  EXPECT_ERROR_HAS(render_error("{{ d.a.b }}", ctx), "'dict object' has no attribute 'a'");
}

TEST(JinjaErrors, TypeErrorsLikePython) {
  EXPECT_ERROR_HAS(render_error("{{ 'a' + 1 }}"), "unsupported operand");
  EXPECT_ERROR_HAS(render_error("{{ 1 / 0 }}"), "division by zero");
  EXPECT_ERROR_HAS(render_error("{{ 1 < 'a' }}"), "not supported between");
  EXPECT_ERROR_HAS(render_error("{% for x in 5 %}{% endfor %}"), "not iterable");
  EXPECT_ERROR_HAS(render_error("{{ none|length }}"), "has no len()");
  EXPECT_ERROR_HAS(render_error("{{ 9223372036854775807 + 1 }}"), "overflow");
  EXPECT_ERROR_HAS(render_error("{{ [1]|map('upper')|list }}"), "");  // upper of an int is 'str(1)'
}

TEST(JinjaErrors, SandboxRefusesMutation) {
  // ImmutableSandboxedEnvironment (HF) refuses list.append and dict.update.
  EXPECT_ERROR_HAS(render_error("{% set l = [] %}{% set _ = l.append(1) %}"),
                   "access to attribute 'append' of 'list' object is unsafe");
  EXPECT_ERROR_HAS(render_error("{% set d = {} %}{{ d.update({'a': 1}) }}"), "'update'");
}

TEST(JinjaErrors, ResourceLimits) {
  EXPECT_ERROR_HAS(render_error("{{ range(1000000)|length }}"), "range too big");
  EXPECT_ERROR_HAS(render_error("{{ 'x' * 100000000 }}"), "too large");
  EXPECT_ERROR_HAS(render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
                   "nested too deeply");
  EXPECT_ERROR_HAS(
      render_error("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"),
      "nested too deeply");
  std::string deep;
  for (int i = 0; i < 300; ++i) deep += "{% if true %}";
  EXPECT_ERROR_HAS(render_error(deep), "nested too deeply");
  EXPECT_ERROR_HAS(render_error("{{ " + std::string(3000, '-') + "1 }}"), "nested too deeply");
  EXPECT_ERROR_HAS(render_error("{{ " + std::string(3000, '[') + " }}"), "line 1");
}

TEST(JinjaErrors, PrintingCallableOrIteratorIsAnError) {
  // Python would print an object address; kiln refuses rather than print something else.
  EXPECT_ERROR_HAS(render_error("{{ [1, 2]|select('odd') }}"), "iterator");
  EXPECT_ERROR_HAS(render_error("{{ range }}"), "callable");
}

}  // namespace

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Randomly damaged templates (bytes deleted, duplicated or replaced by Jinja punctuation)
// must give a rendering or an error, never a crash, hang or sanitizer report.
TEST(JinjaErrors, DamagedTemplatesNeverCrash) {
  const char* files[] = {"statements", "collections_and_filters", "strings_and_slices",
                         "values_and_repr", "realistic_mix"};
  auto conv = nlohmann::ordered_json::parse(read_file(
      std::string(KILN_SOURCE_DIR) + "/tests/oracle/jinja/conversations/tool_call_answered.json"));
  ASSERT_TRUE(conv.is_object());
  RenderContext ctx;
  ctx.max_steps = 200'000;  // damage can make exponential recursion; fail it fast
  ctx.vars.emplace_back("messages", Value::from_json(conv["messages"]));
  ctx.vars.emplace_back("tools", Value::from_json(conv["tools"]));
  std::mt19937 rng(1234);
  const std::string punct = "{}%#-+()[]'\"|.,:~=!<>*/ \n\\x0";
  int num_ok = 0, num_err = 0;
  for (const char* f : files) {
    std::string src =
        read_file(std::string(KILN_SOURCE_DIR) + "/tests/oracle/jinja/features/" + f + ".jinja");
    ASSERT_FALSE(src.empty()) << f;
    for (int iter = 0; iter < 150; ++iter) {
      std::string s = src;
      int num_edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < num_edits && !s.empty(); ++e) {
        size_t pos = rng() % s.size();
        switch (rng() % 3) {
          case 0:
            s.erase(pos, 1 + rng() % 8);
            break;
          case 1:
            s.insert(pos, s.substr(rng() % s.size(), 1 + rng() % 16));
            break;
          default:
            s[pos] = punct[rng() % punct.size()];
        }
      }
      auto out = kiln::chat::jinja::render(s, ctx);
      (out.ok() ? num_ok : num_err)++;
    }
  }
  // Both outcomes occur: damage is not all caught by the lexer, nor all harmless.
  EXPECT_GT(num_ok, 0);
  EXPECT_GT(num_err, 0);
}

}  // namespace

namespace {

TEST(JinjaErrors, ArithmeticEdgesNeverOverflow) {
  EXPECT_ERROR_HAS(render_error("{{ [1, 2, 3][2::9223372036854775807] }}"), "(rendered: [3])");
  EXPECT_ERROR_HAS(render_error("{{ range(9223372036854775806, 9223372036854775807, 5)|list }}"),
                   "(rendered: [9223372036854775806])");
  EXPECT_ERROR_HAS(render_error("{{ (-1) ** 5 }} {{ 2 ** 62 }} {{ 0 ** 0 }}"),
                   "(rendered: -1 4611686018427387904 1)");
  EXPECT_ERROR_HAS(render_error("{{ 3 ** 40 }}"), "overflow");
  EXPECT_ERROR_HAS(render_error("{{ 'ab' * 9223372036854775807 }}"), "too large");
  EXPECT_ERROR_HAS(render_error("{{ 'x'|center(1000000000000) }}"), "too large");
  EXPECT_ERROR_HAS(render_error("{{ '%999999999s'|format('x') }}"), "too long");
}

TEST(JinjaErrors, EndlessWorkIsBounded) {
  RenderContext budget;
  budget.max_steps = 100'000;  // the default (4M) is the same check, only slower
  // Exponential recursion within the depth limit: 2^40 calls.
  EXPECT_ERROR_HAS(render_error("{% macro f(n) %}{% if n < 40 %}{{ f(n + 1) }}{{ f(n + 1) }}"
                                "{% endif %}{% endmacro %}{{ f(0) }}",
                                budget),
                   "exceeded");
  EXPECT_ERROR_HAS(render_error("{% for x in [1, 2] recursive %}{% if loop.depth < 40 %}"
                                "{{ loop([1, 2]) }}{% endif %}{% endfor %}",
                                budget),
                   "exceeded");
  EXPECT_ERROR_HAS(render_error("{% for i in range(100000) %}{% for j in range(100000) %}"
                                "{% endfor %}{% endfor %}",
                                budget),
                   "exceeded");
  RenderContext small;
  small.max_output_bytes = 1000;
  EXPECT_ERROR_HAS(render_error("{% for i in range(10000) %}{{ i }}{% endfor %}", small),
                   "exceeds 1000 bytes");
}

TEST(JinjaErrors, DeeplyNestedValuesFailCleanly) {
  EXPECT_ERROR_HAS(render_error("{% set ns = namespace(x=[]) %}{% for i in range(2000) %}"
                                "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}"),
                   "nested too deeply");
}

}  // namespace

namespace {

TEST(JinjaErrors, EmptyRepetitionIsInstant) {
  EXPECT_EQ(render_error("[{{ '' * 9223372036854775807 }}{{ [] * 9223372036854775807 }}]"),
            "(rendered: [[]])");
}

}  // namespace
