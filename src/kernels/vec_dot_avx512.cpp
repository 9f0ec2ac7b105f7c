// AVX-512VL + VNNI (+ BF16 where present) kernels: 256-bit vectors, dpbusd integer products
// and 32 registers, so 8 tokens per weight pass; see vec_dot_x86.inc. Q4_K, the bulk of the
// common Q4_K_M files, also gets a 512-bit kernel here: one zmm holds a whole 64-element chunk
// (both nibble halves), halving the instructions per block.
// GCC 12's 512-bit insert/extract intrinsics pass an "undefined" vector that its own
// -Wuninitialized then flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define SUBSTRATE_VNNI 1
#define SUBSTRATE_MAX_NT 8
#define SUBSTRATE_ISA_NS avx512
#include "kernels/vec_dot_x86.inc"

namespace substrate::avx512 {
namespace {

// Q4_K's 12 scale bytes -> 8 scales and 8 mins, one byte each, with word operations: words
// w0..w2 hold bytes 0-3, 4-7, 8-11; scales 0-3 and mins 0-3 are the low 6 bits of w0 and w1;
// scales/mins 4-7 take their low 4 bits from w2's nibbles and their top 2 from w0/w1's top bits.
inline void UnpackQ4KScales64(const uint8_t* q, uint64_t* sc, uint64_t* mn) {
  uint32_t w0, w1, w2;
  std::memcpy(&w0, q, 4);
  std::memcpy(&w1, q + 4, 4);
  std::memcpy(&w2, q + 8, 4);
  const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
  uint32_t s_lo = w0 & low6, m_lo = w1 & low6;
  uint32_t s_hi = (w2 & low4) | (((w0 >> 6) & low2) << 4);
  uint32_t m_hi = ((w2 >> 4) & low4) | (((w1 >> 6) & low2) << 4);
  *sc = static_cast<uint64_t>(s_hi) << 32 | s_lo;
  *mn = static_cast<uint64_t>(m_hi) << 32 | m_lo;
}

template <int NT>
void DotQ4_KWideT(int64_t n, const void* wv, const uint8_t* act, size_t stride, float* out) {
  auto* w = static_cast<const BlockQ4_K*>(wv);
  const __m256i m4 = _mm256_set1_epi8(0xF);
  // Lane patterns selecting scale 2j for the low 32 bytes of a chunk and 2j+1 for the high.
  __m512i pick[4];
  for (int j = 0; j < 4; ++j)
    pick[j] = _mm512_inserti64x4(_mm512_zextsi256_si512(_mm256_set1_epi16(static_cast<short>(2 * j))),
                                 _mm256_set1_epi16(static_cast<short>(2 * j + 1)), 1);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockQ4_K& x = w[b];
    PrefetchWeights<NT>(&x, sizeof(x));
    uint64_t sc8, mn8;
    UnpackQ4KScales64(x.scales, &sc8, &mn8);
    __m512i sc16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc8))));
    __m128i mn16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(mn8)));
    __m256i mins = _mm256_set_m128i(_mm_unpackhi_epi16(mn16, mn16), _mm_unpacklo_epi16(mn16, mn16));
    __m512i q[4], s[4];
    for (int j = 0; j < 4; ++j) {
      __m256i raw = Load256(x.qs + 32 * j);
      __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      q[j] = _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);  // elements 64j..64j+63
      s[j] = _mm512_permutexvar_epi16(pick[j], sc16);
    }
    float dw = H(x.d), dmin = H(x.dmin);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& y = Act<BlockQ8_K>(act, stride, t)[b];
      __m512i sumi = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j) {
        __m512i p = _mm512_maddubs_epi16(q[j], _mm512_loadu_si512(y.qs + 64 * j));
        sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(p, s[j]));
      }
      __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
      __m256i pm = _mm256_madd_epi16(mins, Load256(y.bsums));
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * y.d), _mm256_cvtepi32_ps(s8), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(-dmin * y.d), _mm256_cvtepi32_ps(pm), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = HsumPs(acc[t]);
}

SUBSTRATE_DEFINE_MULTI(DotQ4_KWide)

}  // namespace

const DotKernel* FindWide(DType type) {
  static const DotKernel kQ4_K{DType::kQ8_K, DotQ4_KWide, kMaxNT};
  switch (type) {
    case DType::kQ4_K: return &kQ4_K;
    default: return nullptr;
  }
}

}  // namespace substrate::avx512
