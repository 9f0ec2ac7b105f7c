// Device-side decoding of the GGUF block formats (quant/blocks.h, quant/dequantize.cpp): the same
// bytes, the same arithmetic. Weights are read in their file layout; every block of every format
// is an even number of bytes, so 16-bit loads are always aligned (a row starts at a multiple of
// its row bytes from a 256-byte aligned allocation).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_ops.h"

namespace substrate::cuda {

__device__ __forceinline__ float HalfToFloat(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ float Bf16ToFloat(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}
__device__ __forceinline__ uint16_t U16(const uint8_t* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
// 32 bits from a 2-byte aligned address.
__device__ __forceinline__ uint32_t U32A2(const uint8_t* p) {
  return static_cast<uint32_t>(U16(p)) | (static_cast<uint32_t>(U16(p + 2)) << 16);
}

__constant__ constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                1,    13,   25,  38,  53,  69,  89,  113};

__device__ __forceinline__ void ScaleMinK4(int j, const uint8_t* q, int* d, int* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

__device__ __forceinline__ int Q3KScale(const uint8_t* scales, int j) {
  const int lo = j < 8 ? (scales[j] & 0xF) : (scales[j - 8] >> 4);
  const int hi = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// Elements per block and bytes per block of each type the kernels read.
template <int T>
struct Fmt;
#define SUBSTRATE_FMT(T, QK, BYTES)      \
  template <>                            \
  struct Fmt<T> {                        \
    static constexpr int kQK = QK;       \
    static constexpr int kBytes = BYTES; \
  };
SUBSTRATE_FMT(kTypeF32, 1, 4)
SUBSTRATE_FMT(kTypeF16, 1, 2)
SUBSTRATE_FMT(kTypeBF16, 1, 2)
SUBSTRATE_FMT(kTypeQ4_0, 32, 18)
SUBSTRATE_FMT(kTypeQ4_1, 32, 20)
SUBSTRATE_FMT(kTypeQ5_0, 32, 22)
SUBSTRATE_FMT(kTypeQ5_1, 32, 24)
SUBSTRATE_FMT(kTypeQ8_0, 32, 34)
SUBSTRATE_FMT(kTypeQ2_K, 256, 84)
SUBSTRATE_FMT(kTypeQ3_K, 256, 110)
SUBSTRATE_FMT(kTypeQ4_K, 256, 144)
SUBSTRATE_FMT(kTypeQ5_K, 256, 176)
SUBSTRATE_FMT(kTypeQ6_K, 256, 210)
SUBSTRATE_FMT(kTypeIQ4_NL, 32, 18)
SUBSTRATE_FMT(kTypeIQ4_XS, 256, 136)
#undef SUBSTRATE_FMT

// Elements [j0, j0 + 8) of a row (j0 a multiple of 8) as floats. Every sub-block of every
// format is 16 or 32 elements, so the 8 share their scales.
template <int T>
__device__ __forceinline__ void Dequant8(const uint8_t* row, int64_t j0, float* y) {
  if constexpr (T == kTypeF32) {
    const float* p = reinterpret_cast<const float*>(row) + j0;  // rows may be only 4-aligned
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = p[i];
  } else if constexpr (T == kTypeF16 || T == kTypeBF16) {
    const uint8_t* p = row + j0 * 2;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint16_t h = U16(p + 2 * i);
      y[i] = T == kTypeF16 ? HalfToFloat(h) : Bf16ToFloat(h);
    }
  } else {
    constexpr int QK = Fmt<T>::kQK;
    const uint8_t* b = row + (j0 / QK) * Fmt<T>::kBytes;
    const int e = static_cast<int>(j0 % QK);
    if constexpr (T == kTypeQ4_0 || T == kTypeIQ4_NL) {
      const float d = HalfToFloat(U16(b));
      const uint8_t* qs = b + 2 + (e & 15);
      const int shift = e >= 16 ? 4 : 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int q = (qs[i] >> shift) & 0xF;
        if constexpr (T == kTypeQ4_0) {
          y[i] = static_cast<float>(q - 8) * d;
        } else {
          y[i] = d * static_cast<float>(kIq4Values[q]);
        }
      }
    } else if constexpr (T == kTypeQ4_1) {
      const float d = HalfToFloat(U16(b)), m = HalfToFloat(U16(b + 2));
      const uint8_t* qs = b + 4 + (e & 15);
      const int shift = e >= 16 ? 4 : 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) y[i] = static_cast<float>((qs[i] >> shift) & 0xF) * d + m;
    } else if constexpr (T == kTypeQ5_0 || T == kTypeQ5_1) {
      constexpr int off = T == kTypeQ5_0 ? 2 : 4;
      const float d = HalfToFloat(U16(b));
      const float m = T == kTypeQ5_1 ? HalfToFloat(U16(b + 2)) : 0.0f;
      const uint32_t qh = U32A2(b + off);
      const uint8_t* qs = b + off + 4 + (e & 15);
      const int shift = e >= 16 ? 4 : 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int q = ((qs[i] >> shift) & 0xF) | (((qh >> (e + i)) & 1) << 4);
        if constexpr (T == kTypeQ5_0) {
          y[i] = static_cast<float>(q - 16) * d;
        } else {
          y[i] = static_cast<float>(q) * d + m;
        }
      }
    } else if constexpr (T == kTypeQ8_0) {
      const float d = HalfToFloat(U16(b));
      const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2 + e);
#pragma unroll
      for (int i = 0; i < 8; ++i) y[i] = static_cast<float>(qs[i]) * d;
    } else if constexpr (T == kTypeQ2_K) {
      const float d = HalfToFloat(U16(b + 80)), dmin = HalfToFloat(U16(b + 82));
      const int half = e / 128, r = e % 128, s4 = r / 32, k = (r % 32) / 16, l0 = r % 16;
      const int sc = b[half * 8 + s4 * 2 + k];
      const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
      const uint8_t* q = b + 16 + half * 32 + 16 * k + l0;
#pragma unroll
      for (int i = 0; i < 8; ++i) y[i] = dl * static_cast<float>((q[i] >> (2 * s4)) & 3) - ml;
    } else if constexpr (T == kTypeQ3_K) {
      const float d = HalfToFloat(U16(b + 108));
      const int half = e / 128, r = e % 128, s4 = r / 32, k = (r % 32) / 16, l0 = r % 16;
      const float dl = d * static_cast<float>(Q3KScale(b + 96, half * 8 + s4 * 2 + k));
      const uint8_t* q = b + 32 + half * 32 + 16 * k + l0;
      const uint8_t* hm = b + 16 * k + l0;
      const int m = 1 << (half * 4 + s4);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int v = ((q[i] >> (2 * s4)) & 3) - ((hm[i] & m) ? 0 : 4);
        y[i] = dl * static_cast<float>(v);
      }
    } else if constexpr (T == kTypeQ4_K || T == kTypeQ5_K) {
      const float d = HalfToFloat(U16(b)), dmin = HalfToFloat(U16(b + 2));
      const int pair = e / 64, r = e % 64, hi = r / 32, l0 = r % 32;
      int sc, mn;
      ScaleMinK4(pair * 2 + hi, b + 4, &sc, &mn);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
      if constexpr (T == kTypeQ4_K) {
        const uint8_t* q = b + 16 + pair * 32 + l0;
#pragma unroll
        for (int i = 0; i < 8; ++i)
          y[i] = d1 * static_cast<float>(hi ? q[i] >> 4 : q[i] & 0xF) - m1;
      } else {
        const uint8_t* q = b + 48 + pair * 32 + l0;
        const uint8_t* qh = b + 16 + l0;
        const int u = (hi ? 2 : 1) << (2 * pair);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int v = (hi ? q[i] >> 4 : q[i] & 0xF) + ((qh[i] & u) ? 16 : 0);
          y[i] = d1 * static_cast<float>(v) - m1;
        }
      }
    } else if constexpr (T == kTypeQ6_K) {
      const float d = HalfToFloat(U16(b + 208));
      const int half = e / 128, r = e % 128, quarter = r / 32, l0 = r % 32;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float ds = d * static_cast<float>(sc[8 * half + l0 / 16 + 2 * quarter]);
      const uint8_t* ql = b + 64 * half + l0 + (quarter & 1) * 32;
      const uint8_t* qh = b + 128 + 32 * half + l0;
      const int lshift = quarter >= 2 ? 4 : 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int q = (((ql[i] >> lshift) & 0xF) | (((qh[i] >> (2 * quarter)) & 3) << 4)) - 32;
        y[i] = ds * static_cast<float>(q);
      }
    } else if constexpr (T == kTypeIQ4_XS) {
      const float d = HalfToFloat(U16(b));
      const int ib = e / 32, j = e % 32;
      const int ls =
          ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((U16(b + 2) >> (2 * ib)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      const uint8_t* qs = b + 8 + 16 * ib + (j & 15);
      const int shift = j >= 16 ? 4 : 0;
#pragma unroll
      for (int i = 0; i < 8; ++i)
        y[i] = dl * static_cast<float>(kIq4Values[(qs[i] >> shift) & 0xF]);
    }
  }
}

// Elements [j0, j0 + 8) of a repacked row (kRepacked; T the GGUF type) of `cols` elements: the
// same arithmetic as Dequant8<T>, with each field read from its plane.
template <int T>
__device__ __forceinline__ void Dequant8Repacked(const uint8_t* row, int64_t cols, int64_t j0,
                                                 float* y) {
  if constexpr (T == kTypeQ4_0) {
    const int64_t nb = cols / 32, b = j0 / 32;
    const int e = static_cast<int>(j0 % 32);
    const float d = HalfToFloat(U16(row + 16 * nb + 2 * b));
    const uint8_t* qs = row + 16 * b + (e & 15);
    const int shift = e >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = static_cast<float>(((qs[i] >> shift) & 0xF) - 8) * d;
  } else if constexpr (T == kTypeQ8_0) {
    const int64_t nb = cols / 32, b = j0 / 32;
    const float d = HalfToFloat(U16(row + 32 * nb + 2 * b));
    const int8_t* qs = reinterpret_cast<const int8_t*>(row + j0);
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = static_cast<float>(qs[i]) * d;
  } else if constexpr (T == kTypeQ4_K) {
    const int64_t nsb = cols / 256, sb = j0 / 256;
    const uint8_t* meta = row + 128 * nsb + 16 * sb;
    const float d = HalfToFloat(U16(meta)), dmin = HalfToFloat(U16(meta + 2));
    const int e = static_cast<int>(j0 % 256);
    const int pair = e / 64, r = e % 64, hi = r / 32, l0 = r % 32;
    int sc, mn;
    ScaleMinK4(pair * 2 + hi, meta + 4, &sc, &mn);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
    const uint8_t* q = row + 128 * sb + pair * 32 + l0;
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = d1 * static_cast<float>(hi ? q[i] >> 4 : q[i] & 0xF) - m1;
  } else if constexpr (T == kTypeQ6_K) {
    const int64_t nsb = cols / 256, sb = j0 / 256;
    const float d = HalfToFloat(U16(row + 208 * nsb + 2 * sb));
    const int e = static_cast<int>(j0 % 256);
    const int half = e / 128, r = e % 128, quarter = r / 32, l0 = r % 32;
    const int8_t* sc = reinterpret_cast<const int8_t*>(row + 192 * nsb + 16 * sb);
    const float ds = d * static_cast<float>(sc[8 * half + l0 / 16 + 2 * quarter]);
    const uint8_t* ql = row + 128 * sb + 64 * half + l0 + (quarter & 1) * 32;
    const uint8_t* qh = row + 128 * nsb + 64 * sb + 32 * half + l0;
    const int lshift = quarter >= 2 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = (((ql[i] >> lshift) & 0xF) | (((qh[i] >> (2 * quarter)) & 3) << 4)) - 32;
      y[i] = ds * static_cast<float>(q);
    }
  }
}

// Calls f.template operator()<T>() with T the GGUF type of a repacked type id; false for others.
template <typename F>
__host__ __device__ bool DispatchRepacked(int type, F&& f) {
  switch (type) {
    case kTypeQ4_0 | kRepacked:
      f.template operator()<kTypeQ4_0>();
      return true;
    case kTypeQ8_0 | kRepacked:
      f.template operator()<kTypeQ8_0>();
      return true;
    case kTypeQ4_K | kRepacked:
      f.template operator()<kTypeQ4_K>();
      return true;
    case kTypeQ6_K | kRepacked:
      f.template operator()<kTypeQ6_K>();
      return true;
    default:
      return false;
  }
}

// One element of a float-typed row (the tail of rows whose length is not a multiple of 8).
template <int T>
__device__ __forceinline__ float FloatElem(const uint8_t* row, int64_t j) {
  if constexpr (T == kTypeF32) return reinterpret_cast<const float*>(row)[j];
  if constexpr (T == kTypeF16) return HalfToFloat(U16(row + 2 * j));
  if constexpr (T == kTypeBF16) return Bf16ToFloat(U16(row + 2 * j));
  return 0.0f;
}

// Element i of activations being quantized to blocks of 32 (every lane of the warp holds one
// element of the same block, i = 32 * block + lane): writes its int8 and, from lane 0, the
// block's (d, d * sum q); NaN scales for a block holding a NaN or infinity.
__device__ __forceinline__ void QuantizeWarpStore(float v, int64_t i, int8_t* xq, float2* xs) {
  const bool bad = __any_sync(0xffffffffu, !isfinite(v));
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.0f;
  const int q = (bad || d == 0.0f) ? 0 : __float2int_rn(v / d);
  int sum = q;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  xq[i] = static_cast<int8_t>(q);
  if ((threadIdx.x & 31) == 0)
    xs[i / 32] = bad ? make_float2(NAN, NAN) : make_float2(d, d * static_cast<float>(sum));
}

// The block of a tiles launch (LaunchGemvTiles, LaunchGemvTilesMma): its tile {expert, first
// sorted position, slots}, job j (gate or up) and row block rb. False for a block past the
// tiles the sort made (the grid is sized for the most it can make).
struct TileBlock {
  int4 tile;
  int j, rb;
};
__device__ __forceinline__ bool LocateTileBlock(const GemvTilesParams& p, TileBlock* b) {
  const int per_tile = p.n_jobs * p.row_blocks;
  const int tile = static_cast<int>(blockIdx.x) / per_tile;
  if (tile >= *p.n_tiles) return false;
  b->j = (static_cast<int>(blockIdx.x) / p.row_blocks) % p.n_jobs;
  b->rb = static_cast<int>(blockIdx.x) % p.row_blocks;
  b->tile = p.tiles[tile];
  return true;
}

// Calls f.template operator()<T>() with T the kernel type id `type` (a switch over every type
// the kernels read); returns false for others.
template <typename F>
__host__ bool DispatchType(int type, F&& f) {
  switch (type) {
    case kTypeF32:
      f.template operator()<kTypeF32>();
      return true;
    case kTypeF16:
      f.template operator()<kTypeF16>();
      return true;
    case kTypeBF16:
      f.template operator()<kTypeBF16>();
      return true;
    case kTypeQ4_0:
      f.template operator()<kTypeQ4_0>();
      return true;
    case kTypeQ4_1:
      f.template operator()<kTypeQ4_1>();
      return true;
    case kTypeQ5_0:
      f.template operator()<kTypeQ5_0>();
      return true;
    case kTypeQ5_1:
      f.template operator()<kTypeQ5_1>();
      return true;
    case kTypeQ8_0:
      f.template operator()<kTypeQ8_0>();
      return true;
    case kTypeQ2_K:
      f.template operator()<kTypeQ2_K>();
      return true;
    case kTypeQ3_K:
      f.template operator()<kTypeQ3_K>();
      return true;
    case kTypeQ4_K:
      f.template operator()<kTypeQ4_K>();
      return true;
    case kTypeQ5_K:
      f.template operator()<kTypeQ5_K>();
      return true;
    case kTypeQ6_K:
      f.template operator()<kTypeQ6_K>();
      return true;
    case kTypeIQ4_NL:
      f.template operator()<kTypeIQ4_NL>();
      return true;
    case kTypeIQ4_XS:
      f.template operator()<kTypeIQ4_XS>();
      return true;
    default:
      return false;
  }
}

}  // namespace substrate::cuda
