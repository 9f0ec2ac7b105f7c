// AMX int8 tile kernel of the prefill GEMM (see gemm_amx.h). One tile product per sub-block:
// C (16 weight rows x 16 tokens, int32) = A (16 rows x sub int8) . B (sub/4 x 16 tokens x 4).
// The integer products of a sub-block are exact; its scales (per weight row, per token) are
// then applied in float with AVX-512, accumulating 16 rows x 16 tokens in 16 zmm registers.
// Two sub-blocks are in flight at once (C0/A0/B0 and C1/A1/B1) so one tile product overlaps
// the other's store and scaling.
// GCC 12's 512-bit conversion intrinsics pass an "undefined" vector that its own
// -Wmaybe-uninitialized then flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/gemm_amx.h"

#include <immintrin.h>

namespace substrate::amx {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

template <bool kOffset>
void TileDotT(const TileArgs& a, float* out) {
  alignas(64) int32_t cbuf[2][16][16];
  __m512 acc[16];
  for (int m = 0; m < 16; ++m) acc[m] = _mm512_setzero_ps();
  const int64_t sub = a.sub;
  const int64_t b_step = sub * 16;  // bytes of activations per sub-block (16 tokens)
  for (int64_t j = 0; j < a.n_sub; j += 2) {
    const bool two = j + 1 < a.n_sub;
    _tile_loadd(2, a.wq + j * sub, a.ldw);
    _tile_loadd(4, a.aq + j * b_step, 64);
    _tile_zero(0);
    _tile_dpbssd(0, 2, 4);
    if (two) {
      _tile_loadd(3, a.wq + (j + 1) * sub, a.ldw);
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
      if constexpr (kOffset) {
        const __m512 s = _mm512_loadu_ps(a.asum + jj * 16);
        const float* wo = a.wo + jj * 16;
        for (int m = 0; m < 16; ++m) acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(wo[m]), s, acc[m]);
      }
    }
  }
  for (int m = 0; m < 16; ++m) _mm512_storeu_ps(out + 16 * m, acc[m]);
}

}  // namespace

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
  if (a.wo) {
    TileDotT<true>(a, out);
  } else {
    TileDotT<false>(a, out);
  }
}

}  // namespace substrate::amx
