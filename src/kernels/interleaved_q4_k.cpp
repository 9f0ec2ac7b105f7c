#include "kernels/interleaved_q4_k.h"

#include <cstring>
#include <vector>

#include "kernels/vec_dot.h"
#include "quant/blocks.h"

namespace substrate {
namespace {

static_assert(kQ4KInterleaved_BlockBytes == kInterleavedRows * sizeof(BlockQ4_K),
              "an interleaved block holds the same bytes as 16 rows' blocks");

// Byte offsets of the metadata within an interleaved block (the layout in the header).
constexpr int kD = kQ4KInterleaved_QuantBytes;
constexpr int kDmin = kD + 2 * kInterleavedRows;
constexpr int kLow = kDmin + 2 * kInterleavedRows;
constexpr int kHigh = kLow + 8 * kInterleavedRows;

size_t GroupBytes(int64_t cols) {
  return static_cast<size_t>(cols / kQK_K) * kQ4KInterleaved_BlockBytes;
}

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
  const size_t group_bytes = GroupBytes(cols);
  if (pool) {
    pool->ParallelFor(rows / kInterleavedRows, 16, [&](int64_t g0, int64_t g1, int) {
      InterleaveQ4_K(data + static_cast<size_t>(g0) * group_bytes, (g1 - g0) * kInterleavedRows,
                     cols, nullptr);
    });
    return;
  }
  const int64_t nb = cols / kQK_K;
  std::vector<BlockQ4_K> plain(static_cast<size_t>(kInterleavedRows * nb));
  for (int64_t g = 0; g < rows / kInterleavedRows; ++g) {
    uint8_t* group = data + static_cast<size_t>(g) * group_bytes;
    std::memcpy(plain.data(), group, group_bytes);
    for (int64_t b = 0; b < nb; ++b)
      for (int i = 0; i < kInterleavedRows; ++i)
        PutRow(plain[static_cast<size_t>(i * nb + b)], i, group + b * kQ4KInterleaved_BlockBytes);
  }
}

void DeinterleaveQ4_KGroup(const uint8_t* data, int64_t cols, int64_t g, uint8_t* out) {
  const int64_t nb = cols / kQK_K;
  const uint8_t* group = data + static_cast<size_t>(g) * GroupBytes(cols);
  auto* rows = reinterpret_cast<BlockQ4_K*>(out);
  for (int64_t b = 0; b < nb; ++b)
    for (int i = 0; i < kInterleavedRows; ++i)
      GetRow(group + b * kQ4KInterleaved_BlockBytes, i, &rows[i * nb + b]);
}

void DeinterleaveQ4_KRow(const uint8_t* data, int64_t cols, int64_t r, uint8_t* out) {
  const int64_t nb = cols / kQK_K;
  const uint8_t* group = data + static_cast<size_t>(r / kInterleavedRows) * GroupBytes(cols);
  auto* row = reinterpret_cast<BlockQ4_K*>(out);
  for (int64_t b = 0; b < nb; ++b)
    GetRow(group + b * kQ4KInterleaved_BlockBytes, static_cast<int>(r % kInterleavedRows), &row[b]);
}

}  // namespace substrate
