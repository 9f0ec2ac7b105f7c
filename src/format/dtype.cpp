#include "format/dtype.h"

#include <array>
#include <cctype>

namespace substrate {
namespace {

constexpr uint32_t kQK = 32;    // elements per block of the simple 4/5/8-bit formats
constexpr uint32_t kQK_K = 256; // elements per super-block of the K and IQ formats

constexpr int kNumIds = 31;

// Indexed by GGML type id. Sizes follow the block layouts in quant/blocks.h.
constexpr std::array<DTypeTraits, kNumIds> kTraits = {{
    {"F32", 1, 4},            // 0
    {"F16", 1, 2},            // 1
    {"Q4_0", kQK, 18},        // 2
    {"Q4_1", kQK, 20},        // 3
    {"?", 0, 0},              // 4 (removed Q4_2)
    {"?", 0, 0},              // 5 (removed Q4_3)
    {"Q5_0", kQK, 22},        // 6
    {"Q5_1", kQK, 24},        // 7
    {"Q8_0", kQK, 34},        // 8
    {"Q8_1", kQK, 36},        // 9
    {"Q2_K", kQK_K, 84},      // 10
    {"Q3_K", kQK_K, 110},     // 11
    {"Q4_K", kQK_K, 144},     // 12
    {"Q5_K", kQK_K, 176},     // 13
    {"Q6_K", kQK_K, 210},     // 14
    {"Q8_K", kQK_K, 292},     // 15
    {"IQ2_XXS", kQK_K, 66},   // 16
    {"IQ2_XS", kQK_K, 74},    // 17
    {"IQ3_XXS", kQK_K, 98},   // 18
    {"IQ1_S", kQK_K, 50},     // 19
    {"IQ4_NL", kQK, 18},      // 20
    {"IQ3_S", kQK_K, 110},    // 21
    {"IQ2_S", kQK_K, 82},     // 22
    {"IQ4_XS", kQK_K, 136},   // 23
    {"I8", 1, 1},             // 24
    {"I16", 1, 2},            // 25
    {"I32", 1, 4},            // 26
    {"I64", 1, 8},            // 27
    {"F64", 1, 8},            // 28
    {"IQ1_M", kQK_K, 56},     // 29
    {"BF16", 1, 2},           // 30
}};

const DTypeTraits kUnknown = {"?", 0, 0};

}  // namespace

const DTypeTraits& GetDTypeTraits(DType type) {
  auto id = static_cast<uint32_t>(type);
  return id < kNumIds ? kTraits[id] : kUnknown;
}

std::optional<DType> DTypeFromId(uint32_t id) {
  if (id >= kNumIds || kTraits[id].block_bytes == 0) return std::nullopt;
  return static_cast<DType>(id);
}

std::optional<DType> DTypeFromName(std::string_view name) {
  std::string upper(name);
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (uint32_t id = 0; id < kNumIds; ++id)
    if (kTraits[id].block_bytes && upper == kTraits[id].name) return static_cast<DType>(id);
  return std::nullopt;
}

std::optional<uint64_t> RowBytes(DType type, uint64_t n_elements) {
  const DTypeTraits& t = GetDTypeTraits(type);
  if (t.block_bytes == 0 || n_elements % t.block_size != 0) return std::nullopt;
  return n_elements / t.block_size * t.block_bytes;
}

}  // namespace substrate
