// Q6_K weights laid out for the AVX-512 VNNI kernels, decode and prefill alike (a Q4_K_M file's
// attn_v, ffn_down of half its layers and the output matrix). Groups of 16 rows whose blocks
// are interleaved as for Q4_K (interleaved_q4_k.h): a 64-byte load holds one 4-byte word of each
// of the 16 rows, so a dpbusd computes 16 rows x 4 elements against one broadcast activation
// word and the token's activation rows are read once per 16 rows (the row kernel reads 8
// tokens' rows of a 14,336-column ffn_down from L2 for every row). The 6-bit quants are put
// together from their low-nibble and high-bit words in registers, shared by a tile of tokens;
// each 16-element sub-block's dpbusd chain is scaled in float (d * scale, once per block for
// every token), and the -32 offset comes from the activation's 16-element sums (dpwssd).
// The AVX2 tier has a kernel for it too (interleaved_q6_k_avx2.cpp: the same steps on 8 rows).
//
// Same bytes as the plain rows, rearranged in place at load. Layout of block b of group g (16
// rows of one 256-column block, 3,360 bytes, at data + g * 16 * row_bytes + b * 3360):
//   [32 words][16 rows][4 bytes]  ql, word w = ql[4w..4w+3] of each row
//   [16 words][16 rows][4 bytes]  qh likewise
//   [8 pairs][16 rows][2 bytes]   scales 2m and 2m+1 of each row (int8)
//   [16 rows]                     d (fp16)
// Per token the float operations do not depend on how many tokens share a pass, so a prefill
// row has decode's bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/thread_pool.h"
#include "format/dtype.h"
#include "kernels/interleaved_q8_0.h"

namespace substrate {

constexpr int kQ6KInterleaved_QlBytes = kInterleavedRows * 128;                              // 2048
constexpr int kQ6KInterleaved_QhBytes = kInterleavedRows * 64;                               // 1024
constexpr int kQ6KInterleaved_ScaleBytes = kInterleavedRows * 16;                            // 256
constexpr int kQ6KInterleaved_BlockBytes = kQ6KInterleaved_QlBytes + kQ6KInterleaved_QhBytes +
                                           kQ6KInterleaved_ScaleBytes + kInterleavedRows * 2;  // 3360

// Whether a rows x cols matrix of `type` can take the layout: Q6_K, rows a multiple of 16.
bool CanInterleaveQ6_K(DType type, int64_t rows, int64_t cols);

// Rewrites `data` (rows x cols Q6_K in plain rows) in place into the interleaved layout, over
// `pool`'s threads when given.
void InterleaveQ6_K(uint8_t* data, int64_t rows, int64_t cols, ThreadPool* pool = nullptr);

// Plain Q6_K bytes of the 16 rows of group g (out: 16 rows of RowBytes(Q6_K, cols)).
void DeinterleaveQ6_KGroup(const uint8_t* data, int64_t cols, int64_t g, uint8_t* out);
// Plain Q6_K bytes of row r.
void DeinterleaveQ6_KRow(const uint8_t* data, int64_t cols, int64_t r, uint8_t* out);

namespace avx512 {
// For groups [g0, g1) and tokens t < nt (1 <= nt <= 8): y[t * y_stride + 16 * g + i] =
// dot(row 16 g + i, activation row t). act holds Q8_K activation rows act_stride bytes apart.
void GemvQ6_KInterleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* act, size_t act_stride, int nt, float* y,
                         int64_t y_stride);
}  // namespace avx512

namespace avx2 {
// The same product on AVX2 (interleaved_q6_k_avx2.cpp): the CPUs without AVX-512.
void GemvQ6_KInterleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* act, size_t act_stride, int nt, float* y, int64_t y_stride);
}  // namespace avx2

}  // namespace substrate
