#include "kernels/interleaved_q8_0.h"

#include <cstring>
#include <vector>

#include "kernels/cpu_features.h"
#include "quant/blocks.h"

namespace substrate {
namespace {

static_assert(kInterleavedPairBytes == 2 * kInterleavedRows * sizeof(BlockQ8_0),
              "a pair of interleaved blocks holds the same bytes as 16 rows' two blocks");
constexpr uint32_t kFlip = 0x80808080u;  // q ^ 0x80 = q + 128 as an unsigned byte, both ways

size_t GroupBytes(int64_t cols) {
  return static_cast<size_t>(kInterleavedRows) * static_cast<size_t>(cols / kQK8_0) *
         sizeof(BlockQ8_0);
}

// Byte offsets, within a group, of block b's quant byte j of row r and of its scale.
size_t QuantOffset(int64_t b, int r, int j) {
  return static_cast<size_t>(b / 2) * kInterleavedPairBytes +
         static_cast<size_t>(b % 2) * kInterleavedQuantBytes +
         static_cast<size_t>(j / 4) * 64 + static_cast<size_t>(r) * 4 + static_cast<size_t>(j % 4);
}
size_t ScaleOffset(int64_t b, int r) {
  return static_cast<size_t>(b / 2) * kInterleavedPairBytes + kInterleavedScales +
         static_cast<size_t>(b % 2) * kInterleavedScaleBytes + static_cast<size_t>(r) * 2;
}

// Row r of a group (plain blocks) from the interleaved group bytes.
void GatherRow(const uint8_t* group, int64_t nb, int r, BlockQ8_0* out) {
  for (int64_t b = 0; b < nb; ++b) {
    std::memcpy(&out[b].d, group + ScaleOffset(b, r), 2);
    for (int j = 0; j < kQK8_0; j += 4) {
      uint32_t v;
      std::memcpy(&v, group + QuantOffset(b, r, j), 4);
      v ^= kFlip;
      std::memcpy(out[b].qs + j, &v, 4);
    }
  }
}

}  // namespace

bool CanInterleaveQ8_0(DType type, int64_t rows, int64_t cols) {
  return type == DType::kQ8_0 && rows > 0 && rows % kInterleavedRows == 0 && cols > 0 &&
         cols % (2 * kQK8_0) == 0;
}

void InterleaveQ8_0(uint8_t* data, int64_t rows, int64_t cols, ThreadPool* pool) {
  if (pool) {
    const size_t group_bytes = GroupBytes(cols);
    pool->ParallelFor(rows / kInterleavedRows, 8, [&](int64_t g0, int64_t g1, int) {
      InterleaveQ8_0(data + static_cast<size_t>(g0) * group_bytes, (g1 - g0) * kInterleavedRows,
                     cols, nullptr);
    });
    return;
  }
  const int64_t nb = cols / kQK8_0;
  const size_t group_bytes = GroupBytes(cols);
  std::vector<BlockQ8_0> plain(static_cast<size_t>(kInterleavedRows * nb));
  // The layout is only chosen on AVX-512 CPUs, where gathers do this faster
  // (6.1 against 4.2 GB/s per thread).
  const bool vector = ActiveIsa() >= Isa::kAvx512;
  for (int64_t g = 0; g < rows / kInterleavedRows; ++g) {
    uint8_t* group = data + static_cast<size_t>(g) * group_bytes;
    std::memcpy(plain.data(), group, group_bytes);
    if (vector) {
      avx512::InterleaveGroupQ8_0(reinterpret_cast<const uint8_t*>(plain.data()), cols, group);
      continue;
    }
    for (int64_t b = 0; b < nb; ++b) {
      // Word k of block b: 16 rows x 4 bytes, one 64-byte run.
      uint8_t* dst = group + QuantOffset(b, 0, 0);
      for (int k = 0; k < kQK8_0 / 4; ++k)
        for (int r = 0; r < kInterleavedRows; ++r) {
          uint32_t v;
          std::memcpy(&v, plain[r * nb + b].qs + 4 * k, 4);
          v ^= kFlip;
          std::memcpy(dst + 64 * k + 4 * r, &v, 4);
        }
      uint8_t* d = group + ScaleOffset(b, 0);
      for (int r = 0; r < kInterleavedRows; ++r) std::memcpy(d + 2 * r, &plain[r * nb + b].d, 2);
    }
  }
}

void DeinterleaveQ8_0Group(const uint8_t* data, int64_t cols, int64_t g, uint8_t* out) {
  const int64_t nb = cols / kQK8_0;
  const uint8_t* group = data + static_cast<size_t>(g) * GroupBytes(cols);
  auto* rows = reinterpret_cast<BlockQ8_0*>(out);
  // Block by block, each 64-byte word run of 16 rows in turn: reads in address order (this
  // runs once per 16-row tile in prefill, so it must cost little against the tile's products).
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* src = group + QuantOffset(b, 0, 0);
    for (int k = 0; k < kQK8_0 / 4; ++k)
      for (int r = 0; r < kInterleavedRows; ++r) {
        uint32_t v;
        std::memcpy(&v, src + 64 * k + 4 * r, 4);
        v ^= kFlip;
        std::memcpy(rows[r * nb + b].qs + 4 * k, &v, 4);
      }
    const uint8_t* d = group + ScaleOffset(b, 0);
    for (int r = 0; r < kInterleavedRows; ++r) std::memcpy(&rows[r * nb + b].d, d + 2 * r, 2);
  }
}

void DeinterleaveQ8_0Row(const uint8_t* data, int64_t cols, int64_t r, uint8_t* out) {
  const uint8_t* group = data + static_cast<size_t>(r / kInterleavedRows) * GroupBytes(cols);
  GatherRow(group, cols / kQK8_0, static_cast<int>(r % kInterleavedRows),
            reinterpret_cast<BlockQ8_0*>(out));
}

size_t ActTileBytes(int64_t cols, int n) {
  return static_cast<size_t>(cols / kQK8_0) * kActTileBytesPerToken * static_cast<size_t>(n);
}

void PackActTileToken(const uint8_t* act_row, int64_t cols, int tt, int n, uint8_t* tile) {
  const int64_t nb = cols / kQK8_0;
  const auto* y = reinterpret_cast<const BlockQ8_0*>(act_row);
  const auto* yd = reinterpret_cast<const float*>(y + nb);  // the float scales (ActRowBytes)
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = tile + static_cast<size_t>(b) * kActTileBytesPerToken * n;
    int32_t s = 0;
    for (int j = 0; j < kQK8_0; ++j) s += y[b].qs[j];
    s *= -128;
    for (int j = 0; j < 8; ++j) std::memcpy(p + 4 * (j * n + tt), y[b].qs + 4 * j, 4);
    std::memcpy(p + 4 * (8 * n + tt), &s, 4);
    std::memcpy(p + 4 * (9 * n + tt), &yd[b], 4);
  }
}

}  // namespace substrate
