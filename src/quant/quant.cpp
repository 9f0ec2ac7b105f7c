#include "quant/quant.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "quant/quant_internal.h"

namespace substrate {

float Fp16ToFp32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t Fp32ToFp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t abs = x & 0x7fffffff;
  if (abs > 0x7f800000) return static_cast<uint16_t>(sign | 0x7e00);  // NaN
  if (abs >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // overflow -> inf
  if (abs < 0x38800000) {  // subnormal or zero in fp16
    if (abs < 0x33000000) return static_cast<uint16_t>(sign);
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - e;  // 113 + 13 - e
    uint32_t half = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t h = ((abs - 0x38000000) >> 13);
  uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float Bf16ToFp32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t Fp32ToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

namespace {
using namespace quant_internal;

template <typename Block>
const Block* As(const void* p) {
  return static_cast<const Block*>(p);
}
template <typename Block>
Block* As(void* p) {
  return static_cast<Block*>(p);
}
}  // namespace

bool CanDequantize(DType type) {
  switch (type) {
    case DType::kF32: case DType::kF16: case DType::kBF16:
    case DType::kQ4_0: case DType::kQ4_1: case DType::kQ5_0: case DType::kQ5_1:
    case DType::kQ8_0: case DType::kQ2_K: case DType::kQ3_K: case DType::kQ4_K:
    case DType::kQ5_K: case DType::kQ6_K: case DType::kIQ4_NL: case DType::kIQ4_XS:
      return true;
    default:
      return false;
  }
}

bool CanQuantize(DType type) { return CanDequantize(type); }

void DequantizeRow(DType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFp32(s[i]);
      return;
    }
    case DType::kBF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(s[i]);
      return;
    }
    case DType::kQ4_0: return DequantizeQ4_0(As<BlockQ4_0>(src), dst, n);
    case DType::kQ4_1: return DequantizeQ4_1(As<BlockQ4_1>(src), dst, n);
    case DType::kQ5_0: return DequantizeQ5_0(As<BlockQ5_0>(src), dst, n);
    case DType::kQ5_1: return DequantizeQ5_1(As<BlockQ5_1>(src), dst, n);
    case DType::kQ8_0: return DequantizeQ8_0(As<BlockQ8_0>(src), dst, n);
    case DType::kQ2_K: return DequantizeQ2_K(As<BlockQ2_K>(src), dst, n);
    case DType::kQ3_K: return DequantizeQ3_K(As<BlockQ3_K>(src), dst, n);
    case DType::kQ4_K: return DequantizeQ4_K(As<BlockQ4_K>(src), dst, n);
    case DType::kQ5_K: return DequantizeQ5_K(As<BlockQ5_K>(src), dst, n);
    case DType::kQ6_K: return DequantizeQ6_K(As<BlockQ6_K>(src), dst, n);
    case DType::kIQ4_NL: return DequantizeIQ4_NL(As<BlockIQ4_NL>(src), dst, n);
    case DType::kIQ4_XS: return DequantizeIQ4_XS(As<BlockIQ4_XS>(src), dst, n);
    default:
      std::abort();  // precondition: CanDequantize(type)
  }
}

void QuantizeRow(DType type, const float* src, void* dst, int64_t n, const float* importance) {
  const float* qw = importance;
  switch (type) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToFp16(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToBf16(src[i]);
      return;
    }
    // Without importance the 32-element formats use ggml's round-to-nearest reference (what
    // llama-quantize writes without an imatrix); Q8_0 always does.
    case DType::kQ4_0: return QuantizeQ4_0(src, As<BlockQ4_0>(dst), n, qw);
    case DType::kQ4_1: return QuantizeQ4_1(src, As<BlockQ4_1>(dst), n, qw);
    case DType::kQ5_0: return QuantizeQ5_0(src, As<BlockQ5_0>(dst), n, qw);
    case DType::kQ5_1: return QuantizeQ5_1(src, As<BlockQ5_1>(dst), n, qw);
    case DType::kQ8_0: return QuantizeQ8_0(src, As<BlockQ8_0>(dst), n);
    case DType::kQ2_K: return QuantizeQ2_K(src, As<BlockQ2_K>(dst), n, qw);
    case DType::kQ3_K: return QuantizeQ3_K(src, As<BlockQ3_K>(dst), n, qw);
    case DType::kQ4_K: return QuantizeQ4_K(src, As<BlockQ4_K>(dst), n, qw);
    case DType::kQ5_K: return QuantizeQ5_K(src, As<BlockQ5_K>(dst), n, qw);
    case DType::kQ6_K: return QuantizeQ6_K(src, As<BlockQ6_K>(dst), n, qw);
    case DType::kIQ4_NL: return QuantizeIQ4_NL(src, As<BlockIQ4_NL>(dst), n, qw);
    case DType::kIQ4_XS: return QuantizeIQ4_XS(src, As<BlockIQ4_XS>(dst), n, qw);
    default:
      std::abort();  // precondition: CanQuantize(type)
  }
}

}  // namespace substrate
