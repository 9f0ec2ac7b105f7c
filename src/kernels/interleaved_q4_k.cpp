#include "kernels/interleaved_q4_k.h"

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "kernels/interleaved_k_frame.h"
#include "kernels/vec_dot.h"
#include "quant/blocks.h"

namespace substrate {
namespace {

static_assert(kQ4KInterleaved_BlockBytes == k_frame::kBlockBytes<BlockQ4_K>,
              "an interleaved block holds the same bytes as 16 rows' blocks");
static_assert(kQ5KInterleaved_BlockBytes == k_frame::kBlockBytes<BlockQ5_K>,
              "an interleaved block holds the same bytes as 16 rows' blocks");

// Byte offsets within an interleaved block (the layout in the header): the metadata follows the
// quant bytes, and for Q5_K the high-bit plane before it.
template <typename Block>
constexpr int kMeta = kQ4KInterleaved_QuantBytes +
                      (std::is_same_v<Block, BlockQ5_K> ? kQ5KInterleaved_HighBitBytes : 0);
template <typename Block>
constexpr int kD = kMeta<Block>;
template <typename Block>
constexpr int kDmin = kD<Block> + 2 * kInterleavedRows;
template <typename Block>
constexpr int kScale = kDmin<Block> + 2 * kInterleavedRows;
template <typename Block>
constexpr int kMinLow = kScale<Block> + 8 * kInterleavedRows;

// The inverse of scalar::UnpackQ4KScales: 8 scales and 8 mins (6 bits each) to 12 bytes.
void PackQ4KScales(const uint8_t* sc, const uint8_t* mn, uint8_t* q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
    q[j + 4] = static_cast<uint8_t>(mn[j] | (mn[j + 4] >> 4) << 6);
    q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
  }
}

// Row i's metadata (d, dmin, scales and mins) into interleaved block `dst`.
template <typename Block>
void PutMeta(const Block& x, int i, uint8_t* dst) {
  std::memcpy(dst + kD<Block> + 2 * i, &x.d, 2);
  std::memcpy(dst + kDmin<Block> + 2 * i, &x.dmin, 2);
  uint8_t sc[8], mn[8];
  scalar::UnpackQ4KScales(x.scales, sc, mn);
  for (int s = 0; s < 8; ++s)
    dst[kScale<Block> + kInterleavedRows * s + i] = static_cast<uint8_t>(sc[s] | (mn[s] >> 4) << 6);
  for (int p = 0; p < 4; ++p)
    dst[kMinLow<Block> + kInterleavedRows * p + i] =
        static_cast<uint8_t>((mn[2 * p] & 15) | (mn[2 * p + 1] & 15) << 4);
}

// The 16 rows' blocks x[i * stride] into interleaved block `dst`: the word planes at once, then
// each row's metadata.
template <typename Block>
void PutBlock(const Block* x, int64_t stride, uint8_t* dst) {
  const size_t row_bytes = static_cast<size_t>(stride) * sizeof(Block);
  const auto* row0 = reinterpret_cast<const uint8_t*>(x);
  k_frame::CopyWords16(row0 + offsetof(Block, qs), row_bytes, 32, dst);
  if constexpr (std::is_same_v<Block, BlockQ5_K>)
    k_frame::CopyWords16(row0 + offsetof(Block, qh), row_bytes, 8,
                         dst + kQ4KInterleaved_QuantBytes);
  for (int i = 0; i < kInterleavedRows; ++i) PutMeta(x[i * stride], i, dst);
}

// Row i's block from interleaved block `src`.
template <typename Block>
void GetRow(const uint8_t* src, int i, Block* x) {
  for (int w = 0; w < 32; ++w) std::memcpy(x->qs + 4 * w, src + 64 * w + 4 * i, 4);
  if constexpr (std::is_same_v<Block, BlockQ5_K>)
    for (int w = 0; w < 8; ++w)
      std::memcpy(x->qh + 4 * w, src + kQ4KInterleaved_QuantBytes + 64 * w + 4 * i, 4);
  std::memcpy(&x->d, src + kD<Block> + 2 * i, 2);
  std::memcpy(&x->dmin, src + kDmin<Block> + 2 * i, 2);
  uint8_t sc[8], mn[8];
  for (int s = 0; s < 8; ++s) {
    const uint8_t scale = src[kScale<Block> + kInterleavedRows * s + i];
    const uint8_t min_low =
        static_cast<uint8_t>(src[kMinLow<Block> + kInterleavedRows * (s / 2) + i] >> (4 * (s % 2)));
    sc[s] = scale & 63;
    mn[s] = static_cast<uint8_t>((min_low & 15) | (scale >> 6) << 4);
  }
  PackQ4KScales(sc, mn, x->scales);
}

bool CanInterleave(DType want, DType type, int64_t rows, int64_t cols) {
  return type == want && rows > 0 && rows % kInterleavedRows == 0 && cols > 0 &&
         cols % kQK_K == 0;
}

}  // namespace

bool CanInterleaveQ4_K(DType type, int64_t rows, int64_t cols) {
  return CanInterleave(DType::kQ4_K, type, rows, cols);
}

void InterleaveQ4_K(uint8_t* data, int64_t rows, int64_t cols, ThreadPool* pool) {
  k_frame::Interleave<BlockQ4_K>(data, rows, cols, pool, PutBlock<BlockQ4_K>);
}

void DeinterleaveQ4_KGroup(const uint8_t* data, int64_t cols, int64_t g, uint8_t* out) {
  k_frame::DeinterleaveGroup<BlockQ4_K>(data, cols, g, out, GetRow<BlockQ4_K>);
}

void DeinterleaveQ4_KRow(const uint8_t* data, int64_t cols, int64_t r, uint8_t* out) {
  k_frame::DeinterleaveRow<BlockQ4_K>(data, cols, r, out, GetRow<BlockQ4_K>);
}

bool CanInterleaveQ5_K(DType type, int64_t rows, int64_t cols) {
  return CanInterleave(DType::kQ5_K, type, rows, cols);
}

void InterleaveQ5_K(uint8_t* data, int64_t rows, int64_t cols, ThreadPool* pool) {
  k_frame::Interleave<BlockQ5_K>(data, rows, cols, pool, PutBlock<BlockQ5_K>);
}

void DeinterleaveQ5_KGroup(const uint8_t* data, int64_t cols, int64_t g, uint8_t* out) {
  k_frame::DeinterleaveGroup<BlockQ5_K>(data, cols, g, out, GetRow<BlockQ5_K>);
}

void DeinterleaveQ5_KRow(const uint8_t* data, int64_t cols, int64_t r, uint8_t* out) {
  k_frame::DeinterleaveRow<BlockQ5_K>(data, cols, r, out, GetRow<BlockQ5_K>);
}

}  // namespace substrate
