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
// `importance`, if given, holds n per-element weights (finite, >= 0) for the error the quantizer
// minimizes, typically the mean square of the activation each weight column meets. For the
// K-quants and IQ4 types each weight multiplies the error weight of the default search, so
// all-ones importance writes the same bytes as none. Q4_0/Q4_1/Q5_0/Q5_1 switch to a weighted
// scale search (their default is round-to-nearest); Q8_0 ignores it. Precondition:
// CanQuantize(type).
void QuantizeRow(DType type, const float* src, void* dst, int64_t n,
                 const float* importance = nullptr);

}  // namespace substrate
