#include "kernels/interleaved_q6_k.h"

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "kernels/interleaved_k_frame.h"
#include "quant/blocks.h"

namespace substrate {
namespace {

static_assert(kQ6KInterleaved_BlockBytes == k_frame::kBlockBytes<BlockQ6_K>,
              "an interleaved block holds the same bytes as 16 rows' blocks");

// Byte offsets of the parts of an interleaved block (the layout in the header).
constexpr int kQh = kQ6KInterleaved_QlBytes;
constexpr int kScales = kQh + kQ6KInterleaved_QhBytes;
constexpr int kD = kScales + kQ6KInterleaved_ScaleBytes;

// Row i's block into (put) or out of (!put) interleaved block `blk`.
template <bool put>
void Move(std::conditional_t<put, const BlockQ6_K*, BlockQ6_K*> x, int i,
          std::conditional_t<put, uint8_t*, const uint8_t*> blk) {
  auto* plain = reinterpret_cast<std::conditional_t<put, const uint8_t, uint8_t>*>(x);
  auto copy = [&](size_t plain_at, size_t blk_at, size_t n) {
    if constexpr (put)
      std::memcpy(blk + blk_at, plain + plain_at, n);
    else
      std::memcpy(plain + plain_at, blk + blk_at, n);
  };
  for (int w = 0; w < 32; ++w) copy(offsetof(BlockQ6_K, ql) + 4 * w, 64 * w + 4 * i, 4);
  for (int w = 0; w < 16; ++w) copy(offsetof(BlockQ6_K, qh) + 4 * w, kQh + 64 * w + 4 * i, 4);
  for (int m = 0; m < 8; ++m) copy(offsetof(BlockQ6_K, scales) + 2 * m, kScales + 32 * m + 2 * i, 2);
  copy(offsetof(BlockQ6_K, d), kD + 2 * i, 2);
}

void PutRow(const BlockQ6_K& x, int i, uint8_t* blk) { Move<true>(&x, i, blk); }
void GetRow(const uint8_t* blk, int i, BlockQ6_K* x) { Move<false>(x, i, blk); }

}  // namespace

bool CanInterleaveQ6_K(DType type, int64_t rows, int64_t cols) {
  return type == DType::kQ6_K && rows > 0 && rows % kInterleavedRows == 0 && cols > 0 &&
         cols % kQK_K == 0;
}

void InterleaveQ6_K(uint8_t* data, int64_t rows, int64_t cols, ThreadPool* pool) {
  k_frame::Interleave<BlockQ6_K>(data, rows, cols, pool, PutRow);
}

void DeinterleaveQ6_KGroup(const uint8_t* data, int64_t cols, int64_t g, uint8_t* out) {
  k_frame::DeinterleaveGroup<BlockQ6_K>(data, cols, g, out, GetRow);
}

void DeinterleaveQ6_KRow(const uint8_t* data, int64_t cols, int64_t r, uint8_t* out) {
  k_frame::DeinterleaveRow<BlockQ6_K>(data, cols, r, out, GetRow);
}

}  // namespace substrate
