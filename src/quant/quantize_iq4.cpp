// IQ4_NL / IQ4_XS quantizers: 4-bit indices into a fixed non-uniform grid (kIQ4Values), with a
// per-block scale found by trying 15 candidate scales and refitting each by weighted least
// squares (llama-quantize's search with ntry = 7). IQ4_XS adds 6-bit sub-block scales.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/quant_internal.h"

namespace substrate::quant_internal {
namespace {
constexpr float kGroupMaxEps = 1e-15f;
constexpr int kNtry = 7;

// Index of the grid level nearest to x (ties go to the upper level): level j wins over j - 1
// when 2x >= kIQ4Values[j - 1] + kIQ4Values[j], an integer threshold in [-231, 202], so the
// answer depends only on floor(2x): a table over floor(2x) in [-256, 255] (the searches call
// this ~16 times per element).
struct BestIndexTable {
  uint8_t idx[512];
  BestIndexTable() {
    for (int f = -256; f < 256; ++f) {
      int i = 0;
      while (i < 15 && f >= kIQ4Values[i] + kIQ4Values[i + 1]) ++i;
      idx[f + 256] = static_cast<uint8_t>(i);
    }
  }
};
const BestIndexTable kBestIndex;

inline int BestIndex(float x) {
  const float x2 = x + x;
  if (!(x2 >= -256.f)) return 0;  // far below the grid, or NaN
  if (x2 >= 255.f) return 15;
  return kBestIndex.idx[static_cast<int>(std::floor(x2)) + 256];
}

// One group of 32: chooses levels Lb and returns the best scale for the group.
float QuantizeGroup(const float* xb, const float* weight, uint8_t* Lb) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    const float ax = std::fabs(xb[j]);
    if (ax > amax) {
      amax = ax;
      max = xb[j];
    }
  }
  if (amax < kGroupMaxEps) {
    std::memset(Lb, 0, 32);
    return 0.f;
  }
  float d = -max / kIQ4Values[0];
  float id = 1 / d;
  float sumqx = 0, sumq2 = 0;
  for (int j = 0; j < 32; ++j) {
    const int l = BestIndex(id * xb[j]);
    Lb[j] = static_cast<uint8_t>(l);
    const float q = kIQ4Values[l];
    sumqx += weight[j] * q * xb[j];
    sumq2 += weight[j] * q * q;
  }
  d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
  float best = d * sumqx;
  for (int itry = -kNtry; itry <= kNtry; ++itry) {
    id = static_cast<float>(itry + kIQ4Values[0]) / max;
    sumqx = sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
      const float q = kIQ4Values[BestIndex(id * xb[j])];
      sumqx += weight[j] * q * xb[j];
      sumq2 += weight[j] * q * q;
    }
    if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
      d = sumqx / sumq2;
      best = d * sumqx;
    }
  }
  return d;
}

// The search weighs each element's error by x^2, times its importance when one is given (so
// importance 1 everywhere gives exactly the unweighted result).
void Weights(const float* xb, const float* imp, float* weight) {
  for (int j = 0; j < 32; ++j) weight[j] = xb[j] * xb[j] * (imp ? imp[j] : 1.f);
}

void PackNibbles(const uint8_t* L, uint8_t* q4, int n) {
  for (int i = 0; i < n / 32; ++i)
    for (int j = 0; j < 16; ++j)
      q4[16 * i + j] = static_cast<uint8_t>(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

}  // namespace

void QuantizeIQ4_NL(const float* x, BlockIQ4_NL* y, int64_t n, const float* qw) {
  float weight[32];
  uint8_t L[32];
  for (int64_t ib = 0; ib < n / kQK4_NL; ++ib, x += kQK4_NL) {
    Weights(x, qw ? qw + ib * kQK4_NL : nullptr, weight);
    const float d = QuantizeGroup(x, weight, L);
    y[ib].d = Fp32ToFp16(d);
    const float id = d != 0.f ? 1 / d : 0;
    for (int j = 0; j < 32; ++j) L[j] = static_cast<uint8_t>(BestIndex(id * x[j]));
    PackNibbles(L, y[ib].qs, 32);
  }
}

void QuantizeIQ4_XS(const float* x, BlockIQ4_XS* y, int64_t n, const float* qw) {
  float weight[32], scales[kQK_K / 32];
  uint8_t L[kQK_K];
  for (int64_t ibl = 0; ibl < n / kQK_K; ++ibl, x += kQK_K) {
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < kQK_K / 32; ++ib) {
      Weights(x + 32 * ib, qw ? qw + ibl * kQK_K + 32 * ib : nullptr, weight);
      scales[ib] = QuantizeGroup(x + 32 * ib, weight, L + 32 * ib);
      if (std::fabs(scales[ib]) > amax_scale) {
        amax_scale = std::fabs(scales[ib]);
        max_scale = scales[ib];
      }
    }
    y[ibl].scales_h = 0;
    std::memset(y[ibl].scales_l, 0, sizeof(y[ibl].scales_l));
    const float d = -max_scale / 32;
    y[ibl].d = Fp32ToFp16(d);
    const float id = d != 0.f ? 1 / d : 0.f;
    for (int ib = 0; ib < kQK_K / 32; ++ib) {
      int l = std::max(-32, std::min(31, NearestInt(id * scales[ib])));
      const float dl = d * static_cast<float>(l);
      const float idl = dl != 0.f ? 1 / dl : 0.f;
      for (int j = 0; j < 32; ++j)
        L[32 * ib + j] = static_cast<uint8_t>(BestIndex(idl * x[32 * ib + j]));
      l += 32;
      const int l_l = l & 0xF, l_h = l >> 4;
      y[ibl].scales_l[ib / 2] = static_cast<uint8_t>(y[ibl].scales_l[ib / 2] | (l_l << (4 * (ib % 2))));
      y[ibl].scales_h = static_cast<uint16_t>(y[ibl].scales_h | (l_h << (2 * ib)));
    }
    PackNibbles(L, y[ibl].qs, kQK_K);
  }
}

}  // namespace substrate::quant_internal
