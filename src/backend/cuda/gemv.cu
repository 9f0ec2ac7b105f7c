// Matrix-vector products for decode (1..8 tokens per block, every weight type), one warp per
// weight row. Q4_0, Q8_0, Q4_K and Q6_K take int8 dot products (dp4a) over activations quantized
// to blocks of 32 (as the CPU kernels quantize them); the other types, and F16/BF16/F32 (whose
// products must stay exact), dequantize 8 weights at a time against float activations.
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant_device.cuh"
#include "backend/cuda/route_device.cuh"

namespace substrate::cuda {
namespace {

template <typename V>
__device__ __forceinline__ V WarpSum(V v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ int LoadInt(const int8_t* p) {
  return *reinterpret_cast<const int*>(p);
}

// Per type: kLanes lanes share one weight block; Load reads lane `s`'s part of the block once,
// Dot takes it against one token's activations (xq at the block's first element, xs at its
// first group of 32).
template <int T>
struct FastDot;

// Q4_0: lane s holds qs bytes [4s, 4s + 4): elements 4s.. (low nibbles) and 16 + 4s.. (high).
template <>
struct FastDot<kTypeQ4_0> {
  static constexpr int kLanes = 4;
  struct W {
    int q;
    float d;
  };
  __device__ static W Load(const uint8_t* b, int s) {
    return {static_cast<int>(U32A2(b + 2 + 4 * s)), HalfToFloat(U16(b))};
  }
  __device__ static float Dot(const W& w, int s, const int8_t* xq, const float2* xs) {
    const int lo = w.q & 0x0F0F0F0F, hi = (w.q >> 4) & 0x0F0F0F0F;
    const int sumi = __dp4a(lo, LoadInt(xq + 4 * s), __dp4a(hi, LoadInt(xq + 16 + 4 * s), 0));
    const float2 ds = xs[0];
    // sum (q - 8) x: this lane's share of the block's -8 * sum(x) is a quarter.
    return w.d * (ds.x * static_cast<float>(sumi) - 2.0f * ds.y);
  }
};

// Q8_0: lane s holds qs[8s, 8s + 8).
template <>
struct FastDot<kTypeQ8_0> {
  static constexpr int kLanes = 4;
  struct W {
    int a, b;
    float d;
  };
  __device__ static W Load(const uint8_t* b, int s) {
    return {static_cast<int>(U32A2(b + 2 + 8 * s)), static_cast<int>(U32A2(b + 6 + 8 * s)),
            HalfToFloat(U16(b))};
  }
  __device__ static float Dot(const W& w, int s, const int8_t* xq, const float2* xs) {
    const int sumi = __dp4a(w.a, LoadInt(xq + 8 * s), __dp4a(w.b, LoadInt(xq + 8 * s + 4), 0));
    return w.d * xs[0].x * static_cast<float>(sumi);
  }
};

// Q4_K: lane s = 2p + h holds qs[32p + 16h, +16): elements 64p + 16h.. (low nibbles, sub-block
// 2p) and 64p + 32 + 16h.. (high nibbles, sub-block 2p + 1). Blocks are 16-byte aligned.
template <>
struct FastDot<kTypeQ4_K> {
  static constexpr int kLanes = 8;
  struct W {
    uint4 q;
    float dl0, ml0, dl1, ml1;
  };
  __device__ static int ScaleByte(uint32_t s0, uint32_t s1, uint32_t s2, int j) {
    const uint32_t w = j < 4 ? s0 : (j < 8 ? s1 : s2);
    return static_cast<int>((w >> (8 * (j & 3))) & 0xFF);
  }
  __device__ static void ScaleMin(uint32_t s0, uint32_t s1, uint32_t s2, int j, int* d, int* m) {
    if (j < 4) {
      *d = ScaleByte(s0, s1, s2, j) & 63;
      *m = ScaleByte(s0, s1, s2, j + 4) & 63;
    } else {
      *d = (ScaleByte(s0, s1, s2, j + 4) & 0xF) | ((ScaleByte(s0, s1, s2, j - 4) >> 6) << 4);
      *m = (ScaleByte(s0, s1, s2, j + 4) >> 4) | ((ScaleByte(s0, s1, s2, j) >> 6) << 4);
    }
  }
  __device__ static W Load(const uint8_t* b, int s) {
    const int p = s >> 1, h = s & 1;
    W w;
    w.q = *reinterpret_cast<const uint4*>(b + 16 + 32 * p + 16 * h);
    const uint32_t* sc = reinterpret_cast<const uint32_t*>(b + 4);
    const uint32_t s0 = sc[0], s1 = sc[1], s2 = sc[2];
    const float d = HalfToFloat(U16(b)), dmin = HalfToFloat(U16(b + 2));
    int sd, sm;
    ScaleMin(s0, s1, s2, 2 * p, &sd, &sm);
    w.dl0 = d * static_cast<float>(sd);
    w.ml0 = dmin * static_cast<float>(sm);
    ScaleMin(s0, s1, s2, 2 * p + 1, &sd, &sm);
    w.dl1 = d * static_cast<float>(sd);
    w.ml1 = dmin * static_cast<float>(sm);
    return w;
  }
  __device__ static float Dot(const W& w, int s, const int8_t* xq, const float2* xs) {
    const int p = s >> 1, h = s & 1;
    const int4 xl = *reinterpret_cast<const int4*>(xq + 64 * p + 16 * h);
    const int4 xh = *reinterpret_cast<const int4*>(xq + 64 * p + 32 + 16 * h);
    const int q[4] = {static_cast<int>(w.q.x), static_cast<int>(w.q.y), static_cast<int>(w.q.z),
                      static_cast<int>(w.q.w)};
    const int xlo[4] = {xl.x, xl.y, xl.z, xl.w}, xhi[4] = {xh.x, xh.y, xh.z, xh.w};
    int s_lo = 0, s_hi = 0, x_lo = 0, x_hi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s_lo = __dp4a(q[i] & 0x0F0F0F0F, xlo[i], s_lo);
      s_hi = __dp4a((q[i] >> 4) & 0x0F0F0F0F, xhi[i], s_hi);
      x_lo = __dp4a(0x01010101, xlo[i], x_lo);
      x_hi = __dp4a(0x01010101, xhi[i], x_hi);
    }
    const float d_lo = xs[2 * p].x, d_hi = xs[2 * p + 1].x;
    return d_lo * (w.dl0 * static_cast<float>(s_lo) - w.ml0 * static_cast<float>(x_lo)) +
           d_hi * (w.dl1 * static_cast<float>(s_hi) - w.ml1 * static_cast<float>(x_hi));
  }
};

// Q6_K: lane s = 8h + i holds, for l0 = 4i, elements 128h + 32k + l0.. (k = 0..3).
template <>
struct FastDot<kTypeQ6_K> {
  static constexpr int kLanes = 16;
  struct W {
    int q[4];
    float d[4];
  };
  __device__ static W Load(const uint8_t* b, int s) {
    const int h = s >> 3, l0 = 4 * (s & 7);
    const uint32_t a = U32A2(b + 64 * h + l0), c = U32A2(b + 64 * h + 32 + l0);
    const uint32_t hb = U32A2(b + 128 + 32 * h + l0);
    const float d = HalfToFloat(U16(b + 208));
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * h + l0 / 16);
    W w;
    w.q[0] = static_cast<int>(__vsub4((a & 0x0F0F0F0F) | ((hb & 0x03030303) << 4), 0x20202020));
    w.q[1] =
        static_cast<int>(__vsub4((c & 0x0F0F0F0F) | (((hb >> 2) & 0x03030303) << 4), 0x20202020));
    w.q[2] = static_cast<int>(
        __vsub4(((a >> 4) & 0x0F0F0F0F) | (((hb >> 4) & 0x03030303) << 4), 0x20202020));
    w.q[3] = static_cast<int>(
        __vsub4(((c >> 4) & 0x0F0F0F0F) | (((hb >> 6) & 0x03030303) << 4), 0x20202020));
#pragma unroll
    for (int k = 0; k < 4; ++k) w.d[k] = d * static_cast<float>(sc[2 * k]);
    return w;
  }
  __device__ static float Dot(const W& w, int s, const int8_t* xq, const float2* xs) {
    const int h = s >> 3, l0 = 4 * (s & 7);
    float acc = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int sumi = __dp4a(w.q[k], LoadInt(xq + 128 * h + 32 * k + l0), 0);
      acc += w.d[k] * xs[4 * h + k].x * static_cast<float>(sumi);
    }
    return acc;
  }
};

// Which job and row this warp computes; false when past the job's rows.
__device__ __forceinline__ bool LocateRow(const GemvParams& p, int* job, int* row) {
  int j = 0;
  while (j + 1 < p.n_jobs && static_cast<int>(blockIdx.x) >= p.block_start[j + 1]) ++j;
  *job = j;
  *row = (static_cast<int>(blockIdx.x) - p.block_start[j]) * kGemvRowsPerBlock +
         static_cast<int>(threadIdx.x >> 5);
  return *row < p.jobs[j].rows;
}

// Row `row` of a job: its weights, and (routed experts) which activation row it reads, in
// *xrow (0 for a plain product, whose tokens are the launch's). `row` must be below job.rows.
__device__ __forceinline__ const uint8_t* JobRow(const GemvJob& job, int row, int* xrow) {
  if (job.slot_expert) {
    const int s = row / job.slot_rows;
    *xrow = s / job.x_div;
    return job.expert_w[job.slot_expert[s]] +
           static_cast<int64_t>(row - s * job.slot_rows) * job.row_bytes;
  }
  *xrow = 0;
  return job.w + static_cast<int64_t>(row) * job.row_bytes;
}

template <int NT>
__device__ __forceinline__ void WriteRows(const GemvJob& job, int row, int t0, int nt,
                                          float (&acc)[NT]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float v = WarpSum(acc[t]);
    if (lane == 0 && t < nt) {
      const int64_t i = static_cast<int64_t>(t0 + t) * job.ldy + row;
      job.y[i] = job.accumulate ? job.y[i] + v : v;
      if (job.add_to) job.add_to[i] += v;
    }
  }
}

// A warp streams kFastRows rows at once in chunks of kIters warp-iterations' blocks: 16-byte
// loads cover each chunk's bytes exactly once (GGUF blocks are 18, 34, 144 or 210 bytes, so
// lanes reading their own blocks from global memory would request each sector several times),
// staged through shared memory, and the next chunks' loads are in flight while these are
// computed. (Larger chunks and two rows per warp, tried on the H200, were slower.)
template <int T>
struct Chunking;
template <>
struct Chunking<kTypeQ4_0> {
  static constexpr int kIters = 8;
};  // 1152 bytes
template <>
struct Chunking<kTypeQ8_0> {
  static constexpr int kIters = 4;
};  // 1088 bytes
template <>
struct Chunking<kTypeQ4_K> {
  static constexpr int kIters = 2;
};  // 1152 bytes
template <>
struct Chunking<kTypeQ6_K> {
  static constexpr int kIters = 4;
};                                                    // 1680 bytes
constexpr int kFastRows = kGemvFastRowsPerBlock / 4;  // rows per warp

template <int T, int NT>
__global__ void __launch_bounds__(128) GemvFastKernel(const __grid_constant__ GemvParams p) {
  PdlStart();
  using D = FastDot<T>;
  constexpr int kQK = Fmt<T>::kQK, kBytes = Fmt<T>::kBytes, kPer = 32 / D::kLanes;
  constexpr int kBlocksPerChunk = Chunking<T>::kIters * kPer;
  constexpr int kChunk = kBlocksPerChunk * kBytes;  // bytes, a multiple of 16
  static_assert(kChunk % 16 == 0, "chunks of whole 16-byte words");
  constexpr int kVecs = kChunk / 16, kPerLane = (kVecs + 31) / 32;
  __shared__ uint4 stage[4][kFastRows][kVecs];
  int j = 0;
  while (j + 1 < p.n_jobs && static_cast<int>(blockIdx.x) >= p.block_start[j + 1]) ++j;
  const GemvJob& job = p.jobs[j];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sub = lane % D::kLanes;
  const int row0 = ((static_cast<int>(blockIdx.x) - p.block_start[j]) * 4 + warp) * kFastRows;
  if (row0 >= job.rows) return;
  const int nr = min(kFastRows, job.rows - row0);
  const int t0 = blockIdx.y * NT, nt = min(NT, p.ntok - t0);
  const int64_t cols = p.cols, groups = cols / 32;
  const int nb = static_cast<int>(cols / kQK);
  const int64_t row_bytes = job.row_bytes;  // a multiple of 16 (GemvFastType)
  const uint8_t* w[kFastRows];
  int xrow = 0;  // a warp's rows lie in one slot (slot_rows % 4 == 0)
#pragma unroll
  for (int r = 0; r < kFastRows; ++r)  // a missing last row reads the one before (unused)
    w[r] = JobRow(job, row0 + min(r, nr - 1), &xrow);
  const int8_t* xq = static_cast<const int8_t*>(job.x) + (t0 + xrow) * cols;
  const float2* xs = job.xs + (t0 + xrow) * groups;
  float acc[kFastRows][NT];
#pragma unroll
  for (int r = 0; r < kFastRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  const int n_chunks = static_cast<int>((row_bytes + kChunk - 1) / kChunk);
  uint4 next[kFastRows][kPerLane];
  auto fetch = [&](int c) {
#pragma unroll
    for (int r = 0; r < kFastRows; ++r) {
#pragma unroll
      for (int v = 0; v < kPerLane; ++v) {
        const int i = lane + 32 * v;
        const int64_t off = static_cast<int64_t>(c) * kChunk + 16 * i;
        next[r][v] = (i < kVecs && off < row_bytes)
                         ? __ldcs(reinterpret_cast<const uint4*>(w[r] + off))
                         : make_uint4(0, 0, 0, 0);
      }
    }
  };
  fetch(0);
  for (int c = 0; c < n_chunks; ++c) {
    __syncwarp();
#pragma unroll
    for (int r = 0; r < kFastRows; ++r)
#pragma unroll
      for (int v = 0; v < kPerLane; ++v)
        if (lane + 32 * v < kVecs) stage[warp][r][lane + 32 * v] = next[r][v];
    __syncwarp();
    if (c + 1 < n_chunks) fetch(c + 1);
#pragma unroll 4
    for (int it = 0; it < Chunking<T>::kIters; ++it) {
      const int bl = it * kPer + lane / D::kLanes;  // block within the chunk
      const int b = c * kBlocksPerChunk + bl;
      if (b < nb) {
#pragma unroll
        for (int r = 0; r < kFastRows; ++r) {
          const typename D::W wr =
              D::Load(reinterpret_cast<const uint8_t*>(stage[warp][r]) + bl * kBytes, sub);
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            if (t < nt)
              acc[r][t] += D::Dot(wr, sub, xq + t * cols + static_cast<int64_t>(b) * kQK,
                                  xs + t * groups + static_cast<int64_t>(b) * (kQK / 32));
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kFastRows; ++r)
    if (r < nr) WriteRows<NT>(job, row0 + r, t0, nt, acc[r]);
}

// An activation load: through the read-only cache from global memory, or from shared memory
// (the tiles kernel stages a tile's activations there).
template <bool kShared, typename V>
__device__ __forceinline__ V LdAct(const V* p) {
  if constexpr (kShared) {
    return *p;
  } else {
    return __ldg(p);
  }
}

// A 16-byte word of 4-bit quants as dp4a operands: low nibbles in lo, high nibbles in hi.
__device__ __forceinline__ void SplitNibbles(const uint4& q, int (&lo)[4], int (&hi)[4]) {
  const int v[4] = {static_cast<int>(q.x), static_cast<int>(q.y), static_cast<int>(q.z),
                    static_cast<int>(q.w)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lo[i] = v[i] & 0x0F0F0F0F;
    hi[i] = (v[i] >> 4) & 0x0F0F0F0F;
  }
}

// ---- products over repacked weights (kRepacked) ----
//
// A lane's unit is one 16-byte word of a row's quant plane (Q6_K: of its low-bit plane) with the
// fields that scale it; lanes of a warp take consecutive units, so each warp-wide load is 512
// contiguous bytes. A warp computes R rows; Dot takes the unit's index less the batch's base
// (a multiple of 32, so its low bits, which say where in a super-block the unit lies, are the
// lane's, known after unrolling). Each lane first issues the loads of U units of every row (R x
// U words in flight per lane), then computes them: with R x U x 512 bytes in flight per warp
// the stream is latency-hidden without staging. The first batch is loaded before the wait for
// the previous kernel (weights are never written by one), so a product's first bytes arrive
// while the norm or activation kernel before it finishes.
template <int T>
struct Rp;

// Q4_0: unit = block (32 elements): qs bytes j hold elements j (low) and j + 16 (high).
template <>
struct Rp<kTypeQ4_0> {
  struct W {
    uint4 q;
    uint16_t d;
  };
  struct X {
    int4 a, b;
    float2 s;
  };
  __device__ static int Units(int64_t cols) { return static_cast<int>(cols / 32); }
  __device__ static W Load(const uint8_t* row, int64_t cols, int u) {
    return {__ldcs(reinterpret_cast<const uint4*>(row) + u),
            __ldcs(reinterpret_cast<const unsigned short*>(row + 16 * (cols / 32)) + u)};
  }
  template <bool S = false>
  __device__ static X LoadX(const int8_t* xq, const float2* xs, int u) {
    const int4* x = reinterpret_cast<const int4*>(xq) + 2 * u;
    return {LdAct<S>(x), LdAct<S>(x + 1), LdAct<S>(xs + u)};
  }
  __device__ static float Dot(const W& w, const X& x, int) {
    const int q[4] = {static_cast<int>(w.q.x), static_cast<int>(w.q.y), static_cast<int>(w.q.z),
                      static_cast<int>(w.q.w)};
    const int xa[4] = {x.a.x, x.a.y, x.a.z, x.a.w}, xb[4] = {x.b.x, x.b.y, x.b.z, x.b.w};
    int sumi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sumi = __dp4a(q[i] & 0x0F0F0F0F, xa[i], sumi);
      sumi = __dp4a((q[i] >> 4) & 0x0F0F0F0F, xb[i], sumi);
    }
    // sum (q - 8) x = d_x (sum q qx) - 8 d_x sum qx
    return HalfToFloat(w.d) * (x.s.x * static_cast<float>(sumi) - 8.0f * x.s.y);
  }
  // The unit's weights prepared once for several activation rows (the tiles kernel).
  struct P {
    int lo[4], hi[4];
    float d;
  };
  __device__ static P Prep(const W& w, int) {
    P p;
    SplitNibbles(w.q, p.lo, p.hi);
    p.d = HalfToFloat(w.d);
    return p;
  }
  __device__ static float DotP(const P& p, const X& x) {
    const int xa[4] = {x.a.x, x.a.y, x.a.z, x.a.w}, xb[4] = {x.b.x, x.b.y, x.b.z, x.b.w};
    int sumi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) sumi = __dp4a(p.hi[i], xb[i], __dp4a(p.lo[i], xa[i], sumi));
    return p.d * (x.s.x * static_cast<float>(sumi) - 8.0f * x.s.y);
  }
};

// Q8_0: unit = half a block (16 elements).
template <>
struct Rp<kTypeQ8_0> {
  struct W {
    uint4 q;
    uint16_t d;
  };
  struct X {
    int4 a;
    float s;
  };
  __device__ static int Units(int64_t cols) { return static_cast<int>(cols / 16); }
  __device__ static W Load(const uint8_t* row, int64_t cols, int u) {
    return {__ldcs(reinterpret_cast<const uint4*>(row) + u),
            __ldcs(reinterpret_cast<const unsigned short*>(row + 32 * (cols / 32)) + u / 2)};
  }
  template <bool S = false>
  __device__ static X LoadX(const int8_t* xq, const float2* xs, int u) {
    return {LdAct<S>(reinterpret_cast<const int4*>(xq) + u), LdAct<S>(&xs[u / 2].x)};
  }
  __device__ static float Dot(const W& w, const X& x, int) {
    int sumi = __dp4a(static_cast<int>(w.q.x), x.a.x, 0);
    sumi = __dp4a(static_cast<int>(w.q.y), x.a.y, sumi);
    sumi = __dp4a(static_cast<int>(w.q.z), x.a.z, sumi);
    sumi = __dp4a(static_cast<int>(w.q.w), x.a.w, sumi);
    return HalfToFloat(w.d) * x.s * static_cast<float>(sumi);
  }
  struct P {
    int q[4];
    float d;
  };
  __device__ static P Prep(const W& w, int) {
    return {{static_cast<int>(w.q.x), static_cast<int>(w.q.y), static_cast<int>(w.q.z),
             static_cast<int>(w.q.w)},
            HalfToFloat(w.d)};
  }
  __device__ static float DotP(const P& p, const X& x) {
    int sumi = __dp4a(p.q[0], x.a.x, 0);
    sumi = __dp4a(p.q[1], x.a.y, sumi);
    sumi = __dp4a(p.q[2], x.a.z, sumi);
    sumi = __dp4a(p.q[3], x.a.w, sumi);
    return p.d * x.s * static_cast<float>(sumi);
  }
};

// Q4_K: unit u of super-block sb = u / 8, i = u % 8 = 2p + h: qs[32p + 16h, +16), elements
// 64p + 16h.. (low nibbles, sub-block 2p) and 64p + 32 + 16h.. (high, sub-block 2p + 1). The
// sub-blocks' minimum terms cover whole groups of 32 activations: the h = 0 lane adds them
// from the groups' sums.
template <>
struct Rp<kTypeQ4_K> {
  struct W {
    uint4 q, m;
  };
  struct X {
    int4 lo, hi;
    float2 s0, s1;
  };
  __device__ static int Units(int64_t cols) { return static_cast<int>(cols / 32); }
  __device__ static W Load(const uint8_t* row, int64_t cols, int u) {
    return {__ldcs(reinterpret_cast<const uint4*>(row) + u),
            __ldcs(reinterpret_cast<const uint4*>(row + 128 * (cols / 256)) + u / 8)};
  }
  template <bool S = false>
  __device__ static X LoadX(const int8_t* xq, const float2* xs, int u) {
    const int sb = u >> 3, p = (u >> 1) & 3, h = u & 1;
    const int4* x = reinterpret_cast<const int4*>(xq + 256 * sb + 64 * p + 16 * h);
    const float2* s = xs + 8 * sb + 2 * p;
    return {LdAct<S>(x), LdAct<S>(x + 2), LdAct<S>(s), LdAct<S>(s + 1)};
  }
  __device__ static float Dot(const W& w, const X& x, int su) {
    const int p = (su >> 1) & 3, h = su & 1;
    // The 6-bit scales and minimums of sub-blocks 2p and 2p + 1, both at once: bytes 2p, 2p + 1
    // (p < 2), or the low nibbles of bytes 8 + 2q.. with the top bits of bytes 2q.. and 4 + 2q..
    // (p = 2 + q), as 16-bit pairs.
    const int sh = 16 * (p & 1);
    const uint32_t a = (w.m.y >> sh) & 0xFFFFu, b = (w.m.z >> sh) & 0xFFFFu,
                   c = (w.m.w >> sh) & 0xFFFFu;
    const uint32_t sc = p < 2 ? a & 0x3F3Fu : (c & 0x0F0Fu) | ((a >> 2) & 0x3030u);
    const uint32_t mn = p < 2 ? b & 0x3F3Fu : ((c >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u);
    const int q[4] = {static_cast<int>(w.q.x), static_cast<int>(w.q.y), static_cast<int>(w.q.z),
                      static_cast<int>(w.q.w)};
    const int xl[4] = {x.lo.x, x.lo.y, x.lo.z, x.lo.w}, xh[4] = {x.hi.x, x.hi.y, x.hi.z, x.hi.w};
    int s_lo = 0, s_hi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s_lo = __dp4a(q[i] & 0x0F0F0F0F, xl[i], s_lo);
      s_hi = __dp4a((q[i] >> 4) & 0x0F0F0F0F, xh[i], s_hi);
    }
    const float d = HalfToFloat(static_cast<uint16_t>(w.m.x & 0xFFFF));
    const float dmin = HalfToFloat(static_cast<uint16_t>(w.m.x >> 16));
    float r = d * (static_cast<float>(sc & 0xFF) * x.s0.x * static_cast<float>(s_lo) +
                   static_cast<float>(sc >> 8) * x.s1.x * static_cast<float>(s_hi));
    if (h == 0)
      r -= dmin * (static_cast<float>(mn & 0xFF) * x.s0.y + static_cast<float>(mn >> 8) * x.s1.y);
    return r;
  }
  struct P {
    int lo[4], hi[4];
    float d0, d1, m0, m1;  // scale x d of both sub-blocks; minimum x dmin (0 for h = 1)
  };
  __device__ static P Prep(const W& w, int su) {
    const int p2 = (su >> 1) & 3, h = su & 1;
    const int sh = 16 * (p2 & 1);
    const uint32_t a = (w.m.y >> sh) & 0xFFFFu, b = (w.m.z >> sh) & 0xFFFFu,
                   c = (w.m.w >> sh) & 0xFFFFu;
    const uint32_t sc = p2 < 2 ? a & 0x3F3Fu : (c & 0x0F0Fu) | ((a >> 2) & 0x3030u);
    const uint32_t mn = p2 < 2 ? b & 0x3F3Fu : ((c >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u);
    P p;
    SplitNibbles(w.q, p.lo, p.hi);
    const float d = HalfToFloat(static_cast<uint16_t>(w.m.x & 0xFFFF));
    const float dmin = h == 0 ? HalfToFloat(static_cast<uint16_t>(w.m.x >> 16)) : 0.0f;
    p.d0 = d * static_cast<float>(sc & 0xFF);
    p.d1 = d * static_cast<float>(sc >> 8);
    p.m0 = dmin * static_cast<float>(mn & 0xFF);
    p.m1 = dmin * static_cast<float>(mn >> 8);
    return p;
  }
  __device__ static float DotP(const P& p, const X& x) {
    const int xl[4] = {x.lo.x, x.lo.y, x.lo.z, x.lo.w}, xh[4] = {x.hi.x, x.hi.y, x.hi.z, x.hi.w};
    int s_lo = 0, s_hi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s_lo = __dp4a(p.lo[i], xl[i], s_lo);
      s_hi = __dp4a(p.hi[i], xh[i], s_hi);
    }
    return p.d0 * x.s0.x * static_cast<float>(s_lo) + p.d1 * x.s1.x * static_cast<float>(s_hi) -
           (p.m0 * x.s0.y + p.m1 * x.s1.y);
  }
};

// Q6_K: unit u of super-block sb = u / 8, c = u % 8 = 4n + m: ql[64n + 16m, +16), whose low
// nibbles are elements 128n + 16m.. and high nibbles 128n + 64 + 16m..; their two high bits are
// in qh[32n + 16(m % 2), +16) at shifts 2(m / 2) and 2(m / 2) + 4; scales 8n + m and 8n + 4 + m.
template <>
struct Rp<kTypeQ6_K> {
  struct W {
    uint4 ql, qh;
    uint2 sc;
    uint16_t d;
  };
  struct X {
    int4 a, b;
    float sa, sb;
  };
  __device__ static int Units(int64_t cols) { return static_cast<int>(cols / 32); }
  __device__ static W Load(const uint8_t* row, int64_t cols, int u) {
    const int64_t nsb = cols / 256;
    const int sb = u >> 3, n = (u >> 2) & 1, m = u & 3;
    W w;
    w.ql = __ldcs(reinterpret_cast<const uint4*>(row) + u);
    w.qh = __ldcs(reinterpret_cast<const uint4*>(row + 128 * nsb) + 4 * sb + 2 * n + (m & 1));
    w.sc = __ldcs(reinterpret_cast<const uint2*>(row + 192 * nsb) + 2 * sb + n);
    w.d = __ldcs(reinterpret_cast<const unsigned short*>(row + 208 * nsb) + sb);
    return w;
  }
  template <bool S = false>
  __device__ static X LoadX(const int8_t* xq, const float2* xs, int u) {
    const int sb = u >> 3, n = (u >> 2) & 1, m = u & 3;
    const int8_t* x = xq + 256 * sb + 128 * n + 16 * m;
    const float2* s = xs + 8 * sb + 4 * n + (m >> 1);
    return {LdAct<S>(reinterpret_cast<const int4*>(x)),
            LdAct<S>(reinterpret_cast<const int4*>(x + 64)), LdAct<S>(&s[0].x), LdAct<S>(&s[2].x)};
  }
  __device__ static float Dot(const W& w, const X& x, int su) {
    const int m = su & 3, s0 = 2 * (m >> 1);
    const uint32_t ql[4] = {w.ql.x, w.ql.y, w.ql.z, w.ql.w},
                   qh[4] = {w.qh.x, w.qh.y, w.qh.z, w.qh.w};
    const int xa[4] = {x.a.x, x.a.y, x.a.z, x.a.w}, xb[4] = {x.b.x, x.b.y, x.b.z, x.b.w};
    int sa = 0, sb = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = (ql[i] & 0x0F0F0F0Fu) | (((qh[i] >> s0) & 0x03030303u) << 4);
      const uint32_t hi = ((ql[i] >> 4) & 0x0F0F0F0Fu) | (((qh[i] >> (s0 + 4)) & 0x03030303u) << 4);
      sa = __dp4a(static_cast<int>(__vsub4(lo, 0x20202020u)), xa[i], sa);
      sb = __dp4a(static_cast<int>(__vsub4(hi, 0x20202020u)), xb[i], sb);
    }
    const float sc_a = static_cast<float>(static_cast<int8_t>(w.sc.x >> (8 * m)));
    const float sc_b = static_cast<float>(static_cast<int8_t>(w.sc.y >> (8 * m)));
    return HalfToFloat(w.d) *
           (sc_a * x.sa * static_cast<float>(sa) + sc_b * x.sb * static_cast<float>(sb));
  }
  struct P {
    int a[4], b[4];
    float sa, sb;
  };
  __device__ static P Prep(const W& w, int su) {
    const int m = su & 3, s0 = 2 * (m >> 1);
    const uint32_t ql[4] = {w.ql.x, w.ql.y, w.ql.z, w.ql.w},
                   qh[4] = {w.qh.x, w.qh.y, w.qh.z, w.qh.w};
    P p;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = (ql[i] & 0x0F0F0F0Fu) | (((qh[i] >> s0) & 0x03030303u) << 4);
      const uint32_t hi = ((ql[i] >> 4) & 0x0F0F0F0Fu) | (((qh[i] >> (s0 + 4)) & 0x03030303u) << 4);
      p.a[i] = static_cast<int>(__vsub4(lo, 0x20202020u));
      p.b[i] = static_cast<int>(__vsub4(hi, 0x20202020u));
    }
    const float d = HalfToFloat(w.d);
    p.sa = d * static_cast<float>(static_cast<int8_t>(w.sc.x >> (8 * m)));
    p.sb = d * static_cast<float>(static_cast<int8_t>(w.sc.y >> (8 * m)));
    return p;
  }
  __device__ static float DotP(const P& p, const X& x) {
    const int xa[4] = {x.a.x, x.a.y, x.a.z, x.a.w}, xb[4] = {x.b.x, x.b.y, x.b.z, x.b.w};
    int sa = 0, sb = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sa = __dp4a(p.a[i], xa[i], sa);
      sb = __dp4a(p.b[i], xb[i], sb);
    }
    return p.sa * x.sa * static_cast<float>(sa) + p.sb * x.sb * static_cast<float>(sb);
  }
};

// After a warp wrote rows [row0, row0 + nr) of the gate or up product (within one group of 32
// rows): count them; the warp that completes a group's 64 rows computes its 32 SwiGLU outputs
// (the arithmetic of the SwiGLU kernel) and their quantization, and clears the count.
__device__ __forceinline__ void GluEpilogue(const GemvParams& p, int row0, int nr) {
  const int lane = threadIdx.x & 31, g = row0 / 32;
  if (!WarpArrivesLast(&p.glu_counters[g], static_cast<uint32_t>(nr), 64)) return;
  const int i = 32 * g + lane;
  const float gv = __ldcg(p.jobs[0].y + i), uv = __ldcg(p.jobs[1].y + i);
  const float v = gv / (1.0f + expf(-gv)) * uv;
  p.glu_out[i] = v;
  if (p.glu_xq) QuantizeWarpStore(v, i, p.glu_xq, p.glu_xs);
  if (lane == 0) p.glu_counters[g] = 0;
}

// Kernel shapes (R rows per warp, U units per lane in flight, warps per block), by variant.
struct RpShape {
  int r, u, warps;
};
constexpr RpShape kRpShapes[kGemvVariants] = {{1, 4, 4}, {2, 4, 4}, {2, 2, 4},
                                              {4, 2, 4}, {1, 8, 4}, {2, 4, 8}};

template <int T, int NT, int R, int U, int WARPS>
__global__ void __launch_bounds__(32 * WARPS) GemvRpKernel(const __grid_constant__ GemvParams p) {
  using D = Rp<T>;
  int j = 0;
  while (j + 1 < p.n_jobs && static_cast<int>(blockIdx.x) >= p.block_start[j + 1]) ++j;
  const GemvJob& job = p.jobs[j];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = ((static_cast<int>(blockIdx.x) - p.block_start[j]) * WARPS + warp) * R;
  const int nr = min(R, job.rows - row0);  // <= 0: a warp past the job's rows
  const int64_t cols = p.cols;
  const int n_units = D::Units(cols);
  // Routed experts: the slots' experts come from the kernel before, so wait for it first.
  if (job.slot_expert) PdlStart();
  const uint8_t* w[R];
  int xrow = 0;  // a warp's rows lie in one slot (slot_rows % 4 == 0)
#pragma unroll
  for (int r = 0; r < R; ++r)  // a missing last row reads the one before (unused)
    w[r] = JobRow(job, nr > 0 ? row0 + min(r, nr - 1) : 0, &xrow);
  typename D::W wv[R][U];
  auto load = [&](int base) {
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int u = base + lane + 32 * k;
      if (u < n_units) {
#pragma unroll
        for (int r = 0; r < R; ++r) wv[r][k] = D::Load(w[r], cols, u);
      }
    }
  };
  if (nr > 0) load(0);
  PdlStart();
  if (nr <= 0) return;
  const int t0 = blockIdx.y * NT, nt = min(NT, p.ntok - t0);
  const int64_t groups = cols / 32;
  const int8_t* xq = static_cast<const int8_t*>(job.x) + (t0 + xrow) * cols;
  const float2* xs = job.xs + (t0 + xrow) * groups;
  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  for (int base = 0; base < n_units; base += 32 * U) {
    if (base > 0) load(base);
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int u = base + lane + 32 * k;
      if (u < n_units) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (t < nt) {
            const typename D::X x = D::LoadX(xq + t * cols, xs + t * groups, u);
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][t] += D::Dot(wv[r][k], x, lane + 32 * k);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r < nr) WriteRows<NT>(job, row0 + r, t0, nt, acc[r]);
  if constexpr (NT == 1) {
    if (p.glu_out) GluEpilogue(p, row0, nr);
  }
}

template <int T, int NT, int V>
void LaunchRpShape(const GemvParams& p, cudaStream_t stream) {
  constexpr RpShape s = kRpShapes[V];
  const dim3 grid(p.block_start[p.n_jobs], (p.ntok + NT - 1) / NT);
  LaunchKernel(GemvRpKernel<T, NT, s.r, s.u, s.warps>, grid, dim3(32 * s.warps), 0, stream, p);
}

template <int T, int NT>
void LaunchRp(const GemvParams& p, cudaStream_t stream) {
  if constexpr (NT == 1) {  // the other shapes only for one token: the variants' benchmark
    switch (p.variant) {
      case 1:
        return LaunchRpShape<T, NT, 1>(p, stream);
      case 2:
        return LaunchRpShape<T, NT, 2>(p, stream);
      case 3:
        return LaunchRpShape<T, NT, 3>(p, stream);
      case 4:
        return LaunchRpShape<T, NT, 4>(p, stream);
      case 5:
        return LaunchRpShape<T, NT, 5>(p, stream);
      default:
        break;
    }
  }
  LaunchRpShape<T, NT, 0>(p, stream);
}

// LaunchGemvTiles: a block stages its tile's activations (up to kMoeTileSlots rows) in shared
// memory once, then its warps take kTileRowsPerBlock / kTileWarps rows each, R at a time, each
// lane one 16-byte unit of each row per step and every slot's activations of that unit from
// shared memory: a weight word is loaded once for the tile's slots, an activation word once
// per R rows. Two blocks per multiprocessor (at most 128 registers a thread): measured on the
// H200 against one block (134 registers) and two rows per warp at three and four blocks, it
// gave the best prefill on qwen3-30b-a3b and was within 8 % of the best on qwen2moe.
constexpr int kTileWarps = 8, kTileR = 4, kTileRowsPerBlock = kGemvTilesRowsPerBlock;
constexpr int kTileMaxCols = 4096;  // 8 rows of int8 activations and their scales: 40 KiB

template <int T>
__global__ void __launch_bounds__(32 * kTileWarps, 2)
    GemvTilesKernel(const __grid_constant__ GemvTilesParams p) {
  constexpr int R = kTileR, NT = kMoeTileSlots;
  using D = Rp<T>;
  __shared__ int4 sxq[NT * kTileMaxCols / 16];
  __shared__ float2 sxs[NT * kTileMaxCols / 32];
  PdlStart();  // the tiles are the sort kernel's output
  TileBlock b;
  if (!LocateTileBlock(p, &b)) return;
  const int j = b.j, rb = b.rb;
  const int4 tl = b.tile;  // expert, first position, slots
  const int nt = tl.z;
  const int64_t cols = p.cols, groups = cols / 32;
  const int words = static_cast<int>(cols / 16);
  for (int i = threadIdx.x; i < nt * words; i += blockDim.x) {
    const int t = i / words, k = i % words;
    const int64_t xr = p.row_src ? p.row_src[tl.y + t] : tl.y + t;
    sxq[i] = reinterpret_cast<const int4*>(p.xq + xr * cols)[k];
  }
  for (int i = threadIdx.x; i < nt * groups; i += blockDim.x) {
    const int t = static_cast<int>(i / groups);
    const int64_t xr = p.row_src ? p.row_src[tl.y + t] : tl.y + t;
    sxs[i] = p.xs[xr * groups + i % groups];
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n_units = D::Units(cols);
  const uint8_t* base_w = p.expert_w[j][tl.x];
  const int8_t* xq = reinterpret_cast<const int8_t*>(sxq);
  for (int g = warp; g < kTileRowsPerBlock / R; g += kTileWarps) {
    const int row0 = rb * kTileRowsPerBlock + g * R;
    const int nr = min(R, p.rows - row0);
    if (nr <= 0) break;
    const uint8_t* w[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
      w[r] = base_w + static_cast<int64_t>(row0 + min(r, nr - 1)) * p.row_bytes[j];
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
    for (int u = lane; u < n_units; u += 32) {
      typename D::P wp[R];
#pragma unroll
      for (int r = 0; r < R; ++r) wp[r] = D::Prep(D::Load(w[r], cols, u), u);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t < nt) {
          const typename D::X x = D::template LoadX<true>(xq + t * cols, sxs + t * groups, u);
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r][t] += D::DotP(wp[r], x);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float v = WarpSum(acc[r][t]);
        if (lane == 0 && r < nr && t < nt)
          p.y[j][static_cast<int64_t>(tl.y + t) * p.rows + row0 + r] = v;
      }
    }
  }
}

template <int T, int NT>
__global__ void __launch_bounds__(128) GemvFloatKernel(const __grid_constant__ GemvParams p) {
  int j, row;
  if (!LocateRow(p, &j, &row)) {
    PdlStart();
    return;
  }
  const GemvJob& job = p.jobs[j];
  // Routed experts: the slots' experts come from the kernel before, so wait for it first.
  if (job.slot_expert) PdlStart();
  const int lane = threadIdx.x & 31;
  const int t0 = blockIdx.y * NT, nt = min(NT, p.ntok - t0);
  const int64_t cols = p.cols, chunks = cols / 8;
  int xrow = 0;
  const uint8_t* w = JobRow(job, row, &xrow);
  const float* x = static_cast<const float*>(job.x) + (t0 + xrow) * cols;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  // Four chunks' weights are read before any is used: a matrix of few rows (a router's) has a
  // warp or two per multiprocessor, and one read at a time left each waiting on memory. The
  // first four are read before waiting for the kernel before (which wrote x, not the weights),
  // so their trip to memory overlaps its end.
  constexpr int kInFlight = 4;
  float wv[kInFlight][8];
  auto load = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
      if (c0 + 32 * u < chunks) Dequant8<T>(w, (c0 + 32 * u) * 8, wv[u]);
  };
  load(lane);
  PdlStart();
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kInFlight) {
    if (c0 != lane) load(c0);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c >= chunks) break;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t < nt) {
          const float* xt = x + t * cols + c * 8;
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[t] = fmaf(wv[u][i], xt[i], acc[t]);
        }
      }
    }
  }
  if constexpr (T == kTypeF32 || T == kTypeF16 || T == kTypeBF16) {
    for (int64_t e = chunks * 8 + lane; e < cols; e += 32) {
      const float we = FloatElem<T>(w, e);
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (t < nt) acc[t] = fmaf(we, x[t * cols + e], acc[t]);
    }
  }
  WriteRows<NT>(job, row, t0, nt, acc);
}

// A router's product joined to its top-k (p.route; one token, one job of n_expert rows): a
// block a row, its warps splitting the columns, so that the few rows (128 for qwen3-30b-a3b)
// fill the GPU and a row's weights arrive in one trip to memory (a warp a row, four rows a
// block, took 14 us of a 1 MB matrix on an H100). Eight warps, so that a thread of a 2,048-column
// row reads one chunk of 8 floats: qwen3-30b-a3b 329.5-331.2 tokens/s against 324.1-328.3 with
// four (H100, alternating); qwen2moe-a2.7b level. The block that writes the last row routes.
constexpr int kRouterWarps = 8;
// NORM: the norm before the router joined (GemvParams::norm_y): x is the norm's input, and the
// product is taken over x * norm_w, scaled at the end by the norm's scale, which each block
// finds from the squares it summed on the way.
template <int T, bool NORM>
__global__ void __launch_bounds__(32 * kRouterWarps)
    GemvRouterKernel(const __grid_constant__ GemvParams p) {
  constexpr int kThreads = 32 * kRouterWarps, kInFlight = 4;
  const GemvJob& job = p.jobs[0];
  const int row = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int64_t cols = p.cols, chunks = cols / 8;
  const uint8_t* w = job.w + static_cast<int64_t>(row) * job.row_bytes;
  const float* x = static_cast<const float*>(job.x);
  float wv[kInFlight][8];
  auto load = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
      if (c0 + kThreads * u < chunks) Dequant8<T>(w, (c0 + kThreads * u) * 8, wv[u]);
  };
  load(tid);  // the weights before the wait: the kernel before wrote x only
  PdlStart();
  float acc = 0.0f;
  double ss = 0;
  auto input = [&](int64_t e) {  // x, times the norm's weight when joined
    const float v = x[e];
    if constexpr (!NORM) {
      return v;
    } else {
      ss += static_cast<double>(v) * v;
      return v * p.norm_w[e];
    }
  };
  for (int64_t c0 = tid; c0 < chunks; c0 += kThreads * kInFlight) {
    if (c0 != tid) load(c0);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int64_t c = c0 + kThreads * u;
      if (c >= chunks) break;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc = fmaf(wv[u][i], input(c * 8 + i), acc);
    }
  }
  for (int64_t e = chunks * 8 + tid; e < cols; e += kThreads)
    acc = fmaf(FloatElem<T>(w, e), input(e), acc);
  __shared__ float part[kRouterWarps];
  __shared__ double ss_part[kRouterWarps];
  acc = WarpSum(acc);
  if (lane == 0) part[warp] = acc;
  if constexpr (NORM) {
    ss = WarpSum(ss);
    if (lane == 0) ss_part[warp] = ss;
  }
  __syncthreads();
  float scale = 1.0f;
  if constexpr (NORM) {
    double total = 0;
    for (int k = 0; k < kRouterWarps; ++k) total += ss_part[k];
    scale = static_cast<float>(1.0 / sqrt(total / static_cast<double>(cols) +
                                          static_cast<double>(p.norm_eps)));
    // The norm's output in groups of 32, spread over the grid's warps (cols % 32 == 0).
    for (int64_t g = static_cast<int64_t>(row) * kRouterWarps + warp; g < cols / 32;
         g += static_cast<int64_t>(gridDim.x) * kRouterWarps) {
      const int64_t i = 32 * g + lane;
      const float o = x[i] * scale * p.norm_w[i];
      p.norm_y[i] = o;
      if (p.norm_xq) QuantizeWarpStore(o, i, p.norm_xq, p.norm_xs);
    }
  }
  if (warp != 0) return;
  const float v = WarpSum(lane < kRouterWarps ? part[lane] : 0.0f) * scale;
  if (lane == 0) job.y[row] = v;
  if (!WarpArrivesLast(p.route_counter, 1, static_cast<uint32_t>(job.rows))) return;
  __shared__ float prob[2 * kRouteMaxExperts];  // and the k chosen
  __shared__ float choice[kRouteMaxExperts];
  RouteToken(p.route, 0, prob, choice);
  if (lane == 0) *p.route_counter = 0;
}

__global__ void QuantizeQ8Kernel(const __grid_constant__ QuantizeQ8Params p) {
  PdlStart();
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (g >= p.n * (p.cols / 32)) return;
  const int64_t i = g * 32 + (threadIdx.x & 31);  // rows are whole blocks: cols % 32 == 0
  QuantizeWarpStore(p.x[i], i, p.xq, p.xs);
}

template <int T>
constexpr bool kHasFast = T == kTypeQ4_0 || T == kTypeQ8_0 || T == kTypeQ4_K || T == kTypeQ6_K;

template <int T, int NT>
void LaunchTyped(const GemvParams& p, cudaStream_t stream) {
  const dim3 grid(p.block_start[p.n_jobs], (p.ntok + NT - 1) / NT);
  if constexpr (kHasFast<T>) {
    if (p.fast) {
      LaunchKernel(GemvFastKernel<T, NT>, grid, dim3(32 * kGemvRowsPerBlock), 0, stream, p);
      return;
    }
  }
  if constexpr (NT == 1 && (T == kTypeF32 || T == kTypeF16 || T == kTypeBF16)) {
    if (p.route.logits) {
      if (p.norm_y)
        LaunchKernel(GemvRouterKernel<T, true>, dim3(p.jobs[0].rows), dim3(32 * kRouterWarps), 0,
                     stream, p);
      else
        LaunchKernel(GemvRouterKernel<T, false>, dim3(p.jobs[0].rows), dim3(32 * kRouterWarps), 0,
                     stream, p);
      return;
    }
  }
  LaunchKernel(GemvFloatKernel<T, NT>, grid, dim3(32 * kGemvRowsPerBlock), 0, stream, p);
}

}  // namespace

int GemvDefaultVariant(int type, int64_t rows) {
  // Measured on the H200 (bench_cuda_gemv, llama3-8b shapes): two rows per warp and two words
  // in flight per row won or came within a few percent for Q4_0, Q8_0 and Q6_K, except Q6_K's
  // tall output matrix, where one row and four words stream 7 % faster; Q4_K (more arithmetic
  // per word) does best with two rows and four words, the only shape faster than its GGUF
  // kernel on every matrix.
  if ((type & ~kRepacked) == kTypeQ6_K && rows >= 32768) return 0;
  if ((type & ~kRepacked) == kTypeQ4_K) return 1;
  return 2;
}

int GemvRowsPerBlock(int type, bool fast, int variant) {
  if (type & kRepacked) {
    const RpShape s = kRpShapes[variant >= 0 && variant < kGemvVariants ? variant : 0];
    return s.r * s.warps;
  }
  return fast ? kGemvFastRowsPerBlock : kGemvRowsPerBlock;
}

bool GemvFastType(int type, int64_t cols, int64_t row_bytes, const void* w) {
  if (type & kRepacked) return true;  // repacked only where the shape suits (RepackedRowBytes)
  // Rows are streamed in 16-byte words: whole words per row, from a 16-byte aligned start.
  if (row_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0) return false;
  switch (type) {
    case kTypeQ4_0:
    case kTypeQ8_0:
      return cols % 32 == 0;
    case kTypeQ4_K:
    case kTypeQ6_K:
      return cols % 256 == 0;
    default:
      return false;
  }
}

// Calls f.template operator()<NT>() with NT the kernel's token count for nt tokens (1, 2, 4, or
// 8 for more; the caller splits larger batches).
template <typename F>
void DispatchTokens(int nt, F&& f) {
  switch (nt) {
    case 1:
      f.template operator()<1>();
      break;
    case 2:
      f.template operator()<2>();
      break;
    case 4:
      f.template operator()<4>();
      break;
    default:
      f.template operator()<8>();
      break;
  }
}

void LaunchGemv(const void* params, cudaStream_t stream) {
  const GemvParams& p = *static_cast<const GemvParams*>(params);
  if (DispatchRepacked(p.type, [&]<int T>() {
        DispatchTokens(p.nt, [&]<int NT>() { LaunchRp<T, NT>(p, stream); });
      }))
    return;
  const bool ok = DispatchType(p.type, [&]<int T>() {
    DispatchTokens(p.nt, [&]<int NT>() { LaunchTyped<T, NT>(p, stream); });
  });
  if (!ok) FatalError("gemv: unsupported weight type " + std::to_string(p.type));
}

int64_t GemvTilesMaxCols() {
  return kTileMaxCols;
}

void LaunchGemvTiles(const void* params, cudaStream_t stream) {
  const GemvTilesParams& p = *static_cast<const GemvTilesParams*>(params);
  if (!DispatchRepacked(p.type, [&]<int T>() {
        LaunchKernel(GemvTilesKernel<T>, dim3(static_cast<unsigned>(p.grid)), dim3(32 * kTileWarps),
                     0, stream, p);
      }))
    FatalError("gemv tiles: unsupported weight type " + std::to_string(p.type));
}

void LaunchQuantizeQ8(const void* params, cudaStream_t stream) {
  const QuantizeQ8Params& p = *static_cast<const QuantizeQ8Params*>(params);
  const int64_t warps = p.n * (p.cols / 32);
  constexpr int kWarps = 8;
  LaunchKernel(QuantizeQ8Kernel, dim3(static_cast<unsigned>((warps + kWarps - 1) / kWarps)),
               dim3(32 * kWarps), 0, stream, p);
}

}  // namespace substrate::cuda
