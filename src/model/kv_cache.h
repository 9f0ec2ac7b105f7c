// KvCache: per layer, the keys and values of every position seen so far, as float32 rows,
// charged to the ledger account "kv_cache". Positions [0, n_past) are valid; a forward pass of
// n tokens writes rows [n_past, n_past + n) and then advances n_past.
//
// MLA (deepseek) stores the decompressed per-head keys and values, like ordinary attention
// with n_head_kv == n_head (simple and exact; the compressed latent cache is a later
// optimisation).
#pragma once

#include <cstdint>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/status.h"

namespace substrate {

struct ModelHParams;

class KvCache {
 public:
  static Expected<KvCache> Create(const ModelHParams& hp, int64_t n_ctx, MemoryLedger* ledger);

  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_past() const { return static_cast<int64_t>(tokens_.size()); }
  // Tokens whose keys/values are stored, in position order (for prompt reuse).
  const std::vector<int32_t>& tokens() const { return tokens_; }

  int64_t k_stride() const { return k_stride_; }  // floats per position row
  int64_t v_stride() const { return v_stride_; }
  float* k(int layer) { return k_.as<float>() + layer * n_ctx_ * k_stride_; }
  float* v(int layer) { return v_.as<float>() + layer * n_ctx_ * v_stride_; }

  // Forgets positions >= n (n <= n_past): the next pass overwrites them.
  void Truncate(int64_t n) { tokens_.resize(static_cast<size_t>(n)); }
  void Clear() { tokens_.clear(); }
  // Records that `n` tokens were appended (called by Model::Forward).
  void Append(const int32_t* tokens, int64_t n) { tokens_.insert(tokens_.end(), tokens, tokens + n); }

 private:
  int64_t n_ctx_ = 0;
  int64_t k_stride_ = 0, v_stride_ = 0;
  AlignedBuffer k_, v_;
  std::vector<int32_t> tokens_;
};

}  // namespace substrate
