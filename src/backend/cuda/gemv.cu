// Matrix-vector products for decode (1..8 tokens per block, every weight type), one warp per
// weight row. Q4_0, Q8_0, Q4_K and Q6_K take int8 dot products (dp4a) over activations quantized
// to blocks of 32 (as the CPU kernels quantize them); the other types, and F16/BF16/F32 (whose
// products must stay exact), dequantize 8 weights at a time against float activations.
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant_device.cuh"

namespace substrate::cuda {
namespace {

__device__ __forceinline__ float WarpSum(float v) {
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
#pragma unroll
  for (int r = 0; r < kFastRows; ++r)  // a missing last row reads the one before (unused)
    w[r] = job.w + static_cast<int64_t>(row0 + min(r, nr - 1)) * row_bytes;
  const int8_t* xq = static_cast<const int8_t*>(job.x) + t0 * cols;
  const float2* xs = job.xs + t0 * groups;
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

template <int T, int NT>
__global__ void __launch_bounds__(128) GemvFloatKernel(const __grid_constant__ GemvParams p) {
  PdlStart();
  int j, row;
  if (!LocateRow(p, &j, &row)) return;
  const GemvJob& job = p.jobs[j];
  const int lane = threadIdx.x & 31;
  const int t0 = blockIdx.y * NT, nt = min(NT, p.ntok - t0);
  const int64_t cols = p.cols, chunks = cols / 8;
  const uint8_t* w = job.w + static_cast<int64_t>(row) * job.row_bytes;
  const float* x = static_cast<const float*>(job.x) + t0 * cols;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  for (int64_t c = lane; c < chunks; c += 32) {
    float wv[8];
    Dequant8<T>(w, c * 8, wv);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t < nt) {
        const float* xt = x + t * cols + c * 8;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[t] = fmaf(wv[i], xt[i], acc[t]);
      }
    }
  }
  if constexpr (T == kTypeF32 || T == kTypeF16 || T == kTypeBF16) {
    for (int64_t e = chunks * 8 + lane; e < cols; e += 32) {
      const float wv = FloatElem<T>(w, e);
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (t < nt) acc[t] = fmaf(wv, x[t * cols + e], acc[t]);
    }
  }
  WriteRows<NT>(job, row, t0, nt, acc);
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
  LaunchKernel(GemvFloatKernel<T, NT>, grid, dim3(32 * kGemvRowsPerBlock), 0, stream, p);
}

}  // namespace

bool GemvFastType(int type, int64_t cols, int64_t row_bytes, const void* w) {
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

void LaunchGemv(const void* params, cudaStream_t stream) {
  const GemvParams& p = *static_cast<const GemvParams*>(params);
  const bool ok = DispatchType(p.type, [&]<int T>() {
    switch (p.nt) {
      case 1:
        LaunchTyped<T, 1>(p, stream);
        break;
      case 2:
        LaunchTyped<T, 2>(p, stream);
        break;
      case 4:
        LaunchTyped<T, 4>(p, stream);
        break;
      default:
        LaunchTyped<T, 8>(p, stream);
        break;
    }
  });
  if (!ok) FatalError("gemv: unsupported weight type " + std::to_string(p.type));
}

void LaunchQuantizeQ8(const void* params, cudaStream_t stream) {
  const QuantizeQ8Params& p = *static_cast<const QuantizeQ8Params*>(params);
  const int64_t warps = p.n * (p.cols / 32);
  constexpr int kWarps = 8;
  LaunchKernel(QuantizeQ8Kernel, dim3(static_cast<unsigned>((warps + kWarps - 1) / kWarps)),
               dim3(32 * kWarps), 0, stream, p);
}

}  // namespace substrate::cuda
