// JSON Schema -> grammar (ordered_json: properties are generated in the order given), for
// structured output (docs/serve-agents.md lists the subset). Every output of the grammar parses as
// JSON and validates against the schema; a keyword outside the subset is an error naming it and
// where it is, never ignored.
//
//   SchemaGrammar g;
//   auto root = g.Add(schema, "args");          // a rule matching exactly the valid documents
//   std::string text = g.Text("root ::= " + *root);
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace substrate::serve {

class SchemaGrammar {
 public:
  SchemaGrammar();
  // Compiles `schema` (its $defs/definitions resolve "$ref"s inside it) into rules whose names
  // start with `prefix` ([a-z0-9-]+); returns the name of the rule that matches its documents.
  Expected<std::string> Add(const nlohmann::ordered_json& schema, const std::string& prefix);
  // The rule of any JSON object (OpenAI json_object mode).
  std::string AnyObject();
  // All rules added so far, after `head` (which must define the start rule).
  std::string Text(const std::string& head) const;

 private:
  struct Scope;
  Expected<std::string> Compile(const nlohmann::ordered_json& s, const std::string& path,
                                Scope& scope);
  Expected<std::string> Object(const nlohmann::ordered_json& s, const std::string& path,
                               Scope& scope);
  Expected<std::string> Array(const nlohmann::ordered_json& s, const std::string& path,
                              Scope& scope);
  Expected<std::string> String(const nlohmann::ordered_json& s, const std::string& path);
  Expected<std::string> Ref(const std::string& ref, const std::string& path, Scope& scope);
  std::string Rule(const std::string& prefix, const std::string& body);
  void Common(const std::string& name);  // adds a shared rule (string, number, value, ...)

  std::map<std::string, std::string> common_;  // name -> body, emitted once
  std::string rules_;
  int counter_ = 0;
};

// A grammar whose sentences are the JSON documents `schema` accepts (OpenAI json_schema),
// after `prefix` (grammar text, e.g. a reasoning block; may use the rule `ws`).
Expected<std::string> JsonSchemaGrammar(const nlohmann::ordered_json& schema,
                                        const std::string& prefix = "");
// A grammar of any JSON object (OpenAI json_object), after `prefix`.
std::string JsonObjectGrammar(const std::string& prefix = "");

}  // namespace substrate::serve
