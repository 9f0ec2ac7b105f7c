#include "kernels/interleaved_q4_k.h"

#include <cstring>

#include "kernels/interleaved_k_frame.h"
#include "kernels/vec_dot.h"
#include "quant/blocks.h"

namespace substrate {
namespace {

static_assert(kQ4KInterleaved_BlockBytes == k_frame::kBlockBytes<BlockQ4_K>,
              "an interleaved block holds the same bytes as 16 rows' blocks");

// Byte offsets of the metadata within an interleaved block (the layout in the header).
constexpr int kD = kQ4KInterleaved_QuantBytes;
constexpr int kDmin = kD + 2 * kInterleavedRows;
constexpr int kLow = kDmin + 2 * kInterleavedRows;
constexpr int kHigh = kLow + 8 * kInterleavedRows;

// The inverse of scalar::UnpackQ4KScales: 8 scales and 8 mins (6 bits each) to 12 bytes.
void PackQ4KScales(const uint8_t* sc, const uint8_t* mn, uint8_t* q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
    q[j + 4] = static_cast<uint8_t>(mn[j] | (mn[j + 4] >> 4) << 6);
    q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
  }
}

// Row i's block into interleaved block `dst` (the other rows' bytes untouched).
void PutRow(const BlockQ4_K& x, int i, uint8_t* dst) {
  for (int w = 0; w < 32; ++w) std::memcpy(dst + 64 * w + 4 * i, x.qs + 4 * w, 4);
  std::memcpy(dst + kD + 2 * i, &x.d, 2);
  std::memcpy(dst + kDmin + 2 * i, &x.dmin, 2);
  uint8_t sc[8], mn[8];
  scalar::UnpackQ4KScales(x.scales, sc, mn);
  for (int s = 0; s < 8; ++s)
    dst[kLow + kInterleavedRows * s + i] = static_cast<uint8_t>((sc[s] & 15) | (mn[s] & 15) << 4);
  for (int p = 0; p < 4; ++p)
    dst[kHigh + kInterleavedRows * p + i] = static_cast<uint8_t>(
        (sc[2 * p] >> 4) | (mn[2 * p] >> 4) << 2 | (sc[2 * p + 1] >> 4) << 4 |
        (mn[2 * p + 1] >> 4) << 6);
}

// Row i's block from interleaved block `src`.
void GetRow(const uint8_t* src, int i, BlockQ4_K* x) {
  for (int w = 0; w < 32; ++w) std::memcpy(x->qs + 4 * w, src + 64 * w + 4 * i, 4);
  std::memcpy(&x->d, src + kD + 2 * i, 2);
  std::memcpy(&x->dmin, src + kDmin + 2 * i, 2);
  uint8_t sc[8], mn[8];
  for (int s = 0; s < 8; ++s) {
    const uint8_t low = src[kLow + kInterleavedRows * s + i];
    const uint8_t high = static_cast<uint8_t>(src[kHigh + kInterleavedRows * (s / 2) + i] >> (4 * (s % 2)));
    sc[s] = static_cast<uint8_t>((low & 15) | (high & 3) << 4);
    mn[s] = static_cast<uint8_t>((low >> 4) | ((high >> 2) & 3) << 4);
  }
  PackQ4KScales(sc, mn, x->scales);
}

}  // namespace

bool CanInterleaveQ4_K(DType type, int64_t rows, int64_t cols) {
  return type == DType::kQ4_K && rows > 0 && rows % kInterleavedRows == 0 && cols > 0 &&
         cols % kQK_K == 0;
}

void InterleaveQ4_K(uint8_t* data, int64_t rows, int64_t cols, ThreadPool* pool) {
  k_frame::Interleave<BlockQ4_K>(data, rows, cols, pool, PutRow);
}

void DeinterleaveQ4_KGroup(const uint8_t* data, int64_t cols, int64_t g, uint8_t* out) {
  k_frame::DeinterleaveGroup<BlockQ4_K>(data, cols, g, out, GetRow);
}

void DeinterleaveQ4_KRow(const uint8_t* data, int64_t cols, int64_t r, uint8_t* out) {
  k_frame::DeinterleaveRow<BlockQ4_K>(data, cols, r, out, GetRow);
}

}  // namespace substrate
