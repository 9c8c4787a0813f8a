// Language features of kiln's Jinja, each with the exact text Python's Jinja2 (configured as
// in tests/oracle/jinja/render.py) renders for it; the expected strings were produced by that
// oracle when the cases were written.
#include <gtest/gtest.h>

#include "kiln/chat/jinja/jinja.h"

namespace {

using kiln::chat::jinja::RenderContext;
using kiln::chat::jinja::Value;

struct Case {
  const char* name;
  const char* source;
  const char* context_json;
  const char* expected;
};

const Case kCases[] = {
    {"ws_trim_blocks", "{% if true %}\nA\n{% endif %}\nB", "{}", "A\nB"},
    {"ws_lstrip_blocks", "x\n    {% if true %}y{% endif %}\n", "{}", "x\ny"},
    {"ws_lstrip_not_vars", "x\n    {{ 'y' }}\n", "{}", "x\n    y"},
    {"ws_minus_both", "a   {{- 'b' -}}   c", "{}", "abc"},
    {"ws_block_minus", "a\n  {%- if true -%}\n  b\n  {%- endif %}\nc", "{}", "abc"},
    {"ws_plus_disables_lstrip", "x\n    {%+ if true %}y{% endif %}", "{}", "x\n    y"},
    {"ws_comment_trim", "a\n  {# note #}\nb", "{}", "a\nb"},
    {"ws_trailing_newline_dropped", "a\n", "{}", "a"},
    {"ws_crlf_normalized", "a\r\nb\r\n\r\n", "{}", "a\nb\n"},
    {"ws_tag_after_var_same_line", "{{ 'a' }}  {% if true %}x{% endif %}", "{}", "a  x"},
    {"ws_raw", "{% raw %}{{ x }}{% endraw %}", "{}", "{{ x }}"},
    {"ws_first_line_lstrip", "  {% if true %}x{% endif %}", "{}", "x"},
    {"print_none_bool", "{{ none }} {{ true }} {{ false }}", "{}", "None True False"},
    {"float_repr", "{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e-5 }} {{ 100.0 / 3 }}", "{}",
     "1.0 0.30000000000000004 1e+16 1e-05 33.333333333333336"},
    {"int_arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 8 }}", "{}",
     "3 -4 2 3.5 256"},
    {"list_repr", "{{ ['a', \"it's\", 1, 2.5, none, true, {'k': [1]}] }}", "{}",
     "['a', \"it's\", 1, 2.5, None, True, {'k': [1]}]"},
    {"tuple_repr", "{{ (1,) }} {{ (1, 'a') }}", "{}", "(1,) (1, 'a')"},
    {"string_ops", "{{ 'ab' * 2 }} {{ 'a' ~ 1 ~ none }} {{ 'a' + 'b' }}", "{}", "abab a1None ab"},
    {"undefined_prints_empty", "[{{ nope }}]", "{}", "[]"},
    {"in_operator", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in d }} {{ 'x' not in d }}",
     "{\"d\": {\"k\": 1}}", "True True True True"},
    {"comparisons", "{{ 1 == 1.0 }} {{ 1 < 2 < 3 }} {{ 'a' < 'b' }} {{ [1] == [1] }}", "{}",
     "True True True True"},
    {"truthiness", "{{ not [] }} {{ not {} }} {{ not '' }} {{ not 0.0 }} {{ not 'x' }}", "{}",
     "True True True True False"},
    {"conditional_expr", "{{ 'y' if x else 'n' }}{{ 'z' if not x }}", "{\"x\": 0}", "nz"},
    {"slices", "{{ s[1:3] }} {{ s[::-1] }} {{ s[-2:] }} {{ l[::2] }} {{ l[-1] }}",
     "{\"s\": \"hello\", \"l\": [1, 2, 3, 4]}", "el olleh lo [1, 3] 4"},
    {"attr_equals_item", "{{ m.role }}={{ m['role'] }} {{ m.missing is defined }}",
     "{\"m\": {\"role\": \"user\"}}", "user=user False"},
    {"is_tests",
     "{{ x is string }} {{ x is mapping }} {{ l is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ 9 "
     "is divisibleby 3 }} {{ none is none }} {{ 1 is number }} {{ 1.0 is float }} {{ 1 is integer "
     "}} {{ true is boolean }} {{ l is sequence }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ 2 is "
     "in l }} {{ x is not defined }}",
     "{\"x\": \"s\", \"l\": [1, 2]}",
     "True False True True True True True True True True True True True True True False"},
    {"loop_vars",
     "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ "
     "loop.last }}{{ loop.length }}{{ loop.cycle('a', 'b') }};{% endfor %}",
     "{\"l\": [10, 20, 30]}", "103TrueFalse3a;212FalseFalse3b;321FalseTrue3a;"},
    {"loop_prev_next",
     "{% for x in l %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }};{% endfor %}",
     "{\"l\": [1, 2, 3]}", "<1>2;1<2>3;2<3>;"},
    {"loop_else", "{% for x in [] %}x{% else %}empty{% endfor %}", "{}", "empty"},
    {"loop_filter", "{% for x in range(10) if x is odd %}{{ x }}{{ loop.length }} {% endfor %}",
     "{}", "15 35 55 75 95 "},
    {"loop_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }} {% endfor %}",
     "{\"d\": {\"b\": 1, \"a\": 2}}", "b=1 a=2 "},
    {"loop_break_continue",
     "{% for i in range(10) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% "
     "endif %}{{ i }}{% endfor %}",
     "{}", "023"},
    {"loop_scope",
     "{% set x = 'outer' %}{% for i in [1] %}{% set x = 'inner' %}{{ x }}{% endfor %} {{ x }}",
     "{}", "inner outer"},
    {"namespace",
     "{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% endfor %}{{ "
     "ns.n }}",
     "{}", "3"},
    {"set_block", "{% set b %}\n  hi {{ 1 }}\n{% endset %}[{{ b }}]", "{}", "[  hi 1\n]"},
    {"set_tuple", "{% set a, b = 'xy' %}{{ b }}{{ a }}", "{}", "yx"},
    {"macro_defaults",
     "{% macro f(a, b='B', c='C') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ f(1) }} {{ f(1, 2) }} {{ "
     "f(1, c=3) }}",
     "{}", "1BC 12C 1B3"},
    {"macro_caller", "{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %}",
     "{}", "[in]"},
    {"filter_block", "{% filter upper %}abc{% endfilter %}", "{}", "ABC"},
    {"generation_block", "{% generation %}gen{% endgeneration %}", "{}", "gen"},
    {"f_tojson", "{{ d|tojson }} {{ d|tojson(indent=2) }}",
     "{\"d\": {\"b\": [1, \"é\"], \"a\": null}}",
     "{\"b\": [1, \"é\"], \"a\": null} {\n  \"b\": [\n    1,\n    \"é\"\n  ],\n  \"a\": null\n}"},
    {"f_tojson_escapes", "{{ s|tojson }}", "{\"s\": \"q\\\"b\\\\n\\n\\t\\u0001</script>\"}",
     "\"q\\\"b\\\\n\\n\\t\\u0001</script>\""},
    {"f_string",
     "{{ 'x'|upper }}{{ 'X'|lower }} {{ 'ab cd'|title }} {{ 'aB'|capitalize }} [{{ ' t '|trim }}] "
     "{{ 'aa'|replace('a', 'b') }}",
     "{}", "Xx Ab Cd Ab [t] bb"},
    {"f_join_first_last",
     "{{ l|join(', ') }} {{ l|first }} {{ l|last }} {{ l|length }} {{ l|count }}",
     "{\"l\": [\"a\", \"b\", \"c\"]}", "a, b, c a c 3 3"},
    {"f_default", "{{ x|default('d') }} {{ none|default('d') }} {{ ''|default('d', true) }}", "{}",
     "d None d"},
    {"f_selectattr_map",
     "{{ l|selectattr('t', 'equalto', 'a')|map(attribute='v')|list }} {{ l|rejectattr('t', "
     "'equalto', 'a')|map(attribute='v')|join }}",
     "{\"l\": [{\"t\": \"a\", \"v\": 1}, {\"t\": \"b\", \"v\": 2}, {\"t\": \"a\", \"v\": 3}]}",
     "[1, 3] 2"},
    {"f_sort_unique_reverse",
     "{{ l|sort }} {{ l|unique|list }} {{ l|reverse|list }} {{ l|sort(reverse=true) }}",
     "{\"l\": [3, 1, 3, 2]}", "[1, 2, 3, 3] [3, 1, 2] [2, 3, 1, 3] [3, 3, 2, 1]"},
    {"f_items_list", "{{ d|items|list }} {{ d|list }} {{ 'ab'|list }}", "{\"d\": {\"a\": 1}}",
     "[('a', 1)] ['a'] ['a', 'b']"},
    {"f_numbers",
     "{{ '12'|int + 1 }} {{ 3.7|int }} {{ '1.5'|float }} {{ -3|abs }} {{ 2.567|round(1) }}", "{}",
     "13 3 1.5 3 2.6"},
    {"f_indent", "{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}", "{}",
     "a\n  b\n\n  c|  a\n  b"},
    {"f_map_filter", "{{ ['a', 'b']|map('upper')|join }}", "{}", "AB"},
    {"methods_str",
     "{{ ' x '.strip() }}|{{ 'a,b'.split(',') }}|{{ 'a b'.split() }}|{{ 'abc'.startswith(('x', "
     "'a')) }}|{{ 'abc'.endswith('c') }}|{{ 'xay'.lstrip('x') }}|{{ 'abc'.find('c') }}|{{ "
     "'Hello'.replace('l', 'L') }}",
     "{}", "x|['a', 'b']|['a', 'b']|True|True|ay|2|HeLLo"},
    {"methods_dict",
     "{{ d.get('a') }} {{ d.get('z', 0) }} {{ d.keys()|list }} {{ d.values()|list }}",
     "{\"d\": {\"a\": 1, \"b\": 2}}", "1 0 ['a', 'b'] [1, 2]"},
    {"globals", "{{ range(3)|list }} {{ dict(a=1) }} {{ strftime_now('%d %b %Y') }}", "{}",
     "[0, 1, 2] {'a': 1} 26 Jul 2025"},
    {"markup_concat", "{{ '<'|safe + '<' }}", "{}", "<&lt;"},

};

RenderContext make_context(const char* context_json) {
  RenderContext ctx;
  auto j = nlohmann::ordered_json::parse(context_json);
  for (auto it = j.begin(); it != j.end(); ++it) {
    ctx.vars.emplace_back(it.key(), Value::from_json(it.value()));
  }
  ctx.now.tm_year = 2025 - 1900;  // Sat 26 Jul 2025 14:05:09, as render.py's FIXED_NOW
  ctx.now.tm_mon = 6;
  ctx.now.tm_mday = 26;
  ctx.now.tm_wday = 6;
  ctx.now.tm_hour = 14;
  ctx.now.tm_min = 5;
  ctx.now.tm_sec = 9;
  return ctx;
}

class JinjaFeature : public ::testing::TestWithParam<Case> {};

TEST_P(JinjaFeature, RendersLikeJinja2) {
  const Case& c = GetParam();
  auto out = kiln::chat::jinja::render(c.source, make_context(c.context_json));
  ASSERT_TRUE(out.ok()) << c.name << ": " << out.error().message;
  EXPECT_EQ(*out, c.expected) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Cases, JinjaFeature, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
