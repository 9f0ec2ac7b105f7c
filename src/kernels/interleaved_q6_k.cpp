#include "kernels/interleaved_q6_k.h"

#include <cstring>
#include <type_traits>
#include <vector>

#include "quant/blocks.h"

namespace substrate {
namespace {

static_assert(kQ6KInterleaved_BlockBytes == kInterleavedRows * sizeof(BlockQ6_K),
              "an interleaved block holds the same bytes as 16 rows' blocks");

// Byte offsets of the parts of an interleaved block (the layout in the header).
constexpr int kQh = kQ6KInterleaved_QlBytes;
constexpr int kScales = kQh + kQ6KInterleaved_QhBytes;
constexpr int kD = kScales + kQ6KInterleaved_ScaleBytes;

size_t GroupBytes(int64_t cols) {
  return static_cast<size_t>(cols / kQK_K) * kQ6KInterleaved_BlockBytes;
}

// Row i's block into (put) or out of (!put) interleaved block `blk`.
template <bool put>
void Move(BlockQ6_K* x, int i, std::conditional_t<put, uint8_t*, const uint8_t*> blk) {
  auto copy = [](uint8_t* plain, auto* inter, size_t n) {
    if constexpr (put)
      std::memcpy(inter, plain, n);
    else
      std::memcpy(plain, inter, n);
  };
  for (int w = 0; w < 32; ++w) copy(x->ql + 4 * w, blk + 64 * w + 4 * i, 4);
  for (int w = 0; w < 16; ++w) copy(x->qh + 4 * w, blk + kQh + 64 * w + 4 * i, 4);
  for (int m = 0; m < 8; ++m) copy(reinterpret_cast<uint8_t*>(x->scales) + 2 * m, blk + kScales + 32 * m + 2 * i, 2);
  copy(reinterpret_cast<uint8_t*>(&x->d), blk + kD + 2 * i, 2);
}

}  // namespace

bool CanInterleaveQ6_K(DType type, int64_t rows, int64_t cols) {
  return type == DType::kQ6_K && rows > 0 && rows % kInterleavedRows == 0 && cols > 0 &&
         cols % kQK_K == 0;
}

void InterleaveQ6_K(uint8_t* data, int64_t rows, int64_t cols, ThreadPool* pool) {
  const size_t group_bytes = GroupBytes(cols);
  if (pool) {
    pool->ParallelFor(rows / kInterleavedRows, 16, [&](int64_t g0, int64_t g1, int) {
      InterleaveQ6_K(data + static_cast<size_t>(g0) * group_bytes, (g1 - g0) * kInterleavedRows,
                     cols, nullptr);
    });
    return;
  }
  const int64_t nb = cols / kQK_K;
  std::vector<BlockQ6_K> plain(static_cast<size_t>(kInterleavedRows * nb));
  for (int64_t g = 0; g < rows / kInterleavedRows; ++g) {
    uint8_t* group = data + static_cast<size_t>(g) * group_bytes;
    std::memcpy(plain.data(), group, group_bytes);
    for (int64_t b = 0; b < nb; ++b)
      for (int i = 0; i < kInterleavedRows; ++i)
        Move<true>(&plain[static_cast<size_t>(i * nb + b)], i, group + b * kQ6KInterleaved_BlockBytes);
  }
}

void DeinterleaveQ6_KGroup(const uint8_t* data, int64_t cols, int64_t g, uint8_t* out) {
  const int64_t nb = cols / kQK_K;
  const uint8_t* group = data + static_cast<size_t>(g) * GroupBytes(cols);
  auto* rows = reinterpret_cast<BlockQ6_K*>(out);
  for (int64_t b = 0; b < nb; ++b)
    for (int i = 0; i < kInterleavedRows; ++i)
      Move<false>(&rows[i * nb + b], i, group + b * kQ6KInterleaved_BlockBytes);
}

void DeinterleaveQ6_KRow(const uint8_t* data, int64_t cols, int64_t r, uint8_t* out) {
  const int64_t nb = cols / kQK_K;
  const uint8_t* group = data + static_cast<size_t>(r / kInterleavedRows) * GroupBytes(cols);
  auto* row = reinterpret_cast<BlockQ6_K*>(out);
  for (int64_t b = 0; b < nb; ++b)
    Move<false>(&row[b], static_cast<int>(r % kInterleavedRows), group + b * kQ6KInterleaved_BlockBytes);
}

}  // namespace substrate
