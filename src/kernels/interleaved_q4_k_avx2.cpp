// The interleaved Q4_K product (interleaved_q4_k.h) in AVX2, decode and prefill, for CPUs
// without AVX-512. As the Q4_0 kernel on this tier (interleaved_q4_0_avx2.cpp): a 32-byte load
// is 4 quant bytes of 8 rows; a sub-block's 8 words meet broadcast activation words in maddubs
// whose 16-bit sums (at most 8 x 2 x 15 x 128) one madd multiplies by the 8 rows' 6-bit scales,
// so a block's integer sum per row takes 2 x 8 maddubs and 2 madds a chunk instead of the row
// kernel's shuffles per sub-block. The mins meet the activation's sub-block sums in four madds.
// Integer sums equal the row kernels'; per token the float operations do not depend on how many
// tokens share the pass.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/interleaved_k_frame.h"
#include "kernels/interleaved_q4_k.h"
#include "quant/blocks.h"

namespace substrate::avx2 {
namespace {

// Offsets within a block's metadata (d, dmin, scale bytes, low bits of the mins), after the
// quant bytes.
constexpr int kD = 0, kDmin = kD + 32, kScale = kDmin + 32, kMinLow = kScale + 128;
constexpr int kBlockBytes = kQ4KInterleaved_BlockBytes;
constexpr int kMeta = kQ4KInterleaved_QuantBytes;

inline __m256i Word(const int8_t* p) {  // 4 activation quants, broadcast to 8 lanes
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline __m256i Bytes8(const uint8_t* p) {  // 8 rows' bytes, one per 32-bit lane
  int64_t v;
  std::memcpy(&v, p, 8);
  return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v));
}

// Sub-block s's scale (6 bits) for rows 8h..8h+7, in both 16-bit halves of each lane: a madd
// with it multiplies a lane's two 16-bit sums by the row's scale and adds them.
inline __m256i Scale(const uint8_t* meta, int s, int h) {
  const __m256i v = _mm256_and_si256(Bytes8(meta + kScale + 16 * s + 8 * h), _mm256_set1_epi32(63));
  return _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
}

// Mins of sub-blocks 2p and 2p + 1 for rows 8h..8h+7 as the two 16-bit halves of each lane: low
// 4 bits from the pair's byte, bits 4-5 from the top of each scale byte.
inline __m256i MinPair(const uint8_t* meta, int p, int h) {
  const __m256i low = Bytes8(meta + kMinLow + 16 * p + 8 * h);
  const __m256i top = _mm256_set1_epi32(0x30);
  const __m256i top0 = _mm256_srli_epi32(Bytes8(meta + kScale + 16 * (2 * p) + 8 * h), 2);
  const __m256i top1 = _mm256_srli_epi32(Bytes8(meta + kScale + 16 * (2 * p + 1) + 8 * h), 2);
  const __m256i m0 =
      _mm256_or_si256(_mm256_and_si256(low, _mm256_set1_epi32(15)), _mm256_and_si256(top0, top));
  const __m256i m1 = _mm256_or_si256(_mm256_srli_epi32(low, 4), _mm256_and_si256(top1, top));
  return _mm256_or_si256(m0, _mm256_slli_epi32(m1, 16));
}

// One group (16 rows, two halves of 8) against NT tokens. Chunk j holds sub-blocks 2j (low
// nibbles) and 2j + 1 (high) in its 8 words; per token and half, each nibble set's 8 words
// meet the token's words in a 16-bit chain that one madd scales into the integer sum.
template <int NT>
void GroupDot(const uint8_t* group, int64_t nb, const BlockQ8_K* const* y, float* const* out) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  // Decode reads every weight once per token: lines requested ahead, a chunk's at a time
  // (not the block's in one burst, which waits for the core's line fill buffers).
  const PrefetchDistances ahead = PrefetchFor(NT, 2 * kBlockBytes);
  constexpr int kChunkBytes = kBlockBytes / 4;  // 576: 9 lines
  __m256 acc[NT][2];
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + b * kBlockBytes;
    const uint8_t* meta = p + kMeta;
    __m256i isum[NT][2];
    for (int t = 0; t < NT; ++t) isum[t][0] = isum[t][1] = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const char* step = reinterpret_cast<const char*>(p) + kChunkBytes * j;
      for (int o = 0; o < kChunkBytes; o += 64) {
        _mm_prefetch(step + ahead.l1 + o, _MM_HINT_T0);
        if (ahead.l2) _mm_prefetch(step + ahead.l2 + o, _MM_HINT_T1);
      }
      for (int h = 0; h < 2; ++h) {
        const __m256i sc_lo = Scale(meta, 2 * j, h), sc_hi = Scale(meta, 2 * j + 1, h);
        const uint8_t* words = p + 64 * 8 * j + 32 * h;
        for (int t = 0; t < NT; ++t) {
          const int8_t* a = y[t][b].qs + 64 * j;
          __m256i cl = _mm256_setzero_si256(), ch = _mm256_setzero_si256();
          for (int k = 0; k < 8; ++k) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 64 * k));
            cl = _mm256_add_epi16(cl,
                                  _mm256_maddubs_epi16(_mm256_and_si256(x, m4), Word(a + 4 * k)));
            ch = _mm256_add_epi16(
                ch, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(x, 4), m4),
                                         Word(a + 32 + 4 * k)));
          }
          isum[t][h] = _mm256_add_epi32(isum[t][h], _mm256_madd_epi16(cl, sc_lo));
          isum[t][h] = _mm256_add_epi32(isum[t][h], _mm256_madd_epi16(ch, sc_hi));
        }
      }
    }
    // Sub-block sums of each token's activation (pairs of its 16-element bsums), as 16-bit pairs
    // (sums 2p, 2p + 1) in 32-bit elements 0, 1, 4, 5 of its row: both halves' mins meet them.
    alignas(32) int32_t pairs[NT][8];
    for (int t = 0; t < NT; ++t) {
      const __m256i s32 = _mm256_madd_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][b].bsums)), ones);
      _mm256_store_si256(reinterpret_cast<__m256i*>(pairs[t]), _mm256_packs_epi32(s32, s32));
    }
    for (int h = 0; h < 2; ++h) {
      const __m256i mins[4] = {MinPair(meta, 0, h), MinPair(meta, 1, h), MinPair(meta, 2, h),
                               MinPair(meta, 3, h)};
      const __m256 d =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta + kD + 16 * h)));
      const __m256 dmin =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta + kDmin + 16 * h)));
      for (int t = 0; t < NT; ++t) {
        const int32_t* pt = pairs[t];
        __m256i im = _mm256_madd_epi16(mins[0], _mm256_set1_epi32(pt[0]));
        im = _mm256_add_epi32(im, _mm256_madd_epi16(mins[1], _mm256_set1_epi32(pt[1])));
        im = _mm256_add_epi32(im, _mm256_madd_epi16(mins[2], _mm256_set1_epi32(pt[4])));
        im = _mm256_add_epi32(im, _mm256_madd_epi16(mins[3], _mm256_set1_epi32(pt[5])));
        const __m256 yd = _mm256_set1_ps(y[t][b].d);
        acc[t][h] =
            _mm256_fmadd_ps(_mm256_mul_ps(d, yd), _mm256_cvtepi32_ps(isum[t][h]), acc[t][h]);
        acc[t][h] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, yd), _mm256_cvtepi32_ps(im), acc[t][h]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    _mm256_storeu_ps(out[t], acc[t][0]);
    _mm256_storeu_ps(out[t] + 8, acc[t][1]);
  }
}

}  // namespace

void GemvQ4_KInterleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* act, size_t act_stride, int nt, float* y,
                         int64_t y_stride) {
  k_frame::Gemv<BlockQ4_K>(
      data, cols, g0, g1, act, act_stride, nt, y, y_stride,
      [](auto tile, auto&&... args) { GroupDot<decltype(tile)::value>(args...); });
}

}  // namespace substrate::avx2
