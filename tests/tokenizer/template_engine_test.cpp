// Unit tests of the Jinja engine. Expected strings are what Python's jinja2 3.1 renders with
// transformers' settings (trim_blocks, lstrip_blocks, loopcontrols, its tojson).
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"

namespace substrate {
namespace {

// Renders `tmpl` over the JSON context; an error comes back as "ERR: <message>".
std::string R(const std::string& tmpl, const std::string& ctx = "{}") {
  TemplateOptions opts;
  opts.limits.max_steps = 1000000;  // keeps the runaway-loop test short
  opts.now = [] {
    std::tm tm{};
    tm.tm_year = 2026 - 1900;
    tm.tm_mon = 10;
    tm.tm_mday = 29;
    tm.tm_hour = 12;
    tm.tm_wday = 0;
    return tm;
  };
  auto out = RenderChatTemplate(tmpl, nlohmann::ordered_json::parse(ctx), opts);
  if (!out.ok()) return "ERR: " + out.status().message();
  return *out;
}

const char* kMessages =
    R"({"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
         "function": {"name": "f", "arguments": {"x": 1}}}]}, {"role": "tool", "content": "r"}]})";

TEST(TemplateEngine, WhitespaceControl) {
  EXPECT_EQ(R("  {% if true %}\n  a\n  {% endif %}\n  b  {# c #}\n  {# d #}\nq {{ 'v' }}\n"), "  a\n  b  q v");
  EXPECT_EQ(R("{%- set x = 'a' -%}\n  {{- x -}}  \n  {%- if true %}\n    yes\n  {% endif %}\nend\n"),
            "a    yes\nend");
  EXPECT_EQ(R("  {%- if true %}  x  {% endif -%}  \n  y"), "  x  y");
  EXPECT_EQ(R("{% if true -%}\n\n  a  \n\n{%- endif %}"), "a");
  EXPECT_EQ(R("a {%+ if true %}b{% endif %}"), "a b");
  EXPECT_EQ(R("a\n  {# comment #}\nb\n  {#- c2 -#}\n  c"), "a\nbc");
  EXPECT_EQ(R("{{ 'a' }}\n{{ 'b' }}\n\n"), "a\nb\n");  // one trailing newline dropped
  EXPECT_EQ(R("x\r\ny\r\n"), "x\ny");
  EXPECT_EQ(R("{% raw %}{{ x }}{% endraw %}|{%- raw -%}  {% if %}  {%- endraw %}|"), "{{ x }}|{% if %}|");
}

TEST(TemplateEngine, ValuesPrintLikePython) {
  EXPECT_EQ(R("{{ 1.0 }} {{ 1e20 }} {{ 0.1+0.2 }} {{ 10/4 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 2**10 }} "
              "{{ 2**-1 }} {{ 1e-5 }} {{ 123456789.125 }}"),
            "1.0 1e+20 0.30000000000000004 2.5 3 -4 2 1024 0.5 1e-05 123456789.125");
  EXPECT_EQ(R("{{ none }} {{ true }} {{ [1,'a',none,true, 1.5] }} {{ {'a': 1, 'b': [1,2]} }} {{ (1,) }} {{ () }}"),
            "None True [1, 'a', None, True, 1.5] {'a': 1, 'b': [1, 2]} (1,) ()");
  EXPECT_EQ(R("{{ 'it\\'s' }}{{ ['it\\'s', 'a\"b', 'c\\'d\"'] }}"), "it's[\"it's\", 'a\"b', 'c\\'d\"']");
  EXPECT_EQ(R("{{ x }}|{{ x is defined }}|{{ y.z is defined }}", R"({"y": {}})"), "|False|False");
  EXPECT_EQ(R("{{ '\\n\\t\\'\\\\' }}{{ \"\\\"\" }}{{ '\\x41\\u00e9' }}"), "\n\t'\\\"A\xC3\xA9");
  EXPECT_EQ(R("{{ 2 ** 3 ** 2 }}{{ -2 ** 2 }}{{ 10 - 2 - 3 }}{{ 2 * 3 + 1 }}{{ 7 % 4 * 2 }}"), "644576");
  EXPECT_EQ(R("{{ 'a' ~ 1 ~ none ~ x }}|{{ 'ab' * 3 }}|{{ [1] * 2 }}|{{ [1,2] + [3] }}"), "a1None|ababab|[1, 1]|[1, 2, 3]");
}

TEST(TemplateEngine, TojsonFormatsAsTransformers) {
  const char* ctx = R"({"x": {"b": [1, 2.5, null, true, "é\n\"\\"], "a": {}, "c": []}})";
  EXPECT_EQ(R("{{ x|tojson }}", ctx), R"({"b": [1, 2.5, null, true, "é\n\"\\"], "a": {}, "c": []})");
  EXPECT_EQ(R("{{ x|tojson(indent=2) }}", ctx),
            "{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true,\n    \"é\\n\\\"\\\\\"\n  ],\n  \"a\": {},\n  \"c\": []\n}");
  EXPECT_EQ(R("{{ x|tojson(sort_keys=true) }}", ctx), R"({"a": {}, "b": [1, 2.5, null, true, "é\n\"\\"], "c": []})");
  EXPECT_EQ(R("{{ x|tojson(separators=(',', ':')) }}", ctx), R"({"b":[1,2.5,null,true,"é\n\"\\"],"a":{},"c":[]})");
  EXPECT_EQ(R("{{ 'é'|tojson }}{{ 'é'|tojson(ensure_ascii=true) }}{{ 1.0|tojson }}"), "\"é\"\"\\u00e9\"1.0");
  EXPECT_EQ(R("{{ [1,2]|map('string')|tojson }}"), "ERR: Object of type generator is not JSON serializable");
  EXPECT_EQ(R("{{ x|tojson }}"), "ERR: Object of type Undefined is not JSON serializable");
}

TEST(TemplateEngine, Loops) {
  EXPECT_EQ(R("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
              "{{ loop.revindex }}{{ m.role }}|{% endfor %}",
              kMessages),
            "10TrueFalse44system|21FalseFalse43user|32FalseFalse42assistant|43FalseTrue41tool|");
  EXPECT_EQ(R("{% for m in messages if m.role == 'user' %}{{ loop.length }}{{ m.content }}{% else %}none{% endfor %}",
              kMessages),
            "1hi");
  EXPECT_EQ(R("{% for m in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}"
              "{{x}}{% endfor %}"),
            "0134");
  EXPECT_EQ(R("{% for k, v in d|items %}{{k}}={{v}};{% endfor %}", R"({"d": {"b": 1, "a": 2}})"), "b=1;a=2;");
  EXPECT_EQ(R("{% for m in messages %}{{ loop.previtem.role if loop.previtem }}-"
              "{{ loop.nextitem.role if loop.nextitem else 'END' }};{% endfor %}",
              kMessages),
            "-user;system-assistant;user-tool;assistant-END;");
  // Assignments inside a loop body do not leak out, nor persist between iterations.
  EXPECT_EQ(R("{% set x = 1 %}{% for i in range(2) %}{% set x = x + 10 %}{{ x }}{% endfor %}{{ x }}"), "11111");
  EXPECT_EQ(R("{% set ns = namespace(c=0) %}{% for x in range(4) %}{% set ns.c = ns.c + x %}{% endfor %}{{ ns.c }}"), "6");
  EXPECT_EQ(R("{% for a, b in ['xy'] %}{{ a }}{{ b }}{% endfor %}"), "xy");
  EXPECT_EQ(R("{% for a, b in [[1,2,3]] %}{% endfor %}"), "ERR: too many values to unpack (expected 2)");
}

TEST(TemplateEngine, MacrosAndCallBlocks) {
  EXPECT_EQ(R("{% macro f(a, b='d', c=none) %}[{{a}}|{{b}}|{{c}}]{% endmacro %}{{ f(1) }}{{ f(1, 2) }}{{ f(1, c=3) }}{{ f() }}"),
            "[1|d|None][1|2|None][1|d|3][|d|None]");
  EXPECT_EQ(R("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}"), "54321");
  EXPECT_EQ(R("{% macro m(a) %}<{{ caller() }}|{{ a }}>{% endmacro %}{% call m(1) %}inner{% endcall %}"
              "{% call(x) m(2) %}{{ x }}{% endcall %}"),
            "<inner|1><|2>");
  EXPECT_EQ(R("{% set y = 3 %}{% macro f() %}{{ y }}{% endmacro %}{% set y = 4 %}{{ f() }}"), "4");
  EXPECT_EQ(R("{% macro f(a) %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ f(1, 2, 3, k=4) }}"), "(2, 3){'k': 4}");
  EXPECT_EQ(R("{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set c %}blk {{ a }}{% endset %}[{{ c }}]"
              "{% set u | upper %}up{% endset %}{{ u }}"),
            "12[blk 1]UP");
  EXPECT_EQ(R("{% filter upper %}hello {{ 'x' }}{% endfilter %}{% with q = 5 %}{{ q }}{% endwith %}{{ q }}"), "HELLO X5");
}

TEST(TemplateEngine, FiltersTestsAndMethods) {
  EXPECT_EQ(R("{{ [1,2,3]|map('string')|join('-') }}{{ msgs|map(attribute='role')|list }}",
              R"({"msgs": [{"role": "user"}, {"role": "assistant"}]})"),
            "1-2-3['user', 'assistant']");
  EXPECT_EQ(R("{{ none|selectattr('type', 'equalto', 'x')|list|length }}"), "0");
  EXPECT_EQ(R("{{ [1,2,3,4]|select('odd')|list }}{{ [1,2,3,4]|reject('even')|list }}{{ [0,1,'',2]|select|list }}"
              "{{ [1,1,2]|unique|list }}{{ [1,2,3]|sum }}{{ [1,5,2]|max }}{{ [1,5,2]|min }}"),
            "[1, 3][1, 3][1, 2][1, 2]651");
  EXPECT_EQ(R("{{ [3,1,2]|sort }}{{ ['b','A','a']|sort }}{{ [{'n':2},{'n':1}]|sort(attribute='n') }}"),
            "[1, 2, 3]['A', 'a', 'b'][{'n': 1}, {'n': 2}]");
  EXPECT_EQ(R("{{ 'x'|default('d') }}{{ y|default('d') }}{{ ''|default('d', true) }}{{ none|default('d') }}"), "xddNone");
  EXPECT_EQ(R("{{ '3'|int + 1 }}{{ '3.7'|int }}{{ 'x'|int(5) }}{{ 3|float }}{{ 2.567|round(2) }}{{ 2.5|round }}"),
            "4353.02.572.0");
  EXPECT_EQ(R("{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}"), "a\n  b\n\n  c|  a\n  b");
  EXPECT_EQ(R("{{ 'hello world'.title() }}{{ ' a  b '.split() }}{{ 'a b c'.rsplit(' ', 1) }}{{ 'xxaxx'.strip('x') }}"
              "{{ 'a\nb\r\nc'.splitlines() }}"),
            "Hello World['a', 'b']['a b', 'c']a['a', 'b', 'c']");
  EXPECT_EQ(R("{{ s[1:] }}{{ s[::-1] }}{{ s[1:4:2] }}{{ l[-1] }}{{ s[0] }}", R"({"s": "héllo", "l": [1,2,3]})"),
            "élloolléhél3h");
  EXPECT_EQ(R("{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 5) }}{{ 'a' in d }}{{ 'z' not in d }}", R"({"d": {"a": 1}})"),
            "1None5TrueTrue");
  EXPECT_EQ(R("{{ 5 is divisibleby 5 }}{{ 'a' is string }}{{ 1 is integer }}{{ true is number }}{{ {} is mapping }}"
              "{{ 'a' is iterable }}{{ 3 is iterable }}{{ x is not defined }}"),
            "TrueTrueTrueTrueTrueTrueFalseTrue");
  EXPECT_EQ(R("{{ '%s and %d and %.2f and %05.1f %%'|format('a', 3, 1.23456, 2.25) }}{{ '{0}{a}'.format(7, a=1) }}"),
            "a and 3 and 1.23 and 002.2 %71");
  // markupsafe: Markup + str escapes the str, as transformers' renders it.
  EXPECT_EQ(R("{{ \"'\"|safe + '\"<x>' }}"), "'&#34;&lt;x&gt;");
  EXPECT_EQ(R("{{ strftime_now('%d %b %Y') }}"), "29 Nov 2026");
}

TEST(TemplateEngine, ErrorsCarryPythonMessages) {
  EXPECT_EQ(R("{{ raise_exception('boom: ' ~ 3) }}"), "ERR: boom: 3");
  EXPECT_EQ(R("{% for x in tools %}{% endfor %}"), "ERR: 'NoneType' object is not iterable");
  EXPECT_EQ(R("{{ 'a' + functions }}"), "ERR: 'functions' is undefined");
  EXPECT_EQ(R("{{ d.y.z }}", R"({"d": {}})"), "ERR: 'dict object' has no attribute 'y'");
  EXPECT_EQ(R("{{ l[5].z }}", R"({"l": [1]})"), "ERR: list object has no element 5");
  EXPECT_EQ(R("{{ none + 1 }}"), "ERR: unsupported operand type(s) for +: 'NoneType' and 'int'");
  EXPECT_EQ(R("{{ 'a' + 1 }}"), "ERR: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(R("{{ 1//0 }}"), "ERR: integer division or modulo by zero");
  EXPECT_EQ(R("{{ [1,2]|map('string')|length }}"), "ERR: object of type 'generator' has no len()");
  EXPECT_EQ(R("{{ 'a' < 1 }}"), "ERR: '<' not supported between instances of 'str' and 'int'");
  EXPECT_EQ(R("{{ range(200000)|length }}"),
            "ERR: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  EXPECT_EQ(R("{{ [].append(1) }}"), "ERR: access to attribute 'append' of 'list' object is unsafe.");
}

TEST(TemplateEngine, MalformedTemplatesAreSyntaxErrors) {
  for (const char* bad : {"{% if %}", "{% for %}", "{{ 1 + }}", "{% if true %}", "{% endif %}", "{{ 'abc",
                          "{# abc", "{% raw %}abc", "{{ x|nofilter }}", "{{ x is notatest }}", "{% break %}",
                          "{% for x in y %}{% endif %}", "{{ (1 }}", "{{ [1, }}", "{{ {'a' 1} }}", "{% set %}",
                          "{% macro %}", "{% include 'x' %}", "{{ }}", "{% %}", "{{ a.1b }}", "{% unknowntag %}"}) {
    SCOPED_TRACE(bad);
    auto out = RenderChatTemplate(bad, nlohmann::ordered_json::object());
    ASSERT_FALSE(out.ok()) << *out;
    EXPECT_NE(out.status().message().find("line 1"), std::string::npos) << out.status().message();
  }
}

TEST(TemplateEngine, RunawayTemplatesAreStopped) {
  EXPECT_NE(R("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("ERR: maximum recursion depth"),
            std::string::npos);
  EXPECT_NE(R("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}").find("step limit"),
            std::string::npos);
  EXPECT_NE(R("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
                .find("ERR: "),
            std::string::npos);
  EXPECT_NE(R("{{ 'x' * 100000000000 }}").find("ERR: "), std::string::npos);
  // Deep nesting is a syntax error, not a stack overflow.
  EXPECT_NE(R("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}").find("ERR: "),
            std::string::npos);
  std::string ifs;
  for (int i = 0; i < 20000; ++i) ifs += "{% if true %}";
  EXPECT_NE(R(ifs).find("ERR: "), std::string::npos);
  std::string nots = "{{ " + std::string(0, ' ');
  for (int i = 0; i < 50000; ++i) nots += "not ";
  EXPECT_NE(R(nots + "1 }}").find("ERR: "), std::string::npos);
}

TEST(TemplateEngine, RandomInputNeverCrashes) {
  // Templates glued from fragments of real syntax: each either renders or fails cleanly.
  const std::vector<std::string> frags = {
      "{%", "%}", "{{", "}}", "{#", "#}", "-", "+", " if ", " for ", " in ", " endif ", " endfor ", " else ",
      " set ", "=", " x ", " messages ", "[", "]", "(", ")", "{", "}", "'s'", "\"q\"", "1", "2.5", "|",
      " length ", " tojson ", " items ", ".", ",", ":", " macro ", " endmacro ", " call ", " not ", " is ",
      " defined ", "~", "*", "**", "/", "//", "%", "\n", "  ", " loop ", " ns ", " namespace ", " raw ",
      " endraw ", " break ", " continue ", " none ", " and ", " or ", "text", "\\", " filter ", " endfilter "};
  std::mt19937 rng(12345);
  const char* ctx = R"({"messages": [{"role": "user", "content": "hi"}], "x": [1, {"a": null}]})";
  int rendered = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string t;
    int n = 1 + static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) t += frags[rng() % frags.size()];
    TemplateOptions opts;
    opts.limits.max_steps = 100000;
    auto out = RenderChatTemplate(t, nlohmann::ordered_json::parse(ctx), opts);
    rendered += out.ok();
  }
  EXPECT_GT(rendered, 0);
}

}  // namespace
}  // namespace substrate
