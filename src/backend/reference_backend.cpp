#include "backend/reference_backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/routing.h"
#include "quant/quant.h"

namespace substrate {
namespace {

void FreeHost(void*, void* data) { std::free(data); }

ThreadPool& OneThread() {
  static ThreadPool pool(1);
  return pool;
}

std::vector<float> VectorOf(const WeightView& w) {
  std::vector<float> v(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r) DequantizeWeightRow(w, r, v.data() + r * w.cols);
  return v;
}

void SetElement(void* base, DType type, int64_t i, float v) {
  if (type == DType::kF16) {
    static_cast<uint16_t*>(base)[i] = Fp32ToFp16(v);
  } else {
    static_cast<float*>(base)[i] = v;
  }
}

}  // namespace

Expected<Buffer> ReferenceBackend::Allocate(size_t bytes, const std::string& account) {
  ASSIGN_OR_RETURN(LedgerCharge charge, ledger_->Charge(account, bytes));
  void* p = std::calloc(bytes ? bytes : 1, 1);
  if (!p) return OutOfMemory("reference backend: " + FormatBytes(bytes));
  return Buffer(p, bytes, std::move(charge), &FreeHost, nullptr);
}

void ReferenceBackend::Download(const Tensor& src, float* host) {
  std::memcpy(host, src.data, static_cast<size_t>(src.size()) * sizeof(float));
}

void ReferenceBackend::Upload(const float* host, const Tensor& dst) {
  std::memcpy(dst.data, host, static_cast<size_t>(dst.size()) * sizeof(float));
}

void ReferenceBackend::EmbedRows(const WeightView& table, const int32_t* ids, int64_t n,
                                 const Tensor& out) {
  for (int64_t t = 0; t < n; ++t) DequantizeWeightRow(table, ids[t], out.data + t * out.cols);
}

void ReferenceBackend::MatMul(const WeightView& w, const Tensor& x, const Tensor& y) {
  MatMulReference(w, x.data, x.rows, y.data);
}

void ReferenceBackend::MatMulBatch(const MatMulOp* ops, int n_ops) {
  for (int i = 0; i < n_ops; ++i) MatMul(*ops[i].w, ops[i].x, ops[i].y);
}

void ReferenceBackend::RmsNorm(const Tensor& x, const WeightView& w, float eps, const Tensor& y) {
  const std::vector<float> scale = VectorOf(w);
  substrate::RmsNorm(x.data, scale.data(), eps, x.cols, x.rows, y.data);
}

void ReferenceBackend::AddBias(const Tensor& y, const WeightView& b) {
  const std::vector<float> bias = VectorOf(b);
  for (int64_t t = 0; t < y.rows; ++t)
    for (int64_t i = 0; i < y.cols; ++i) y.data[t * y.cols + i] += bias[static_cast<size_t>(i)];
}

void ReferenceBackend::Fill(const Tensor& y, float value) {
  for (int64_t i = 0; i < y.size(); ++i) y.data[i] = value;
}

void ReferenceBackend::Add(const Tensor& y, const Tensor& x) {
  for (int64_t i = 0; i < y.size(); ++i) y.data[i] += x.data[i];
}

void ReferenceBackend::SwiGlu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  for (int64_t i = 0; i < out.size(); ++i) {
    const double g = gate.data[i];
    out.data[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up.data[i]);
  }
}

void ReferenceBackend::ScaleRowsBySigmoid(const Tensor& y, const Tensor& g) {
  for (int64_t t = 0; t < y.rows; ++t) {
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(g.data[t * g.cols])));
    for (int64_t i = 0; i < y.cols; ++i)
      y.data[t * y.cols + i] = static_cast<float>(y.data[t * y.cols + i] * s);
  }
}

void ReferenceBackend::CopyColumns(const Tensor& src, int64_t src_col, const Tensor& dst,
                                   int64_t dst_col, int64_t n_cols) {
  for (int64_t t = 0; t < src.rows; ++t)
    for (int64_t i = 0; i < n_cols; ++i)
      dst.data[t * dst.cols + dst_col + i] = src.data[t * src.cols + src_col + i];
}

void ReferenceBackend::Rope(const Tensor& x, int n_heads, int head_dim, int head_offset,
                            const int32_t* pos, const RopeParams& p) {
  substrate::Rope(x.data + head_offset, x.rows, n_heads, head_dim, pos, p);
}

bool ReferenceBackend::AllFinite(const Tensor& x, const Tensor* also) {
  for (int64_t i = 0; i < x.size(); ++i)
    if (std::isnan(x.data[i]) || std::isinf(x.data[i])) return false;
  return !also || AllFinite(*also);
}

void ReferenceBackend::StoreKv(const KvLayer& kv, int64_t pos0, const Tensor& k,
                               const Tensor& v) {
  for (int64_t t = 0; t < k.rows; ++t) {
    for (int64_t i = 0; i < k.cols; ++i)
      SetElement(kv.k, kv.type, (pos0 + t) * kv.k_stride + i, k.data[t * k.cols + i]);
    for (int64_t i = 0; i < v.cols; ++i)
      SetElement(kv.v, kv.type, (pos0 + t) * kv.v_stride + i, v.data[t * v.cols + i]);
  }
}

void ReferenceBackend::StoreMlaKv(const KvLayer& kv, int64_t pos0, const Tensor& kvb,
                                  const Tensor& latent, int64_t rope_col, const MlaShape& s) {
  const int dk = s.nope + s.rot, per_head = s.nope + s.dv;
  for (int64_t t = 0; t < kvb.rows; ++t) {
    const int64_t krow = (pos0 + t) * kv.k_stride, vrow = (pos0 + t) * kv.v_stride;
    for (int h = 0; h < s.n_head; ++h) {
      for (int i = 0; i < s.nope; ++i)
        SetElement(kv.k, kv.type, krow + h * dk + i, kvb.data[t * kvb.cols + h * per_head + i]);
      for (int i = 0; i < s.rot; ++i)
        SetElement(kv.k, kv.type, krow + h * dk + s.nope + i,
                   latent.data[t * latent.cols + rope_col + i]);
      for (int i = 0; i < s.dv; ++i)
        SetElement(kv.v, kv.type, vrow + h * s.dv + i,
                   kvb.data[t * kvb.cols + h * per_head + s.nope + i]);
    }
  }
}

void ReferenceBackend::Attention(const AttentionShape& s, const Tensor& q, const KvLayer& kv,
                                 int64_t pos0, const Tensor& out) {
  AttentionReference(s, q.data, q.rows, pos0, {kv.type, kv.k, kv.k_stride, kv.v, kv.v_stride},
                     out.data, OneThread());
}

void ReferenceBackend::Route(const Tensor& logits, const WeightView* bias,
                             const RoutingParams& p, int32_t* sel, float* weight) {
  const std::vector<float> b = bias ? VectorOf(*bias) : std::vector<float>();
  for (int64_t t = 0; t < logits.rows; ++t)
    RouteRow(p, logits.data + t * logits.cols, bias ? b.data() : nullptr, sel + t * p.k,
             weight + t * p.k);
}

void ReferenceBackend::GatherRows(const Tensor& src, const int32_t* rows, int64_t n,
                                  const Tensor& dst) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < src.cols; ++c) dst.data[i * dst.cols + c] = src.data[rows[i] * src.cols + c];
}

void ReferenceBackend::ScatterAddRows(const Tensor& src, const int32_t* rows,
                                      const float* weight, int64_t n, const Tensor& dst) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < dst.cols; ++c)
      dst.data[rows[i] * dst.cols + c] += weight[i] * src.data[i * src.cols + c];
}

}  // namespace substrate
