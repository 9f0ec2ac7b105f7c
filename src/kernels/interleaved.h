// The decode layouts as one choice: which layout the CPU backend gives a resident matrix at
// load, and the plain rows of any interleaved layout (for the reference, the AMX GEMM's tile
// unpacking and residual tiers). The layouts themselves: interleaved_q8_0.h, interleaved_q4_0.h,
// interleaved_q4_k.h (Q4_K and Q5_K), interleaved_q6_k.h.
#pragma once

#include <cstdint>
#include <string>

#include "core/thread_pool.h"
#include "format/dtype.h"
#include "kernels/cpu_features.h"
#include "quant/weight_view.h"

namespace substrate {

// The interleaved layout a rows x cols matrix of `type` takes (kRows: none). It depends on the
// type and shape alone, so a store can hold a matrix in it (store/pack.h) for any CPU that
// chooses it.
WeightLayout DecodeLayoutFor(DType type, int64_t rows, int64_t cols);

// Whether `isa` has a product kernel for `layout` (AVX-512 every layout; AVX2 Q4_0's, Q4_K's
// and Q6_K's): where it has none, a matrix stays in plain rows (an interleaved one is read back
// into them).
bool InterleavedKernelFor(WeightLayout layout, Isa isa);

// Rearranges a resident rows x cols matrix of `type` in place into DecodeLayoutFor's layout, and
// returns that layout (kRows: left as it is). Groups of 16 rows are independent: rearranging a
// matrix in pieces of whole groups gives the bytes of rearranging it whole.
WeightLayout InterleaveForDecode(DType type, int64_t rows, int64_t cols, uint8_t* data,
                                 ThreadPool* pool);

// Puts a rows x cols matrix in `layout` back into plain rows, in place.
void DeinterleaveInPlace(WeightLayout layout, DType type, int64_t rows, int64_t cols,
                         uint8_t* data);

// A layout's name in a store's manifest ("q4_0_x16", ...; "rows" for kRows), and back.
const char* WeightLayoutName(WeightLayout layout);
bool WeightLayoutFromName(const std::string& name, WeightLayout* layout);

// Plain rows of 16-row group g of an interleaved matrix (16 rows of its row bytes).
void DeinterleaveGroup(WeightLayout layout, const uint8_t* data, int64_t cols, int64_t g,
                       uint8_t* out);
// Plain bytes of row r of an interleaved matrix.
void DeinterleaveRow(WeightLayout layout, const uint8_t* data, int64_t cols, int64_t r,
                     uint8_t* out);

}  // namespace substrate
