// The interleaved Q4_0 product (interleaved_q4_0.h) in AVX-512 VNNI, decode and prefill.
// GCC 12's 512-bit reduce/extract intrinsics pass an "undefined" vector that its own
// -Wuninitialized then flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/interleaved_pairs_avx512.h"
#include "kernels/interleaved_q4_0.h"
#include "kernels/token_tile.h"
#include "quant/blocks.h"

namespace substrate::avx512 {
namespace {

constexpr int kPairBytes = kQ4Interleaved_PairBytes;
constexpr int kQuant = kQ4Interleaved_QuantBytes;

// C pairs of blocks (blocks b .. b + 2C - 1) of one group against NT tokens, into acc. Per block:
// the 4 64-byte words give 8 vectors of 16 rows x 4 nibbles (low nibbles: elements 4k..4k+3,
// high: 16+4k..), each meeting one broadcast activation word in a dpbusd; the sum starts from the
// block's -8 * sum(a). Two chains per block (low and high) hide dpbusd's latency. Then one fp16
// scale vector for the 16 rows times the token's activation scale. Token t's float operations
// are the same for every NT and C.
//
// The C pairs' scales (the last line of each pair) are read before their quants, and each line
// is requested ahead beside the load that uses it. Decode streams at the core's limit this way
// (Zen 5, one thread: 35 GB/s with C = 4, as the Q4_K kernel, whose scales lead each 2304-byte
// block; 19-26 GB/s reading pair by pair with the requests in one burst; even a plain loop of
// loads over the same bytes reaches only 14-18).
struct Q4_0Pairs {
  template <int NT, int C>
  static void Run(const uint8_t* p, int64_t b, const BlockQ8_0* const* y, const float* const* yd,
                  const int32_t* const* sums, const PrefetchDistances& ahead, __m512* acc) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    // Few tokens: the high nibbles stay in place (16 times their value) and each token's chain is
    // shifted down once, instead of shifting every weight word; with more tokens sharing the
    // words, shifting the words once is cheaper (as in the Q4_K kernel). The sums are the same.
    constexpr bool kHighInPlace = NT <= 2;
    const char* pc = reinterpret_cast<const char*>(p);
    __m512 d[2 * C];
    PairScales<C>(pc, kPairBytes, kQ4Interleaved_Scales, ahead, d);
    for (int i = 0; i < 2 * C; ++i) {  // block b + i: quants at pair i / 2, half i % 2
      const char* q = pc + (i / 2) * kPairBytes + (i % 2) * kQuant;
      __m512i lo[4], hi[4];
      for (int k = 0; k < 4; ++k) {
        _mm_prefetch(q + 64 * k + ahead.l1, _MM_HINT_T0);
        if (ahead.l2) _mm_prefetch(q + 64 * k + ahead.l2, _MM_HINT_T1);
        const __m512i w = _mm512_loadu_si512(q + 64 * k);
        lo[k] = _mm512_and_si512(w, m4);
        hi[k] = kHighInPlace ? _mm512_andnot_si512(m4, w)
                             : _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
      }
      for (int t = 0; t < NT; ++t) {
        const int8_t* a = y[t][b + i].qs;
        // ActBlockSums holds -128 * sum(a), a multiple of 16: the shift is exact.
        __m512i s = _mm512_set1_epi32(sums[t][b + i] >> 4), u = _mm512_setzero_si512();
        for (int k = 0; k < 4; ++k) {
          s = _mm512_dpbusd_epi32(s, lo[k], Word(a + 4 * k));
          u = _mm512_dpbusd_epi32(u, hi[k], Word(a + 16 + 4 * k));
        }
        if constexpr (kHighInPlace) u = _mm512_srai_epi32(u, 4);  // exact: each product is 16x
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d[i], _mm512_set1_ps(yd[t][b + i])),
                                 _mm512_cvtepi32_ps(_mm512_add_epi32(s, u)), acc[t]);
      }
    }
  }
};

}  // namespace

void InterleaveGroupQ4_0(const uint8_t* plain, int64_t cols, uint8_t* group) {
  const int64_t nb = cols / kQK4_0;
  const size_t row_bytes = static_cast<size_t>(nb) * sizeof(BlockQ4_0);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = plain + b * static_cast<int64_t>(sizeof(BlockQ4_0));
    auto qs = [&](int r) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + r * row_bytes + 2));
    };
    // a[q]: rows q, q + 4, q + 8, q + 12 in its four 128-bit lanes, each lane a row's 4 words.
    __m512i a[4];
    for (int q = 0; q < 4; ++q) {
      __m512i v = _mm512_castsi128_si512(qs(q));
      v = _mm512_inserti32x4(v, qs(q + 4), 1);
      v = _mm512_inserti32x4(v, qs(q + 8), 2);
      a[q] = _mm512_inserti32x4(v, qs(q + 12), 3);
    }
    // A 4x4 transpose of words within each lane: lane l of word k then holds word k of rows
    // 4l..4l+3, so the vector is word k of rows 0..15 in order.
    const __m512i lo01 = _mm512_unpacklo_epi32(a[0], a[1]),
                  hi01 = _mm512_unpackhi_epi32(a[0], a[1]);
    const __m512i lo23 = _mm512_unpacklo_epi32(a[2], a[3]),
                  hi23 = _mm512_unpackhi_epi32(a[2], a[3]);
    uint8_t* pair = group + (b / 2) * kPairBytes;
    uint8_t* words = pair + (b % 2) * kQuant;
    _mm512_storeu_si512(words + 0, _mm512_unpacklo_epi64(lo01, lo23));
    _mm512_storeu_si512(words + 64, _mm512_unpackhi_epi64(lo01, lo23));
    _mm512_storeu_si512(words + 128, _mm512_unpacklo_epi64(hi01, hi23));
    _mm512_storeu_si512(words + 192, _mm512_unpackhi_epi64(hi01, hi23));
    uint8_t* d = pair + kQ4Interleaved_Scales + (b % 2) * kInterleavedScaleBytes;
    for (int r = 0; r < kInterleavedRows; ++r) std::memcpy(d + 2 * r, block + r * row_bytes, 2);
  }
}

void GemvQ4_0Interleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* act, size_t act_stride, const int32_t* sums, int nt,
                         float* y, int64_t y_stride) {
  constexpr int kMaxTokens = 8;
  const int64_t nb = cols / kQK4_0;
  const size_t group_bytes = static_cast<size_t>(nb) * kPairBytes / 2;
  const BlockQ8_0* ys[kMaxTokens];
  const float* yds[kMaxTokens];
  const int32_t* ss[kMaxTokens];
  float* outs[kMaxTokens];
  for (int t = 0; t < nt; ++t) {
    ys[t] = reinterpret_cast<const BlockQ8_0*>(act + static_cast<size_t>(t) * act_stride);
    yds[t] = reinterpret_cast<const float*>(ys[t] + nb);  // float scales (ActRowBytes)
    ss[t] = sums + t * nb;
  }
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* group = data + static_cast<size_t>(g) * group_bytes;
    for (int t = 0; t < nt; ++t) outs[t] = y + t * y_stride + g * kInterleavedRows;
    WithTokenTile(nt, [&](auto tile) {
      GroupDot<decltype(tile)::value, Q4_0Pairs>(group, nb, kPairBytes, ys, yds, ss, outs);
    });
  }
}

}  // namespace substrate::avx512
