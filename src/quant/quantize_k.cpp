// Reference K-quant quantizers (Q2_K..Q6_K). They follow llama-quantize's default path (ggml's
// quantize_row_*_ref), float operations in ggml's order for identical output; an importance
// vector reweights the errors those searches minimize (see below).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "quant/kquant_search.h"
#include "quant/quant_internal.h"

namespace substrate::quant_internal {
namespace {
constexpr float kGroupMaxEps = 1e-15f;

// 2-bit levels of 128 elements in 32 bytes: element l + 32*s at bits 2s of byte l.
void Pack2Bit(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < kQK_K; j += 128)
    for (int l = 0; l < 32; ++l)
      qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) |
                                            (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

// Packs eight 6-bit scales and mins into Q4_K/Q5_K's 12 bytes.
void PackScalesK4(const uint8_t* ls, const uint8_t* lm, uint8_t* scales) {
  for (int j = 0; j < kQK_K / 32; ++j) {
    if (j < 4) {
      scales[j] = ls[j];
      scales[j + 4] = lm[j];
    } else {
      scales[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      scales[j - 4] = static_cast<uint8_t>(scales[j - 4] | ((ls[j] >> 4) << 6));
      scales[j] = static_cast<uint8_t>(scales[j] | ((lm[j] >> 4) << 6));
    }
  }
}

// Final pass shared by Q4_K/Q5_K: requantize each sub-block with the rounded scales.
void RequantizeK4(const float* x, const uint8_t* scales, uint16_t d16, uint16_t dmin16,
                  int nmax, uint8_t* L) {
  for (int j = 0; j < kQK_K / 32; ++j) {
    uint8_t sc, m;
    GetScaleMinK4(j, scales, &sc, &m);
    const float d = Fp16ToFp32(d16) * sc;
    if (d == 0.f) continue;
    const float dm = Fp16ToFp32(dmin16) * m;
    for (int ii = 0; ii < 32; ++ii) {
      const int l = NearestInt((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    }
  }
}

// Scales and mins of the eight sub-blocks -> 6-bit levels, the ggml reference way (max/63).
void QuantizeScalesK4Ref(const float* scales, const float* mins, BlockQ4_K* yq4,
                         BlockQ5_K* yq5) {
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < kQK_K / 32; ++j) {
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < kQK_K / 32; ++j) {
    // ggml stores nearest_int into a uint8_t before clamping: keep the same wrap.
    ls[j] = std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_scale * scales[j])));
    lm[j] = std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_min * mins[j])));
  }
  uint8_t* sc = yq4 ? yq4->scales : yq5->scales;
  std::memset(sc, 0, kKScaleBytes);
  PackScalesK4(ls, lm, sc);
  const uint16_t d = Fp32ToFp16(max_scale / 63.f), dmin = Fp32ToFp16(max_min / 63.f);
  if (yq4) {
    yq4->d = d;
    yq4->dmin = dmin;
  } else {
    yq5->d = d;
    yq5->dmin = dmin;
  }
}

}  // namespace

// Importance (imp, per element, may be null): every error weight the default search uses is
// multiplied by the element's importance, so the search minimizes the importance-weighted error
// and importance 1 everywhere gives exactly the default result. The super-block scale steps are
// the default ones (they carry no per-element weights).
namespace {
inline float Imp(const float* imp, int64_t i) { return imp ? imp[i] : 1.f; }
}  // namespace

void QuantizeQ2_K(const float* x, BlockQ2_K* y, int64_t n, const float* imp) {
  uint8_t L[kQK_K], Laux[16];
  float weights[16], mins[kQK_K / 16], scales[kQK_K / 16];
  constexpr float q4scale = 15.f;
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < kQK_K / 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      if (imp)
        for (int l = 0; l < 16; ++l) weights[l] *= imp[kQK_K * i + 16 * j + l];
      scales[j] = MakeQkx2Quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f,
                                 0.1f, 15, true);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    if (max_scale > 0) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < kQK_K / 16; ++j)
        y[i].scales[j] = static_cast<uint8_t>(NearestInt(iscale * scales[j]));
      y[i].d = Fp32ToFp16(max_scale / q4scale);
    } else {
      std::memset(y[i].scales, 0, sizeof(y[i].scales));
      y[i].d = Fp32ToFp16(0.f);
    }
    if (max_min > 0) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < kQK_K / 16; ++j)
        y[i].scales[j] =
            static_cast<uint8_t>(y[i].scales[j] | (NearestInt(iscale * mins[j]) << 4));
      y[i].dmin = Fp32ToFp16(max_min / q4scale);
    } else {
      y[i].dmin = Fp32ToFp16(0.f);
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = Fp16ToFp32(y[i].d) * static_cast<float>(y[i].scales[j] & 0xF);
      if (d == 0.f) continue;
      const float dm = Fp16ToFp32(y[i].dmin) * static_cast<float>(y[i].scales[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) {
        const int l = NearestInt((x[16 * j + ii] + dm) / d);
        L[16 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(3, l)));
      }
    }
    Pack2Bit(L, y[i].qs);
  }
}

void QuantizeQ3_K(const float* x, BlockQ3_K* y, int64_t n, const float* imp) {
  int8_t L[kQK_K];
  float scales[kQK_K / 16], weights[16];
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    std::memset(y[i].scales, 0, 12);
    auto put_scale = [&](int j, int l) {  // l in [0, 63]
      if (j < 8)
        y[i].scales[j] = static_cast<uint8_t>(l & 0xF);
      else
        y[i].scales[j - 8] = static_cast<uint8_t>(y[i].scales[j - 8] | ((l & 0xF) << 4));
      y[i].scales[j % 4 + 8] =
          static_cast<uint8_t>(y[i].scales[j % 4 + 8] | ((l >> 4) << (2 * (j / 4))));
    };
    float max_scale = 0, amax = 0;
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float* xj = x + 16 * j;
      for (int l = 0; l < 16; ++l) weights[l] = xj[l] * xj[l] * Imp(imp, kQK_K * i + 16 * j + l);
      scales[j] = MakeQ3Quants(16, 4, xj, L + 16 * j, true, weights);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    if (max_scale != 0.f) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < kQK_K / 16; ++j) {
        int l = static_cast<int8_t>(NearestInt(iscale * scales[j]));
        put_scale(j, std::max(-32, std::min(31, l)) + 32);
      }
      y[i].d = Fp32ToFp16(1 / iscale);
    } else {
      y[i].d = Fp32ToFp16(0.f);
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = Fp16ToFp32(y[i].d) * static_cast<float>(Q3KScale(y[i].scales, j));
      if (d == 0.f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        const int l = NearestInt(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<int8_t>(std::max(-4, std::min(3, l)) + 4);
      }
    }
    // High bit of the first 32 quants goes to bit 0 of hmask[0..31], the next 32 to bit 1...
    std::memset(y[i].hmask, 0, kQK_K / 8);
    uint8_t Lu[kQK_K];
    for (int j = 0; j < kQK_K; ++j) {
      int l = L[j];
      if (l > 3) {
        y[i].hmask[j % 32] = static_cast<uint8_t>(y[i].hmask[j % 32] | (1 << (j / 32)));
        l -= 4;
      }
      Lu[j] = static_cast<uint8_t>(l);
    }
    Pack2Bit(Lu, y[i].qs);
  }
}

namespace {

// Q4_K and Q5_K share the sub-block search (levels 0..nmax with a min per 32 elements).
template <typename Block>
void SearchK4(const float* x, const float* imp, int nmax, float rmin, int nstep, Block* y) {
  uint8_t L[kQK_K], Laux[32];
  float weights[32], mins[kQK_K / 32], scales[kQK_K / 32];
  for (int j = 0; j < kQK_K / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    if (imp)
      for (int l = 0; l < 32; ++l) weights[l] *= imp[32 * j + l];
    scales[j] = MakeQkx2Quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin,
                               0.1f, nstep, false);
  }
  if constexpr (std::is_same_v<Block, BlockQ4_K>)
    QuantizeScalesK4Ref(scales, mins, y, nullptr);
  else
    QuantizeScalesK4Ref(scales, mins, nullptr, y);
  RequantizeK4(x, y->scales, y->d, y->dmin, nmax, L);
  if constexpr (std::is_same_v<Block, BlockQ4_K>) {
    uint8_t* q = y->qs;
    for (int j = 0; j < kQK_K; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  } else {
    uint8_t* qh = y->qh;
    uint8_t* ql = y->qs;
    std::memset(qh, 0, kQK_K / 8);
    uint8_t m1 = 1, m2 = 2;
    for (int b = 0; b < kQK_K; b += 64, ql += 32) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[b + j], l2 = L[b + j + 32];
        if (l1 > 15) {
          l1 -= 16;
          qh[j] |= m1;
        }
        if (l2 > 15) {
          l2 -= 16;
          qh[j] |= m2;
        }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
      m1 = static_cast<uint8_t>(m1 << 2);
      m2 = static_cast<uint8_t>(m2 << 2);
    }
  }
}

}  // namespace

void QuantizeQ4_K(const float* x, BlockQ4_K* y, int64_t n, const float* imp) {
  for (int64_t i = 0; i < n / kQK_K; ++i)
    SearchK4(x + kQK_K * i, imp ? imp + kQK_K * i : nullptr, 15, -1.f, 20, &y[i]);
}

void QuantizeQ5_K(const float* x, BlockQ5_K* y, int64_t n, const float* imp) {
  for (int64_t i = 0; i < n / kQK_K; ++i)
    SearchK4(x + kQK_K * i, imp ? imp + kQK_K * i : nullptr, 31, -0.5f, 15, &y[i]);
}

void QuantizeQ6_K(const float* x, BlockQ6_K* y, int64_t n, const float* imp) {
  int8_t L[kQK_K];
  float scales[kQK_K / 16], weights[16];
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      const float* xb = x + 16 * ib;
      // Without importance the search weights by x^2 itself; with it, by x^2 * importance.
      if (imp)
        for (int l = 0; l < 16; ++l) weights[l] = xb[l] * xb[l] * imp[kQK_K * i + 16 * ib + l];
      const float scale = MakeQxQuants(16, 32, xb, L + 16 * ib, 1, imp ? weights : nullptr);
      scales[ib] = scale;
      if (std::fabs(scale) > max_abs_scale) {
        max_abs_scale = std::fabs(scale);
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(BlockQ6_K));
      y[i].d = Fp32ToFp16(0.f);
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[i].d = Fp32ToFp16(1 / iscale);
    for (int ib = 0; ib < kQK_K / 16; ++ib)
      y[i].scales[ib] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scales[ib])));
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = Fp16ToFp32(y[i].d) * static_cast<float>(y[i].scales[j]);
      if (d == 0.f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        const int l = NearestInt(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<int8_t>(std::max(-32, std::min(31, l)) + 32);
      }
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < kQK_K; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
        const int q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
        ql[l] = static_cast<uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                     ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace substrate::quant_internal
