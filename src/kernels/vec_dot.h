// Row-by-activation dot products per weight type, the building block of MatMul. Computed the
// way ggml computes them, so results track the reference runtime: activations are first
// quantized per row to the weight type's partner format (Q8_0, Q8_1, Q8_K), then each weight
// block meets its activation block in integer arithmetic and one float scale per block. F32,
// F16 and BF16 weights meet float activations (exact, so half-weight models match float32
// references).
//
// A kernel computes one weight row against `nt` activation rows at once (prefill: each weight
// block is unpacked once and used for several tokens). Implementations: scalar (the reference
// the SIMD versions are tested against), AVX2 and AVX-512 (256-bit VNNI), chosen at run time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/dtype.h"
#include "kernels/cpu_features.h"

namespace substrate {

// out[t] = dot(w_row, act + t * act_stride) for t < nt. n is the row length (a multiple of the
// weight type's block size); act rows are in the activation format, act_stride in bytes.
using VecDotFn = void (*)(int64_t n, const void* w_row, const void* act, size_t act_stride,
                          int nt, float* out);
// Several rows at once: out[t * out_stride + r] = dot(row r, act + t * act_stride) for r <
// n_rows (row r at w + r * row_bytes) and t < nt, each value bit-identical to VecDotFn's.
using RowsDotFn = void (*)(int64_t n, const void* w, size_t row_bytes, int n_rows,
                           const void* act, size_t act_stride, int nt, float* out,
                           int64_t out_stride);
// Converts n floats to the activation format (n a multiple of its block size).
using QuantizeActFn = void (*)(const float* x, void* out, int64_t n);

struct DotKernel {
  DType act_type = DType::kF32;  // the activation format this weight type pairs with
  VecDotFn dot = nullptr;
  int max_nt = 1;                // tokens per call the kernel handles best (larger nt is looped)
  // Optional: register tiles of rows x tokens, where loading each activation for one row was
  // what bound prefill (float weights: a load per FMA).
  RowsDotFn rows = nullptr;
};

// The kernel for weight type `type` at tier `isa` (falls back to a lower tier where the higher
// one has no implementation), or nullptr when no kernel exists for the type.
const DotKernel* FindDotKernel(DType type, Isa isa);
// The activation quantizer for an activation format at tier `isa` (nullptr if none).
QuantizeActFn FindQuantizeAct(DType act_type, Isa isa);
// Bytes of one activation row of n elements in format act_type. A Q8_0 row is its blocks
// followed by each block's scale as a float (the same value as the block's fp16 d), so SIMD
// kernels skip an fp16 conversion per block and token.
size_t ActRowBytes(DType act_type, int64_t n);

// The 16 non-linear levels of IQ4_NL and IQ4_XS (fixed by the format).
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// Per-tier tables, defined in vec_dot_scalar.cpp / vec_dot_avx2.cpp / vec_dot_avx512.cpp.
// They return nullptr for types the tier does not implement.
namespace scalar {
const DotKernel* Find(DType type);
QuantizeActFn FindQuantize(DType act_type);
// Scale unpacking shared with the SIMD kernels: Q3_K's 16 signed 6-bit scales; Q4_K/Q5_K's 8
// 6-bit scales and 8 6-bit mins.
void UnpackQ3KScales(const uint8_t* packed, int8_t* out);
void UnpackQ4KScales(const uint8_t* packed, uint8_t* sc, uint8_t* mn);
}  // namespace scalar
namespace avx2 {
const DotKernel* Find(DType type);
QuantizeActFn FindQuantize(DType act_type);
}  // namespace avx2
namespace avx512 {
const DotKernel* Find(DType type);
QuantizeActFn FindQuantize(DType act_type);
}  // namespace avx512

}  // namespace substrate
