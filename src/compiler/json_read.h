// Small helpers for reading our JSON documents (plans, profiles) with errors that name the
// path of the bad field ("plan: op_bundles[3].tiers[1].peak_ram_delta_bytes: expected an
// unsigned integer"). Internal to the compiler layer.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace substrate::compiler::jsonr {

using nlohmann::json;

inline Status TypeError(const std::string& doc, const std::string& path, const char* what) {
  return Corruption(doc + ": " + path + ": expected " + what);
}

inline Expected<const json*> Field(const std::string& doc, const json& obj, const std::string& path,
                                   const char* key) {
  if (!obj.is_object()) return TypeError(doc, path, "an object");
  auto it = obj.find(key);
  if (it == obj.end()) return Corruption(doc + ": " + path + ": missing field '" + key + "'");
  return &*it;
}

inline Expected<uint64_t> U64(const std::string& doc, const json& obj, const std::string& path,
                              const char* key) {
  ASSIGN_OR_RETURN(const json* v, Field(doc, obj, path, key));
  if (!v->is_number_unsigned() && !(v->is_number_integer() && v->get<int64_t>() >= 0))
    return TypeError(doc, path + "." + key, "an unsigned integer");
  return v->get<uint64_t>();
}

inline Expected<int64_t> I64(const std::string& doc, const json& obj, const std::string& path,
                             const char* key) {
  ASSIGN_OR_RETURN(const json* v, Field(doc, obj, path, key));
  if (!v->is_number_integer()) return TypeError(doc, path + "." + key, "an integer");
  if (v->is_number_unsigned() && v->get<uint64_t>() > (1ull << 62))
    return TypeError(doc, path + "." + key, "an integer of sane size");
  return v->get<int64_t>();
}

inline Expected<double> F64(const std::string& doc, const json& obj, const std::string& path,
                            const char* key) {
  ASSIGN_OR_RETURN(const json* v, Field(doc, obj, path, key));
  if (!v->is_number()) return TypeError(doc, path + "." + key, "a number");
  return v->get<double>();
}

inline Expected<std::string> Str(const std::string& doc, const json& obj, const std::string& path,
                                 const char* key) {
  ASSIGN_OR_RETURN(const json* v, Field(doc, obj, path, key));
  if (!v->is_string()) return TypeError(doc, path + "." + key, "a string");
  return v->get<std::string>();
}

inline Expected<const json*> Arr(const std::string& doc, const json& obj, const std::string& path,
                                 const char* key) {
  ASSIGN_OR_RETURN(const json* v, Field(doc, obj, path, key));
  if (!v->is_array()) return TypeError(doc, path + "." + key, "an array");
  return v;
}

inline Expected<std::vector<std::string>> StrArr(const std::string& doc, const json& obj,
                                                 const std::string& path, const char* key) {
  ASSIGN_OR_RETURN(const json* a, Arr(doc, obj, path, key));
  std::vector<std::string> out;
  for (size_t i = 0; i < a->size(); ++i) {
    if (!(*a)[i].is_string())
      return TypeError(doc, path + "." + key + "[" + std::to_string(i) + "]", "a string");
    out.push_back((*a)[i].get<std::string>());
  }
  return out;
}

// Parses text; a syntax error names the byte offset.
inline Expected<json> Parse(const std::string& doc, const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    return Corruption(doc + ": not valid JSON: " + e.what());
  }
}

}  // namespace substrate::compiler::jsonr
