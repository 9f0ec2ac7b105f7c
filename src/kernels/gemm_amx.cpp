// AMX int8 tile kernels of the prefill GEMM (see gemm_amx.h). Q8_0/Q4_0: one tile product per
// 32-element block, C (16 weight rows x 16 tokens, int32) = A (16 rows x 32 int8) . B (8 x 16
// tokens x 4); the integer products are exact, the block's fp16 scales (per row, per token) are
// applied in float with AVX-512, accumulating 16 x 16 results in 16 zmm registers; two blocks
// in flight at once. Q4_K/Q6_K (folded, see TileDotFoldedT): two K = 64 products per 64
// elements, stored once per 256-element super-block. Tiles: C 0-1, A 2-3, B 4-5.
// GCC 12's 512-bit conversion intrinsics pass an "undefined" vector that its own
// -Wmaybe-uninitialized then flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/gemm_amx.h"

#include <immintrin.h>

#include <cstring>

#include "kernels/vec_dot.h"
#include "quant/blocks.h"

namespace substrate::amx {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Q8_0/Q4_0 weights against Q8_0 activations: scales applied per 32-element block.
void TileDotBlocks(const TileArgs& a, float* out) {
  alignas(64) int32_t cbuf[2][16][16];
  __m512 acc[16];
  for (int m = 0; m < 16; ++m) acc[m] = _mm512_setzero_ps();
  const int64_t sub = a.sub;
  const int64_t b_step = sub * 16;  // bytes of activations per sub-block (16 tokens)
  for (int64_t j = 0; j < a.n_sub; j += 2) {
    const bool two = j + 1 < a.n_sub;
    _tile_loadd(2, a.wq + j * 16 * sub, sub);
    _tile_loadd(4, a.aq + j * b_step, 64);
    _tile_zero(0);
    _tile_dpbssd(0, 2, 4);
    if (two) {
      _tile_loadd(3, a.wq + (j + 1) * 16 * sub, sub);
      _tile_loadd(5, a.aq + (j + 1) * b_step, 64);
      _tile_zero(1);
      _tile_dpbssd(1, 3, 5);
    }
    _tile_stored(0, cbuf[0], 64);
    if (two) _tile_stored(1, cbuf[1], 64);
    for (int h = 0; h < (two ? 2 : 1); ++h) {
      const int64_t jj = j + h;
      const __m512 da = _mm512_loadu_ps(a.ad + (jj >> a.act_shift) * 16);
      const float* ws = a.ws + jj * 16;
      for (int m = 0; m < 16; ++m) {
        __m512 c = _mm512_cvtepi32_ps(_mm512_load_si512(cbuf[h][m]));
        acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(c, _mm512_set1_ps(ws[m])), da, acc[m]);
      }
    }
  }
  for (int m = 0; m < 16; ++m) _mm512_storeu_ps(out + 16 * m, acc[m]);
}

// Q4_K and Q6_K, folded: each weight is stored as q * sc (its integer sub-block scale applied)
// split into a low 7-bit part (unsigned) and a high part (signed, times 128), so a whole
// 256-element super-block accumulates in two int32 tiles with K = 64 products, stored once
// per super-block instead of once per sub-block; the super-block scale d (and, for Q4_K, the
// mins against the activation sums) are applied in float.
template <bool kOffset>
void TileDotFoldedT(const TileArgs& a, float* out) {
  alignas(64) int32_t cbuf[2][16][16];
  __m512 acc[16];
  for (int m = 0; m < 16; ++m) acc[m] = _mm512_setzero_ps();
  const int64_t per = int64_t{1} << a.act_shift;  // 64-element chunks per super-block
  for (int64_t sb = 0; sb < a.n_sub / per; ++sb) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t j = sb * per; j < (sb + 1) * per; ++j) {
      _tile_loadd(2, a.wq + j * 1024, 64);  // A: 16 rows x 64 (sub = 64 config)
      _tile_loadd(3, a.wq_hi + j * 1024, 64);
      _tile_loadd(4, a.aq + j * 1024, 64);  // B: 16 groups of 4 x 16 tokens
      _tile_dpbusd(0, 2, 4);
      _tile_dpbssd(1, 3, 4);
    }
    _tile_stored(0, cbuf[0], 64);
    _tile_stored(1, cbuf[1], 64);
    const __m512 da = _mm512_loadu_ps(a.ad + sb * 16);
    const float* ws = a.ws + sb * 16;
    for (int m = 0; m < 16; ++m) {
      __m512i v = _mm512_add_epi32(_mm512_load_si512(cbuf[0][m]),
                                   _mm512_slli_epi32(_mm512_load_si512(cbuf[1][m]), 7));
      acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(ws[m])), da,
                               acc[m]);
    }
    if constexpr (kOffset) {
      for (int64_t j = sb * 8; j < sb * 8 + 8; ++j) {  // mins of the 8 sub-blocks of 32
        const __m512 s = _mm512_loadu_ps(a.asum + j * 16);
        const float* wo = a.wo + j * 16;
        for (int m = 0; m < 16; ++m) acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(wo[m]), s, acc[m]);
      }
    }
  }
  for (int m = 0; m < 16; ++m) _mm512_storeu_ps(out + 16 * m, acc[m]);
}

inline float H(uint16_t h) { return _cvtsh_ss(h); }

inline __m256i Load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Stores 32 values as two 16-value sub-blocks j, j+1 of row m (Q6_K's layout, sub = 16).
inline void Store2x16(int8_t* q, int64_t j, int m, __m256i v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + (j * 16 + m) * 16), _mm256_castsi256_si128(v));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + ((j + 1) * 16 + m) * 16),
                   _mm256_extracti128_si256(v, 1));
}

inline void Store32(int8_t* q, int64_t j, int m, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + (j * 16 + m) * 32), v);
}

// 32 folded values (q * sc as int16, |v| <= 4096) at offset `at` of 64-element chunk j, row m:
// low 7 bits to q (unsigned), the rest (arithmetic shift, so v = 128 * hi + lo) to q_hi.
inline void StoreFolded(int8_t* q, int8_t* q_hi, int64_t j, int m, int at, __m512i v) {
  const size_t off = static_cast<size_t>((j * 16 + m) * 64 + at);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + off),
                      _mm512_cvtepi16_epi8(_mm512_and_si512(v, _mm512_set1_epi16(127))));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q_hi + off),
                      _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 7)));
}

void UnpackRow(WeightFormat f, const uint8_t* row, int64_t cols, int m, int8_t* q, int8_t* q_hi,
               float* s, float* o) {
  const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
  switch (f) {
    case WeightFormat::kQ8_0: {
      auto* x = reinterpret_cast<const BlockQ8_0*>(row);
      for (int64_t b = 0; b < cols / kQK8_0; ++b) {
        s[b * 16 + m] = H(x[b].d);
        Store32(q, b, m, Load256(x[b].qs));
      }
      break;
    }
    case WeightFormat::kQ4_0: {
      auto* x = reinterpret_cast<const BlockQ4_0*>(row);
      for (int64_t b = 0; b < cols / kQK4_0; ++b) {
        s[b * 16 + m] = H(x[b].d);
        __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].qs));
        __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), m4);
        Store32(q, b, m, _mm256_sub_epi8(v, _mm256_set1_epi8(8)));
      }
      break;
    }
    case WeightFormat::kQ4_K: {  // sub-block 2i: low nibbles of bytes 32i.., 2i+1: high
      auto* x = reinterpret_cast<const BlockQ4_K*>(row);
      for (int64_t b = 0; b < cols / kQK_K; ++b) {
        uint8_t sc[8], mn[8];
        scalar::UnpackQ4KScales(x[b].scales, sc, mn);
        s[b * 16 + m] = H(x[b].d);
        const float dmin = H(x[b].dmin);
        for (int j = 0; j < 8; ++j) o[(8 * b + j) * 16 + m] = -dmin * mn[j];
        for (int i = 0; i < 4; ++i) {  // chunk 4b + i: sub-blocks 2i, 2i+1
          __m256i v = Load256(x[b].qs + 32 * i);
          StoreFolded(q, q_hi, 4 * b + i, m, 0,
                      _mm512_mullo_epi16(_mm512_cvtepu8_epi16(_mm256_and_si256(v, m4)),
                                         _mm512_set1_epi16(sc[2 * i])));
          StoreFolded(q, q_hi, 4 * b + i, m, 32,
                      _mm512_mullo_epi16(
                          _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4)),
                          _mm512_set1_epi16(sc[2 * i + 1])));
        }
      }
      break;
    }
    case WeightFormat::kQ6_K: {  // value = d * scales[j] * (6-bit q - 32), sub-blocks of 16
      auto* x = reinterpret_cast<const BlockQ6_K*>(row);
      const __m256i k32 = _mm256_set1_epi8(32);
      for (int64_t b = 0; b < cols / kQK_K; ++b) {
        s[b * 16 + m] = H(x[b].d);
        for (int h = 0; h < 2; ++h) {
          __m256i ql0 = Load256(x[b].ql + 64 * h), ql1 = Load256(x[b].ql + 64 * h + 32);
          __m256i qh = Load256(x[b].qh + 32 * h);
          __m256i lo[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                           _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
          for (int k = 0; k < 4; ++k) {  // elements 128h + 32k .. +31: sub-blocks 8h+2k, +1
            __m256i top = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m3), 4);
            __m256i v = _mm256_sub_epi8(_mm256_or_si256(lo[k], top), k32);
            const int8_t* sc = x[b].scales + 8 * h + 2 * k;
            __m512i scv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(sc[0])),
                                             _mm256_set1_epi16(sc[1]), 1);
            StoreFolded(q, q_hi, 4 * b + 2 * h + k / 2, m, 32 * (k % 2),
                        _mm512_mullo_epi16(_mm512_cvtepi8_epi16(v), scv));
          }
        }
      }
      break;
    }
  }
}

}  // namespace

void UnpackTile(WeightFormat f, const uint8_t* w, size_t row_bytes, int n_rows, int64_t cols,
                int8_t* q, int8_t* q_hi, float* s, float* o) {
  const bool folded = f == WeightFormat::kQ4_K || f == WeightFormat::kQ6_K;
  const int sub = folded ? 64 : 32;
  const int64_t n_sub = cols / sub;
  for (int m = 0; m < 16; ++m) {
    if (m < n_rows) {
      UnpackRow(f, w + static_cast<size_t>(m) * row_bytes, cols, m, q, q_hi, s, o);
      continue;
    }
    for (int64_t j = 0; j < n_sub; ++j) {  // rows past the end: zeros, never written out
      std::memset(q + (j * 16 + m) * sub, 0, static_cast<size_t>(sub));
      if (q_hi) std::memset(q_hi + (j * 16 + m) * sub, 0, static_cast<size_t>(sub));
    }
    for (int64_t j = 0; j < cols / 16; ++j) {  // every scale layout fits in cols / 16
      s[j * 16 + m] = 0;
      if (o) o[j * 16 + m] = 0;
    }
  }
}

void ConfigureTiles(int sub) {
  TileConfig c{};
  c.palette = 1;
  for (int i = 0; i < 2; ++i) c.rows[i] = 16, c.colsb[i] = 64;                  // C
  for (int i = 2; i < 4; ++i) c.rows[i] = 16, c.colsb[i] = static_cast<uint16_t>(sub);  // A
  for (int i = 4; i < 6; ++i) c.rows[i] = static_cast<uint8_t>(sub / 4), c.colsb[i] = 64;  // B
  // GCC 12 does not see ldtilecfg read the whole struct and drops the stores to rows/colsb
  // (then the first tile load faults): make the writes visible first.
  __asm__ volatile("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}

void ReleaseTiles() { _tile_release(); }

void TileDot(const TileArgs& a, float* out) {
  if (a.wq_hi) {
    if (a.wo) {
      TileDotFoldedT<true>(a, out);
    } else {
      TileDotFoldedT<false>(a, out);
    }
  } else {
    TileDotBlocks(a, out);  // Q8_0/Q4_0: no mins
  }
}

}  // namespace substrate::amx
