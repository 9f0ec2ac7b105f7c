#include "kernels/interleaved_q4_0.h"

#include <cstring>
#include <vector>

#include "kernels/cpu_features.h"
#include "quant/blocks.h"

namespace substrate {
namespace {

static_assert(kQ4Interleaved_PairBytes == 2 * kInterleavedRows * sizeof(BlockQ4_0),
              "a pair of interleaved blocks holds the same bytes as 16 rows' two blocks");

size_t GroupBytes(int64_t cols) {
  return static_cast<size_t>(kInterleavedRows) * static_cast<size_t>(cols / kQK4_0) *
         sizeof(BlockQ4_0);
}

// Byte offsets, within a group, of block b's quant byte j (0..15) of row r and of its scale.
size_t QuantOffset(int64_t b, int r, int j) {
  return static_cast<size_t>(b / 2) * kQ4Interleaved_PairBytes +
         static_cast<size_t>(b % 2) * kQ4Interleaved_QuantBytes + static_cast<size_t>(j / 4) * 64 +
         static_cast<size_t>(r) * 4 + static_cast<size_t>(j % 4);
}
size_t ScaleOffset(int64_t b, int r) {
  return static_cast<size_t>(b / 2) * kQ4Interleaved_PairBytes + kQ4Interleaved_Scales +
         static_cast<size_t>(b % 2) * kInterleavedScaleBytes + static_cast<size_t>(r) * 2;
}

}  // namespace

bool CanInterleaveQ4_0(DType type, int64_t rows, int64_t cols) {
  return type == DType::kQ4_0 && rows > 0 && rows % kInterleavedRows == 0 && cols > 0 &&
         cols % (2 * kQK4_0) == 0;
}

void InterleaveQ4_0(uint8_t* data, int64_t rows, int64_t cols, ThreadPool* pool) {
  const size_t group_bytes = GroupBytes(cols);
  if (pool) {
    pool->ParallelFor(rows / kInterleavedRows, 8, [&](int64_t g0, int64_t g1, int) {
      InterleaveQ4_0(data + static_cast<size_t>(g0) * group_bytes, (g1 - g0) * kInterleavedRows,
                     cols, nullptr);
    });
    return;
  }
  const int64_t nb = cols / kQK4_0;
  std::vector<BlockQ4_0> plain(static_cast<size_t>(kInterleavedRows * nb));
  // The layout is only chosen on AVX-512 CPUs, where a register transpose does this faster
  // (an expert cache rearranges every expert it reads).
  const bool vector = ActiveIsa() >= Isa::kAvx512;
  for (int64_t g = 0; g < rows / kInterleavedRows; ++g) {
    uint8_t* group = data + static_cast<size_t>(g) * group_bytes;
    std::memcpy(plain.data(), group, group_bytes);
    if (vector) {
      avx512::InterleaveGroupQ4_0(reinterpret_cast<const uint8_t*>(plain.data()), cols, group);
      continue;
    }
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* dst = group + QuantOffset(b, 0, 0);  // word k: 16 rows x 4 bytes, one 64-byte run
      for (int k = 0; k < 4; ++k)
        for (int r = 0; r < kInterleavedRows; ++r)
          std::memcpy(dst + 64 * k + 4 * r, plain[r * nb + b].qs + 4 * k, 4);
      uint8_t* d = group + ScaleOffset(b, 0);
      for (int r = 0; r < kInterleavedRows; ++r) std::memcpy(d + 2 * r, &plain[r * nb + b].d, 2);
    }
  }
}

void DeinterleaveQ4_0Group(const uint8_t* data, int64_t cols, int64_t g, uint8_t* out) {
  const int64_t nb = cols / kQK4_0;
  const uint8_t* group = data + static_cast<size_t>(g) * GroupBytes(cols);
  auto* rows = reinterpret_cast<BlockQ4_0*>(out);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* src = group + QuantOffset(b, 0, 0);
    for (int k = 0; k < 4; ++k)
      for (int r = 0; r < kInterleavedRows; ++r)
        std::memcpy(rows[r * nb + b].qs + 4 * k, src + 64 * k + 4 * r, 4);
    const uint8_t* d = group + ScaleOffset(b, 0);
    for (int r = 0; r < kInterleavedRows; ++r) std::memcpy(&rows[r * nb + b].d, d + 2 * r, 2);
  }
}

void DeinterleaveQ4_0Row(const uint8_t* data, int64_t cols, int64_t r, uint8_t* out) {
  const int64_t nb = cols / kQK4_0;
  const uint8_t* group = data + static_cast<size_t>(r / kInterleavedRows) * GroupBytes(cols);
  const int i = static_cast<int>(r % kInterleavedRows);
  auto* row = reinterpret_cast<BlockQ4_0*>(out);
  for (int64_t b = 0; b < nb; ++b) {
    std::memcpy(&row[b].d, group + ScaleOffset(b, i), 2);
    for (int k = 0; k < 4; ++k) std::memcpy(row[b].qs + 4 * k, group + QuantOffset(b, i, 4 * k), 4);
  }
}

}  // namespace substrate
