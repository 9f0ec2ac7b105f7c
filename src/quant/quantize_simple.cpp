// Reference quantizers of the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0). Without an
// importance matrix they reproduce ggml's round-to-nearest reference quantizers byte for byte,
// which needs the very same float operations in the same order: do not "simplify" them.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "quant/kquant_search.h"
#include "quant/quant_internal.h"

namespace substrate::quant_internal {
namespace {

// float -> int8 by truncation toward zero as C's (int8_t) cast does, but defined for every
// input: NaN gives 0 and out-of-range values saturate (real data never reaches either case).
inline int TruncToInt8(float v) {
  if (!(v == v)) return 0;
  if (v >= 127.f) return 127;
  if (v <= -128.f) return -128;
  return static_cast<int>(v);
}

inline float AbsMaxSigned(const float* x, int n) {  // the element of largest magnitude
  float amax = 0.f, max = 0.f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

inline void MinMax(const float* x, int n, float* min, float* max) {
  *min = FLT_MAX;
  *max = -FLT_MAX;
  for (int j = 0; j < n; ++j) {
    if (x[j] < *min) *min = x[j];
    if (x[j] > *max) *max = x[j];
  }
}

inline void StoreQh(uint8_t* dst, uint32_t qh) {
  for (int k = 0; k < 4; ++k) dst[k] = static_cast<uint8_t>(qh >> (8 * k));
}

}  // namespace

void QuantizeQ4_0(const float* x, BlockQ4_0* y, int64_t n) {
  constexpr int qk = kQK4_0;
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    const float max = AbsMaxSigned(x, qk);
    const float d = max / -8;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    for (int j = 0; j < qk / 2; ++j) {
      const float x0 = x[j] * id;
      const float x1 = x[qk / 2 + j] * id;
      const int q0 = std::min(15, TruncToInt8(x0 + 8.5f));
      const int q1 = std::min(15, TruncToInt8(x1 + 8.5f));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0xF) | (q1 << 4));
    }
  }
}

void QuantizeQ4_1(const float* x, BlockQ4_1* y, int64_t n) {
  constexpr int qk = kQK4_1;
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    float min, max;
    MinMax(x, qk, &min, &max);
    const float d = (max - min) / ((1 << 4) - 1);
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    y[i].m = Fp32ToFp16(min);
    for (int j = 0; j < qk / 2; ++j) {
      const float x0 = (x[j] - min) * id;
      const float x1 = (x[qk / 2 + j] - min) * id;
      const int q0 = std::min(15, TruncToInt8(x0 + 0.5f));
      const int q1 = std::min(15, TruncToInt8(x1 + 0.5f));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0xF) | (q1 << 4));
    }
  }
}

void QuantizeQ5_0(const float* x, BlockQ5_0* y, int64_t n) {
  constexpr int qk = kQK5_0;
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    const float max = AbsMaxSigned(x, qk);
    const float d = max / -16;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < qk / 2; ++j) {
      const float x0 = x[j] * id;
      const float x1 = x[qk / 2 + j] * id;
      const int q0 = std::min(31, TruncToInt8(x0 + 16.5f));
      const int q1 = std::min(31, TruncToInt8(x1 + 16.5f));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= static_cast<uint32_t>((q0 & 0x10) >> 4) << j;
      qh |= static_cast<uint32_t>((q1 & 0x10) >> 4) << (j + qk / 2);
    }
    StoreQh(y[i].qh, qh);
  }
}

void QuantizeQ5_1(const float* x, BlockQ5_1* y, int64_t n) {
  constexpr int qk = kQK5_1;
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    float min, max;
    MinMax(x, qk, &min, &max);
    const float d = (max - min) / ((1 << 5) - 1);
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    y[i].m = Fp32ToFp16(min);
    uint32_t qh = 0;
    for (int j = 0; j < qk / 2; ++j) {
      const float x0 = (x[j] - min) * id;
      const float x1 = (x[qk / 2 + j] - min) * id;
      // ggml truncates to uint8 here without a clamp; x0 <= 31 by construction.
      const int q0 = std::min(31, std::max(0, TruncToInt8(x0 + 0.5f)));
      const int q1 = std::min(31, std::max(0, TruncToInt8(x1 + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= static_cast<uint32_t>((q0 & 0x10) >> 4) << j;
      qh |= static_cast<uint32_t>((q1 & 0x10) >> 4) << (j + qk / 2);
    }
    StoreQh(y[i].qh, qh);
  }
}

void QuantizeQ8_0(const float* x, BlockQ8_0* y, int64_t n) {
  constexpr int qk = kQK8_0;
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    float amax = 0.f;
    for (int j = 0; j < qk; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / ((1 << 7) - 1);
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    for (int j = 0; j < qk; ++j) {
      const float r = std::round(x[j] * id);  // ties away from zero, as roundf
      y[i].qs[j] = static_cast<int8_t>(TruncToInt8(r));
    }
  }
}

// Importance-weighted variants (llama-quantize with an imatrix): the weights are
// importance * sqrt(sigma2 + x^2), sigma2 the row's mean square, and the scale (and min) come
// from the same searches as the K-quants'.
namespace {
float RowSigma2(const float* x, int64_t n) {
  float sum_x2 = 0;
  for (int64_t j = 0; j < n; ++j) sum_x2 += x[j] * x[j];
  return sum_x2 / static_cast<float>(n);
}
void Weights32(const float* xb, const float* qw, float sigma2, float* w) {
  for (int j = 0; j < 32; ++j) w[j] = qw[j] * std::sqrt(sigma2 + xb[j] * xb[j]);
}
}  // namespace

void QuantizeQ4_0(const float* x, BlockQ4_0* y, int64_t n, const float* qw) {
  if (!qw) return QuantizeQ4_0(x, y, n);
  const float sigma2 = RowSigma2(x, n);
  float w[32];
  int8_t L[32];
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    Weights32(x + 32 * ib, qw + 32 * ib, sigma2, w);
    y[ib].d = Fp32ToFp16(MakeQxQuants(32, 8, x + 32 * ib, L, 1, w));
    for (int j = 0; j < 16; ++j) y[ib].qs[j] = static_cast<uint8_t>(L[j] | (L[j + 16] << 4));
  }
}

void QuantizeQ4_1(const float* x, BlockQ4_1* y, int64_t n, const float* qw) {
  if (!qw) return QuantizeQ4_1(x, y, n);
  const float sigma2 = RowSigma2(x, n);
  float w[32], min;
  uint8_t L[32], Laux[32];
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    Weights32(x + 32 * ib, qw + 32 * ib, sigma2, w);
    const float d = MakeQkx3Quants(32, 15, x + 32 * ib, w, L, &min, Laux, -0.9f, 0.05f, 36, false);
    y[ib].d = Fp32ToFp16(d);
    y[ib].m = Fp32ToFp16(-min);
    for (int j = 0; j < 16; ++j) y[ib].qs[j] = static_cast<uint8_t>(L[j] | (L[j + 16] << 4));
  }
}

void QuantizeQ5_0(const float* x, BlockQ5_0* y, int64_t n, const float* qw) {
  if (!qw) return QuantizeQ5_0(x, y, n);
  const float sigma2 = RowSigma2(x, n);
  float w[32];
  int8_t L[32];
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    Weights32(x + 32 * ib, qw + 32 * ib, sigma2, w);
    y[ib].d = Fp32ToFp16(MakeQxQuants(32, 16, x + 32 * ib, L, 1, w));
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      y[ib].qs[j] = static_cast<uint8_t>((L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4));
      qh |= static_cast<uint32_t>((L[j] & 0x10) >> 4) << j;
      qh |= static_cast<uint32_t>((L[j + 16] & 0x10) >> 4) << (j + 16);
    }
    StoreQh(y[ib].qh, qh);
  }
}

void QuantizeQ5_1(const float* x, BlockQ5_1* y, int64_t n, const float* qw) {
  if (!qw) return QuantizeQ5_1(x, y, n);
  const float sigma2 = RowSigma2(x, n);
  float w[32], min;
  uint8_t L[32], Laux[32];
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    Weights32(x + 32 * ib, qw + 32 * ib, sigma2, w);
    const float d = MakeQkx3Quants(32, 31, x + 32 * ib, w, L, &min, Laux, -0.9f, 0.05f, 36, false);
    y[ib].d = Fp32ToFp16(d);
    y[ib].m = Fp32ToFp16(-min);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      y[ib].qs[j] = static_cast<uint8_t>((L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4));
      qh |= static_cast<uint32_t>((L[j] & 0x10) >> 4) << j;
      qh |= static_cast<uint32_t>((L[j + 16] & 0x10) >> 4) << (j + 16);
    }
    StoreQh(y[ib].qh, qh);
  }
}

}  // namespace substrate::quant_internal
