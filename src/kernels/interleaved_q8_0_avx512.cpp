// The interleaved Q8_0 decode product (interleaved_q8_0.h) in AVX-512 VNNI.
// GCC 12's 512-bit reduce/extract intrinsics pass an "undefined" vector that its own
// -Wuninitialized then flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/interleaved_pairs_avx512.h"
#include "kernels/interleaved_q8_0.h"
#include "kernels/token_tile.h"
#include "quant/blocks.h"

namespace substrate::avx512 {
namespace {

constexpr int kPairBytes = kInterleavedPairBytes;
constexpr int kQuant = kInterleavedQuantBytes;  // the second block's quants

// A block's products (PairsOf): 8 dpbusd of 16 rows x 4 quants each with a broadcast
// activation word; split chains take the even and odd words.
//
// As in the Q4_0 kernel: the C pairs' scales (the last line of each pair) are read before their
// quants, and each line is requested ahead beside its first load, not in one burst per pair.
struct Q8_0Layout {
  static constexpr int kPairBytes = kInterleavedPairBytes;
  static constexpr int kQuantBytes = kInterleavedQuantBytes;
  static constexpr int kScales = kInterleavedScales;
  static constexpr float kScaleFactor = 1.0f;

  template <int R, int NT, int P, bool kSplit>
  static void Feed(const char* q, size_t group_bytes, const PrefetchDistances& ahead,
                   const TileBlock<P>& a, __m512i (&s)[R][NT], __m512i (&u)[R][NT]) {
    auto word_k = [&](int k, __m512i(&chain)[R][NT]) {
      __m512i w[R];
      for (int r = 0; r < R; ++r) {
        const char* line = q + r * group_bytes + 64 * k;
        _mm_prefetch(line + ahead.l1, _MM_HINT_T0);
        if (ahead.l2) _mm_prefetch(line + ahead.l2, _MM_HINT_T1);
        w[r] = _mm512_loadu_si512(line);
      }
      DotWord(w, a, k, chain);
    };
    for (int k = 0; k < 8; k += 2) {  // even words into s, odd into u when split
      word_k(k, s);
      if constexpr (kSplit) {
        word_k(k + 1, u);
      } else {
        word_k(k + 1, s);
      }
    }
  }
};
using Q8_0Pairs = PairsOf<Q8_0Layout>;

}  // namespace

void InterleaveGroupQ8_0(const uint8_t* plain, int64_t cols, uint8_t* group) {
  const int64_t nb = cols / kQK8_0;
  const int row_bytes = static_cast<int>(nb * sizeof(BlockQ8_0));
  // Lane r reads row r: one gather collects a word (or the scale) of a block for 16 rows.
  const __m512i rows =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(row_bytes));
  const __m512i flip = _mm512_set1_epi32(static_cast<int>(0x80808080u));
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = plain + b * static_cast<int64_t>(sizeof(BlockQ8_0));
    uint8_t* pair = group + (b / 2) * kPairBytes;
    uint8_t* words = pair + (b % 2) * kQuant;
    for (int k = 0; k < kQK8_0 / 4; ++k) {
      const __m512i w = _mm512_i32gather_epi32(rows, block + 2 + 4 * k, 1);
      _mm512_storeu_si512(words + 64 * k, _mm512_xor_si512(w, flip));
    }
    // The scales: the low half of each row's first word (its fp16 d).
    const __m512i d = _mm512_i32gather_epi32(rows, block, 1);
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(pair + kInterleavedScales + (b % 2) * kInterleavedScaleBytes),
        _mm512_cvtepi32_epi16(d));
  }
}

void GemvQ8_0Interleaved(const uint8_t* data, int64_t cols, int64_t g0, int64_t g1,
                         const uint8_t* tile, int nt, float* y, int64_t y_stride) {
  const int64_t nb = cols / kQK8_0;
  const size_t group_bytes = static_cast<size_t>(nb) * kPairBytes / 2;
  WithTokenTile(nt, [&](auto n) {
    TileDot<decltype(n)::value, Q8_0Pairs>(data, group_bytes, nb, kPairBytes, g0, g1, tile, y,
                                           y_stride);
  });
}

}  // namespace substrate::avx512
