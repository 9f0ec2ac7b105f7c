// Elementwise, normalisation, RoPE, dequantization and row-movement kernels of the CUDA backend.
// Each follows the arithmetic of the scalar reference (kernels/ops.cpp, quant/dequantize.cpp):
// sums of squares and RoPE angles in double, SiLU and sigmoid with expf.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant_device.cuh"

namespace substrate::cuda {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(int64_t n, int per = kThreads) {
  return static_cast<unsigned>(std::max<int64_t>(1, (n + per - 1) / per));
}

__device__ void Dequant8Any(int type, const uint8_t* row, int64_t cols, int64_t j0, float* y) {
  if (DispatchRepacked(type, [&]<int T>() { Dequant8Repacked<T>(row, cols, j0, y); })) return;
  switch (type) {
    case kTypeF32:
      Dequant8<kTypeF32>(row, j0, y);
      return;
    case kTypeF16:
      Dequant8<kTypeF16>(row, j0, y);
      return;
    case kTypeBF16:
      Dequant8<kTypeBF16>(row, j0, y);
      return;
    case kTypeQ4_0:
      Dequant8<kTypeQ4_0>(row, j0, y);
      return;
    case kTypeQ4_1:
      Dequant8<kTypeQ4_1>(row, j0, y);
      return;
    case kTypeQ5_0:
      Dequant8<kTypeQ5_0>(row, j0, y);
      return;
    case kTypeQ5_1:
      Dequant8<kTypeQ5_1>(row, j0, y);
      return;
    case kTypeQ8_0:
      Dequant8<kTypeQ8_0>(row, j0, y);
      return;
    case kTypeQ2_K:
      Dequant8<kTypeQ2_K>(row, j0, y);
      return;
    case kTypeQ3_K:
      Dequant8<kTypeQ3_K>(row, j0, y);
      return;
    case kTypeQ4_K:
      Dequant8<kTypeQ4_K>(row, j0, y);
      return;
    case kTypeQ5_K:
      Dequant8<kTypeQ5_K>(row, j0, y);
      return;
    case kTypeQ6_K:
      Dequant8<kTypeQ6_K>(row, j0, y);
      return;
    case kTypeIQ4_NL:
      Dequant8<kTypeIQ4_NL>(row, j0, y);
      return;
    case kTypeIQ4_XS:
      Dequant8<kTypeIQ4_XS>(row, j0, y);
      return;
    default:
#pragma unroll
      for (int i = 0; i < 8; ++i) y[i] = NAN;
  }
}

__device__ float FloatElemAny(int type, const uint8_t* row, int64_t j) {
  switch (type) {
    case kTypeF32:
      return FloatElem<kTypeF32>(row, j);
    case kTypeF16:
      return FloatElem<kTypeF16>(row, j);
    case kTypeBF16:
      return FloatElem<kTypeBF16>(row, j);
    default:
      return NAN;
  }
}

__global__ void DequantKernel(const __grid_constant__ DequantParams p) {
  PdlWait();  // its output may feed cuBLAS, whose kernels must not start before it is written
  const int64_t i = blockIdx.y;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (j0 >= p.cols) return;
  const int64_t r = p.ids ? p.ids[i] : p.r0 + i;
  float v[8];
  const int m = p.cols - j0 < 8 ? static_cast<int>(p.cols - j0) : 8;
  for (int k = 0; k < p.n_parts; ++k) {
    const uint8_t* row = p.parts[k].w + r * p.parts[k].row_bytes;
    float t[8];
    if (m == 8) {
      Dequant8Any(p.parts[k].type, row, p.cols, j0, t);
    } else {
      for (int e = 0; e < m; ++e) t[e] = FloatElemAny(p.parts[k].type, row, j0 + e);
    }
    for (int e = 0; e < m; ++e) v[e] = k == 0 ? t[e] : v[e] + t[e];
  }
  if (p.out_half) {
    __half* o = static_cast<__half*>(p.out) + i * p.ldo + j0;
    for (int e = 0; e < m; ++e) o[e] = __float2half_rn(v[e]);
  } else {
    float* o = static_cast<float*>(p.out) + i * p.ldo + j0;
    for (int e = 0; e < m; ++e) o[e] = v[e];
  }
}

// The prefill GEMM's operand: one weight part to half, 32 elements per thread (four
// Dequant8 of one sub-block, so the type is known at compile time) written as four 16-byte
// stores. Rows of a multiple of 32 elements, ldo a multiple of 8.
template <int T, bool kRp>
__global__ void DequantHalfKernel(const __grid_constant__ DequantParams p) {
  PdlWait();  // feeds cuBLAS, as DequantKernel
  const int64_t groups = p.cols / 32;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= p.n * groups) return;
  const int64_t i = g / groups, j0 = (g % groups) * 32;
  const uint8_t* row = p.parts[0].w + (p.r0 + i) * p.parts[0].row_bytes;
  uint4 out[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float v[8];
    if constexpr (kRp) {
      Dequant8Repacked<T>(row, p.cols, j0 + 8 * k, v);
    } else {
      Dequant8<T>(row, j0 + 8 * k, v);
    }
    __half2* h = reinterpret_cast<__half2*>(&out[k]);
#pragma unroll
    for (int e = 0; e < 4; ++e) h[e] = __floats2half2_rn(v[2 * e], v[2 * e + 1]);
  }
  uint4* o = reinterpret_cast<uint4*>(static_cast<__half*>(p.out) + i * p.ldo + j0);
#pragma unroll
  for (int k = 0; k < 4; ++k) o[k] = out[k];
}

template <typename T>
__device__ T BlockReduceSum(T v, T* shared) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T s = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) s += shared[w];
  __syncthreads();
  return s;
}

__global__ void ToHalfKernel(const __grid_constant__ ToHalfParams p) {
  PdlWait();  // feeds cuBLAS, as DequantKernel
  __shared__ float smax[kThreads / 32];
  __shared__ int sbad;
  const int64_t t = blockIdx.x;
  const float* x = p.x + t * p.cols;
  if (threadIdx.x == 0) sbad = 0;
  float amax = 0.0f;
  bool bad = false;
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) {
    amax = fmaxf(amax, fabsf(x[c]));
    bad |= !isfinite(x[c]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  __syncthreads();
  if (bad) sbad = 1;
  if ((threadIdx.x & 31) == 0) smax[threadIdx.x >> 5] = amax;
  __syncthreads();
  float m = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) m = fmaxf(m, smax[w]);
  // A power of two keeps the division exact; non-finite rows pass through as they are.
  const float s = (!sbad && m > 16384.0f) ? exp2f(ceilf(log2f(m / 16384.0f))) : 1.0f;
  if (threadIdx.x == 0) p.scales[t] = s;
  __half* xh = static_cast<__half*>(p.xh) + t * p.cols;
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) xh[c] = __float2half_rn(x[c] / s);
}

__global__ void ScaleRowsKernel(const __grid_constant__ ScaleRowsParams p) {
  PdlStart();
  const int64_t t = blockIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.cols) return;
  const float s = p.scales[t];
  if (s != 1.0f) p.y[t * p.ld + c] *= s;
}

// One block per row, each thread holding VPT elements in registers: the row is read once with
// all of a thread's loads in flight, then scaled (one block does a whole decode row, so the
// kernel is as long as its chain of dependent memory accesses).
template <int VPT>
__global__ void RmsNormKernel(const __grid_constant__ RmsNormParams p) {
  PdlStart();
  __shared__ double shared[32];
  int64_t t = blockIdx.x;
  const float* x = p.x + t * p.cols;
  float* y = p.y + t * p.cols;
  const float* wt = p.w;
  if (t >= p.rows) {  // the second norm
    t -= p.rows;
    x = p.x2 + t * p.cols;
    y = p.y2 + t * p.cols;
    wt = p.w2;
  }
  float v[VPT], w[VPT];  // the weights read with x, not after the reduction
  double ss = 0;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    v[k] = c < p.cols ? x[c] : 0.0f;
    w[k] = c < p.cols ? wt[c] : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < VPT; ++k) ss += static_cast<double>(v[k]) * v[k];
  ss = BlockReduceSum(ss, shared);
  const float scale =
      static_cast<float>(1.0 / sqrt(ss / static_cast<double>(p.cols) + static_cast<double>(p.eps)));
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    // With xq, cols % 32 == 0: a warp's 32 columns are all in the row or all past it.
    if (c < p.cols) {
      const float o = v[k] * scale * w[k];
      y[c] = o;
      if (p.xq) QuantizeWarpStore(o, t * p.cols + c, p.xq, p.xs);
    }
  }
}

__global__ void ElementwiseKernel(const __grid_constant__ ElementwiseParams p) {
  PdlStart();
  const int64_t n = p.rows * p.cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    switch (p.kind) {
      case kAddBias:
        p.y[i] += p.a[i % p.cols];
        break;
      case kFill:
        p.y[i] = p.value;
        break;
      case kAdd:
        p.y[i] += p.a[i];
        break;
      case kSwiGlu: {
        const float g = p.a[i];
        const float v = g / (1.0f + expf(-g)) * p.b[i];
        p.y[i] = v;
        // Whole warps: n and the grid's stride are multiples of 32 when xq is set.
        if (p.xq) QuantizeWarpStore(v, i, p.xq, p.xs);
        break;
      }
      case kScaleSigmoid: {
        const float s = 1.0f / (1.0f + expf(-p.a[(i / p.cols) * p.a_stride]));
        p.y[i] *= s;
        break;
      }
    }
  }
}

__global__ void CopyColumnsKernel(const __grid_constant__ CopyColumnsParams p) {
  PdlStart();
  const int64_t n = p.rows * p.n_cols;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t t = i / p.n_cols, c = i % p.n_cols;
  p.dst[t * p.dst_stride + p.dst_col + c] = p.src[t * p.src_stride + p.src_col + c];
}

// A joined head norm's scale (RopeParamsDev::norm_w) from a thread's pair: the head's `half`
// threads are consecutive and lie in one block. Every thread of the block calls it.
__device__ __forceinline__ float HeadNormScale(float x0, float x1, int half, int head_dim,
                                               float eps) {
  __shared__ double part[kRopeThreads / 32];
  double ss = static_cast<double>(x0) * x0 + static_cast<double>(x1) * x1;
  const int span = min(half, 32);
  for (int o = 1; o < span; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (half > 32) {  // the head's warps add their sums
    const int warp = static_cast<int>(threadIdx.x >> 5), per = half / 32;
    if ((threadIdx.x & 31) == 0) part[warp] = ss;
    __syncthreads();
    ss = 0;
    for (int k = warp / per * per; k < (warp / per + 1) * per; ++k) ss += part[k];
  }
  return static_cast<float>(1.0 / sqrt(ss / head_dim + static_cast<double>(eps)));
}

// One thread per (row, head, pair): the angle in double as the reference computes it.
__global__ void RopeKernel(const __grid_constant__ RopeParamsDev p) {
  const int half = p.n_rot / 2;
  const int heads = p.n_heads + p.n_heads2;
  int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool rotates = idx < p.rows * heads * half;
  // The angle (double pow, cos and sin: microseconds of latency) before the wait: positions and
  // frequencies come from the argument copy that precedes the whole chain, never from the
  // kernel before, so they are there already while the q/k product that feeds x still runs.
  const int i = static_cast<int>(idx % half);
  const int64_t t = idx / (static_cast<int64_t>(half) * heads);
  float c = 0.0f, s = 0.0f;
  if (rotates) {
    const double position = p.pos[t];
    const double inv_freq = pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_rot);
    double theta = position * inv_freq;
    if (p.yarn) {
      const double interp = theta / p.yarn_factor;
      const float y = (static_cast<float>(i) - p.corr_lo) / fmaxf(0.001f, p.corr_hi - p.corr_lo);
      const float ramp = 1.0f - fminf(1.0f, fmaxf(0.0f, y));
      theta = interp * (1.0 - ramp) + theta * ramp;
    } else {
      theta *= p.freq_scale;
    }
    c = static_cast<float>(cos(theta)) * p.attn_factor;
    s = static_cast<float>(sin(theta)) * p.attn_factor;
  }
  PdlStart();
  const int h = static_cast<int>((idx / half) % heads);
  const int a = p.neox ? i : 2 * i, b = p.neox ? i + half : 2 * i + 1;
  float* xh = h < p.n_heads ? p.x + (t * p.n_heads + h) * p.head_dim
                            : p.x2 + (t * p.n_heads2 + (h - p.n_heads)) * p.head_dim;
  float x0 = rotates ? xh[a] : 0.0f, x1 = rotates ? xh[b] : 0.0f;
  if (p.norm_w) {  // a joined head norm, as the norm kernel computes it
    const float scale = HeadNormScale(x0, x1, half, p.head_dim, p.norm_eps);
    const float* w = h < p.n_heads ? p.norm_w : p.norm_w2;
    if (rotates) {
      x0 = x0 * scale * w[a];
      x1 = x1 * scale * w[b];
    }
  }
  if (!rotates) {
    // The threads past the rotation copy v into the cache (a joined StoreKv).
    idx -= p.rows * heads * half;
    if (!p.kc || idx >= p.rows * p.v_cols) return;
    const int64_t tv = idx / p.v_cols, cv = idx % p.v_cols;
    const int64_t o = (*p.pos0 + tv) * p.v_stride + cv;
    const float v = p.v[idx];
    if (p.f16) {
      static_cast<__half*>(p.vc)[o] = __float2half_rn(v);
    } else {
      static_cast<float*>(p.vc)[o] = v;
    }
    return;
  }
  const float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
  xh[a] = y0;
  xh[b] = y1;
  if (p.kc && h >= p.n_heads) {  // k's rows into the cache (n_rot == head_dim: all of them)
    const int64_t o = (*p.pos0 + t) * p.k_stride + static_cast<int64_t>(h - p.n_heads) * p.head_dim;
    if (p.f16) {
      static_cast<__half*>(p.kc)[o + a] = __float2half_rn(y0);
      static_cast<__half*>(p.kc)[o + b] = __float2half_rn(y1);
    } else {
      static_cast<float*>(p.kc)[o + a] = y0;
      static_cast<float*>(p.kc)[o + b] = y1;
    }
  }
}

__global__ void GatherKernel(const __grid_constant__ GatherParams p) {
  PdlStart();
  const int64_t i = blockIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < p.cols) p.dst[i * p.cols + c] = p.src[static_cast<int64_t>(p.rows[i]) * p.cols + c];
}

// One thread per column, the rows in order: repeated destination rows add in the order given.
__global__ void ScatterAddKernel(const __grid_constant__ ScatterAddParams p) {
  PdlStart();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.cols) return;
  for (int64_t i = 0; i < p.n; ++i) {
    float* a = p.dst + static_cast<int64_t>(p.rows[i]) * p.cols + c;
    *a += p.weight[i] * p.src[i * p.cols + c];
  }
}

__global__ void AllFiniteKernel(const float* x, int64_t n, int* flag) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (!isfinite(x[i])) *flag = 1;
}

__global__ void FillPatternKernel(uint4* p, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = make_uint4(static_cast<uint32_t>(i), static_cast<uint32_t>(i * 7 + 1), 0x9e3779b9u,
                      static_cast<uint32_t>(i >> 3));
}

// Reads every 16 bytes once; the XOR keeps the loads (it is written only if it is a value no
// pattern produces).
__global__ void ReadKernel(const uint4* p, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

}  // namespace

bool PdlEnabled() {
  static const bool enabled = [] {
    const char* e = std::getenv("SUBSTRATE_CUDA_PDL");
    if (e && e[0] == '0') return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
      return false;
    return major >= 9;
  }();
  return enabled;
}

void LaunchDequant(const void* params, cudaStream_t stream) {
  const DequantParams& p = *static_cast<const DequantParams*>(params);
  if (p.out_half && p.n_parts == 1 && p.cols % 32 == 0 && p.ldo % 8 == 0 && !p.ids) {
    const int64_t threads = p.n * (p.cols / 32);
    const dim3 grid(Blocks(threads, 128));
    const bool typed = DispatchType(p.parts[0].type, [&]<int T>() {
      LaunchKernel(DequantHalfKernel<T, false>, grid, dim3(128), 0, stream, p);
    });
    if (typed) return;
    if (DispatchRepacked(p.parts[0].type, [&]<int T>() {
          LaunchKernel(DequantHalfKernel<T, true>, grid, dim3(128), 0, stream, p);
        }))
      return;
  }
  const dim3 grid(Blocks((p.cols + 7) / 8, 128), static_cast<unsigned>(p.n));
  LaunchKernel(DequantKernel, grid, dim3(128), 0, stream, p);
}

void LaunchToHalf(const void* params, cudaStream_t stream) {
  const ToHalfParams& p = *static_cast<const ToHalfParams*>(params);
  LaunchKernel(ToHalfKernel, dim3(static_cast<unsigned>(p.n)), dim3(kThreads), 0, stream, p);
}

void LaunchScaleRows(const void* params, cudaStream_t stream) {
  const ScaleRowsParams& p = *static_cast<const ScaleRowsParams*>(params);
  LaunchKernel(ScaleRowsKernel, dim3(Blocks(p.cols), static_cast<unsigned>(p.n)), dim3(kThreads), 0,
               stream, p);
}

void LaunchRmsNorm(const void* params, cudaStream_t stream) {
  const RmsNormParams& p = *static_cast<const RmsNormParams*>(params);
  // Threads: a multiple of 32, at most 1024, about four elements each.
  const int64_t threads = std::clamp<int64_t>((p.cols / 4 + 31) / 32 * 32, 32, 1024);
  const int64_t vpt = (p.cols + threads - 1) / threads;
  const dim3 grid(static_cast<unsigned>(p.rows + p.rows2)), block(static_cast<unsigned>(threads));
  if (vpt <= 1)
    LaunchKernel(RmsNormKernel<1>, grid, block, 0, stream, p);
  else if (vpt <= 2)
    LaunchKernel(RmsNormKernel<2>, grid, block, 0, stream, p);
  else if (vpt <= 4)
    LaunchKernel(RmsNormKernel<4>, grid, block, 0, stream, p);
  else if (vpt <= 8)
    LaunchKernel(RmsNormKernel<8>, grid, block, 0, stream, p);
  else if (vpt <= 16)
    LaunchKernel(RmsNormKernel<16>, grid, block, 0, stream, p);
  else if (vpt <= 32)
    LaunchKernel(RmsNormKernel<32>, grid, block, 0, stream, p);
  else
    FatalError("rms_norm: rows of " + std::to_string(p.cols) + " (at most 32768)");
}

void LaunchElementwise(const void* params, cudaStream_t stream) {
  const ElementwiseParams& p = *static_cast<const ElementwiseParams*>(params);
  const unsigned blocks = std::min<unsigned>(Blocks(p.rows * p.cols), 4096);
  LaunchKernel(ElementwiseKernel, dim3(blocks), dim3(kThreads), 0, stream, p);
}

void LaunchCopyColumns(const void* params, cudaStream_t stream) {
  const CopyColumnsParams& p = *static_cast<const CopyColumnsParams*>(params);
  LaunchKernel(CopyColumnsKernel, dim3(Blocks(p.rows * p.n_cols)), dim3(kThreads), 0, stream, p);
}

void LaunchRope(const void* params, cudaStream_t stream) {
  const RopeParamsDev& p = *static_cast<const RopeParamsDev*>(params);
  const int64_t n =
      p.rows * (p.n_heads + p.n_heads2) * (p.n_rot / 2) + (p.kc ? p.rows * p.v_cols : 0);
  LaunchKernel(RopeKernel, dim3(Blocks(n, kRopeThreads)), dim3(kRopeThreads), 0, stream, p);
}

void LaunchGather(const void* params, cudaStream_t stream) {
  const GatherParams& p = *static_cast<const GatherParams*>(params);
  LaunchKernel(GatherKernel, dim3(Blocks(p.cols), static_cast<unsigned>(p.n)), dim3(kThreads), 0,
               stream, p);
}

void LaunchScatterAdd(const void* params, cudaStream_t stream) {
  const ScatterAddParams& p = *static_cast<const ScatterAddParams*>(params);
  LaunchKernel(ScatterAddKernel, dim3(Blocks(p.cols, 128)), dim3(128), 0, stream, p);
}

void AllFiniteAsync(const float* x, int64_t n, int* flag, cudaStream_t stream) {
  const unsigned blocks = std::min<unsigned>(Blocks(n), 2048);
  AllFiniteKernel<<<blocks, kThreads, 0, stream>>>(x, n, flag);
}

double MeasureReadBandwidth(uint64_t bytes, int reps, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(bytes / 16);
  uint4* buf = nullptr;
  uint32_t* sink = nullptr;
  SUBSTRATE_CUDA_CHECK(cudaMalloc(&buf, static_cast<size_t>(n) * 16));
  SUBSTRATE_CUDA_CHECK(cudaMalloc(&sink, sizeof(uint32_t)));
  int sms = 0, dev = 0;
  SUBSTRATE_CUDA_CHECK(cudaGetDevice(&dev));
  SUBSTRATE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  FillPatternKernel<<<sms * 8, kThreads, 0, stream>>>(buf, n);
  cudaEvent_t a, b;
  SUBSTRATE_CUDA_CHECK(cudaEventCreate(&a));
  SUBSTRATE_CUDA_CHECK(cudaEventCreate(&b));
  double best = 0;
  for (int r = 0; r < reps + 1; ++r) {  // the first is a warm-up
    SUBSTRATE_CUDA_CHECK(cudaEventRecord(a, stream));
    ReadKernel<<<sms * 16, 512, 0, stream>>>(buf, n, sink);
    SUBSTRATE_CUDA_CHECK(cudaEventRecord(b, stream));
    SUBSTRATE_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    SUBSTRATE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0 && ms > 0) best = std::max(best, static_cast<double>(n) * 16 / (ms * 1e-3));
  }
  SUBSTRATE_CUDA_CHECK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(buf);
  cudaFree(sink);
  return best;
}

}  // namespace substrate::cuda
