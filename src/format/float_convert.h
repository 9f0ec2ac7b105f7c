// Conversions between the plain float types a model file stores (F32, F16, BF16), for convert
// and for comparing tensors. Rounding is round-to-nearest-even, NaN stays NaN — the same as
// numpy/torch (and quant/quant.h), so converted files are bit-identical to the reference
// converter's. Lives in format (below quant) because convert needs nothing more.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "format/dtype.h"

namespace substrate {

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
inline float BFloat16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
uint16_t FloatToBFloat16(float f);

inline bool IsPlainFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// Converts n elements from `src` (type from) to `dst` (type to); both must be plain float types.
// Same type is a copy.
Status ConvertFloats(DType from, const void* src, DType to, void* dst, uint64_t n);

}  // namespace substrate
