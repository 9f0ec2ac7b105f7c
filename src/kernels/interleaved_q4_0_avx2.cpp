// The interleaved Q4_0 product (interleaved_q4_0.h) in AVX2, decode and prefill, for CPUs
// without AVX-512 (AMD Zen 2 and 3, Intel's client cores). The row kernel spends ~25
// instructions on each 18-byte block of one row (its nibbles unpacked, a scalar scale
// converted, a horizontal sum per row); here one 32-byte load holds 4 quant bytes of 8 rows, so
// a block of 16 rows is 8 loads, 8 maddubs a token and row half into 16-bit sums, one madd, and
// the 16 rows' scales converted 8 at a time: about a fifth of the instructions a byte.
//
// The nibbles meet the activations unsigned (0..15): a maddubs pair is at most 2 x 15 x 128, so
// the eight of a block sum in 16 bits without overflow; the -8 offset comes back exactly from
// the tile's -128 * sum(a) (an exact multiple of 16) divided by 16. Per token the float
// operations do not depend on how many tokens share the pass, so prefill rows have decode's
// bits.
#include <immintrin.h>

#include "kernels/cpu_features.h"
#include "kernels/interleaved_q4_0.h"
#include "kernels/token_tile.h"
#include "quant/blocks.h"

namespace substrate::avx2 {
namespace {

constexpr int kPairBytes = kQ4Interleaved_PairBytes;
constexpr int kQuant = kQ4Interleaved_QuantBytes;

inline __m256i Load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline __m256i Word(const uint8_t* tile_block, int n, int word, int t) {
  int32_t v;
  __builtin_memcpy(&v, tile_block + 4 * (word * n + t), 4);
  return _mm256_set1_epi32(v);
}

template <int NT>
void Groups(const uint8_t* data, size_t group_bytes, int64_t nb, int64_t g0, int64_t g1,
            const uint8_t* tile, float* y, int64_t y_stride) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const PrefetchDistances ahead = PrefetchFor(NT, 2048);
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* group = data + static_cast<size_t>(g) * group_bytes;
    __m256 acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* pair = group + (b / 2) * kPairBytes;
      if (b % 2 == 0) {  // the pair's 9 lines, requested ahead in address order
        for (int off = 0; off < kPairBytes; off += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(pair) + off + ahead.l1, _MM_HINT_T0);
          if (ahead.l2)
            _mm_prefetch(reinterpret_cast<const char*>(pair) + off + ahead.l2, _MM_HINT_T1);
        }
      }
      const uint8_t* words = pair + (b % 2) * kQuant;  // [4 words][16 rows][4 bytes]
      const uint8_t* scales = pair + kQ4Interleaved_Scales + (b % 2) * kInterleavedScaleBytes;
      const __m256 dw0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
      const __m256 dw1 =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 16)));
      const uint8_t* a = tile + static_cast<size_t>(b) * kActTileBytesPerToken * NT;
      for (int t = 0; t < NT; ++t) {
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();  // rows 0-7, 8-15
        for (int k = 0; k < 4; ++k) {
          const __m256i x0 = Load256(words + 64 * k), x1 = Load256(words + 64 * k + 32);
          const __m256i lo = Word(a, NT, k, t), hi = Word(a, NT, 4 + k, t);
          s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(_mm256_and_si256(x0, low4), lo));
          s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(_mm256_and_si256(x1, low4), lo));
          s0 = _mm256_add_epi16(
              s0, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(x0, 4), low4), hi));
          s1 = _mm256_add_epi16(
              s1, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(x1, 4), low4), hi));
        }
        int32_t neg128_sum;
        float da;
        __builtin_memcpy(&neg128_sum, a + 4 * (8 * NT + t), 4);
        __builtin_memcpy(&da, a + 4 * (9 * NT + t), 4);
        const __m256i offset = _mm256_set1_epi32(neg128_sum / 16);  // -8 * sum(a), exact
        const __m256i i0 = _mm256_add_epi32(_mm256_madd_epi16(s0, ones), offset);
        const __m256i i1 = _mm256_add_epi32(_mm256_madd_epi16(s1, ones), offset);
        const __m256 d = _mm256_set1_ps(da);
        acc[t][0] = _mm256_fmadd_ps(_mm256_mul_ps(dw0, d), _mm256_cvtepi32_ps(i0), acc[t][0]);
        acc[t][1] = _mm256_fmadd_ps(_mm256_mul_ps(dw1, d), _mm256_cvtepi32_ps(i1), acc[t][1]);
      }
    }
    for (int t = 0; t < NT; ++t) {
      float* out = y + t * y_stride + g * kInterleavedRows;
      _mm256_storeu_ps(out, acc[t][0]);
      _mm256_storeu_ps(out + 8, acc[t][1]);
    }
  }
}

}  // namespace

void GemvQ4_0Interleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* tile, int nt, float* y, int64_t y_stride) {
  const int64_t nb = cols / kQK4_0;
  const size_t group_bytes = static_cast<size_t>(nb) * kPairBytes / 2;
  WithTokenTile(nt, [&](auto n) {
    Groups<decltype(n)::value>(data, group_bytes, nb, g0, g1, tile, y, y_stride);
  });
}

}  // namespace substrate::avx2
