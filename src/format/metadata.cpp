// Metadata accessors, value formatting, and the format-independent parts of ModelFile.
#include <cmath>
#include <cstdio>
#include <limits>

#include "format/gguf_reader.h"
#include "format/hf_model_file.h"
#include "format/model_file.h"

namespace substrate {
namespace {

bool IsUnsigned(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 ||
         t == GgufType::kUint64;
}
bool IsSigned(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 ||
         t == GgufType::kInt64;
}
bool IsFloat(GgufType t) { return t == GgufType::kFloat32 || t == GgufType::kFloat64; }

// Integer value of a scalar, if it is an integer (or bool) that fits int64.
std::optional<int64_t> AsInt(const MetaValue& v) {
  if (IsUnsigned(v.type)) {
    uint64_t u = std::get<uint64_t>(v.value);
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (IsSigned(v.type)) return std::get<int64_t>(v.value);
  if (v.type == GgufType::kBool) return std::get<bool>(v.value) ? 1 : 0;
  return std::nullopt;
}

std::optional<double> AsFloat(const MetaValue& v) {
  if (IsFloat(v.type)) return std::get<double>(v.value);
  if (IsUnsigned(v.type)) return static_cast<double>(std::get<uint64_t>(v.value));
  if (IsSigned(v.type)) return static_cast<double>(std::get<int64_t>(v.value));
  return std::nullopt;
}

Status WrongType(const std::string& key, const MetaValue& v, const char* wanted) {
  std::string got = GgufTypeName(v.type);
  if (v.is_array()) got += std::string(" of ") + GgufTypeName(v.array_type);
  return InvalidArgument("metadata key '" + key + "' is " + got + ", expected " + wanted);
}

}  // namespace

const char* GgufTypeName(GgufType t) {
  switch (t) {
    case GgufType::kUint8: return "u8";
    case GgufType::kInt8: return "i8";
    case GgufType::kUint16: return "u16";
    case GgufType::kInt16: return "i16";
    case GgufType::kUint32: return "u32";
    case GgufType::kInt32: return "i32";
    case GgufType::kFloat32: return "f32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kUint64: return "u64";
    case GgufType::kInt64: return "i64";
    case GgufType::kFloat64: return "f64";
  }
  return "?";
}

MetaValue MetaValue::StrArray(const std::vector<std::string>& items) {
  std::vector<MetaValue> v;
  v.reserve(items.size());
  for (const auto& s : items) v.push_back(Str(s));
  return Array(GgufType::kString, std::move(v));
}

MetaValue MetaValue::I32Array(const std::vector<int32_t>& items) {
  std::vector<MetaValue> v;
  v.reserve(items.size());
  for (int32_t x : items) v.push_back(I32(x));
  return Array(GgufType::kInt32, std::move(v));
}

MetaValue MetaValue::F32Array(const std::vector<float>& items) {
  std::vector<MetaValue> v;
  v.reserve(items.size());
  for (float x : items) v.push_back(F32(x));
  return Array(GgufType::kFloat32, std::move(v));
}

std::string MetaValueToString(const MetaValue& v, size_t max_items) {
  char buf[64];
  switch (v.type) {
    case GgufType::kString: {
      std::string s = std::get<std::string>(v.value);
      if (s.size() > 120) s = s.substr(0, 117) + "...";
      std::string out = "\"";
      for (char c : s) {
        if (c == '\n') out += "\\n";
        else if (c == '"') out += "\\\"";
        else out += c;
      }
      return out + "\"";
    }
    case GgufType::kBool: return std::get<bool>(v.value) ? "true" : "false";
    case GgufType::kFloat32:
    case GgufType::kFloat64:
      std::snprintf(buf, sizeof buf, "%.9g", std::get<double>(v.value));
      return buf;
    case GgufType::kArray: {
      const auto& a = v.array();
      if (a.size() > max_items) {
        return std::string("[") + GgufTypeName(v.array_type) + " x " + std::to_string(a.size()) +
               "]";
      }
      std::string out = "[";
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) out += ", ";
        out += MetaValueToString(a[i], max_items);
      }
      return out + "]";
    }
    default:
      if (IsUnsigned(v.type)) return std::to_string(std::get<uint64_t>(v.value));
      return std::to_string(std::get<int64_t>(v.value));
  }
}

const MetaValue* Metadata::Find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

Expected<std::string> Metadata::GetString(const std::string& key) const {
  const MetaValue* v = Find(key);
  if (!v) return NotFound("metadata key '" + key + "' is missing");
  if (v->type != GgufType::kString) return WrongType(key, *v, "string");
  return std::get<std::string>(v->value);
}

Expected<int64_t> Metadata::GetInt(const std::string& key) const {
  const MetaValue* v = Find(key);
  if (!v) return NotFound("metadata key '" + key + "' is missing");
  auto x = AsInt(*v);
  if (!x) return WrongType(key, *v, "an integer");
  return *x;
}

Expected<double> Metadata::GetFloat(const std::string& key) const {
  const MetaValue* v = Find(key);
  if (!v) return NotFound("metadata key '" + key + "' is missing");
  auto x = AsFloat(*v);
  if (!x) return WrongType(key, *v, "a number");
  return *x;
}

Expected<bool> Metadata::GetBool(const std::string& key) const {
  const MetaValue* v = Find(key);
  if (!v) return NotFound("metadata key '" + key + "' is missing");
  if (v->type == GgufType::kBool) return std::get<bool>(v->value);
  auto x = AsInt(*v);
  if (!x) return WrongType(key, *v, "bool");
  return *x != 0;
}

Expected<std::vector<std::string>> Metadata::GetStringArray(const std::string& key) const {
  const MetaValue* v = Find(key);
  if (!v) return NotFound("metadata key '" + key + "' is missing");
  if (!v->is_array() || v->array_type != GgufType::kString)
    return WrongType(key, *v, "array of string");
  std::vector<std::string> out;
  out.reserve(v->array().size());
  for (const auto& e : v->array()) out.push_back(std::get<std::string>(e.value));
  return out;
}

Expected<std::vector<int64_t>> Metadata::GetIntArray(const std::string& key) const {
  const MetaValue* v = Find(key);
  if (!v) return NotFound("metadata key '" + key + "' is missing");
  if (!v->is_array()) return WrongType(key, *v, "array of integers");
  std::vector<int64_t> out;
  out.reserve(v->array().size());
  for (const auto& e : v->array()) {
    auto x = AsInt(e);
    if (!x) return WrongType(key, *v, "array of integers");
    out.push_back(*x);
  }
  return out;
}

Expected<std::vector<double>> Metadata::GetFloatArray(const std::string& key) const {
  const MetaValue* v = Find(key);
  if (!v) return NotFound("metadata key '" + key + "' is missing");
  if (!v->is_array()) return WrongType(key, *v, "array of numbers");
  std::vector<double> out;
  out.reserve(v->array().size());
  for (const auto& e : v->array()) {
    auto x = AsFloat(e);
    if (!x) return WrongType(key, *v, "array of numbers");
    out.push_back(*x);
  }
  return out;
}

std::string Metadata::GetString(const std::string& key, const std::string& fallback) const {
  auto v = GetString(key);
  return v.ok() ? *v : fallback;
}

int64_t Metadata::GetInt(const std::string& key, int64_t fallback) const {
  auto v = GetInt(key);
  return v.ok() ? *v : fallback;
}

double Metadata::GetFloat(const std::string& key, double fallback) const {
  auto v = GetFloat(key);
  return v.ok() ? *v : fallback;
}

void Metadata::Set(const std::string& key, MetaValue v) {
  auto it = kv_.find(key);
  if (it != kv_.end()) {
    it->second = std::move(v);  // keeps its place in the order
    return;
  }
  kv_.emplace(key, std::move(v));
  order_.push_back(key);
}

void Metadata::Erase(const std::string& key) {
  if (kv_.erase(key) == 0) return;
  for (auto it = order_.begin(); it != order_.end(); ++it) {
    if (*it == key) {
      order_.erase(it);
      break;
    }
  }
}

uint64_t TensorInfo::n_elements() const {
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;
  return n;
}

const TensorInfo* ModelFile::Find(const std::string& name) const {
  for (const auto& t : tensors())
    if (t.name == name) return &t;
  return nullptr;
}

Expected<std::unique_ptr<ModelFile>> ModelFile::Open(const std::string& path) {
  if (IsDirectory(path)) {
    ASSIGN_OR_RETURN(auto hf, HfModelFile::Open(path));
    return std::unique_ptr<ModelFile>(std::move(hf));
  }
  if (!FileExists(path)) return NotFound("model '" + path + "': no such file or folder");
  ASSIGN_OR_RETURN(auto gguf, GgufFile::Open(path));
  return std::unique_ptr<ModelFile>(std::move(gguf));
}

}  // namespace substrate
