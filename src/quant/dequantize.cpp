// Reference dequantizers, one per block format. The arithmetic (order of float operations)
// follows the layouts' definitions exactly, so SIMD kernels can be checked bit for bit.
#include "quant/quant_internal.h"

namespace substrate::quant_internal {

void DequantizeQ4_0(const BlockQ4_0* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_0; ++i, y += kQK4_0) {
    const float d = Fp16ToFp32(x[i].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      y[j] = static_cast<float>((x[i].qs[j] & 0x0F) - 8) * d;
      y[j + kQK4_0 / 2] = static_cast<float>((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void DequantizeQ4_1(const BlockQ4_1* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_1; ++i, y += kQK4_1) {
    const float d = Fp16ToFp32(x[i].d), m = Fp16ToFp32(x[i].m);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      y[j] = static_cast<float>(x[i].qs[j] & 0x0F) * d + m;
      y[j + kQK4_1 / 2] = static_cast<float>(x[i].qs[j] >> 4) * d + m;
    }
  }
}

// Q5: the fifth bit of element j sits in bit j of the 32-bit little-endian qh.
static inline uint32_t LoadQh(const uint8_t* qh) {
  return static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
         static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
}

void DequantizeQ5_0(const BlockQ5_0* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK5_0; ++i, y += kQK5_0) {
    const float d = Fp16ToFp32(x[i].d);
    const uint32_t qh = LoadQh(x[i].qh);
    for (int j = 0; j < kQK5_0 / 2; ++j) {
      const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
      y[j] = static_cast<float>(((x[i].qs[j] & 0x0F) | h0) - 16) * d;
      y[j + kQK5_0 / 2] = static_cast<float>(((x[i].qs[j] >> 4) | h1) - 16) * d;
    }
  }
}

void DequantizeQ5_1(const BlockQ5_1* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK5_1; ++i, y += kQK5_1) {
    const float d = Fp16ToFp32(x[i].d), m = Fp16ToFp32(x[i].m);
    const uint32_t qh = LoadQh(x[i].qh);
    for (int j = 0; j < kQK5_1 / 2; ++j) {
      const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
      y[j] = static_cast<float>((x[i].qs[j] & 0x0F) | h0) * d + m;
      y[j + kQK5_1 / 2] = static_cast<float>((x[i].qs[j] >> 4) | h1) * d + m;
    }
  }
}

void DequantizeQ8_0(const BlockQ8_0* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK8_0; ++i, y += kQK8_0) {
    const float d = Fp16ToFp32(x[i].d);
    for (int j = 0; j < kQK8_0; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

// Q2_K: 16 sub-blocks of 16; each scale byte holds a 4-bit scale (low) and a 4-bit min (high).
// The 2-bit quants of 128 elements share 32 bytes: element l + 32*s is at bits 2s of byte l.
void DequantizeQ2_K(const BlockQ2_K* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = Fp16ToFp32(x[i].d), dmin = Fp16ToFp32(x[i].dmin);
    const uint8_t* q = x[i].qs;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int k = 0; k < 2; ++k) {
          const uint8_t sc = x[i].scales[is++];
          const float dl = d * static_cast<float>(sc & 0xF);
          const float ml = dmin * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l)
            *y++ = dl * static_cast<float>((q[l + 16 * k] >> shift) & 3) - ml;
        }
      }
    }
  }
}

// Q3_K: 2 low bits as in Q2_K plus a high bit in hmask (set = no -4 offset); 6-bit scales.
void DequantizeQ3_K(const BlockQ3_K* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d_all = Fp16ToFp32(x[i].d);
    const uint8_t* q = x[i].qs;
    const uint8_t* hm = x[i].hmask;
    uint8_t m = 1;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1)) {
        for (int k = 0; k < 2; ++k) {
          const float dl = d_all * static_cast<float>(Q3KScale(x[i].scales, is++));
          for (int l = 0; l < 16; ++l) {
            const int lo = (q[l + 16 * k] >> shift) & 3;
            const int v = lo - ((hm[l + 16 * k] & m) ? 0 : 4);
            *y++ = dl * static_cast<float>(v);
          }
        }
      }
    }
  }
}

void DequantizeQ4_K(const BlockQ4_K* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const uint8_t* q = x[i].qs;
    const float d = Fp16ToFp32(x[i].d), dmin = Fp16ToFp32(x[i].dmin);
    for (int is = 0; is < 8; is += 2, q += 32) {
      uint8_t sc, m;
      GetScaleMinK4(is, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      GetScaleMinK4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void DequantizeQ5_K(const BlockQ5_K* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const uint8_t* ql = x[i].qs;
    const uint8_t* qh = x[i].qh;
    const float d = Fp16ToFp32(x[i].d), dmin = Fp16ToFp32(x[i].dmin);
    uint8_t u1 = 1, u2 = 2;
    for (int is = 0; is < 8; is += 2, ql += 32) {
      uint8_t sc, m;
      GetScaleMinK4(is, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      GetScaleMinK4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l)
        *y++ = d1 * static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l)
        *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

// Q6_K: 4 low bits in ql, 2 high bits in qh, signed 8-bit scales per 16 elements.
void DequantizeQ6_K(const BlockQ6_K* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void DequantizeIQ4_NL(const BlockIQ4_NL* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_NL; ++i, y += kQK4_NL) {
    const float d = Fp16ToFp32(x[i].d);
    for (int j = 0; j < kQK4_NL / 2; ++j) {
      y[j] = d * static_cast<float>(kIQ4Values[x[i].qs[j] & 0xF]);
      y[j + kQK4_NL / 2] = d * static_cast<float>(kIQ4Values[x[i].qs[j] >> 4]);
    }
  }
}

// IQ4_XS: IQ4_NL levels in 8 sub-blocks of 32 with 6-bit scales (offset 32): 4 low bits in
// scales_l (two per byte), 2 high bits in scales_h.
void DequantizeIQ4_XS(const BlockIQ4_XS* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    const uint8_t* qs = x[i].qs;
    for (int ib = 0; ib < kQK_K / 32; ++ib, qs += 16, y += 32) {
      const int ls = ((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) |
                     (((x[i].scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * static_cast<float>(kIQ4Values[qs[j] & 0xF]);
        y[j + 16] = dl * static_cast<float>(kIQ4Values[qs[j] >> 4]);
      }
    }
  }
}

}  // namespace substrate::quant_internal
