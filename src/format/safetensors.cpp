#include "format/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace substrate {
namespace {

using nlohmann::json;

std::optional<DType> SafetensorsDType(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  return std::nullopt;
}

Expected<SafetensorsEntry> ParseEntry(const std::string& key, const json& v, uint64_t data_start,
                                      uint64_t data_size, const std::string& name) {
  auto err = [&](const std::string& what) {
    return Corruption("safetensors '" + name + "': tensor '" + key + "' " + what);
  };
  if (!v.is_object()) return err("entry is not an object");
  auto dt = v.find("dtype");
  auto sh = v.find("shape");
  auto off = v.find("data_offsets");
  if (dt == v.end() || !dt->is_string()) return err("has no string 'dtype'");
  if (sh == v.end() || !sh->is_array()) return err("has no 'shape' array");
  if (off == v.end() || !off->is_array() || off->size() != 2) return err("has no 'data_offsets' pair");
  SafetensorsEntry e;
  e.name = key;
  auto type = SafetensorsDType(dt->get<std::string>());
  if (!type) {
    return Status(StatusCode::kUnimplemented, "safetensors '" + name + "': tensor '" + key +
                                                  "' has dtype " + dt->get<std::string>() +
                                                  " (only F32, F16, BF16 are supported)");
  }
  e.type = *type;
  if (sh->size() > 4) return err("has rank " + std::to_string(sh->size()) + " (at most 4 supported)");
  uint64_t n = 1;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned()) return err("has a shape entry that is not a non-negative integer");
    uint64_t x = d.get<uint64_t>();
    if (__builtin_mul_overflow(n, x, &n) || n > (1ull << 62)) return err("has an absurd shape");
    e.shape.push_back(x);
  }
  const json& b = (*off)[0];
  const json& en = (*off)[1];
  if (!b.is_number_unsigned() || !en.is_number_unsigned())
    return err("has data_offsets that are not non-negative integers");
  uint64_t begin = b.get<uint64_t>(), end = en.get<uint64_t>();
  if (begin > end || end > data_size) {
    return err("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
               "] are outside the data section (" + std::to_string(data_size) + " bytes)");
  }
  uint64_t want = n * GetDTypeTraits(e.type).block_bytes;
  if (end - begin != want) {
    return err("holds " + std::to_string(end - begin) + " bytes but its shape and dtype need " +
               std::to_string(want));
  }
  e.offset = data_start + begin;
  e.bytes = want;
  return e;
}

}  // namespace

Expected<std::vector<SafetensorsEntry>> ParseSafetensorsHeader(const std::string& text,
                                                               uint64_t data_start,
                                                               uint64_t data_size,
                                                               const std::string& name) {
  json header;
  try {
    header = json::parse(text);
  } catch (const std::exception& e) {
    return Corruption("safetensors '" + name + "': header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) return Corruption("safetensors '" + name + "': header is not a JSON object");
  std::vector<SafetensorsEntry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    ASSIGN_OR_RETURN(auto e, ParseEntry(it.key(), it.value(), data_start, data_size, name));
    entries.push_back(std::move(e));
  }
  // nlohmann's object keeps keys sorted already; sort explicitly so the order is a contract.
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i - 1]->offset + by_offset[i - 1]->bytes > by_offset[i]->offset) {
      return Corruption("safetensors '" + name + "': tensors '" + by_offset[i - 1]->name +
                        "' and '" + by_offset[i]->name + "' overlap");
    }
  }
  return entries;
}

Expected<std::vector<SafetensorsEntry>> ReadSafetensorsHeader(const RandomAccessFile& file) {
  const std::string& name = file.path();
  if (file.size() < 8) {
    return Corruption("safetensors '" + name + "': file of " + std::to_string(file.size()) +
                      " bytes is too small for a header");
  }
  uint64_t len = 0;
  RETURN_IF_ERROR(file.Read(0, 8, &len));
  if (len > file.size() - 8 || len > kMaxSafetensorsHeader) {
    return Corruption("safetensors '" + name + "': header length " + std::to_string(len) +
                      " is impossible (file size " + std::to_string(file.size()) + ")");
  }
  std::string text(len, '\0');
  RETURN_IF_ERROR(file.Read(8, len, text.data()));
  return ParseSafetensorsHeader(text, 8 + len, file.size() - 8 - len, name);
}

}  // namespace substrate
