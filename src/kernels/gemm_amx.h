// The AMX int8 tile kernel of the prefill GEMM (gemm_amx.cpp, compiled with AMX flags; call
// only when ActiveIsa() >= Isa::kAmx). Operands come prepared by gemm.cpp:
//  - weights: 16 rows of int8 values, tiled [sub-block][16 rows][sub] (each tile load reads
//    contiguous bytes; row-major rows 4 KiB apart would all fall into one L1 set), plus float
//    scales laid out [block][16] (see UnpackTile for each format);
//  - activations: 16 tokens of int8 values in the tiles' VNNI order (for each group of 4
//    elements, 4 bytes per token: [k/4][16 tokens][4]), one float scale per (activation block,
//    token) laid out [block][16], and for formats with offsets the float sum of each sub-block
//    of 32 of each token (its scale times the sum of its int8 values).
#pragma once

#include <cstddef>
#include <cstdint>

namespace substrate::amx {

struct TileArgs {
  const int8_t* wq = nullptr;    // 16 weight rows, [n_sub][16][sub]
  const int8_t* wq_hi = nullptr; // folded formats (Q4_K, Q6_K): the high parts, same layout
  const float* ws = nullptr;     // [n_sub][16] weight scales (folded: [super-block][16] d)
  const float* wo = nullptr;     // Q4_K: [cols/32][16] offsets (-dmin * min), else nullptr
  const uint8_t* aq = nullptr;   // activations, VNNI order, n_sub * sub * 16 bytes
  const float* ad = nullptr;     // [n_act_blocks][16] activation scales
  const float* asum = nullptr;   // [cols/32][16] activation sums (when wo is set)
  int64_t n_sub = 0;             // tile products along the row (cols / sub)
  int sub = 32;                  // elements per tile product: 32, or 64 when folded
  int act_shift = 0;             // sub-block j uses activation scale j >> act_shift
};

// Weight formats the tiles take, and their unpacking into the layout above.
enum class WeightFormat { kQ8_0, kQ4_0, kQ4_K, kQ6_K };
// Unpacks rows [0, n_rows) (n_rows <= 16; rows past n_rows become zeros with zero scales) of
// `cols` columns, row r at w + r * row_bytes. Q8_0/Q4_0: q [cols/32][16][32] and s [cols/32]
// [16], value s * q. Q4_K/Q6_K are folded: each sub-block's integer scale times its quants,
// v = 128 * q_hi + q (q in 0..127), in 64-element chunks [cols/64][16][64]; s [cols/256][16] is
// the super-block's d; Q4_K's value is s * v + o with o [cols/32][16] = -dmin * min. s and o
// must hold (cols/16) * 16 floats each.
void UnpackTile(WeightFormat f, const uint8_t* w, size_t row_bytes, int n_rows, int64_t cols,
                int8_t* q, int8_t* q_hi, float* s, float* o);

// Loads the tile configuration for products of `sub` (32 or 64) elements on this thread.
void ConfigureTiles(int sub);
// Gives the tile state back (cheaper context switches); call when a thread's work is done.
void ReleaseTiles();
// out[m * 16 + n] = sum over the row of weight row m times token n, for 16 rows x 16 tokens.
void TileDot(const TileArgs& a, float* out);

}  // namespace substrate::amx
