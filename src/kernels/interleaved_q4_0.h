// Q4_0 weights laid out for the AVX-512 VNNI kernels (and an AVX2 one), decode and prefill alike:
// groups of 16 rows whose blocks are interleaved, so that one aligned 64-byte load holds 4 quant
// bytes (8 nibbles) of each of the 16 rows. A dpbusd then multiplies 16 rows x 4 nibbles with one
// broadcast activation word: no horizontal sum per row, one scale conversion per 16 rows, and
// every int8 lane of every dpbusd does useful work (the row kernel spends a dpbusd per block on
// the -8 offset and a cvt/fmadd per 8 lanes). Tokens share each unpacked weight vector and two
// groups share each activation word (register tiles of 2 groups x up to 4 tokens), so prefill
// runs near the ceiling the block's scale multiply and FMA leave beside dpbusd on their shared
// pipes (~80 % of dpbusd's peak).
//
// Same bytes as the plain rows, rearranged in place when the resident weights are loaded, so
// no second copy of the weights exists. Layout of group g (16 * row_bytes bytes, at
// data + g * 16 * row_bytes), per pair of blocks (64 columns), 576 bytes:
//   [2 blocks][4 words][16 rows][4 bytes]  quant bytes as stored (low nibble: element j,
//                                          high nibble: element j + 16 of the block)
//   [2 blocks][16 rows]                    the rows' fp16 scales d
// Nibbles meet activations as unsigned values 0..15 and the -8 offset comes back exactly as
// -8 * sum(a) of the block, so integer sums equal the row kernels'.
// Per token the float operations do not depend on how many tokens share a pass: a row of a
// prefill pass has exactly the bits decode gives it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/thread_pool.h"
#include "format/dtype.h"
#include "kernels/interleaved_q8_0.h"

namespace substrate {

constexpr int kQ4Interleaved_QuantBytes = kInterleavedRows * 16;                              // 256
constexpr int kQ4Interleaved_Scales = 2 * kQ4Interleaved_QuantBytes;                          // 512
constexpr int kQ4Interleaved_PairBytes = kQ4Interleaved_Scales + 2 * kInterleavedScaleBytes;  // 576

// Whether a rows x cols matrix of `type` can take the layout: Q4_0, rows a multiple of 16 and
// cols of 64.
bool CanInterleaveQ4_0(DType type, int64_t rows, int64_t cols);

// Rewrites `data` (rows x cols Q4_0 in plain rows) in place into the interleaved layout, over
// `pool`'s threads when given.
void InterleaveQ4_0(uint8_t* data, int64_t rows, int64_t cols, ThreadPool* pool = nullptr);

// Plain Q4_0 bytes of the 16 rows of group g (out: 16 rows of RowBytes(Q4_0, cols)).
void DeinterleaveQ4_0Group(const uint8_t* data, int64_t cols, int64_t g, uint8_t* out);
// Plain Q4_0 bytes of row r.
void DeinterleaveQ4_0Row(const uint8_t* data, int64_t cols, int64_t r, uint8_t* out);

namespace avx512 {
// One group's interleaved bytes from its 16 plain rows (plain: 16 rows of RowBytes(Q4_0, cols)).
void InterleaveGroupQ4_0(const uint8_t* plain, int64_t cols, uint8_t* group);
// For groups [g0, g1) and the nt tokens of an nt-token activation tile (interleaved_q8_0.h;
// 1 <= nt <= 8): y[t * y_stride + 16 * g + i] = dot(row 16 g + i, token t).
void GemvQ4_0Interleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* tile, int nt, float* y, int64_t y_stride);
}  // namespace avx512

namespace avx2 {
// The same product on AVX2 (interleaved_q4_0_avx2.cpp): the CPUs without AVX-512.
void GemvQ4_0Interleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* tile, int nt, float* y, int64_t y_stride);
}  // namespace avx2

}  // namespace substrate
