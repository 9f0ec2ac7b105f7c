#include "serve/json_schema.h"

#include <set>

#include "serve/grammar.h"

namespace substrate::serve {

using json = nlohmann::ordered_json;

namespace {

// Whitespace between tokens: one space, or a newline and an indentation. Bounded, so that a
// model cannot spend its whole answer on whitespace.
const char* kWs = R"(( " " | "\n" [ \t]{0,16} )?)";

const std::map<std::string, std::string>& CommonRules() {
  static const std::map<std::string, std::string> rules = {
      {"ws", kWs},
      {"json-char", R"([^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ))"},
      {"json-string", R"("\"" json-char* "\"")"},
      {"json-int", R"("-"? ( "0" | [1-9] [0-9]{0,15} ))"},
      {"json-number", R"(json-int ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?)"},
      {"json-bool", R"("true" | "false")"},
      {"json-null", R"("null")"},
      {"json-value",
       "json-object | json-array | json-string | json-number | json-bool | json-null"},
      {"json-object", R"("{" ws ( json-member ( ws "," ws json-member )* ws )? "}")"},
      {"json-member", R"(json-string ws ":" ws json-value)"},
      {"json-array", R"("[" ws ( json-value ( ws "," ws json-value )* ws )? "]")"},
      {"json-hex", "[0-9a-fA-F]"},
      {"json-date",
       R"([0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ))"},
      {"json-time",
       R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? )"
       R"(( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))"},
      {"json-uuid",
       R"(json-hex{8} "-" json-hex{4} "-" json-hex{4} "-" json-hex{4} "-" json-hex{12})"},
  };
  return rules;
}

// Which common rules each one uses (so Common adds what it needs).
const std::map<std::string, std::vector<std::string>>& CommonDeps() {
  static const std::map<std::string, std::vector<std::string>> deps = {
      {"json-string", {"json-char"}},
      {"json-number", {"json-int"}},
      {"json-value",
       {"json-object", "json-array", "json-string", "json-number", "json-bool", "json-null"}},
      {"json-object", {"ws", "json-member"}},
      {"json-member", {"json-string", "ws", "json-value"}},
      {"json-array", {"ws", "json-value"}},
      {"json-uuid", {"json-hex"}},
  };
  return deps;
}

const std::set<std::string>& Annotations() {
  static const std::set<std::string> a = {"title",    "description", "$schema",  "$id",
                                          "$comment", "default",     "examples", "deprecated",
                                          "readOnly", "writeOnly"};
  return a;
}

const std::set<std::string>& Supported() {
  static const std::set<std::string> s = {
      "type",  "enum",        "const",      "anyOf",     "$ref",
      "$defs", "definitions", "properties", "required",  "additionalProperties",
      "items", "minItems",    "maxItems",   "minLength", "maxLength",
      "format"};
  return s;
}

const std::set<std::string>& Formats() {
  static const std::set<std::string> f = {"date", "time", "date-time", "uuid"};
  return f;
}

Status Unsupported(const std::string& path, const std::string& what) {
  return InvalidArgument("JSON schema at '" + path + "': " + what);
}

// A non-negative integer keyword, or `fallback` when absent.
Expected<int64_t> Count(const json& s, const char* key, const std::string& path, int64_t fallback) {
  auto it = s.find(key);
  if (it == s.end()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 10000)
    return Unsupported(path, std::string("'") + key + "' must be an integer in 0..10000");
  return it->get<int64_t>();
}

// "{m,n}" for a repetition of at least lo and at most hi (< 0: unbounded) more items.
std::string Repeat(int64_t lo, int64_t hi) {
  if (hi < 0) return lo == 0 ? "*" : "{" + std::to_string(lo) + ",}";
  if (lo == hi) return "{" + std::to_string(lo) + "}";
  return "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
}

}  // namespace

struct SchemaGrammar::Scope {
  const json* root = nullptr;
  std::string prefix;
  std::map<std::string, std::string> refs;  // "$ref" -> its rule
};

SchemaGrammar::SchemaGrammar() {
  Common("ws");
}

void SchemaGrammar::Common(const std::string& name) {
  if (common_.count(name)) return;
  common_[name] = CommonRules().at(name);
  auto d = CommonDeps().find(name);
  if (d != CommonDeps().end())
    for (const std::string& n : d->second) Common(n);
}

std::string SchemaGrammar::Rule(const std::string& prefix, const std::string& body) {
  const std::string name = prefix + "-" + std::to_string(++counter_);
  rules_ += name + " ::= " + body + "\n";
  return name;
}

std::string SchemaGrammar::AnyObject() {
  Common("json-object");
  return "json-object";
}

std::string SchemaGrammar::Text(const std::string& head) const {
  std::string out = head + "\n" + rules_;
  for (const auto& [name, body] : common_) out += name + " ::= " + body + "\n";
  return out;
}

Expected<std::string> SchemaGrammar::Add(const json& schema, const std::string& prefix) {
  Scope scope;
  scope.root = &schema;
  scope.prefix = prefix;
  return Compile(schema, "schema", scope);
}

Expected<std::string> SchemaGrammar::Compile(const json& s, const std::string& path, Scope& scope) {
  if (s.is_boolean()) {
    if (!s.get<bool>()) return Unsupported(path, "the schema 'false' matches nothing");
    Common("json-value");
    return std::string("json-value");
  }
  if (!s.is_object()) return Unsupported(path, "a schema must be an object or a boolean");
  for (const auto& [key, v] : s.items())
    if (!Supported().count(key) && !Annotations().count(key))
      return Unsupported(path, "unsupported keyword '" + key +
                                   "' (supported: type, properties, required, "
                                   "additionalProperties, items, minItems, maxItems, enum, const, "
                                   "anyOf, $ref/$defs, minLength, maxLength, format)");

  if (auto it = s.find("$ref"); it != s.end()) {
    if (!it->is_string()) return Unsupported(path, "'$ref' must be a string");
    for (const auto& [key, v] : s.items())
      if (key != "$ref" && key != "$defs" && key != "definitions" && !Annotations().count(key))
        return Unsupported(path, "'" + key + "' beside '$ref' is not supported");
    return Ref(it->get<std::string>(), path, scope);
  }
  if (auto it = s.find("const"); it != s.end())
    return Rule(scope.prefix, GrammarLiteral(it->dump()));
  if (auto it = s.find("enum"); it != s.end()) {
    if (!it->is_array() || it->empty())
      return Unsupported(path, "'enum' must be a non-empty array");
    std::string body;
    for (const json& v : *it) body += (body.empty() ? "" : " | ") + GrammarLiteral(v.dump());
    return Rule(scope.prefix, body);
  }
  if (auto it = s.find("anyOf"); it != s.end()) {
    if (!it->is_array() || it->empty())
      return Unsupported(path, "'anyOf' must be a non-empty array");
    // Keywords beside anyOf apply to every branch.
    json rest = s;
    rest.erase("anyOf");
    std::string body;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& branch = (*it)[i];
      json merged = branch;
      if (branch.is_object())
        for (const auto& [k, v] : rest.items())
          if (!Annotations().count(k) && !merged.contains(k)) merged[k] = v;
      ASSIGN_OR_RETURN(std::string r,
                       Compile(merged, path + ".anyOf[" + std::to_string(i) + "]", scope));
      body += (body.empty() ? "" : " | ") + r;
    }
    return Rule(scope.prefix, body);
  }

  std::vector<std::string> types;
  if (auto it = s.find("type"); it != s.end()) {
    if (it->is_string()) {
      types.push_back(it->get<std::string>());
    } else if (it->is_array() && !it->empty()) {
      for (const json& t : *it) {
        if (!t.is_string()) return Unsupported(path, "'type' must be a string or strings");
        types.push_back(t.get<std::string>());
      }
    } else {
      return Unsupported(path, "'type' must be a string or a non-empty array of strings");
    }
  } else if (s.contains("properties") || s.contains("additionalProperties") ||
             s.contains("required")) {
    types.push_back("object");
  } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
    types.push_back("array");
  } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("format")) {
    types.push_back("string");
  } else {
    Common("json-value");
    return std::string("json-value");
  }
  std::string body;
  for (const std::string& t : types) {
    std::string r;
    if (t == "object") {
      ASSIGN_OR_RETURN(r, Object(s, path, scope));
    } else if (t == "array") {
      ASSIGN_OR_RETURN(r, Array(s, path, scope));
    } else if (t == "string") {
      ASSIGN_OR_RETURN(r, String(s, path));
    } else if (t == "integer" || t == "number" || t == "boolean" || t == "null") {
      r = t == "integer"   ? "json-int"
          : t == "number"  ? "json-number"
          : t == "boolean" ? "json-bool"
                           : "json-null";
      Common(r);
    } else {
      return Unsupported(path, "unknown type '" + t + "'");
    }
    body += (body.empty() ? "" : " | ") + r;
  }
  return types.size() == 1 ? body : Rule(scope.prefix, body);
}

Expected<std::string> SchemaGrammar::Object(const json& s, const std::string& path, Scope& scope) {
  const json empty = json::object();
  auto pit = s.find("properties");
  const json& props = pit == s.end() ? empty : *pit;
  if (!props.is_object()) return Unsupported(path, "'properties' must be an object");
  std::set<std::string> required;
  if (auto it = s.find("required"); it != s.end()) {
    if (!it->is_array()) return Unsupported(path, "'required' must be an array of names");
    for (const json& r : *it) {
      if (!r.is_string()) return Unsupported(path, "'required' must be an array of names");
      required.insert(r.get<std::string>());
    }
  }
  json extra = true;
  if (auto it = s.find("additionalProperties"); it != s.end()) {
    if (!it->is_boolean() && !it->is_object())
      return Unsupported(path, "'additionalProperties' must be a boolean or a schema");
    extra = *it;
  }
  // Properties in the order given, then required names the schema does not describe.
  std::vector<std::pair<std::string, const json*>> keys;
  for (const auto& [k, v] : props.items()) keys.push_back({k, &v});
  for (const std::string& r : required)
    if (!props.contains(r)) {
      if (extra.is_boolean() && !extra.get<bool>())
        return Unsupported(path, "required property '" + r +
                                     "' is not in 'properties' and additionalProperties is false");
      keys.push_back({r, extra.is_object() ? &extra : nullptr});
    }

  if (keys.empty()) {
    if (extra.is_boolean() && !extra.get<bool>()) return Rule(scope.prefix, R"("{" ws "}")");
    // A map: any keys, values of the additionalProperties schema.
    std::string value = "json-value";
    if (extra.is_object()) {
      ASSIGN_OR_RETURN(value, Compile(extra, path + ".additionalProperties", scope));
    } else {
      Common("json-value");
    }
    Common("json-string");
    const std::string kv = Rule(scope.prefix, "json-string ws \":\" ws " + value);
    return Rule(scope.prefix, "\"{\" ws ( " + kv + " ( ws \",\" ws " + kv + " )* ws )? \"}\"");
  }
  // Declared properties only (additional ones are allowed but never generated), in order;
  // optional ones may be left out. rest[i][first]: the members from i on.
  std::vector<std::string> member(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    std::string value = "json-value";
    if (keys[i].second) {
      ASSIGN_OR_RETURN(value,
                       Compile(*keys[i].second, path + ".properties." + keys[i].first, scope));
    } else {
      Common("json-value");
    }
    member[i] = GrammarLiteral(json(keys[i].first).dump()) + " ws \":\" ws " + value;
  }
  std::map<std::pair<size_t, bool>, std::string> rest;
  std::function<std::string(size_t, bool)> Rest = [&](size_t i, bool first) -> std::string {
    if (i == keys.size()) return "";
    auto key = std::make_pair(i, first);
    if (auto it = rest.find(key); it != rest.end()) return it->second;
    const std::string sep = first ? "" : "ws \",\" ws ";
    const std::string with = sep + member[i] + " " + Rest(i + 1, false);
    std::string body = with;
    if (!required.count(keys[i].first)) {
      const std::string without = Rest(i + 1, first);
      body = "( " + with + " ) | ( " + without + " )";
    }
    return rest[key] = Rule(scope.prefix, body);
  };
  const std::string members = Rest(0, true);
  return Rule(scope.prefix, "\"{\" ws " + members + " ws \"}\"");
}

Expected<std::string> SchemaGrammar::Array(const json& s, const std::string& path, Scope& scope) {
  std::string item = "json-value";
  if (auto it = s.find("items"); it != s.end()) {
    ASSIGN_OR_RETURN(item, Compile(*it, path + ".items", scope));
  } else {
    Common("json-value");
  }
  ASSIGN_OR_RETURN(int64_t lo, Count(s, "minItems", path, 0));
  ASSIGN_OR_RETURN(int64_t hi, Count(s, "maxItems", path, -1));
  if (hi >= 0 && hi < lo) return Unsupported(path, "maxItems is less than minItems");
  if (hi == 0) return Rule(scope.prefix, R"("[" ws "]")");
  const std::string more =
      "( ws \",\" ws " + item + " )" + Repeat(lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
  const std::string items = item + " " + more;
  return Rule(scope.prefix,
              lo > 0 ? "\"[\" ws " + items + " ws \"]\"" : "\"[\" ws ( " + items + " ws )? \"]\"");
}

Expected<std::string> SchemaGrammar::String(const json& s, const std::string& path) {
  if (auto it = s.find("format"); it != s.end()) {
    if (!it->is_string() || !Formats().count(it->get<std::string>()))
      return Unsupported(path, "unsupported string format " + it->dump() +
                                   " (supported: date, time, date-time, uuid)");
    if (s.contains("minLength") || s.contains("maxLength"))
      return Unsupported(path, "minLength/maxLength beside 'format' are not supported");
    const std::string f = it->get<std::string>();
    std::string body;
    if (f == "date-time") {
      Common("json-date");
      Common("json-time");
      body = "json-date \"T\" json-time";
    } else {
      Common("json-" + f);
      body = "json-" + f;
    }
    return Rule("fmt", "\"\\\"\" " + body + " \"\\\"\"");
  }
  ASSIGN_OR_RETURN(int64_t lo, Count(s, "minLength", path, 0));
  ASSIGN_OR_RETURN(int64_t hi, Count(s, "maxLength", path, -1));
  if (hi >= 0 && hi < lo) return Unsupported(path, "maxLength is less than minLength");
  if (lo == 0 && hi < 0) {
    Common("json-string");
    return std::string("json-string");
  }
  Common("json-char");
  return Rule("str", "\"\\\"\" json-char" + Repeat(lo, hi) + " \"\\\"\"");
}

Expected<std::string> SchemaGrammar::Ref(const std::string& ref, const std::string& path,
                                         Scope& scope) {
  if (auto it = scope.refs.find(ref); it != scope.refs.end()) return it->second;
  if (ref.empty() || ref[0] != '#')
    return Unsupported(path, "'$ref' " + ref + " is not local (only '#...' references)");
  const json* target = nullptr;
  try {
    json::json_pointer ptr(ref.substr(1));
    if (scope.root->contains(ptr)) target = &scope.root->at(ptr);
  } catch (const std::exception&) {
    target = nullptr;
  }
  if (!target) return Unsupported(path, "'$ref' " + ref + " does not resolve");
  // Named before compiling, so that a recursive schema refers to its own rule.
  const std::string name = scope.prefix + "-ref" + std::to_string(++counter_);
  scope.refs[ref] = name;
  ASSIGN_OR_RETURN(std::string body, Compile(*target, path + "($ref " + ref + ")", scope));
  rules_ += name + " ::= " + body + "\n";
  return name;
}

Expected<std::string> JsonSchemaGrammar(const json& schema, const std::string& prefix) {
  SchemaGrammar g;
  ASSIGN_OR_RETURN(std::string root, g.Add(schema, "s"));
  return g.Text("root ::= " + prefix + " " + root);
}

std::string JsonObjectGrammar(const std::string& prefix) {
  SchemaGrammar g;
  return g.Text("root ::= " + prefix + " " + g.AnyObject());
}

}  // namespace substrate::serve
