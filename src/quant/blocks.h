// Block layouts of the quantized formats, byte-compatible with GGUF files written by ggml-based
// tools. Every struct is packed to its on-disk size (checked by static_assert), so a row of
// blocks is read straight from a file. `d`/`dmin` are IEEE half floats stored as uint16_t.
#pragma once

#include <cstdint>

namespace substrate {

constexpr int kQK4_0 = 32, kQK4_1 = 32, kQK5_0 = 32, kQK5_1 = 32, kQK8_0 = 32, kQK8_1 = 32;
constexpr int kQK4_NL = 32;
constexpr int kQK_K = 256;          // super-block size of K and IQ formats
constexpr int kKScaleBytes = 12;    // packed 6-bit scales/mins of Q4_K and Q5_K

#pragma pack(push, 1)
struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK4_0 / 2]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[kQK4_1 / 2]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[kQK5_0 / 2]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[kQK5_1 / 2]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK8_0]; };
struct BlockQ8_1 { uint16_t d, s; int8_t qs[kQK8_1]; };  // s = d * sum(qs)
struct BlockQ2_K { uint8_t scales[kQK_K / 16]; uint8_t qs[kQK_K / 4]; uint16_t d, dmin; };
struct BlockQ3_K { uint8_t hmask[kQK_K / 8]; uint8_t qs[kQK_K / 4]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[kKScaleBytes]; uint8_t qs[kQK_K / 2]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[kKScaleBytes]; uint8_t qh[kQK_K / 8]; uint8_t qs[kQK_K / 2]; };
struct BlockQ6_K { uint8_t ql[kQK_K / 2]; uint8_t qh[kQK_K / 4]; int8_t scales[kQK_K / 16]; uint16_t d; };
struct BlockQ8_K { float d; int8_t qs[kQK_K]; int16_t bsums[kQK_K / 16]; };  // activations only
struct BlockIQ4_NL { uint16_t d; uint8_t qs[kQK4_NL / 2]; };
struct BlockIQ4_XS { uint16_t d; uint16_t scales_h; uint8_t scales_l[kQK_K / 64]; uint8_t qs[kQK_K / 2]; };
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);

}  // namespace substrate
