// The decode layouts as one choice: which layout the CPU backend gives a resident matrix at
// load, and the plain rows of any interleaved layout (for the reference, the AMX GEMM's tile
// unpacking and residual tiers). The layouts themselves: interleaved_q8_0.h, interleaved_q4_0.h,
// interleaved_q4_k.h (Q4_K and Q5_K), interleaved_q6_k.h.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "format/dtype.h"
#include "quant/weight_view.h"

namespace substrate {

// Rearranges a resident rows x cols matrix of `type` in place into the interleaved layout its
// type and shape take, and returns that layout (kRows: left as it is).
WeightLayout InterleaveForDecode(DType type, int64_t rows, int64_t cols, uint8_t* data,
                                 ThreadPool* pool);

// Plain rows of 16-row group g of an interleaved matrix (16 rows of its row bytes).
void DeinterleaveGroup(WeightLayout layout, const uint8_t* data, int64_t cols, int64_t g,
                       uint8_t* out);
// Plain bytes of row r of an interleaved matrix.
void DeinterleaveRow(WeightLayout layout, const uint8_t* data, int64_t cols, int64_t r,
                     uint8_t* out);

}  // namespace substrate
