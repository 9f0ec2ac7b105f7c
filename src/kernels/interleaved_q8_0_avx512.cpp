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

// C pairs of blocks (blocks b .. b + 2C - 1) of one group against NT tokens, into acc. Per
// block: 8 dpbusd of 16 rows x 4 quants each with a broadcast activation word, started from the
// block's -128 * sum(a); then one fp16 scale vector for the 16 rows times the token's activation
// scale. Two chains per block (even and odd words) keep dpbusd's latency hidden. Token t's float
// operations are the same for every NT and C.
//
// As in the Q4_0 kernel: the C pairs' scales (the last line of each pair) are read before their
// quants, and each line is requested ahead beside its first load, not in one burst per pair.
struct Q8_0Pairs {
  template <int NT, int C>
  static void Run(const uint8_t* p, int64_t b, const BlockQ8_0* const* y, const float* const* yd,
                  const int32_t* const* sums, const PrefetchDistances& ahead, __m512* acc) {
    const char* pc = reinterpret_cast<const char*>(p);
    __m512 d[2 * C];
    PairScales<C>(pc, kPairBytes, kInterleavedScales, ahead, d);
    for (int i = 0; i < 2 * C; ++i) {  // block b + i: quants at pair i / 2, half i % 2
      const uint8_t* q = p + (i / 2) * kPairBytes + (i % 2) * kQuant;
      for (int k = 0; k < 8; ++k) {
        _mm_prefetch(reinterpret_cast<const char*>(q) + 64 * k + ahead.l1, _MM_HINT_T0);
        if (ahead.l2)
          _mm_prefetch(reinterpret_cast<const char*>(q) + 64 * k + ahead.l2, _MM_HINT_T1);
      }
      for (int t = 0; t < NT; ++t) {
        const int8_t* a = y[t][b + i].qs;
        __m512i s = _mm512_set1_epi32(sums[t][b + i]), u = _mm512_setzero_si512();
        for (int k = 0; k < 8; k += 2) {
          s = _mm512_dpbusd_epi32(s, _mm512_loadu_si512(q + 64 * k), Word(a + 4 * k));
          u = _mm512_dpbusd_epi32(u, _mm512_loadu_si512(q + 64 * k + 64), Word(a + 4 * k + 4));
        }
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d[i], _mm512_set1_ps(yd[t][b + i])),
                                 _mm512_cvtepi32_ps(_mm512_add_epi32(s, u)), acc[t]);
      }
    }
  }
};

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
                         const uint8_t* act, size_t act_stride, const int32_t* sums, int nt,
                         float* y, int64_t y_stride) {
  constexpr int kMaxTokens = 8;
  const int64_t nb = cols / kQK8_0;
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
      GroupDot<decltype(tile)::value, Q8_0Pairs>(group, nb, kPairBytes, ys, yds, ss, outs);
    });
  }
}

}  // namespace substrate::avx512
