// Element types of tensors in model files. The numeric values are GGML's type ids, as stored in
// GGUF tensor infos, so a GGUF type id converts with a range check and nothing else.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace substrate {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
};

struct DTypeTraits {
  const char* name;     // "Q4_K", as llama.cpp prints it
  uint32_t block_size;  // elements per block (1 for plain types)
  uint32_t block_bytes; // bytes per block (0: a type id we know but cannot size)
};

// Traits of a type; name "?" and block_bytes 0 for ids we do not know.
const DTypeTraits& GetDTypeTraits(DType type);
inline const char* DTypeName(DType t) { return GetDTypeTraits(t).name; }
// A valid, sized type id from a file, or nullopt.
std::optional<DType> DTypeFromId(uint32_t id);
// "q4_k", "Q4_K", "bf16" -> type; nullopt when unknown.
std::optional<DType> DTypeFromName(std::string_view name);

// Bytes of a row of n elements; nullopt if n is not a multiple of the block size or the type
// is unsized. Callers use this to validate shapes from files before trusting them.
std::optional<uint64_t> RowBytes(DType type, uint64_t n_elements);

}  // namespace substrate
