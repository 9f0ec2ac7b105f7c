// Q8_0 weights laid out for decode: groups of 16 rows whose blocks are interleaved, so that one
// aligned 64-byte load holds 4 quants of each of the 16 rows. The decode product then computes
// 16 rows at once with dpbusd against one broadcast activation word: no horizontal sum per row,
// one scale conversion per 16 rows, every load aligned and in address order (the hardware
// prefetchers follow it; the row-by-row kernel's loads straddle 34-byte blocks). It reads a
// Q8_0 matrix 20-30 % faster from DRAM than the row kernel on the test machine.
//
// Same bytes as the plain rows, rearranged in place when the resident weights are loaded, so
// no second copy of the weights exists. Layout of group g (16 * row_bytes bytes, at
// data + g * 16 * row_bytes), per pair of blocks (64 columns), 1,088 bytes:
//   [2 blocks][8 words][16 rows][4 bytes]  quants as unsigned bytes, q + 128 (q ^ 0x80)
//   [2 blocks][16 rows]                    the rows' fp16 scales d
// The +128 is taken back exactly through the activations: dpbusd starts from -128 * sum(a) of
// the block (the activation tile carries it), so integer sums equal the plain kernels' and
// results match them up to float summation order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/thread_pool.h"
#include "format/dtype.h"

namespace substrate {

constexpr int kInterleavedRows = 16;
// The layout's byte offsets within a pair of blocks (the comment above): block h's quants at
// h * kInterleavedQuantBytes, its scales at kInterleavedScales + h * kInterleavedScaleBytes.
constexpr int kInterleavedQuantBytes = kInterleavedRows * 32;         // 512
constexpr int kInterleavedScaleBytes = kInterleavedRows * 2;          // 32
constexpr int kInterleavedScales = 2 * kInterleavedQuantBytes;        // 1024
constexpr int kInterleavedPairBytes = kInterleavedScales + 2 * kInterleavedScaleBytes;  // 1088

// Whether a rows x cols matrix of `type` can take the layout: Q8_0, rows a multiple of 16 and
// cols of 64.
bool CanInterleaveQ8_0(DType type, int64_t rows, int64_t cols);

// Rewrites `data` (rows x cols Q8_0 in plain rows) in place into the interleaved layout, over
// `pool`'s threads when given.
void InterleaveQ8_0(uint8_t* data, int64_t rows, int64_t cols, ThreadPool* pool = nullptr);

// Plain Q8_0 bytes of the 16 rows of group g (out: 16 rows of RowBytes(Q8_0, cols)).
void DeinterleaveQ8_0Group(const uint8_t* data, int64_t cols, int64_t g, uint8_t* out);
// Plain Q8_0 bytes of row r.
void DeinterleaveQ8_0Row(const uint8_t* data, int64_t cols, int64_t r, uint8_t* out);

// Q8_0 activations of a tile of up to kActTileTokens tokens as the interleaved Q8_0 and Q4_0
// kernels read them. Block b (32 columns) of an n-token tile holds 40 * n bytes at
// tile + b * 40 * n: [8 words][n tokens] the quants, 4 per word; [n] -128 * the sum of the
// block's quants (int32: the +128 of the weights taken back); [n] the block's scale (float).
// One pointer and constant offsets reach every token of a block, so a register tile of
// tokens needs no pointer of its own per token (with one per token the compiler ran out of
// registers and reloaded them inside the loop).
constexpr int kActTileTokens = 8;
constexpr int kActTileBytesPerToken = 40;  // a block's: 8 words, the sum, the scale
size_t ActTileBytes(int64_t cols, int n);
// Writes token tt of an n-token tile from that token's Q8_0 activation row (ActRowBytes).
void PackActTileToken(const uint8_t* act_row, int64_t cols, int tt, int n, uint8_t* tile);

// The product (AVX-512 VNNI, decode and prefill): for groups [g0, g1) and the nt tokens of an
// nt-token activation tile (1 <= nt <= 8; token t's float operations do not depend on nt),
// y[t * y_stride + 16 * g + i] = dot(row 16 g + i, token t).
namespace avx512 {
// One group's interleaved bytes from its 16 plain rows (plain: 16 rows of RowBytes(Q8_0, cols)).
void InterleaveGroupQ8_0(const uint8_t* plain, int64_t cols, uint8_t* group);
void GemvQ8_0Interleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* tile, int nt, float* y, int64_t y_stride);
}  // namespace avx512

}  // namespace substrate
