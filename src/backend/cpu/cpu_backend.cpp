#include "backend/cpu/cpu_backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/aligned_buffer.h"
#include "kernels/attention.h"
#include "kernels/cpu_features.h"
#include "kernels/interleaved.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/routing.h"
#include "quant/quant.h"

namespace substrate {
namespace {

void FreeAligned(void*, void* data) { std::free(data); }

KvRows ReadRows(const KvLayer& kv) { return {kv.type, kv.k, kv.k_stride, kv.v, kv.v_stride}; }

// Row `pos` of a cache side (keys or values) whose rows are `stride` elements of `type`.
uint8_t* CacheRow(void* base, DType type, int64_t stride, int64_t pos) {
  return static_cast<uint8_t*>(base) + pos * stride * (type == DType::kF16 ? 2 : 4);
}

// Stores `n` float values as the cache's element type.
void StoreValues(const float* src, int64_t n, DType type, uint8_t* dst) {
  if (type == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  auto* h = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = Fp32ToFp16(src[i]);
}

// Element-wise work on at least this many values is split over the pool: a step of several
// sequences (or a prompt) norms and gates rows whose serial cost would rival the step's
// matmuls on a many-core machine, while one decode row stays on the caller. Rows and elements
// are computed as they are alone, so the split changes no bit.
constexpr int64_t kParallelElements = 16384;

}  // namespace

Expected<Buffer> CpuBackend::Allocate(size_t bytes, const std::string& account) {
  ASSIGN_OR_RETURN(LedgerCharge charge, ledger_->Charge(account, bytes));
  // 64-byte aligned (a cache line, every SIMD width), zeroed, large ones on 2 MiB pages as
  // AlignedBuffer's: decode reads each KV head's rows a whole position row apart, so on 4 KiB
  // pages each key of a long history cost a TLB miss (half the attention's time at 8K).
  void* p = AllocateZeroed(bytes, 64);
  if (!p) return OutOfMemory("allocating " + FormatBytes(bytes) + " for '" + account + "'");
  return Buffer(p, bytes, std::move(charge), &FreeAligned, nullptr);
}

void CpuBackend::Download(const Tensor& src, float* host) {
  std::memcpy(host, src.data, static_cast<size_t>(src.size()) * sizeof(float));
}

void CpuBackend::Upload(const float* host, const Tensor& dst) {
  std::memcpy(dst.data, host, static_cast<size_t>(dst.size()) * sizeof(float));
}

WeightLayout CpuBackend::AdoptedLayout(DType type, int64_t rows, int64_t cols) const {
  if (!options_.decode_layout) return WeightLayout::kRows;
  const WeightLayout layout = DecodeLayoutFor(type, rows, cols);
  return InterleavedKernelFor(layout, ActiveIsa()) ? layout : WeightLayout::kRows;
}

WeightLayout CpuBackend::AdoptResidentWeight(DType type, int64_t rows, int64_t cols,
                                             uint8_t* bytes) {
  if (AdoptedLayout(type, rows, cols) == WeightLayout::kRows) return WeightLayout::kRows;
  return InterleaveForDecode(type, rows, cols, bytes, pool_);
}

WeightLayout CpuBackend::AdoptStreamedWeight(DType type, int64_t rows, int64_t cols,
                                             uint8_t* bytes, bool reading_thread) {
  if (AdoptedLayout(type, rows, cols) == WeightLayout::kRows) return WeightLayout::kRows;
  return InterleaveForDecode(type, rows, cols, bytes, reading_thread ? nullptr : pool_);
}

void CpuBackend::EmbedRows(const WeightView& table, const int32_t* ids, int64_t n,
                           const Tensor& out) {
  for (int64_t t = 0; t < n; ++t) DequantizeWeightRow(table, ids[t], out.data + t * out.cols);
}

void CpuBackend::MatMul(const WeightView& w, const Tensor& x, const Tensor& y) {
  substrate::MatMul(w, x.data, x.rows, y.data, *pool_);
}

void CpuBackend::MatMulBatch(const MatMulOp* ops, int n_ops) {
  thread_local std::vector<MatMulJob> jobs;
  jobs.clear();
  for (int i = 0; i < n_ops; ++i) jobs.push_back({ops[i].w, ops[i].x.data, ops[i].x.rows, ops[i].y.data});
  substrate::MatMulBatch(jobs.data(), n_ops, *pool_);
}

const float* CpuBackend::VectorOf(const WeightView& w, int64_t n) {
  if (w.type == DType::kF32 && w.n_residuals == 0) return reinterpret_cast<const float*>(w.data);
  if (vec_.size() < static_cast<size_t>(n)) vec_.resize(static_cast<size_t>(n));
  DequantizeWeightRow(w, 0, vec_.data());
  return vec_.data();
}

void CpuBackend::RmsNorm(const Tensor& x, const WeightView& w, float eps, const Tensor& y) {
  const float* wv = VectorOf(w, x.cols);
  if (x.size() < kParallelElements) {
    substrate::RmsNorm(x.data, wv, eps, x.cols, x.rows, y.data);
    return;
  }
  pool_->ParallelFor(x.rows, 1, [&](int64_t r0, int64_t r1, int) {
    substrate::RmsNorm(x.data + r0 * x.cols, wv, eps, x.cols, r1 - r0, y.data + r0 * y.cols);
  });
}

void CpuBackend::AddBias(const Tensor& y, const WeightView& b) {
  substrate::AddBias(y.data, VectorOf(b, y.cols), y.cols, y.rows);
}

void CpuBackend::Fill(const Tensor& y, float value) {
  std::fill(y.data, y.data + y.size(), value);
}

void CpuBackend::Add(const Tensor& y, const Tensor& x) { AddInPlace(y.data, x.data, y.size()); }

void CpuBackend::SwiGlu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const int64_t n = out.size();
  if (n < kParallelElements) {
    substrate::SwiGlu(gate.data, up.data, n, out.data);
    return;
  }
  pool_->ParallelFor(n, kParallelElements / 4, [&](int64_t i0, int64_t i1, int) {
    substrate::SwiGlu(gate.data + i0, up.data + i0, i1 - i0, out.data + i0);
  });
}

void CpuBackend::ScaleRowsBySigmoid(const Tensor& y, const Tensor& g) {
  for (int64_t t = 0; t < y.rows; ++t) {
    const float s = Sigmoid(g.data[t * g.cols]);
    float* row = y.data + t * y.cols;
    for (int64_t i = 0; i < y.cols; ++i) row[i] *= s;
  }
}

void CpuBackend::CopyColumns(const Tensor& src, int64_t src_col, const Tensor& dst,
                             int64_t dst_col, int64_t n_cols) {
  for (int64_t t = 0; t < src.rows; ++t)
    std::memcpy(dst.data + t * dst.cols + dst_col, src.data + t * src.cols + src_col,
                static_cast<size_t>(n_cols) * sizeof(float));
}

void CpuBackend::Rope(const Tensor& x, int n_heads, int head_dim, int head_offset,
                      const int32_t* pos, const RopeParams& p) {
  // A prompt's rows split over the threads (each row's angles and rotation are its own: the
  // same bits either way); on one thread a 512-token pass left the other idle for ~1 % of it.
  if (x.size() < kParallelElements) {
    substrate::Rope(x.data + head_offset, x.rows, n_heads, head_dim, pos, p);
    return;
  }
  pool_->ParallelFor(x.rows, 1, [&](int64_t r0, int64_t r1, int) {
    substrate::Rope(x.data + r0 * n_heads * head_dim + head_offset, r1 - r0, n_heads, head_dim,
                    pos + r0, p);
  });
}

bool CpuBackend::AllFinite(const Tensor& x, const Tensor* also) {
  for (int64_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(x.data[i])) return false;
  return !also || AllFinite(*also);
}

void CpuBackend::StoreKv(const KvLayer& kv, int64_t pos0, const Tensor& k, const Tensor& v) {
  StoreValues(k.data, k.size(), kv.type, CacheRow(kv.k, kv.type, kv.k_stride, pos0));
  StoreValues(v.data, v.size(), kv.type, CacheRow(kv.v, kv.type, kv.v_stride, pos0));
}

void CpuBackend::StoreMlaKv(const KvLayer& kv, int64_t pos0, const Tensor& kvb,
                            const Tensor& latent, int64_t rope_col, const MlaShape& s) {
  const int dk = s.nope + s.rot;
  const int64_t per_head = s.nope + s.dv;
  vec_.resize(static_cast<size_t>(kv.k_stride + kv.v_stride));
  float* kr = vec_.data();
  float* vr = kr + kv.k_stride;
  for (int64_t t = 0; t < kvb.rows; ++t) {
    const float* src = kvb.data + t * kvb.cols;
    const float* kpe = latent.data + t * latent.cols + rope_col;
    for (int h = 0; h < s.n_head; ++h) {
      std::memcpy(kr + h * dk, src + h * per_head, static_cast<size_t>(s.nope) * 4);
      std::memcpy(kr + h * dk + s.nope, kpe, static_cast<size_t>(s.rot) * 4);
      std::memcpy(vr + h * s.dv, src + h * per_head + s.nope, static_cast<size_t>(s.dv) * 4);
    }
    StoreValues(kr, kv.k_stride, kv.type, CacheRow(kv.k, kv.type, kv.k_stride, pos0 + t));
    StoreValues(vr, kv.v_stride, kv.type, CacheRow(kv.v, kv.type, kv.v_stride, pos0 + t));
  }
}

void CpuBackend::Attention(const AttentionShape& s, const Tensor& q, const KvLayer& kv,
                           int64_t pos0, const Tensor& out) {
  substrate::Attention(s, q.data, q.rows, pos0, ReadRows(kv), out.data, *pool_);
}

void CpuBackend::Route(const Tensor& logits, const WeightView* bias, const RoutingParams& p,
                       int32_t* sel, float* weight) {
  const float* b = bias ? VectorOf(*bias, p.n_expert) : nullptr;
  for (int64_t t = 0; t < logits.rows; ++t)
    RouteRow(p, logits.data + t * logits.cols, b, sel + t * p.k, weight + t * p.k);
}

void CpuBackend::GatherRows(const Tensor& src, const int32_t* rows, int64_t n,
                            const Tensor& dst) {
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(dst.data + i * dst.cols, src.data + static_cast<int64_t>(rows[i]) * src.cols,
                static_cast<size_t>(src.cols) * sizeof(float));
}

void CpuBackend::ScatterAddRows(const Tensor& src, const int32_t* rows, const float* weight,
                                int64_t n, const Tensor& dst) {
  for (int64_t i = 0; i < n; ++i) {
    float* a = dst.data + static_cast<int64_t>(rows[i]) * dst.cols;
    const float* o = src.data + i * src.cols;
    const float wt = weight[i];
    for (int64_t k = 0; k < dst.cols; ++k) a[k] += wt * o[k];
  }
}

}  // namespace substrate
