// Scalar dot-product kernels and activation quantizers: the reference every SIMD kernel is
// tested against. Integer sums per block, one float multiply-add per block (as ggml does).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/vec_dot.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace substrate::scalar {
namespace {

inline float H(uint16_t h) { return Fp16ToFp32(h); }

// ---- activation quantizers (round half to even, like the SIMD versions) ----

void QuantizeQ8_0(const float* x, void* out, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(out);
  float* dtail = reinterpret_cast<float*>(y + n / kQK8_0);  // see ActRowBytes
  for (int64_t b = 0; b < n / kQK8_0; ++b, x += kQK8_0) {
    float amax = 0, poison = 0;
    for (int j = 0; j < kQK8_0; ++j) {
      amax = std::max(amax, std::fabs(x[j]));
      poison += x[j] * 0.0f;
    }
    // max drops NaN; a non-finite input makes the block's scale NaN so the products show it.
    float d = poison == 0 ? amax / 127.0f : NAN;
    float id = d != 0 ? 1.0f / d : 0.0f;
    y[b].d = Fp32ToFp16(d);
    float df = H(y[b].d);
    std::memcpy(dtail + b, &df, sizeof(float));
    for (int j = 0; j < kQK8_0; ++j) y[b].qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
  }
}

void QuantizeQ8_1(const float* x, void* out, int64_t n) {
  auto* y = static_cast<BlockQ8_1*>(out);
  for (int64_t b = 0; b < n / kQK8_1; ++b, x += kQK8_1) {
    float amax = 0, poison = 0;
    for (int j = 0; j < kQK8_1; ++j) {
      amax = std::max(amax, std::fabs(x[j]));
      poison += x[j] * 0.0f;
    }
    float d = poison == 0 ? amax / 127.0f : NAN;
    float id = d != 0 ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < kQK8_1; ++j) {
      y[b].qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
      sum += y[b].qs[j];
    }
    y[b].d = Fp32ToFp16(d);
    y[b].s = Fp32ToFp16(static_cast<float>(sum) * d);
  }
}

void QuantizeQ8_K(const float* x, void* out, int64_t n) {
  auto* y = static_cast<BlockQ8_K*>(out);
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    float amax = 0, max = 0, poison = 0;
    for (int j = 0; j < kQK_K; ++j) {
      float ax = std::fabs(x[j]);
      poison += x[j] * 0.0f;
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0 || poison != 0) {
      // All zero, or a non-finite input: then the scale is NaN, so the products show it.
      std::memset(&y[b], 0, sizeof(BlockQ8_K));
      if (poison != 0) y[b].d = NAN;
      continue;
    }
    // The element of largest magnitude maps to -127 exactly (ggml's convention).
    float iscale = -127.0f / max;
    for (int j = 0; j < kQK_K; ++j) {
      int v = static_cast<int>(std::nearbyint(iscale * x[j]));
      y[b].qs[j] = static_cast<int8_t>(std::min(127, v));
    }
    for (int g = 0; g < kQK_K / 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += y[b].qs[16 * g + j];
      y[b].bsums[g] = static_cast<int16_t>(s);
    }
    y[b].d = 1.0f / iscale;
  }
}

void QuantizeF16(const float* x, void* out, int64_t n) {
  auto* y = static_cast<uint16_t*>(out);
  for (int64_t i = 0; i < n; ++i) y[i] = Fp32ToFp16(x[i]);
}

void QuantizeBF16(const float* x, void* out, int64_t n) {
  auto* y = static_cast<uint16_t*>(out);
  for (int64_t i = 0; i < n; ++i) y[i] = Fp32ToBf16(x[i]);
}

void CopyF32(const float* x, void* out, int64_t n) {
  std::memcpy(out, x, static_cast<size_t>(n) * sizeof(float));
}

// ---- one row against one activation row ----

float DotF32(int64_t n, const void* wv, const void* av) {
  auto* w = static_cast<const float*>(wv);
  auto* a = static_cast<const float*>(av);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += w[i] * a[i];
  return s;
}

float DotF16(int64_t n, const void* wv, const void* av) {
  auto* w = static_cast<const uint16_t*>(wv);
  auto* a = static_cast<const float*>(av);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += H(w[i]) * a[i];
  return s;
}

float DotBF16(int64_t n, const void* wv, const void* av) {
  auto* w = static_cast<const uint16_t*>(wv);
  auto* a = static_cast<const float*>(av);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += Bf16ToFp32(w[i]) * a[i];
  return s;
}

float DotQ8_0(int64_t n, const void* wv, const void* av) {
  auto* w = static_cast<const BlockQ8_0*>(wv);
  auto* a = static_cast<const BlockQ8_0*>(av);
  float s = 0;
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    int si = 0;
    for (int j = 0; j < kQK8_0; ++j) si += w[b].qs[j] * a[b].qs[j];
    s += static_cast<float>(si) * (H(w[b].d) * H(a[b].d));
  }
  return s;
}

float DotQ4_0(int64_t n, const void* wv, const void* av) {
  auto* w = static_cast<const BlockQ4_0*>(wv);
  auto* a = static_cast<const BlockQ8_0*>(av);
  float s = 0;
  for (int64_t b = 0; b < n / kQK4_0; ++b) {
    int si = 0;
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      si += ((w[b].qs[j] & 0xF) - 8) * a[b].qs[j];
      si += ((w[b].qs[j] >> 4) - 8) * a[b].qs[j + 16];
    }
    s += static_cast<float>(si) * (H(w[b].d) * H(a[b].d));
  }
  return s;
}

float DotQ4_1(int64_t n, const void* wv, const void* av) {
  auto* w = static_cast<const BlockQ4_1*>(wv);
  auto* a = static_cast<const BlockQ8_1*>(av);
  float s = 0;
  for (int64_t b = 0; b < n / kQK4_1; ++b) {
    int si = 0;
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      si += (w[b].qs[j] & 0xF) * a[b].qs[j];
      si += (w[b].qs[j] >> 4) * a[b].qs[j + 16];
    }
    s += static_cast<float>(si) * (H(w[b].d) * H(a[b].d)) + H(w[b].m) * H(a[b].s);
  }
  return s;
}

inline uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

float DotQ5_0(int64_t n, const void* wv, const void* av) {
  auto* w = static_cast<const BlockQ5_0*>(wv);
  auto* a = static_cast<const BlockQ8_0*>(av);
  float s = 0;
  for (int64_t b = 0; b < n / kQK5_0; ++b) {
    uint32_t qh = Load32(w[b].qh);
    int si = 0;
    for (int j = 0; j < kQK5_0 / 2; ++j) {
      int lo = (w[b].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      int hi = (w[b].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      si += (lo - 16) * a[b].qs[j] + (hi - 16) * a[b].qs[j + 16];
    }
    s += static_cast<float>(si) * (H(w[b].d) * H(a[b].d));
  }
  return s;
}

float DotQ5_1(int64_t n, const void* wv, const void* av) {
  auto* w = static_cast<const BlockQ5_1*>(wv);
  auto* a = static_cast<const BlockQ8_1*>(av);
  float s = 0;
  for (int64_t b = 0; b < n / kQK5_1; ++b) {
    uint32_t qh = Load32(w[b].qh);
    int si = 0;
    for (int j = 0; j < kQK5_1 / 2; ++j) {
      int lo = (w[b].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      int hi = (w[b].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      si += lo * a[b].qs[j] + hi * a[b].qs[j + 16];
    }
    s += static_cast<float>(si) * (H(w[b].d) * H(a[b].d)) + H(w[b].m) * H(a[b].s);
  }
  return s;
}

float DotIQ4_NL(int64_t n, const void* wv, const void* av) {
  auto* w = static_cast<const BlockIQ4_NL*>(wv);
  auto* a = static_cast<const BlockQ8_0*>(av);
  float s = 0;
  for (int64_t b = 0; b < n / kQK4_NL; ++b) {
    int si = 0;
    for (int j = 0; j < kQK4_NL / 2; ++j) {
      si += kIq4NlValues[w[b].qs[j] & 0xF] * a[b].qs[j];
      si += kIq4NlValues[w[b].qs[j] >> 4] * a[b].qs[j + 16];
    }
    s += static_cast<float>(si) * (H(w[b].d) * H(a[b].d));
  }
  return s;
}

// ---- K formats against Q8_K: sub-block integer sums, scales applied in integers ----

float DotQ2_K(int64_t n, const void* wv, const void* av) {
  auto* w = static_cast<const BlockQ2_K*>(wv);
  auto* a = static_cast<const BlockQ8_K*>(av);
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int isum = 0, msum = 0;
    for (int g = 0; g < 16; ++g) msum += (w[b].scales[g] >> 4) * a[b].bsums[g];
    for (int e = 0; e < kQK_K; e += 16) {
      // Element e: byte 32*(e/128) + (e%32), bits 2*((e%128)/32).
      int sub = e / 16, shift = 2 * ((e % 128) / 32);
      const uint8_t* q = w[b].qs + 32 * (e / 128) + (e % 32);
      int si = 0;
      for (int l = 0; l < 16; ++l) si += ((q[l] >> shift) & 3) * a[b].qs[e + l];
      isum += (w[b].scales[sub] & 0xF) * si;
    }
    float yd = a[b].d;
    s += H(w[b].d) * yd * static_cast<float>(isum) - H(w[b].dmin) * yd * static_cast<float>(msum);
  }
  return s;
}

}  // namespace

// Unpacks Q3_K's 16 6-bit scales (stored offset by 32) into signed values.
void UnpackQ3KScales(const uint8_t* packed, int8_t* out) {
  uint32_t aux[4];
  std::memcpy(aux, packed, 12);
  uint32_t tmp = aux[2];
  const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
  aux[2] = ((aux[0] >> 4) & m4) | (((tmp >> 4) & m2) << 4);
  aux[3] = ((aux[1] >> 4) & m4) | (((tmp >> 6) & m2) << 4);
  aux[0] = (aux[0] & m4) | (((tmp >> 0) & m2) << 4);
  aux[1] = (aux[1] & m4) | (((tmp >> 2) & m2) << 4);
  std::memcpy(out, aux, 16);
  for (int i = 0; i < 16; ++i) out[i] = static_cast<int8_t>(out[i] - 32);
}

// Unpacks Q4_K/Q5_K's 8 6-bit scales and 8 6-bit mins.
void UnpackQ4KScales(const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      sc[j] = q[j] & 63;
      mn[j] = q[j + 4] & 63;
    } else {
      sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
      mn[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
  }
}

namespace {

float DotQ3_K(int64_t n, const void* wv, const void* av) {
  auto* w = static_cast<const BlockQ3_K*>(wv);
  auto* a = static_cast<const BlockQ8_K*>(av);
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int8_t sc[16];
    UnpackQ3KScales(w[b].scales, sc);
    int isum = 0;
    for (int e = 0; e < kQK_K; e += 16) {
      int half = e / 128, j = (e % 128) / 32, shift = 2 * j;
      const uint8_t* q = w[b].qs + 32 * half + (e % 32);
      const uint8_t* hm = w[b].hmask + (e % 32);
      int bit = 4 * half + j, si = 0;
      for (int l = 0; l < 16; ++l) {
        int v = ((q[l] >> shift) & 3) - (((hm[l] >> bit) & 1) ? 0 : 4);
        si += v * a[b].qs[e + l];
      }
      isum += sc[e / 16] * si;
    }
    s += H(w[b].d) * a[b].d * static_cast<float>(isum);
  }
  return s;
}

float DotQ4_K(int64_t n, const void* wv, const void* av) {
  auto* w = static_cast<const BlockQ4_K*>(wv);
  auto* a = static_cast<const BlockQ8_K*>(av);
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    uint8_t sc[8], mn[8];
    UnpackQ4KScales(w[b].scales, sc, mn);
    int isum = 0, msum = 0;
    for (int sub = 0; sub < 8; ++sub) {
      const uint8_t* q = w[b].qs + 32 * (sub / 2);
      int shift = 4 * (sub % 2), si = 0;
      for (int l = 0; l < 32; ++l) si += ((q[l] >> shift) & 0xF) * a[b].qs[32 * sub + l];
      isum += sc[sub] * si;
      msum += mn[sub] * (a[b].bsums[2 * sub] + a[b].bsums[2 * sub + 1]);
    }
    float yd = a[b].d;
    s += H(w[b].d) * yd * static_cast<float>(isum) - H(w[b].dmin) * yd * static_cast<float>(msum);
  }
  return s;
}

float DotQ5_K(int64_t n, const void* wv, const void* av) {
  auto* w = static_cast<const BlockQ5_K*>(wv);
  auto* a = static_cast<const BlockQ8_K*>(av);
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    uint8_t sc[8], mn[8];
    UnpackQ4KScales(w[b].scales, sc, mn);
    int isum = 0, msum = 0;
    for (int sub = 0; sub < 8; ++sub) {
      const uint8_t* q = w[b].qs + 32 * (sub / 2);
      int shift = 4 * (sub % 2), si = 0;
      for (int l = 0; l < 32; ++l) {
        int v = ((q[l] >> shift) & 0xF) | (((w[b].qh[l] >> sub) & 1) << 4);
        si += v * a[b].qs[32 * sub + l];
      }
      isum += sc[sub] * si;
      msum += mn[sub] * (a[b].bsums[2 * sub] + a[b].bsums[2 * sub + 1]);
    }
    float yd = a[b].d;
    s += H(w[b].d) * yd * static_cast<float>(isum) - H(w[b].dmin) * yd * static_cast<float>(msum);
  }
  return s;
}

float DotQ6_K(int64_t n, const void* wv, const void* av) {
  auto* w = static_cast<const BlockQ6_K*>(wv);
  auto* a = static_cast<const BlockQ8_K*>(av);
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int isum = 0;
    for (int e = 0; e < kQK_K; e += 16) {
      // Quarter k of a 128-element half: ql bytes [0,32) for even k, [32,64) for odd k; low
      // nibbles for k < 2, high for k >= 2; the top two bits are bits 2k..2k+1 of qh.
      int half = e / 128, k = (e % 128) / 32, l0 = e % 32;
      const uint8_t* ql = w[b].ql + 64 * half + (k & 1 ? 32 : 0);
      const uint8_t* qh = w[b].qh + 32 * half;
      int nib = k >= 2 ? 4 : 0, si = 0;
      for (int l = l0; l < l0 + 16; ++l) {
        int v = ((ql[l] >> nib) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4);
        si += (v - 32) * a[b].qs[e + l - l0];
      }
      isum += w[b].scales[e / 16] * si;
    }
    s += H(w[b].d) * a[b].d * static_cast<float>(isum);
  }
  return s;
}

float DotIQ4_XS(int64_t n, const void* wv, const void* av) {
  auto* w = static_cast<const BlockIQ4_XS*>(wv);
  auto* a = static_cast<const BlockQ8_K*>(av);
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int isum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      int ls = ((w[b].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) |
               (((w[b].scales_h >> (2 * ib)) & 3) << 4);
      const uint8_t* q = w[b].qs + 16 * ib;
      const int8_t* y = a[b].qs + 32 * ib;
      int si = 0;
      for (int j = 0; j < 16; ++j)
        si += kIq4NlValues[q[j] & 0xF] * y[j] + kIq4NlValues[q[j] >> 4] * y[j + 16];
      isum += (ls - 32) * si;
    }
    s += H(w[b].d) * a[b].d * static_cast<float>(isum);
  }
  return s;
}

template <float (*F)(int64_t, const void*, const void*)>
void Multi(int64_t n, const void* w, const void* act, size_t stride, int nt, float* out) {
  auto* a = static_cast<const uint8_t*>(act);
  for (int t = 0; t < nt; ++t) out[t] = F(n, w, a + t * stride);
}

const DotKernel kF32{DType::kF32, Multi<DotF32>, 1};
// Half weights pair with float activations (see vec_dot_x86.inc).
const DotKernel kF16{DType::kF32, Multi<DotF16>, 1};
const DotKernel kBF16{DType::kF32, Multi<DotBF16>, 1};
const DotKernel kQ8_0{DType::kQ8_0, Multi<DotQ8_0>, 1};
const DotKernel kQ4_0{DType::kQ8_0, Multi<DotQ4_0>, 1};
const DotKernel kQ4_1{DType::kQ8_1, Multi<DotQ4_1>, 1};
const DotKernel kQ5_0{DType::kQ8_0, Multi<DotQ5_0>, 1};
const DotKernel kQ5_1{DType::kQ8_1, Multi<DotQ5_1>, 1};
const DotKernel kIQ4_NL{DType::kQ8_0, Multi<DotIQ4_NL>, 1};
const DotKernel kQ2_K{DType::kQ8_K, Multi<DotQ2_K>, 1};
const DotKernel kQ3_K{DType::kQ8_K, Multi<DotQ3_K>, 1};
const DotKernel kQ4_K{DType::kQ8_K, Multi<DotQ4_K>, 1};
const DotKernel kQ5_K{DType::kQ8_K, Multi<DotQ5_K>, 1};
const DotKernel kQ6_K{DType::kQ8_K, Multi<DotQ6_K>, 1};
const DotKernel kIQ4_XS{DType::kQ8_K, Multi<DotIQ4_XS>, 1};

}  // namespace

const DotKernel* Find(DType type) {
  switch (type) {
    case DType::kF32: return &kF32;
    case DType::kF16: return &kF16;
    case DType::kBF16: return &kBF16;
    case DType::kQ8_0: return &kQ8_0;
    case DType::kQ4_0: return &kQ4_0;
    case DType::kQ4_1: return &kQ4_1;
    case DType::kQ5_0: return &kQ5_0;
    case DType::kQ5_1: return &kQ5_1;
    case DType::kIQ4_NL: return &kIQ4_NL;
    case DType::kQ2_K: return &kQ2_K;
    case DType::kQ3_K: return &kQ3_K;
    case DType::kQ4_K: return &kQ4_K;
    case DType::kQ5_K: return &kQ5_K;
    case DType::kQ6_K: return &kQ6_K;
    case DType::kIQ4_XS: return &kIQ4_XS;
    default: return nullptr;
  }
}

QuantizeActFn FindQuantize(DType act_type) {
  switch (act_type) {
    case DType::kF32: return CopyF32;
    case DType::kF16: return QuantizeF16;
    case DType::kBF16: return QuantizeBF16;
    case DType::kQ8_0: return QuantizeQ8_0;
    case DType::kQ8_1: return QuantizeQ8_1;
    case DType::kQ8_K: return QuantizeQ8_K;
    default: return nullptr;
  }
}

}  // namespace substrate::scalar
