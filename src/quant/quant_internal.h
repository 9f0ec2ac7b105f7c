// Helpers shared by the reference quantizers and dequantizers (not part of the contract).
#pragma once

#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/quant.h"

namespace substrate::quant_internal {

// The 16 levels of IQ4_NL / IQ4_XS (a non-uniform 4-bit grid, sorted ascending).
inline constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};

// Round-to-nearest through the float mantissa, ties to even: ggml rounds the K-quant levels
// this way, so bit-compatible output needs the same rounding (not std::lround's ties-away).
inline int NearestInt(float f) {
  float v = f + 12582912.f;  // 1.5 * 2^23: the integer lands in the low mantissa bits
  int32_t i;
  std::memcpy(&i, &v, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// Q4_K / Q5_K pack eight 6-bit scales and eight 6-bit mins into 12 bytes.
inline void GetScaleMinK4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q3_K packs sixteen 6-bit signed (offset 32) scales into 12 bytes.
inline int Q3KScale(const uint8_t* scales, int j) {
  int lo = j < 8 ? (scales[j] & 0xF) : (scales[j - 8] >> 4);
  int hi = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// Per-format row functions (n is a multiple of the block size; checked by the dispatcher).
void DequantizeQ4_0(const BlockQ4_0* x, float* y, int64_t n);
void DequantizeQ4_1(const BlockQ4_1* x, float* y, int64_t n);
void DequantizeQ5_0(const BlockQ5_0* x, float* y, int64_t n);
void DequantizeQ5_1(const BlockQ5_1* x, float* y, int64_t n);
void DequantizeQ8_0(const BlockQ8_0* x, float* y, int64_t n);
void DequantizeQ2_K(const BlockQ2_K* x, float* y, int64_t n);
void DequantizeQ3_K(const BlockQ3_K* x, float* y, int64_t n);
void DequantizeQ4_K(const BlockQ4_K* x, float* y, int64_t n);
void DequantizeQ5_K(const BlockQ5_K* x, float* y, int64_t n);
void DequantizeQ6_K(const BlockQ6_K* x, float* y, int64_t n);
void DequantizeIQ4_NL(const BlockIQ4_NL* x, float* y, int64_t n);
void DequantizeIQ4_XS(const BlockIQ4_XS* x, float* y, int64_t n);

void QuantizeQ4_0(const float* x, BlockQ4_0* y, int64_t n);
void QuantizeQ4_1(const float* x, BlockQ4_1* y, int64_t n);
void QuantizeQ5_0(const float* x, BlockQ5_0* y, int64_t n);
void QuantizeQ5_1(const float* x, BlockQ5_1* y, int64_t n);
void QuantizeQ8_0(const float* x, BlockQ8_0* y, int64_t n);
// With an importance matrix (null: the round-to-nearest versions above).
void QuantizeQ4_0(const float* x, BlockQ4_0* y, int64_t n, const float* importance);
void QuantizeQ4_1(const float* x, BlockQ4_1* y, int64_t n, const float* importance);
void QuantizeQ5_0(const float* x, BlockQ5_0* y, int64_t n, const float* importance);
void QuantizeQ5_1(const float* x, BlockQ5_1* y, int64_t n, const float* importance);
void QuantizeQ2_K(const float* x, BlockQ2_K* y, int64_t n, const float* importance);
void QuantizeQ3_K(const float* x, BlockQ3_K* y, int64_t n, const float* importance);
void QuantizeQ4_K(const float* x, BlockQ4_K* y, int64_t n, const float* importance);
void QuantizeQ5_K(const float* x, BlockQ5_K* y, int64_t n, const float* importance);
void QuantizeQ6_K(const float* x, BlockQ6_K* y, int64_t n, const float* importance);
void QuantizeIQ4_NL(const float* x, BlockIQ4_NL* y, int64_t n, const float* importance);
void QuantizeIQ4_XS(const float* x, BlockIQ4_XS* y, int64_t n, const float* importance);

}  // namespace substrate::quant_internal
