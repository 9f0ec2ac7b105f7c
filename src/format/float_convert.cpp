#include "format/float_convert.h"

#include <cstring>

namespace substrate {

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000 | mant << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  uint32_t abs = u & 0x7fffffff;
  if (abs > 0x7f800000) return sign | 0x7e00 | static_cast<uint16_t>((abs >> 13) & 0x3ff);  // NaN
  if (abs >= 0x477ff000) return sign | 0x7c00;  // rounds to >= 65520: infinity
  if (abs < 0x38800000) {  // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000) return sign;  // < 2^-25 rounds to zero
    uint32_t mant = (abs & 0x7fffff) | 0x800000;
    int shift = 113 - static_cast<int>(abs >> 23) + 13;  // 126 - exp
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t h = ((abs >> 23) - 112) << 10 | ((abs >> 13) & 0x3ff);
  uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // carries into the exponent correctly
  return sign | static_cast<uint16_t>(h);
}

uint16_t FloatToBFloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((u >> 16) | 64);  // quiet NaN
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

Status ConvertFloats(DType from, const void* src, DType to, void* dst, uint64_t n) {
  if (!IsPlainFloat(from) || !IsPlainFloat(to)) {
    return Unimplemented(std::string("cannot convert ") + DTypeName(from) + " to " + DTypeName(to) +
                         " (only F32, F16 and BF16)");
  }
  if (from == to) {
    std::memcpy(dst, src, n * GetDTypeTraits(from).block_bytes);
    return Status::Ok();
  }
  auto load = [&](uint64_t i) -> float {
    if (from == DType::kF32) {
      float f;
      std::memcpy(&f, static_cast<const uint8_t*>(src) + 4 * i, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, static_cast<const uint8_t*>(src) + 2 * i, 2);
    return from == DType::kF16 ? HalfToFloat(h) : BFloat16ToFloat(h);
  };
  for (uint64_t i = 0; i < n; ++i) {
    float f = load(i);
    if (to == DType::kF32) {
      std::memcpy(static_cast<uint8_t*>(dst) + 4 * i, &f, 4);
    } else {
      uint16_t h = to == DType::kF16 ? FloatToHalf(f) : FloatToBFloat16(f);
      std::memcpy(static_cast<uint8_t*>(dst) + 2 * i, &h, 2);
    }
  }
  return Status::Ok();
}

}  // namespace substrate
