// JSON schema -> grammar: documents drawn at random through the token mask always parse and
// validate (checked by an independent validator written here), for random schemas of the
// documented subset; known-bad documents are rejected; keywords outside the subset are errors
// naming them.
#include "serve/json_schema.h"

#include <gtest/gtest.h>

#include <random>
#include <regex>

#include "grammar_test_util.h"

namespace substrate::serve {
namespace {

using ojson = nlohmann::ordered_json;
using testing::Accepts;
using testing::MustParse;

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// An independent validator for the documented subset.
bool Valid(const ojson& s, const ojson& v, const ojson& root, std::string* why) {
  auto fail = [&](const std::string& w) {
    *why = w + " at " + v.dump();
    return false;
  };
  if (s.is_boolean()) return s.get<bool>() || fail("false schema");
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    return Valid(root.at(ojson::json_pointer(ref.substr(1))), v, root, why);
  }
  if (s.contains("const") && v != s["const"]) return fail("not the const");
  if (s.contains("enum")) {
    bool found = false;
    for (const auto& e : s["enum"]) found |= e == v;
    if (!found) return fail("not in enum");
  }
  if (s.contains("anyOf")) {
    bool any = false;
    for (const auto& b : s["anyOf"]) {
      ojson merged = b;
      for (const auto& [k, x] : s.items())
        if (k != "anyOf" && !merged.contains(k)) merged[k] = x;
      std::string w;
      any |= Valid(merged, v, root, &w);
    }
    if (!any) return fail("no anyOf branch");
    return true;
  }
  if (s.contains("type")) {
    std::vector<std::string> types;
    if (s["type"].is_string())
      types.push_back(s["type"]);
    else
      for (const auto& t : s["type"]) types.push_back(t);
    bool ok = false;
    for (const std::string& t : types)
      ok |= (t == "string" && v.is_string()) || (t == "integer" && v.is_number_integer()) ||
            (t == "number" && v.is_number()) || (t == "boolean" && v.is_boolean()) ||
            (t == "null" && v.is_null()) || (t == "object" && v.is_object()) ||
            (t == "array" && v.is_array());
    if (!ok) return fail("wrong type");
  }
  if (v.is_object()) {
    const ojson props = s.value("properties", ojson::object());
    for (const auto& r : s.value("required", ojson::array()))
      if (!v.contains(r.get<std::string>())) return fail("missing " + r.dump());
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (!Valid(props[k], x, root, why)) return false;
      } else if (s.contains("additionalProperties")) {
        if (!Valid(s["additionalProperties"], x, root, why)) return false;
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return fail("too few");
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return fail("too many");
    if (s.contains("items"))
      for (const auto& x : v)
        if (!Valid(s["items"], x, root, why)) return false;
  }
  if (v.is_string()) {
    const std::string str = v;
    if (s.contains("minLength") && CodePoints(str) < s["minLength"].get<size_t>())
      return fail("short");
    if (s.contains("maxLength") && CodePoints(str) > s["maxLength"].get<size_t>())
      return fail("long");
    if (s.contains("format")) {
      static const std::string date = R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))";
      static const std::string time =
          R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
      const std::string f = s["format"];
      const std::string re =
          f == "date"   ? date
          : f == "time" ? time
          : f == "date-time"
              ? date + "T" + time
              : R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})";
      if (!std::regex_match(str, std::regex(re))) return fail("bad " + f);
    }
  }
  return true;
}

// A random schema of the documented subset.
ojson RandomSchema(std::mt19937_64& rng, int depth, ojson* defs) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  const int kind = depth >= 3 ? pick(6) : pick(11);
  switch (kind) {
    case 0: {
      ojson s = {{"type", "string"}};
      if (pick(2)) s["maxLength"] = 1 + pick(12);
      if (pick(3) == 0) s["minLength"] = pick(2);
      return s;
    }
    case 1:
      return {{"type", "integer"}, {"description", "a count"}};
    case 2:
      return {{"type", pick(2) ? "number" : "boolean"}};
    case 3:
      return {{"enum", {"red", "green", 7, nullptr}}};
    case 4: {
      static const char* formats[] = {"date", "time", "date-time", "uuid"};
      return {{"type", "string"}, {"format", formats[pick(4)]}};
    }
    case 5:
      return {{"type", {"string", "null"}}, {"maxLength", 5}};
    case 6:
    case 7: {
      ojson s = {
          {"type", "object"}, {"properties", ojson::object()}, {"additionalProperties", false}};
      ojson req = ojson::array();
      const int n = 1 + pick(4);
      for (int i = 0; i < n; ++i) {
        const std::string key =
            std::string("k") + static_cast<char>('a' + i) + (pick(2) ? "_x" : "");
        s["properties"][key] = RandomSchema(rng, depth + 1, defs);
        if (pick(2)) req.push_back(key);
      }
      s["required"] = req;
      return s;
    }
    case 8: {
      ojson s = {{"type", "array"}, {"items", RandomSchema(rng, depth + 1, defs)}};
      const int lo = pick(3);
      s["minItems"] = lo;
      s["maxItems"] = lo + pick(3);
      return s;
    }
    case 9:
      return {{"anyOf", {RandomSchema(rng, depth + 1, defs), RandomSchema(rng, depth + 1, defs)}}};
    default: {
      std::string name = std::to_string(defs->size());
      name.insert(name.begin(), 'd');
      (*defs)[name] = RandomSchema(rng, depth + 1, defs);
      return {{"$ref", "#/$defs/" + name}};
    }
  }
}

TEST(JsonSchema, RandomSchemasGiveValidDocuments) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 60; ++round) {
    ojson defs = ojson::object();
    ojson schema = RandomSchema(rng, 0, &defs);
    if (!defs.empty()) schema["$defs"] = defs;
    SCOPED_TRACE(schema.dump());
    auto text = JsonSchemaGrammar(schema);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    auto g = MustParse(*text);
    ASSERT_TRUE(g);
    for (uint64_t seed = 0; seed < 4; ++seed) {
      const std::string doc = testing::RandomSentence(g, seed * 1000 + round);
      ojson v = ojson::parse(doc, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << "not JSON: " << doc;
      std::string why;
      EXPECT_TRUE(Valid(schema, v, schema, &why)) << why << "\n" << doc;
    }
  }
}

TEST(JsonSchema, ObjectsKeepOrderRequireAndRejectExtras) {
  ojson schema = ojson::parse(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"},"maxItems":2}},
      "required":["name","tags"],"additionalProperties":false})");
  auto text = JsonSchemaGrammar(schema);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  auto g = MustParse(*text);
  EXPECT_TRUE(Accepts(g, R"({"name": "x", "age": 3, "tags": []})"));
  EXPECT_TRUE(Accepts(g, R"({"name":"x","tags":["a","b"]})"));
  EXPECT_TRUE(Accepts(g, "{\n  \"name\": \"\\u00e9\",\n  \"tags\": [\"a\"]\n}"));
  EXPECT_FALSE(Accepts(g, R"({"name": "x", "age": 3})"));                // tags required
  EXPECT_FALSE(Accepts(g, R"({"name": "x", "tags": [], "extra": 1})"));  // no extras
  EXPECT_FALSE(Accepts(g, R"({"tags": [], "name": "x"})"));              // declared order
  EXPECT_FALSE(Accepts(g, R"({"name": "x", "tags": ["a","b","c"]})"));   // maxItems
  EXPECT_FALSE(Accepts(g, R"({"name": 1, "tags": []})"));
  EXPECT_FALSE(Accepts(g, R"({"name": "x", "age": 3.5, "tags": []})"));
}

TEST(JsonSchema, RecursiveRefsAndMaps) {
  ojson schema = ojson::parse(R"({"$defs":{"node":{"type":"object","properties":{
      "v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"})");
  auto text = JsonSchemaGrammar(schema);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  auto g = MustParse(*text);
  EXPECT_TRUE(Accepts(g, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]})"));
  EXPECT_FALSE(Accepts(g, R"({"v": 1, "kids": [{"w": 2}]})"));
  auto map = JsonSchemaGrammar(
      ojson::parse(R"({"type":"object","additionalProperties":{"type":"boolean"}})"));
  ASSERT_TRUE(map.ok());
  auto m = MustParse(*map);
  EXPECT_TRUE(Accepts(m, R"({"a": true, "b": false})"));
  EXPECT_FALSE(Accepts(m, R"({"a": 1})"));
  auto any = MustParse(JsonObjectGrammar());
  EXPECT_TRUE(Accepts(any, R"({"a": [1, {"b": null}, "x", -2.5e3], "c": {}})"));
  EXPECT_FALSE(Accepts(any, R"([1])"));
  EXPECT_FALSE(Accepts(any, R"({"a": 01})"));
}

TEST(JsonSchema, UnsupportedKeywordsAreErrorsNamingThem) {
  struct Case {
    const char* schema;
    const char* names;
  } cases[] = {
      {R"({"type":"string","pattern":"^a+$"})", "'pattern'"},
      {R"({"type":"object","properties":{"x":{"type":"integer","minimum":3}}})", "'minimum'"},
      {R"({"oneOf":[{"type":"string"}]})", "'oneOf'"},
      {R"({"type":"string","format":"email"})", "\"email\""},
      {R"({"$ref":"https://example.com/s.json"})", "not local"},
      {R"({"$ref":"#/$defs/missing"})", "does not resolve"},
      {R"({"type":"thing"})", "'thing'"},
      {R"({"type":"array","minItems":3,"maxItems":1})", "maxItems"},
  };
  for (const Case& c : cases) {
    auto text = JsonSchemaGrammar(ojson::parse(c.schema));
    ASSERT_FALSE(text.ok()) << c.schema;
    EXPECT_NE(text.status().message().find(c.names), std::string::npos)
        << c.schema << " -> " << text.status().message();
  }
  // The path says where: the nested property.
  auto nested = JsonSchemaGrammar(ojson::parse(R"({"properties":{"x":{"not":{}}}})"));
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("schema.properties.x"), std::string::npos);
}

}  // namespace
}  // namespace substrate::serve
