// ReferenceBackend: every Backend op the plainest way, on the host, one thread: the kernels'
// scalar references (MatMulReference: weights dequantized row by row with their residuals and
// float dot products of unquantized activations; AttentionReference; the scalar norm, RoPE and
// routing) and plain loops. It is what each backend is tested against (tests/backend: the
// differential op test), not a backend to run models with.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "core/memory_ledger.h"

namespace substrate {

class ReferenceBackend : public Backend {
 public:
  explicit ReferenceBackend(MemoryLedger* ledger) : ledger_(ledger) {}
  const char* name() const override { return "reference"; }

  Expected<Buffer> Allocate(size_t bytes, const std::string& account) override;
  void Download(const Tensor& src, float* host) override;
  void Upload(const float* host, const Tensor& dst) override;

  void EmbedRows(const WeightView& table, const int32_t* ids, int64_t n,
                 const Tensor& out) override;
  void MatMul(const WeightView& w, const Tensor& x, const Tensor& y) override;
  void MatMulBatch(const MatMulOp* ops, int n_ops) override;
  void RmsNorm(const Tensor& x, const WeightView& w, float eps, const Tensor& y) override;
  void AddBias(const Tensor& y, const WeightView& b) override;

  void Fill(const Tensor& y, float value) override;
  void Add(const Tensor& y, const Tensor& x) override;
  void SwiGlu(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void ScaleRowsBySigmoid(const Tensor& y, const Tensor& g) override;
  void CopyColumns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col,
                   int64_t n_cols) override;
  void Rope(const Tensor& x, int n_heads, int head_dim, int head_offset, const int32_t* pos,
            const RopeParams& p) override;
  bool AllFinite(const Tensor& x, const Tensor* also = nullptr) override;

  void StoreKv(const KvLayer& kv, int64_t pos0, const Tensor& k, const Tensor& v) override;
  void StoreMlaKv(const KvLayer& kv, int64_t pos0, const Tensor& kvb, const Tensor& latent,
                  int64_t rope_col, const MlaShape& s) override;
  void Attention(const AttentionShape& s, const Tensor& q, const KvLayer& kv, int64_t pos0,
                 const Tensor& out) override;

  void Route(const Tensor& logits, const WeightView* bias, const RoutingParams& p, int32_t* sel,
             float* weight) override;
  void GatherRows(const Tensor& src, const int32_t* rows, int64_t n, const Tensor& dst) override;
  void ScatterAddRows(const Tensor& src, const int32_t* rows, const float* weight, int64_t n,
                      const Tensor& dst) override;

 private:
  MemoryLedger* ledger_;
};

}  // namespace substrate
