// Q4_K (and Q5_K) weights laid out for the AVX-512 VNNI kernels, decode and prefill alike (the bulk of a
// Q4_K_M file). Groups of 16 rows whose blocks are interleaved, as for Q4_0
// (interleaved_q4_0.h): one aligned 64-byte load holds 4 quant bytes (8 nibbles) of each of
// the 16 rows, and a dpbusd multiplies them with one broadcast activation word. The row kernel
// spends a maddubs, a madd and an add per 64 products and shuffles per block to apply the 6-bit
// sub-block scales; here each sub-block's 16-element halves end in a dpbusd chain (at most
// 16 * 15 * 127 in magnitude: an int16) that one dpwssd multiplies by the 16 rows' scales, so
// the products run at about dpbusd's rate and the scale unpacking is shared by the tokens of a
// register tile.
// Q4_K's layout has an AVX2 kernel too (interleaved_q4_k_avx2.cpp: maddubs and madd on 8 rows).
//
// Same bytes as the plain rows, rearranged in place when the resident weights are loaded, so
// no second copy of the weights exists. The 12 packed scale bytes of a row hold eight 6-bit
// scales and eight 6-bit mins (all 96 bits), so any rearrangement of those bits is lossless:
// this one makes them cheap to widen for 16 rows at once. Layout of block b of group g (16
// rows of one 256-column block, 2,304 bytes, at data + g * 16 * row_bytes + b * 2304):
//   [4 chunks][8 words][16 rows][4 bytes]  quant bytes as stored: chunk j word k holds bytes
//                                          32j + 4k.. of each row (low nibbles: elements
//                                          64j + 4k.., sub-block 2j; high: 64j + 32 + 4k..)
//   [16 rows] d (fp16)   [16 rows] dmin (fp16)
//   [8 sub-blocks][16 rows]  scale | (min >> 4) << 6   (the whole scale in one byte: one
//                                                      zero-extend and a mask per sub-block)
//   [4 pairs][16 rows]       (min 2p & 15) | (min 2p+1 & 15) << 4
// Integer sums equal the row kernels' (and the scalar reference's); per token the float
// operations do not depend on how many tokens share a pass, so a prefill row has decode's bits.
//
// Q5_K is Q4_K with a fifth bit per element (qh: bit s of byte l is element l of sub-block s's
// high bit) and takes the same layout with that plane after the quant bytes (2,816 bytes):
//   [4 chunks][8 words][16 rows][4 bytes]  quant bytes, as above
//   [8 words][16 rows][4 bytes]            qh as stored: word k holds qh bytes 4k.. of each row
//   d, dmin, low and high scale bytes      as above
// Its 5-bit values make a 16-element chain too wide for dpwssd's int16, so its chains are 8
// elements long (at most 8 * 31 * 128).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/thread_pool.h"
#include "format/dtype.h"
#include "kernels/interleaved_q8_0.h"

namespace substrate {

constexpr int kQ4KInterleaved_QuantBytes = kInterleavedRows * 128;                    // 2048
constexpr int kQ4KInterleaved_BlockBytes = kQ4KInterleaved_QuantBytes + kInterleavedRows * 16;  // 2304
constexpr int kQ5KInterleaved_HighBitBytes = kInterleavedRows * 32;                   // 512
constexpr int kQ5KInterleaved_BlockBytes = kQ4KInterleaved_BlockBytes + kQ5KInterleaved_HighBitBytes;  // 2816

// Whether a rows x cols matrix of `type` can take the layout: Q4_K, rows a multiple of 16.
bool CanInterleaveQ4_K(DType type, int64_t rows, int64_t cols);

// Rewrites `data` (rows x cols Q4_K in plain rows) in place into the interleaved layout, over
// `pool`'s threads when given.
void InterleaveQ4_K(uint8_t* data, int64_t rows, int64_t cols, ThreadPool* pool = nullptr);

// Plain Q4_K bytes of the 16 rows of group g (out: 16 rows of RowBytes(Q4_K, cols)).
void DeinterleaveQ4_KGroup(const uint8_t* data, int64_t cols, int64_t g, uint8_t* out);
// Plain Q4_K bytes of row r.
void DeinterleaveQ4_KRow(const uint8_t* data, int64_t cols, int64_t r, uint8_t* out);

// The same for Q5_K.
bool CanInterleaveQ5_K(DType type, int64_t rows, int64_t cols);
void InterleaveQ5_K(uint8_t* data, int64_t rows, int64_t cols, ThreadPool* pool = nullptr);
void DeinterleaveQ5_KGroup(const uint8_t* data, int64_t cols, int64_t g, uint8_t* out);
void DeinterleaveQ5_KRow(const uint8_t* data, int64_t cols, int64_t r, uint8_t* out);

namespace avx512 {
// For groups [g0, g1) and tokens t < nt (1 <= nt <= 8): y[t * y_stride + 16 * g + i] =
// dot(row 16 g + i, activation row t). act holds Q8_K activation rows act_stride bytes apart.
void GemvQ4_KInterleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* act, size_t act_stride, int nt, float* y,
                         int64_t y_stride);
void GemvQ5_KInterleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* act, size_t act_stride, int nt, float* y,
                         int64_t y_stride);
}  // namespace avx512

namespace avx2 {
// The Q4_K product on AVX2 (interleaved_q4_k_avx2.cpp): the CPUs without AVX-512.
void GemvQ4_KInterleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* act, size_t act_stride, int nt, float* y, int64_t y_stride);
}  // namespace avx2

}  // namespace substrate
