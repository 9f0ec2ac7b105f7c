// Reference (scalar) quantization and dequantization of every block format, bit-compatible with
// files written by ggml-based tools. SIMD versions live in kernels/; they are tested against
// these.
#pragma once

#include <cstdint>

#include "format/dtype.h"

namespace substrate {

// Half-precision conversions (IEEE fp16 with round-to-nearest-even; bf16 as the top 16 bits of
// an fp32, rounded to nearest-even, NaN kept NaN).
float Fp16ToFp32(uint16_t h);
uint16_t Fp32ToFp16(float f);
float Bf16ToFp32(uint16_t h);
uint16_t Fp32ToBf16(float f);

bool CanDequantize(DType type);
bool CanQuantize(DType type);

// Dequantizes n elements (n a multiple of the type's block size) from src into dst.
// Precondition: CanDequantize(type).
void DequantizeRow(DType type, const void* src, float* dst, int64_t n);

// Quantizes n floats (n a multiple of the block size) into dst (RowBytes(type, n) bytes).
// `importance`, if given, holds n per-element weights for the error the quantizer minimizes
// (an importance matrix); nullptr means uniform. Precondition: CanQuantize(type).
void QuantizeRow(DType type, const float* src, void* dst, int64_t n,
                 const float* importance = nullptr);

}  // namespace substrate
