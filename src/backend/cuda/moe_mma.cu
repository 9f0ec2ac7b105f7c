// The routed experts' prefill products on int8 tensor cores (LaunchGemvTilesMma): the same
// tiles of sorted slots as LaunchGemvTiles, 32 slots a tile, so each expert row a warp decodes
// serves 32 tokens. A block stages its tile's int8 activations in shared memory and its eight
// warps take 16 rows each of a 128-row block: the weights' quants go from memory straight into
// the A operand of m16n8k32 (Q6_K: m16n8k16, one per 16-element scale) MMAs, each 32-element
// group's int32 sums are scaled into float accumulators by the weights' and the activations'
// block scales, and the activations come from shared memory by ldmatrix.
//
// The weights are in the repacked layout (repack.cpp: each row's quant plane first, then its
// scale planes; a 16-byte "unit" of the quant plane per lane in the GEMV kernels of gemv.cu).
// MMA fragments (mma.cuh; integer m16n8k32): lane = 4 g + c holds rows g and g + 8 of A, the
// k-bytes 4c..4c+3 (registers 0, 1) and 16 + 4c.. (2, 3); B's k-bytes 4c.. and 16 + 4c.. of
// column g; C's columns 2c and 2c + 1 of rows g and g + 8.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/quant_device.cuh"

namespace substrate::cuda {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kRowsPerBlock = 16 * kWarps;
static_assert(kRowsPerBlock == kGemvTilesRowsPerBlock, "the host sizes the grid by it");
constexpr int kSlots = kMoeMmaTileSlots;
constexpr int kNTiles = kSlots / 8;  // the 8-token columns of a tile
constexpr int kChunkSteps = 8;       // 32-element steps a thread's loads cover at once

__device__ __forceinline__ uint32_t Word(const uint8_t* p) {
  return __ldg(reinterpret_cast<const uint32_t*>(p));
}
__device__ __forceinline__ uint32_t Low(uint32_t v) {
  return v & 0x0F0F0F0Fu;
}
__device__ __forceinline__ uint32_t High(uint32_t v) {
  return (v >> 4) & 0x0F0F0F0Fu;
}

// One 32-element step of the activations for the warp's kNTiles columns of 8 tokens: the B
// fragments (k-bytes 0-15 and 16-31) and the (d, d * sum) of tokens 2c and 2c + 1 of each.
struct XStep {
  uint32_t b[kNTiles][2];
  float2 s[kNTiles][2];
};

// acc[n][e] += the row's scale x the token's scale x sums[e] (rows g, g + 8 for e < 2, >= 2).
__device__ __forceinline__ void Scale(float (&acc)[4], const int (&sums)[4], const float (&wd)[2],
                                      const float2 (&xs)[2]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) acc[e] += wd[e >> 1] * xs[e & 1].x * static_cast<float>(sums[e]);
}

// The f16 d of blocks b0 .. b0 + steps of both rows, from the scale plane `plane` bytes into
// each row (Q4_0, Q8_0); zeros past the row.
__device__ __forceinline__ void LoadBlockScales(float (&d)[2][kChunkSteps],
                                                const uint8_t* const (&row)[2], int64_t plane,
                                                int b0, int steps) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int s = 0; s < kChunkSteps; ++s)
      d[r][s] =
          s < steps
              ? HalfToFloat(__ldg(reinterpret_cast<const unsigned short*>(row[r] + plane) + b0 + s))
              : 0.0f;
}

// Per type: Chunk holds a thread's two rows' words for kChunkSteps steps (Load), Step adds step
// s's products with the warp's tokens to acc.
template <int T>
struct Mq;

// Q4_0: block b's 16 quant bytes hold element j (low nibble) and j + 16 (high) in byte j; its
// d in the plane after the quants. Unsigned nibbles: sum (q - 8) x = sum q x - 8 sum x.
template <>
struct Mq<kTypeQ4_0> {
  struct Chunk {
    uint32_t q[2][kChunkSteps];
    float d[2][kChunkSteps];
  };
  __device__ static void Load(Chunk& w, const uint8_t* const (&row)[2], int64_t cols, int b0,
                              int steps, int c) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int s = 0; s < kChunkSteps; ++s)
        w.q[r][s] = s < steps ? Word(row[r] + 16 * (b0 + s) + 4 * c) : 0;
    LoadBlockScales(w.d, row, 16 * (cols / 32), b0, steps);
  }
  __device__ static void Step(const Chunk& w, int s, const XStep& x, float (&acc)[kNTiles][4],
                              int n_used) {
    const uint32_t a0 = Low(w.q[0][s]), a1 = Low(w.q[1][s]);
    const uint32_t a2 = High(w.q[0][s]), a3 = High(w.q[1][s]);
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      if (n >= n_used) break;
      int sums[4];
      MmaS8K32(sums, a0, a1, a2, a3, x.b[n][0], x.b[n][1]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 xs = x.s[n][e & 1];
        acc[n][e] += w.d[e >> 1][s] * (xs.x * static_cast<float>(sums[e]) - 8.0f * xs.y);
      }
    }
  }
};

// Q8_0: block b's 32 quants as two 16-byte units, its d in the plane after the quants.
template <>
struct Mq<kTypeQ8_0> {
  struct Chunk {
    uint32_t q[2][kChunkSteps][2];
    float d[2][kChunkSteps];
  };
  __device__ static void Load(Chunk& w, const uint8_t* const (&row)[2], int64_t cols, int b0,
                              int steps, int c) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int s = 0; s < kChunkSteps; ++s) {
        const bool in = s < steps;
        const uint8_t* q = row[r] + 32 * (b0 + s) + 4 * c;
        w.q[r][s][0] = in ? Word(q) : 0;
        w.q[r][s][1] = in ? Word(q + 16) : 0;
      }
    LoadBlockScales(w.d, row, 32 * (cols / 32), b0, steps);
  }
  __device__ static void Step(const Chunk& w, int s, const XStep& x, float (&acc)[kNTiles][4],
                              int n_used) {
    const float wd[2] = {w.d[0][s], w.d[1][s]};
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      if (n >= n_used) break;
      int sums[4];
      MmaS8K32(sums, w.q[0][s][0], w.q[1][s][0], w.q[0][s][1], w.q[1][s][1], x.b[n][0], x.b[n][1]);
      Scale(acc[n], sums, wd, x.s[n]);
    }
  }
};

// Q4_K: a chunk is a super-block (256 elements, 8 sub-blocks of 32). Unit i = 2p + h of its 128
// quant bytes holds elements 64p + 16h.. (low nibbles: sub-block 2p) and 64p + 32 + 16h.. (high:
// sub-block 2p + 1); its 16-byte header (d, dmin, 12 bytes of 6-bit scales and minimums) is in
// the plane after the quants.
template <>
struct Mq<kTypeQ4_K> {
  struct Chunk {
    uint32_t q[2][4][2];  // [row][p][h]: word c of unit 2p + h
    uint4 m[2];
  };
  __device__ static void Load(Chunk& w, const uint8_t* const (&row)[2], int64_t cols, int b0, int,
                              int c) {
    const int sb = b0 / 8;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int p = 0; p < 4; ++p)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          w.q[r][p][h] = Word(row[r] + 128 * sb + 16 * (2 * p + h) + 4 * c);
      w.m[r] = __ldg(reinterpret_cast<const uint4*>(row[r] + 128 * (cols / 256)) + sb);
    }
  }
  // Sub-block j's scale and minimum of a header (the 6-bit packing of Q4_K; j is known at
  // compile time, so the byte picks are shifts of registers).
  __device__ static void ScaleMin(const uint4& m, int j, float* d, float* dmin) {
    const uint32_t w[3] = {m.y, m.z, m.w};
    auto byte = [&](int i) { return (w[i >> 2] >> (8 * (i & 3))) & 0xFFu; };
    uint32_t sc, mn;
    if (j < 4) {
      sc = byte(j) & 63;
      mn = byte(j + 4) & 63;
    } else {
      sc = (byte(j + 4) & 0x0F) | ((byte(j - 4) >> 6) << 4);
      mn = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
    }
    *d = HalfToFloat(static_cast<uint16_t>(m.x & 0xFFFF)) * static_cast<float>(sc);
    *dmin = HalfToFloat(static_cast<uint16_t>(m.x >> 16)) * static_cast<float>(mn);
  }
  __device__ static void Step(const Chunk& w, int s, const XStep& x, float (&acc)[kNTiles][4],
                              int n_used) {
    const int p = s >> 1;
    const bool hi = s & 1;
    const uint32_t a0 = hi ? High(w.q[0][p][0]) : Low(w.q[0][p][0]);
    const uint32_t a1 = hi ? High(w.q[1][p][0]) : Low(w.q[1][p][0]);
    const uint32_t a2 = hi ? High(w.q[0][p][1]) : Low(w.q[0][p][1]);
    const uint32_t a3 = hi ? High(w.q[1][p][1]) : Low(w.q[1][p][1]);
    float wd[2], wm[2];
    ScaleMin(w.m[0], s, &wd[0], &wm[0]);
    ScaleMin(w.m[1], s, &wd[1], &wm[1]);
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      if (n >= n_used) break;
      int sums[4];
      MmaS8K32(sums, a0, a1, a2, a3, x.b[n][0], x.b[n][1]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 xs = x.s[n][e & 1];
        acc[n][e] += wd[e >> 1] * xs.x * static_cast<float>(sums[e]) - wm[e >> 1] * xs.y;
      }
    }
  }
};

// Q6_K: a chunk is a super-block; 16 groups of 16 elements, each with its own int8 scale, so
// each 32-element step is two k16 MMAs. Group t = 8n + 4l + m (l: high nibble) is unit 4n + m of
// the low-bit plane's nibbles, its two high bits at shift 2(m / 2) + 4l of qh word
// 4 sb + 2n + m % 2 (plane after the low bits), its scale byte t of the scale plane, d after.
template <>
struct Mq<kTypeQ6_K> {
  struct Chunk {
    uint32_t ql[2][8];     // [row][unit 4n + m]: word c
    uint32_t qh[2][2][2];  // [row][n][m % 2]: word c
    uint4 sc[2];
    float d[2];
  };
  __device__ static void Load(Chunk& w, const uint8_t* const (&row)[2], int64_t cols, int b0, int,
                              int c) {
    const int sb = b0 / 8;
    const int64_t nsb = cols / 256;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int u = 0; u < 8; ++u) w.ql[r][u] = Word(row[r] + 128 * sb + 16 * u + 4 * c);
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          w.qh[r][n][h] = Word(row[r] + 128 * nsb + 16 * (4 * sb + 2 * n + h) + 4 * c);
      w.sc[r] = __ldg(reinterpret_cast<const uint4*>(row[r] + 192 * nsb) + sb);
      w.d[r] = HalfToFloat(__ldg(reinterpret_cast<const unsigned short*>(row[r] + 208 * nsb) + sb));
    }
  }
  // Row r's quants of group t, as int8 (q - 32).
  __device__ static uint32_t Quants(const Chunk& w, int r, int t) {
    const int n = t >> 3, l = (t >> 2) & 1, m = t & 3;
    const uint32_t ql = l ? High(w.ql[r][4 * n + m]) : Low(w.ql[r][4 * n + m]);
    const uint32_t qh = (w.qh[r][n][m & 1] >> (2 * (m >> 1) + 4 * l)) & 0x03030303u;
    return __vsub4(ql | (qh << 4), 0x20202020u);
  }
  __device__ static float GroupScale(const Chunk& w, int r, int t) {
    const uint32_t v[4] = {w.sc[r].x, w.sc[r].y, w.sc[r].z, w.sc[r].w};
    return w.d[r] * static_cast<float>(static_cast<int8_t>(v[t >> 2] >> (8 * (t & 3))));
  }
  __device__ static void Step(const Chunk& w, int s, const XStep& x, float (&acc)[kNTiles][4],
                              int n_used) {
    const int t0 = 2 * s, t1 = 2 * s + 1;
    const uint32_t a0 = Quants(w, 0, t0), a1 = Quants(w, 1, t0);
    const uint32_t b0 = Quants(w, 0, t1), b1 = Quants(w, 1, t1);
    const float s0[2] = {GroupScale(w, 0, t0), GroupScale(w, 1, t0)};
    const float s1[2] = {GroupScale(w, 0, t1), GroupScale(w, 1, t1)};
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      if (n >= n_used) break;
      int first[4], second[4];
      MmaS8K16(first, a0, a1, x.b[n][0]);
      MmaS8K16(second, b0, b1, x.b[n][1]);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        acc[n][e] += x.s[n][e & 1].x * (s0[e >> 1] * static_cast<float>(first[e]) +
                                        s1[e >> 1] * static_cast<float>(second[e]));
    }
  }
};

// Shared memory: the tile's activations, rows of cols + 16 bytes (so the eight rows an
// ldmatrix reads start in different bank quads), then their (d, d * sum) per 32, by group
// ([group][slot]: a lane's two tokens are one 16-byte read).
__host__ __device__ constexpr int64_t XLd(int64_t cols) {
  return cols + 16;
}
__host__ __device__ constexpr int64_t SmemBytes(int64_t cols) {
  return kSlots * XLd(cols) + kSlots * (cols / 32) * 8;
}

template <int T>
__global__ void __launch_bounds__(kThreads, 2)
    GemvTilesMmaKernel(const __grid_constant__ GemvTilesParams p) {
  using M = Mq<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  PdlStart();  // the tiles are the sort kernel's output
  TileBlock b;
  if (!LocateTileBlock(p, &b)) return;
  const int j = b.j, rb = b.rb;
  const int4 tl = b.tile;  // expert, first position, slots
  const int nt = tl.z;
  const int64_t cols = p.cols, groups = cols / 32, ld = XLd(cols);
  int8_t* sx = reinterpret_cast<int8_t*>(smem);
  float2* sxs = reinterpret_cast<float2*>(smem + kSlots * ld);

  // The tile's activations (zeros past its slots).
  const int words = static_cast<int>(cols / 16);
  for (int i = threadIdx.x; i < kSlots * words; i += kThreads) {
    const int t = i / words, k = i % words;
    int4 v = make_int4(0, 0, 0, 0);
    if (t < nt) {
      const int64_t xr = p.row_src ? p.row_src[tl.y + t] : tl.y + t;
      v = reinterpret_cast<const int4*>(p.xq + xr * cols)[k];
    }
    *reinterpret_cast<int4*>(sx + t * ld + 16 * k) = v;
  }
  for (int i = threadIdx.x; i < kSlots * groups; i += kThreads) {
    const int t = static_cast<int>(i / groups);
    const int64_t q = i % groups;
    float2 v = make_float2(0.0f, 0.0f);
    if (t < nt) {
      const int64_t xr = p.row_src ? p.row_src[tl.y + t] : tl.y + t;
      v = p.xs[xr * groups + q];
    }
    sxs[q * kSlots + t] = v;
  }
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int row0 = rb * kRowsPerBlock + warp * 16;
  if (row0 >= p.rows) return;
  const uint8_t* base = p.expert_w[j][tl.x];
  const uint8_t* row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
    row[r] = base + static_cast<int64_t>(min(row0 + g + 8 * r, p.rows - 1)) * p.row_bytes[j];
  const int n_used = (nt + 7) / 8;
  float acc[kNTiles][4];
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  // ldmatrix rows: lanes 8m..8m+7 address token (m / 2) * 8 + lane % 8 of a pair of 8-token
  // columns, k-bytes (m % 2) * 16.. of the step.
  const int m = lane >> 3;
  const int x_row = (m >> 1) * 8 + (lane & 7), x_col = (m & 1) * 16;
  const int n_steps = static_cast<int>(groups);
  for (int b0 = 0; b0 < n_steps; b0 += kChunkSteps) {
    const int steps = min(kChunkSteps, n_steps - b0);
    typename M::Chunk w;
    M::Load(w, row, cols, b0, steps, c);
#pragma unroll
    for (int s = 0; s < kChunkSteps; ++s) {
      if (s >= steps) break;
      const int k0 = 32 * (b0 + s);
      XStep x;
#pragma unroll
      for (int n = 0; n < kNTiles; n += 2) {
        if (n >= n_used) break;
        uint32_t r[4];
        LoadMatrices(SmemAddress(sx + (8 * n + x_row) * ld + k0 + x_col), r);
        x.b[n][0] = r[0];
        x.b[n][1] = r[1];
        x.b[n + 1][0] = r[2];
        x.b[n + 1][1] = r[3];
      }
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        const float4 v = *reinterpret_cast<const float4*>(sxs + (b0 + s) * kSlots + 8 * n + 2 * c);
        x.s[n][0] = make_float2(v.x, v.y);
        x.s[n][1] = make_float2(v.z, v.w);
      }
      M::Step(w, s, x, acc, n_used);
    }
  }

#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = row0 + g + 8 * (e >> 1), t = 8 * n + 2 * c + (e & 1);
      if (r < p.rows && t < nt) p.y[j][static_cast<int64_t>(tl.y + t) * p.rows + r] = acc[n][e];
    }
  }
}

}  // namespace

void AllowGemvTilesMmaSmem() {
  const int bytes = static_cast<int>(SmemBytes(GemvTilesMaxCols()));
  for (int type : {kTypeQ4_0, kTypeQ8_0, kTypeQ4_K, kTypeQ6_K})
    DispatchRepacked(type | kRepacked, [&]<int T>() {
      SUBSTRATE_CUDA_CHECK(cudaFuncSetAttribute(
          GemvTilesMmaKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    });
}

void LaunchGemvTilesMma(const void* params, cudaStream_t stream) {
  const GemvTilesParams& p = *static_cast<const GemvTilesParams*>(params);
  const size_t smem = static_cast<size_t>(SmemBytes(p.cols));
  if (!DispatchRepacked(p.type, [&]<int T>() {
        LaunchKernel(GemvTilesMmaKernel<T>, dim3(static_cast<unsigned>(p.grid)), dim3(kThreads),
                     smem, stream, p);
      }))
    FatalError("gemv tiles (tensor cores): unsupported weight type " + std::to_string(p.type));
}

}  // namespace substrate::cuda
