// Prefill GEMM: many tokens against one quantized weight on AMX int8 tiles. MatMul sends
// products of enough tokens (GemmSupports) here when the tier is Isa::kAmx, the weight has no
// residual tiers and its type is supported (Q8_0, Q4_0, Q4_K, Q6_K); everything else keeps the
// per-row dot kernels.
//
// Weights are never copied whole: each thread unpacks one panel of rows at a time (int8 values
// plus float scales) into a small buffer that stays in L2 while every token passes over it.
// Q4_K and Q6_K are unpacked "folded" (quants times their integer sub-block scale, split into
// a 7-bit low and a high byte), so a 256-element super-block is two exact int32 tile sums.
// Activations arrive quantized by MatMul in the same formats the dot kernels use (Q8_0 rows for
// Q8_0/Q4_0, Q8_K rows for the K formats), so results equal the dot kernels' up to float order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/thread_pool.h"
#include "format/dtype.h"
#include "kernels/cpu_features.h"
#include "quant/weight_view.h"

namespace substrate {

// Whether MatMul should use GemmQuantized for weight `type` with `cols` columns and n_tokens
// tokens at tier `isa`: the format is supported and n_tokens is past the point where the tiles
// beat the dot kernels (measured, one core: 8 tokens for Q8_0/Q4_0/Q6_K, 12 for Q4_K; fewer
// tokens pad the 16-token tiles and leave the unpacking unamortized).
bool GemmSupports(DType type, int64_t cols, int64_t n_tokens, Isa isa);
// The activation format GemmQuantized expects for `type` (the dot kernels' partner format).
DType GemmActType(DType type);

// y[t * rows + r] = dot(row r of w, activation row t) for r < rows, t < n_tokens. w is `rows`
// rows of `row_bytes` bytes in format `type`; act holds n_tokens rows of GemmActType(type),
// act_stride bytes apart (ActRowBytes). Needs Isa::kAmx and a supported type; any n_tokens >= 1.
// With an interleaved layout, each 16-row tile is put back into plain rows before unpacking.
void GemmQuantized(DType type, WeightLayout layout, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols,
                   const uint8_t* act, size_t act_stride, int64_t n_tokens, float* y,
                   ThreadPool& pool);

}  // namespace substrate
