// Random quantized matrices and activations for the kernel tests: every bit pattern of quants
// and packed scales (random bytes) with sane fp16 scales, and normal activations.
#pragma once

#include <cstring>
#include <random>
#include <vector>

#include "format/dtype.h"
#include "quant/quant.h"

namespace substrate::kernel_test {

// Byte offsets of the fp16 fields of one block, which must hold sane scales.
inline std::vector<int> HalfFields(DType t) {
  switch (t) {
    case DType::kQ4_K:
    case DType::kQ5_K: return {0, 2};  // d, dmin
    case DType::kQ6_K: return {208};
    default: return {0};
  }
}

// Every bit pattern of quants and packed scales (random bytes), sane fp16 scales.
inline std::vector<uint8_t> RandomMatrix(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::uniform_real_distribution<float> ud(0.002f, 0.02f);
  const size_t block = GetDTypeTraits(t).block_bytes;
  std::vector<uint8_t> m(*RowBytes(t, static_cast<uint64_t>(cols)) * rows);
  for (auto& b : m) b = static_cast<uint8_t>(rng());
  for (size_t blk = 0; blk < m.size() / block; ++blk)
    for (int off : HalfFields(t)) {
      uint16_t h = Fp32ToFp16(ud(rng));
      std::memcpy(m.data() + blk * block + off, &h, 2);
    }
  return m;
}

inline std::vector<float> RandomFloats(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& f : v) f = g(rng);
  return v;
}

}  // namespace substrate::kernel_test
