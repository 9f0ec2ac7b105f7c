// The frame the K-quant interleaved layouts share (interleaved_q4_k.h, interleaved_q6_k.h): a
// group's block b (256 columns of 16 rows) is 16 * sizeof(Block) bytes at group + b * that, and
// the layouts differ only in how a block of 16 rows is laid into an interleaved block and in
// their kernels' GroupDot. Internal to those layouts' sources.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/interleaved_q8_0.h"
#include "kernels/token_tile.h"
#include "quant/blocks.h"

namespace substrate {
namespace avx512 {
// CopyWords16's AVX-512 path (interleaved_q4_k_avx512.cpp): 16 words at a time by a register
// transpose, the rest by a gather a word.
void CopyWords16(const uint8_t* row0, size_t row_bytes, int n_words, uint8_t* dst);
}  // namespace avx512

namespace k_frame {

// The word planes of an interleaved block: dst[64 w + 4 i .. +3] = 4-byte word w of row i
// (row i at row0 + i * row_bytes), for w < n_words and the 16 rows.
inline void CopyWords16(const uint8_t* row0, size_t row_bytes, int n_words, uint8_t* dst) {
  if (ActiveIsa() >= Isa::kAvx512) {
    avx512::CopyWords16(row0, row_bytes, n_words, dst);
    return;
  }
  for (int i = 0; i < kInterleavedRows; ++i)
    for (int w = 0; w < n_words; ++w)
      std::memcpy(dst + 64 * w + 4 * i, row0 + i * row_bytes + 4 * w, 4);
}

template <typename Block>
constexpr size_t kBlockBytes = kInterleavedRows * sizeof(Block);

template <typename Block>
size_t GroupBytes(int64_t cols) {
  return static_cast<size_t>(cols / kQK_K) * kBlockBytes<Block>;
}

// Rewrites rows x cols plain blocks in place into the layout; put(const Block* x, stride, blk)
// lays the 16 rows' blocks x[i * stride] into interleaved block blk.
template <typename Block, typename Put>
void Interleave(uint8_t* data, int64_t rows, int64_t cols, ThreadPool* pool, const Put& put) {
  const size_t group_bytes = GroupBytes<Block>(cols);
  if (pool) {
    pool->ParallelFor(rows / kInterleavedRows, 16, [&](int64_t g0, int64_t g1, int) {
      Interleave<Block>(data + static_cast<size_t>(g0) * group_bytes, (g1 - g0) * kInterleavedRows,
                        cols, nullptr, put);
    });
    return;
  }
  const int64_t nb = cols / kQK_K;
  std::vector<Block> plain(static_cast<size_t>(kInterleavedRows * nb));
  for (int64_t g = 0; g < rows / kInterleavedRows; ++g) {
    uint8_t* group = data + static_cast<size_t>(g) * group_bytes;
    std::memcpy(plain.data(), group, group_bytes);
    for (int64_t b = 0; b < nb; ++b) put(plain.data() + b, nb, group + b * kBlockBytes<Block>);
  }
}

// Plain blocks of the 16 rows of group g; get(block, row, Block*) takes one row's block out.
template <typename Block, typename Get>
void DeinterleaveGroup(const uint8_t* data, int64_t cols, int64_t g, uint8_t* out, const Get& get) {
  const int64_t nb = cols / kQK_K;
  const uint8_t* group = data + static_cast<size_t>(g) * GroupBytes<Block>(cols);
  auto* rows = reinterpret_cast<Block*>(out);
  for (int64_t b = 0; b < nb; ++b)
    for (int i = 0; i < kInterleavedRows; ++i)
      get(group + b * kBlockBytes<Block>, i, &rows[i * nb + b]);
}

// Plain blocks of row r.
template <typename Block, typename Get>
void DeinterleaveRow(const uint8_t* data, int64_t cols, int64_t r, uint8_t* out, const Get& get) {
  const int64_t nb = cols / kQK_K;
  const uint8_t* group = data + static_cast<size_t>(r / kInterleavedRows) * GroupBytes<Block>(cols);
  auto* row = reinterpret_cast<Block*>(out);
  for (int64_t b = 0; b < nb; ++b)
    get(group + b * kBlockBytes<Block>, static_cast<int>(r % kInterleavedRows), &row[b]);
}

// The product over groups [g0, g1) for nt tokens (1..8) of Q8_K activations act_stride bytes
// apart: dot(tile, group, blocks per row, activation rows, outputs) per group, tile the token
// count as a compile-time constant (token_tile.h); outputs land at y[t * y_stride + 16 g + i].
template <typename Block, typename Dot>
void Gemv(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1, const uint8_t* act,
          size_t act_stride, int nt, float* y, int64_t y_stride, const Dot& dot) {
  constexpr int kMaxTokens = 8;
  const int64_t nb = cols / kQK_K;
  const BlockQ8_K* ys[kMaxTokens];
  float* outs[kMaxTokens];
  for (int t = 0; t < nt; ++t)
    ys[t] = reinterpret_cast<const BlockQ8_K*>(act + static_cast<size_t>(t) * act_stride);
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* group = data + static_cast<size_t>(g) * GroupBytes<Block>(cols);
    for (int t = 0; t < nt; ++t) outs[t] = y + t * y_stride + g * kInterleavedRows;
    WithTokenTile(nt, [&](auto tile) { dot(tile, group, nb, ys, outs); });
  }
}

}  // namespace k_frame
}  // namespace substrate
