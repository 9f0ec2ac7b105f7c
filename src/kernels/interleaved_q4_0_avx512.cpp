// The interleaved Q4_0 product (interleaved_q4_0.h) in AVX-512 VNNI, decode and prefill.
// GCC 12's 512-bit reduce/extract intrinsics pass an "undefined" vector that its own
// -Wuninitialized then flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "kernels/cpu_features.h"
#include "kernels/interleaved_pairs_avx512.h"
#include "kernels/interleaved_q4_0.h"
#include "kernels/token_tile.h"
#include "quant/blocks.h"

namespace substrate::avx512 {
namespace {

constexpr int kPairBytes = kQ4Interleaved_PairBytes;
constexpr int kQuant = kQ4Interleaved_QuantBytes;

// A block's products (PairsOf): the 4 64-byte words give 8 vectors of 16 rows x 4 nibbles (low
// nibbles: elements 4k..4k+3, high: 16+4k..), each meeting one broadcast activation word in a
// dpbusd. Both nibbles enter as 16 times their value (moved to the byte's high half), so the
// chain starts from the tile's -128 * sum(a), which is 16 times the -8 offset's sum, and ends at
// 16 times the block's integer sum; the scale vector carries the 1/16, which is exact, so the
// products and their bits are those of unscaled sums. Per block and token that leaves three
// operations beside the 8 dpbusd (convert, scale, add). Split chains take the low and high
// halves.
//
// The C pairs' scales (the last line of each pair) are read before their quants, and each line
// is requested ahead beside the load that uses it. Decode streams at the core's limit this way
// (Zen 5, one thread: 35 GB/s with C = 4, as the Q4_K kernel, whose scales lead each 2304-byte
// block; 19-26 GB/s reading pair by pair with the requests in one burst; even a plain loop of
// loads over the same bytes reaches only 14-18).
struct Q4_0Layout {
  static constexpr int kPairBytes = kQ4Interleaved_PairBytes;
  static constexpr int kQuantBytes = kQ4Interleaved_QuantBytes;
  static constexpr int kScales = kQ4Interleaved_Scales;
  static constexpr float kScaleFactor = 1.0f / 16;

  template <int R, int NT, int P, bool kSplit>
  static void Feed(const char* q, size_t group_bytes, const PrefetchDistances& ahead,
                   const TileBlock<P>& a, __m512i (&s)[R][NT], __m512i (&u)[R][NT]) {
    const __m512i high_half = _mm512_set1_epi8(static_cast<char>(0xF0));
    // The low nibbles (words 0..3 of the activations), then the high (words 4..7).
    auto half = [&](auto high, __m512i(&chain)[R][NT]) {
      for (int k = 0; k < 4; ++k) {
        __m512i w[R];
        for (int r = 0; r < R; ++r) {
          const char* line = q + r * group_bytes + 64 * k;
          if constexpr (!high) {
            _mm_prefetch(line + ahead.l1, _MM_HINT_T0);
            if (ahead.l2) _mm_prefetch(line + ahead.l2, _MM_HINT_T1);
          }
          const __m512i x = _mm512_loadu_si512(line);
          w[r] = _mm512_and_si512(high ? x : _mm512_slli_epi16(x, 4), high_half);
        }
        DotWord(w, a, 4 * high + k, chain);
      }
    };
    half(std::false_type(), s);
    if constexpr (kSplit) {
      half(std::true_type(), u);
    } else {
      half(std::true_type(), s);
    }
  }
};
using Q4_0Pairs = PairsOf<Q4_0Layout>;

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
                         const uint8_t* tile, int nt, float* y, int64_t y_stride) {
  const int64_t nb = cols / kQK4_0;
  const size_t group_bytes = static_cast<size_t>(nb) * kPairBytes / 2;
  WithTokenTile(nt, [&](auto n) {
    TileDot<decltype(n)::value, Q4_0Pairs>(data, group_bytes, nb, kPairBytes, g0, g1, tile, y,
                                           y_stride);
  });
}

}  // namespace substrate::avx512
