// libFuzzer target: safetensors header parsing (length prefix, JSON, dtype/shape/offsets checks)
// on arbitrary file bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t len = 0;
  std::memcpy(&len, data, 8);
  if (len > size - 8 || len > substrate::kMaxSafetensorsHeader) return 0;  // as the file reader
  std::string header(reinterpret_cast<const char*>(data) + 8, len);
  auto entries = substrate::ParseSafetensorsHeader(header, 8 + len, size - 8 - len, "fuzz");
  if (entries.ok()) {
    for (const auto& e : *entries)
      if (e.offset + e.bytes > size) __builtin_trap();
  }
  return 0;
}
