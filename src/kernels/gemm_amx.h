// The AMX int8 tile kernel of the prefill GEMM (gemm_amx.cpp, compiled with AMX flags; call
// only when ActiveIsa() >= Isa::kAmx). Operands come prepared by gemm.cpp:
//  - weights: 16 rows of int8 values, tiled [sub-block][16 rows][sub] (each tile load reads 512
//    contiguous bytes; row-major rows 4 KiB apart would all fall into one L1 set), plus one float
//    scale per (sub-block of `sub` elements, row) laid out [sub-block][16], and for formats with
//    mins one float offset per (sub-block, row), same layout;
//  - activations: 16 tokens of int8 values in the tiles' VNNI order (for each group of 4
//    elements, 4 bytes per token: [k/4][16 tokens][4]), one float scale per (activation block,
//    token) laid out [block][16], and for formats with offsets the float sum of each sub-block
//    of each token (its scale times the sum of its int8 values) laid out [sub-block][16].
#pragma once

#include <cstddef>
#include <cstdint>

namespace substrate::amx {

struct TileArgs {
  const int8_t* wq = nullptr;    // 16 weight rows, [n_sub][16][sub]
  const float* ws = nullptr;     // [n_sub][16] weight scales
  const float* wo = nullptr;     // [n_sub][16] weight offsets (mins), or nullptr
  const uint8_t* aq = nullptr;   // activations, VNNI order, n_sub * sub * 16 bytes
  const float* ad = nullptr;     // [n_act_blocks][16] activation scales
  const float* asum = nullptr;   // [n_sub][16] activation sub-block sums (when wo is set)
  int64_t n_sub = 0;             // sub-blocks along the row
  int sub = 32;                  // elements per sub-block: 16 or 32
  int act_shift = 0;             // sub-block j uses activation scale j >> act_shift
};

// Weight formats the tiles take, and their unpacking into the layout above.
enum class WeightFormat { kQ8_0, kQ4_0, kQ4_K, kQ6_K };
// Unpacks rows [0, n_rows) (n_rows <= 16; rows past n_rows become zeros with zero scales) of
// `cols` columns, row r at w + r * row_bytes, into q ([n_sub][16][sub]), s and o ([n_sub][16];
// o only for Q4_K, whose values are s * q + o).
void UnpackTile(WeightFormat f, const uint8_t* w, size_t row_bytes, int n_rows, int64_t cols,
                int8_t* q, float* s, float* o);

// Loads the tile configuration for sub-blocks of `sub` (16 or 32) elements on this thread.
void ConfigureTiles(int sub);
// Gives the tile state back (cheaper context switches); call when a thread's work is done.
void ReleaseTiles();
// out[m * 16 + n] = sum over the row of weight row m times token n, for 16 rows x 16 tokens.
void TileDot(const TileArgs& a, float* out);

}  // namespace substrate::amx
