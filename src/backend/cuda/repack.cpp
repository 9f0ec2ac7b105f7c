// The device's repacked weight layout (cuda_ops.h, kRepacked): GGUF rows split into planes.
// Plain host code: it runs once per tensor at upload.
#include <cstring>

#include "backend/cuda/cuda_ops.h"

namespace substrate::cuda {
namespace {

// One field of a block: where it starts in the GGUF block, how long it is.
struct Field {
  int off, len;
};
// The fields of each repacked type, in plane order (a plane is one field of every block).
struct Planes {
  int qk = 0, block_bytes = 0, n = 0;
  Field f[4];
};

Planes PlanesOf(int type) {
  switch (type) {
    case kTypeQ4_0:
      return {32, 18, 2, {{2, 16}, {0, 2}}};
    case kTypeQ8_0:
      return {32, 34, 2, {{2, 32}, {0, 2}}};
    case kTypeQ4_K:
      return {256, 144, 2, {{16, 128}, {0, 16}}};
    case kTypeQ6_K:
      return {256, 210, 4, {{0, 128}, {128, 64}, {192, 16}, {208, 2}}};
    default:
      return {};
  }
}

}  // namespace

int64_t RepackedRowBytes(int type, int64_t cols) {
  const Planes p = PlanesOf(type);
  if (p.n == 0 || cols <= 0 || cols % p.qk != 0) return 0;
  const int64_t bytes = cols / p.qk * p.block_bytes;
  return (bytes + 15) / 16 * 16;
}

void RepackRows(int type, int64_t rows, int64_t cols, const uint8_t* src, uint8_t* dst) {
  const Planes p = PlanesOf(type);
  const int64_t nb = cols / p.qk, row_bytes = nb * p.block_bytes;
  const int64_t dst_row = RepackedRowBytes(type, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* s = src + r * row_bytes;
    uint8_t* d = dst + r * dst_row;
    int64_t plane = 0;
    for (int k = 0; k < p.n; ++k) {
      const Field f = p.f[k];
      for (int64_t b = 0; b < nb; ++b)
        std::memcpy(d + plane + b * f.len, s + b * p.block_bytes + f.off, f.len);
      plane += nb * f.len;
    }
    std::memset(d + plane, 0, static_cast<size_t>(dst_row - plane));
  }
}

}  // namespace substrate::cuda
