#include "kernels/interleaved_q6_k.h"

#include <cstddef>
#include <cstring>

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

// Row i's block out of interleaved block `blk`.
void GetRow(const uint8_t* blk, int i, BlockQ6_K* x) {
  for (int w = 0; w < 32; ++w) std::memcpy(x->ql + 4 * w, blk + 64 * w + 4 * i, 4);
  for (int w = 0; w < 16; ++w) std::memcpy(x->qh + 4 * w, blk + kQh + 64 * w + 4 * i, 4);
  for (int m = 0; m < 8; ++m) std::memcpy(x->scales + 2 * m, blk + kScales + 32 * m + 2 * i, 2);
  std::memcpy(&x->d, blk + kD + 2 * i, 2);
}

// The 16 rows' blocks x[i * stride] into interleaved block `blk`: the word planes at once, then
// each row's scales and d.
void PutBlock(const BlockQ6_K* x, int64_t stride, uint8_t* blk) {
  const size_t row_bytes = static_cast<size_t>(stride) * sizeof(BlockQ6_K);
  const auto* row0 = reinterpret_cast<const uint8_t*>(x);
  k_frame::CopyWords16(row0 + offsetof(BlockQ6_K, ql), row_bytes, 32, blk);
  k_frame::CopyWords16(row0 + offsetof(BlockQ6_K, qh), row_bytes, 16, blk + kQh);
  for (int i = 0; i < kInterleavedRows; ++i) {
    const BlockQ6_K& r = x[i * stride];
    for (int m = 0; m < 8; ++m) std::memcpy(blk + kScales + 32 * m + 2 * i, r.scales + 2 * m, 2);
    std::memcpy(blk + kD + 2 * i, &r.d, 2);
  }
}

}  // namespace

bool CanInterleaveQ6_K(DType type, int64_t rows, int64_t cols) {
  return type == DType::kQ6_K && rows > 0 && rows % kInterleavedRows == 0 && cols > 0 &&
         cols % kQK_K == 0;
}

void InterleaveQ6_K(uint8_t* data, int64_t rows, int64_t cols, ThreadPool* pool) {
  k_frame::Interleave<BlockQ6_K>(data, rows, cols, pool, PutBlock);
}

void DeinterleaveQ6_KGroup(const uint8_t* data, int64_t cols, int64_t g, uint8_t* out) {
  k_frame::DeinterleaveGroup<BlockQ6_K>(data, cols, g, out, GetRow);
}

void DeinterleaveQ6_KRow(const uint8_t* data, int64_t cols, int64_t r, uint8_t* out) {
  k_frame::DeinterleaveRow<BlockQ6_K>(data, cols, r, out, GetRow);
}

}  // namespace substrate
