// CpuBackend: the Backend over host memory and the SIMD kernels of kernels/ (AVX-512/AVX2/AMX
// or scalar, chosen at run time), parallel over a thread pool. Ops run synchronously on the
// calling thread and the pool; Tensors are host pointers.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "core/memory_ledger.h"
#include "core/thread_pool.h"

namespace substrate {

struct CpuBackendOptions {
  // Rearrange resident Q8_0 and Q4_0 matrices into the interleaved layouts
  // (kernels/interleaved_q8_0.h, interleaved_q4_0.h) when the CPU runs them (AVX-512): the same
  // bytes, faster decode and prefill.
  bool decode_layout = true;
};

class CpuBackend : public Backend {
 public:
  // `pool` and `ledger` must outlive the backend.
  CpuBackend(ThreadPool* pool, MemoryLedger* ledger, CpuBackendOptions options = {})
      : pool_(pool), ledger_(ledger), options_(options) {}

  const char* name() const override { return "cpu"; }
  ThreadPool& pool() { return *pool_; }

  Expected<Buffer> Allocate(size_t bytes, const std::string& account) override;
  void Download(const Tensor& src, float* host) override;
  void Upload(const float* host, const Tensor& dst) override;
  WeightLayout AdoptResidentWeight(DType type, int64_t rows, int64_t cols,
                                   uint8_t* bytes) override;
  WeightLayout AdoptStreamedWeight(DType type, int64_t rows, int64_t cols, uint8_t* bytes,
                                   bool reading_thread) override;
  WeightLayout AdoptedLayout(DType type, int64_t rows, int64_t cols) const override;

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
  // A vector weight (norm scale, bias) as floats: the view's own bytes when they are F32,
  // else dequantized into vec_ (grown once).
  const float* VectorOf(const WeightView& w, int64_t n);

  ThreadPool* pool_;
  MemoryLedger* ledger_;
  CpuBackendOptions options_;
  std::vector<float> vec_;
};

}  // namespace substrate
