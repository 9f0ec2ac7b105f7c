// The interleaved Q4_K and Q5_K products (interleaved_q4_k.h) in AVX-512 VNNI, decode and
// prefill.
// GCC 12's 512-bit reduce/extract intrinsics pass an "undefined" vector that its own
// -Wuninitialized then flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/interleaved_q4_k.h"
#include "kernels/interleaved_k_frame.h"
#include "quant/blocks.h"

namespace substrate::avx512 {
namespace {

// Offsets within a block's metadata (d, dmin, scale bytes, low bits of the mins), which follows
// the quant bytes (Q4_K) or the quant bytes and the high-bit plane (Q5_K).
constexpr int kD = 0, kDmin = kD + 32, kScale = kDmin + 32, kMinLow = kScale + 128;
constexpr int kQh = kQ4KInterleaved_QuantBytes;  // Q5_K's high-bit plane

inline __m512i Word(const int8_t* p) {  // 4 activation quants, broadcast to 16 lanes
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

inline __m512i Bytes16(const uint8_t* p) {  // 16 rows' bytes, one per 32-bit lane
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Bit `bit` of each byte of v moved to bit 4, the other bits cleared: a Q5_K element's high bit
// in place above its nibble. 16-bit shifts by at most 4 only bring a neighbouring byte's bits
// into bits that the mask clears.
inline __m512i Bit4(__m512i v, int bit) {
  const __m512i at4 = bit <= 4 ? _mm512_slli_epi16(v, static_cast<unsigned>(4 - bit))
                               : _mm512_srli_epi16(v, static_cast<unsigned>(bit - 4));
  return _mm512_and_si512(at4, _mm512_set1_epi8(0x10));
}

// Sub-block s's scale (6 bits) for the 16 rows of block `m`'s metadata, one per 32-bit lane
// with a zero high word, as dpwssd wants it.
inline __m512i Scale(const uint8_t* m, int s) {
  return _mm512_and_si512(Bytes16(m + kScale + 16 * s), _mm512_set1_epi32(63));
}

// Mins of sub-blocks 2p and 2p + 1 as the two words of each lane: low 4 bits from the pair's
// byte, bits 4-5 from the top of each scale byte.
inline __m512i MinPair(const uint8_t* m, int p) {
  const __m512i low = Bytes16(m + kMinLow + 16 * p);
  const __m512i top = _mm512_set1_epi32(0x30);
  const __m512i m0 = _mm512_or_si512(_mm512_and_si512(low, _mm512_set1_epi32(15)),
                                     _mm512_and_si512(_mm512_srli_epi32(Bytes16(m + kScale + 16 * (2 * p)), 2), top));
  const __m512i m1 = _mm512_or_si512(_mm512_srli_epi32(low, 4),
                                     _mm512_and_si512(_mm512_srli_epi32(Bytes16(m + kScale + 16 * (2 * p + 1)), 2), top));
  return _mm512_or_si512(m0, _mm512_slli_epi32(m1, 16));
}

// One group (16 rows) against NT tokens. Per half chunk (16 elements of two sub-blocks), 4
// weight words give 4 low-nibble and 4 high-nibble vectors; per token each set meets broadcast
// activation words in a dpbusd chain, and a dpwssd adds the chain times its sub-block's scales
// to the token's integer sum. Per block the mins come from the activation's sub-block sums
// (4 dpwssd), and two fmas turn the integer sums into floats. Token t's float operations are the
// same for every NT. Q5_K (kFive) ORs each element's high bit above its nibble and, its values
// being 5-bit, splits each chain in two of 8 elements.
template <bool kFive, int NT>
void GroupDot(const uint8_t* group, int64_t nb, const BlockQ8_K* const* y, float* const* out) {
  constexpr int kBlockBytes = kFive ? kQ5KInterleaved_BlockBytes : kQ4KInterleaved_BlockBytes;
  constexpr int kMeta = kFive ? kQh + kQ5KInterleaved_HighBitBytes : kQ4KInterleaved_QuantBytes;
  // Bytes requested ahead per half chunk (8 of them).
  constexpr int kAheadStep = (kBlockBytes / 8 + 63) / 64 * 64;
  // Few tokens: the high nibbles stay in place (16 times their value) and each token's chain is
  // shifted down once, instead of shifting every weight word; with more tokens sharing the
  // words, shifting the words once is cheaper. The integer sums are the same either way.
  constexpr bool kHighInPlace = !kFive && NT <= 2;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  // Decode reads every weight once per token: keep enough lines in flight to cover DRAM latency
  // (DecodePrefetch: the distances this core wants). A tile of tokens computes long enough per
  // block for the block after next to arrive meanwhile. Either way the lines are requested a few
  // per step below, not in one burst per block, which would wait for the core's line fill
  // buffers (one burst cost decode 15 % of the bandwidth).
  const PrefetchDistances ahead = PrefetchFor(NT, 2 * kBlockBytes);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + b * kBlockBytes;
    const uint8_t* meta = p + kMeta;
    __m512i isum[NT];
    for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {
      const __m512i sc_lo = Scale(meta, 2 * j), sc_hi = Scale(meta, 2 * j + 1);
      for (int h = 0; h < 2; ++h) {
        const char* step = reinterpret_cast<const char*>(p) + kAheadStep * (2 * j + h);
        for (int o = 0; o < kAheadStep; o += 64) {
          _mm_prefetch(step + ahead.l1 + o, _MM_HINT_T0);
          if (ahead.l2) _mm_prefetch(step + ahead.l2 + o, _MM_HINT_T1);
        }
        __m512i lo[4], hi[4];
        for (int k = 0; k < 4; ++k) {
          const __m512i w = _mm512_loadu_si512(p + 64 * (8 * j + 4 * h + k));
          lo[k] = _mm512_and_si512(w, m4);
          hi[k] = kHighInPlace ? _mm512_andnot_si512(m4, w)
                               : _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
          if constexpr (kFive) {  // qh word 4h + k: elements 16h + 4k.. of every sub-block
            const __m512i qh = _mm512_loadu_si512(p + kQh + 64 * (4 * h + k));
            lo[k] = _mm512_or_si512(lo[k], Bit4(qh, 2 * j));
            hi[k] = _mm512_or_si512(hi[k], Bit4(qh, 2 * j + 1));
          }
        }
        for (int t = 0; t < NT; ++t) {
          const int8_t* a = y[t][b].qs + 64 * j + 16 * h;
          // |chain| <= 16 * 15 * 128 (Q4_K) or 8 * 31 * 128 (Q5_K): the low word is the whole
          // value, the scale's high word is zero, so each dpwssd adds exactly chain * scale.
          constexpr int kChain = kFive ? 2 : 4;  // words per chain
          for (int c = 0; c < 4; c += kChain) {
            __m512i cl = _mm512_setzero_si512(), ch = _mm512_setzero_si512();
            for (int k = c; k < c + kChain; ++k) {
              cl = _mm512_dpbusd_epi32(cl, lo[k], Word(a + 4 * k));
              ch = _mm512_dpbusd_epi32(ch, hi[k], Word(a + 32 + 4 * k));
            }
            if constexpr (kHighInPlace) ch = _mm512_srai_epi32(ch, 4);  // exact: 16 * chain
            isum[t] = _mm512_dpwssd_epi32(isum[t], cl, sc_lo);
            isum[t] = _mm512_dpwssd_epi32(isum[t], ch, sc_hi);
          }
        }
      }
    }
    const __m512i mins[4] = {MinPair(meta, 0), MinPair(meta, 1), MinPair(meta, 2),
                             MinPair(meta, 3)};
    const __m512 d =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(meta + kD)));
    const __m512 dmin =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(meta + kDmin)));
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& yb = y[t][b];
      // Sub-block sums of the activation (pairs of its 16-element bsums), as word pairs
      // (sums 2p, 2p + 1) in 32-bit elements 0, 1, 4, 5 of `pairs`.
      const __m256i s32 = _mm256_madd_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb.bsums)), _mm256_set1_epi16(1));
      alignas(32) int32_t pairs[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(pairs), _mm256_packs_epi32(s32, s32));
      __m512i im = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mins[0], _mm512_set1_epi32(pairs[0]));
      im = _mm512_dpwssd_epi32(im, mins[1], _mm512_set1_epi32(pairs[1]));
      im = _mm512_dpwssd_epi32(im, mins[2], _mm512_set1_epi32(pairs[4]));
      im = _mm512_dpwssd_epi32(im, mins[3], _mm512_set1_epi32(pairs[5]));
      const __m512 yd = _mm512_set1_ps(yb.d);
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, yd), _mm512_cvtepi32_ps(isum[t]), acc[t]);
      acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, yd), _mm512_cvtepi32_ps(im), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(out[t], acc[t]);
}

}  // namespace

void GemvQ4_KInterleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* act, size_t act_stride, int nt, float* y,
                         int64_t y_stride) {
  k_frame::Gemv<BlockQ4_K>(data, cols, g0, g1, act, act_stride, nt, y, y_stride,
                           [](auto tile, auto&&... args) {
                             GroupDot<false, decltype(tile)::value>(args...);
                           });
}

void GemvQ5_KInterleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* act, size_t act_stride, int nt, float* y,
                         int64_t y_stride) {
  k_frame::Gemv<BlockQ5_K>(data, cols, g0, g1, act, act_stride, nt, y, y_stride,
                           [](auto tile, auto&&... args) {
                             GroupDot<true, decltype(tile)::value>(args...);
                           });
}

void CopyWords16(const uint8_t* row0, size_t row_bytes, int n_words, uint8_t* dst) {
  int w0 = 0;
  // 16 words at a time: a 16 x 16 transpose of 32-bit words in four rounds of shuffles (pairs of
  // words, of pairs, then 128-bit lanes twice), several times faster here than a gather a word.
  for (; w0 + 16 <= n_words; w0 += 16) {
    __m512i r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(row0 + i * row_bytes + 4 * w0);
    for (int k = 0; k < 8; ++k) {  // lane L: rows 2k, 2k+1, words 4L .. 4L+3 interleaved
      t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
      t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 4; ++k) {  // r[4k + j], lane L: word 4L + j of rows 4k .. 4k+3
      r[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
      r[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
      r[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
      r[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    for (int j = 0; j < 4; ++j) {  // word 4L + j: lane L of r[j], r[4 + j], r[8 + j], r[12 + j]
      const __m512i a = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44);
      const __m512i b = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xEE);
      const __m512i c = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44);
      const __m512i d = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xEE);
      uint8_t* out = dst + 64 * (w0 + j);
      _mm512_storeu_si512(out, _mm512_shuffle_i32x4(a, c, 0x88));
      _mm512_storeu_si512(out + 256, _mm512_shuffle_i32x4(a, c, 0xDD));
      _mm512_storeu_si512(out + 512, _mm512_shuffle_i32x4(b, d, 0x88));
      _mm512_storeu_si512(out + 768, _mm512_shuffle_i32x4(b, d, 0xDD));
    }
  }
  if (w0 == n_words) return;
  const __m512i rows = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
      _mm512_set1_epi32(static_cast<int>(row_bytes)));
  for (int w = w0; w < n_words; ++w)
    _mm512_storeu_si512(dst + 64 * w, _mm512_i32gather_epi32(rows, row0 + 4 * w, 1));
}

}  // namespace substrate::avx512
