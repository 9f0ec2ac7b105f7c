// The interleaved Q6_K product (interleaved_q6_k.h) in AVX2, decode and prefill, for CPUs
// without AVX-512, on 8 rows a register. A 16-element sub-block's 4 words of 6-bit quants (0..63)
// meet the token's words in maddubs, two at a time summed in 16 bits (at most 2 x 2 x 63 x 128);
// a madd multiplies each pair sum by the rows' signed scale into the block's 32-bit integer sum
// (at most 16 x 258,048 x 128 in magnitude), and the -32 offset comes from the activation's
// 16-element sums, so a block ends in one conversion and two FMAs a token. Integer sums equal
// the row kernels'; per token the float operations do not depend on how many tokens share the
// pass.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/interleaved_k_frame.h"
#include "kernels/interleaved_q6_k.h"
#include "quant/blocks.h"

namespace substrate::avx2 {
namespace {

constexpr int kBlockBytes = kQ6KInterleaved_BlockBytes;
constexpr int kQh = kQ6KInterleaved_QlBytes;
constexpr int kScales = kQh + kQ6KInterleaved_QhBytes;
constexpr int kD = kScales + kQ6KInterleaved_ScaleBytes;

inline __m256i Word(const void* p) {  // 4 bytes, broadcast to 8 lanes
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline __m256i Load(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// Scales 2m and 2m + 1 of rows 8h..8h+7 as the two (signed) 16-bit halves of each lane.
inline __m256i ScalePair(const uint8_t* blk, int m, int h) {
  return _mm256_cvtepi8_epi16(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kScales + 32 * m + 16 * h)));
}

// The 6-bit quants of 4 elements of 8 rows (interleaved_q6_k_avx512.cpp's Quants, 8 rows).
template <int k>
inline __m256i Quants(const uint8_t* ql, const uint8_t* qh) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  const __m256i l = Load(ql), h = Load(qh);
  const __m256i low =
      k < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
  __m256i high;
  if constexpr (k == 0) high = _mm256_slli_epi16(h, 4);
  if constexpr (k == 1) high = _mm256_slli_epi16(h, 2);
  if constexpr (k == 2) high = h;
  if constexpr (k == 3) high = _mm256_srli_epi16(h, 2);
  return _mm256_or_si256(low, _mm256_and_si256(high, m30));
}

// Quarter k of half n of a block for rows 8h..8h+7: two sub-blocks, each 4 weight vectors and,
// per token, a chain multiplied by the rows' scale into the token's integer sum.
template <int NT, int k>
inline void SubBlocks(const uint8_t* blk, int n, int h, const BlockQ8_K* const* y, int64_t b,
                      const PrefetchDistances& ahead, __m256i* isum) {
  const __m256i pair = ScalePair(blk, 4 * n + k, h);
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  for (int lh = 0; lh < 2; ++lh) {
    if (h == 0) {  // 16 steps per block, 4 lines each
      const char* step = reinterpret_cast<const char*>(blk) + 256 * (8 * n + 2 * k + lh);
      for (int o = 0; o < 256; o += 64) {
        _mm_prefetch(step + ahead.l1 + o, _MM_HINT_T0);
        if (ahead.l2) _mm_prefetch(step + ahead.l2 + o, _MM_HINT_T1);
      }
    }
    // The sub-block's scale in both 16-bit halves of each lane.
    const __m256i sc =
        lh ? _mm256_or_si256(_mm256_srli_epi32(pair, 16), _mm256_andnot_si256(low16, pair))
           : _mm256_or_si256(_mm256_and_si256(pair, low16), _mm256_slli_epi32(pair, 16));
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
      const int w = 4 * lh + i;
      q[i] = Quants<k>(blk + 64 * (16 * n + 8 * (k & 1) + w) + 32 * h,
                       blk + kQh + 64 * (8 * n + w) + 32 * h);
    }
    for (int t = 0; t < NT; ++t) {
      const int8_t* a = y[t][b].qs + 128 * n + 32 * k + 16 * lh;
      const __m256i c01 = _mm256_add_epi16(_mm256_maddubs_epi16(q[0], Word(a)),
                                           _mm256_maddubs_epi16(q[1], Word(a + 4)));
      const __m256i c23 = _mm256_add_epi16(_mm256_maddubs_epi16(q[2], Word(a + 8)),
                                           _mm256_maddubs_epi16(q[3], Word(a + 12)));
      isum[t] = _mm256_add_epi32(
          isum[t], _mm256_add_epi32(_mm256_madd_epi16(c01, sc), _mm256_madd_epi16(c23, sc)));
    }
  }
}

template <int NT>
void GroupDot(const uint8_t* group, int64_t nb, const BlockQ8_K* const* y, float* const* out) {
  const PrefetchDistances ahead = PrefetchFor(NT, 2 * kBlockBytes);
  __m256 acc[NT][2];
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * kBlockBytes;
    // The block's scales and d, at its end, are read first: requested two blocks ahead.
    if constexpr (NT == 1)
      for (int o = kScales; o < kBlockBytes; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(blk) + 2 * kBlockBytes + o, _MM_HINT_T0);
    for (int h = 0; h < 2; ++h) {
      __m256i isum[NT];
      for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
      for (int n = 0; n < 2; ++n) {
        SubBlocks<NT, 0>(blk, n, h, y, b, ahead, isum);
        SubBlocks<NT, 1>(blk, n, h, y, b, ahead, isum);
        SubBlocks<NT, 2>(blk, n, h, y, b, ahead, isum);
        SubBlocks<NT, 3>(blk, n, h, y, b, ahead, isum);
      }
      __m256i pairs[8];
      for (int m = 0; m < 8; ++m) pairs[m] = ScalePair(blk, m, h);
      const __m256 d =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kD + 16 * h)));
      for (int t = 0; t < NT; ++t) {
        const BlockQ8_K& yb = y[t][b];
        __m256i off = _mm256_setzero_si256();
        for (int m = 0; m < 8; ++m)
          off = _mm256_add_epi32(off, _mm256_madd_epi16(pairs[m], Word(yb.bsums + 2 * m)));
        const __m256i s = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(off, 5));  // - 32 * off
        acc[t][h] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(yb.d)), _mm256_cvtepi32_ps(s),
                                    acc[t][h]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    _mm256_storeu_ps(out[t], acc[t][0]);
    _mm256_storeu_ps(out[t] + 8, acc[t][1]);
  }
}

}  // namespace

void GemvQ6_KInterleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* act, size_t act_stride, int nt, float* y,
                         int64_t y_stride) {
  k_frame::Gemv<BlockQ6_K>(
      data, cols, g0, g1, act, act_stride, nt, y, y_stride,
      [](auto tile, auto&&... args) { GroupDot<decltype(tile)::value>(args...); });
}

}  // namespace substrate::avx2
