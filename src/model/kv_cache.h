// KvCache: per layer, the keys and values of every position seen so far, as float32 or float16
// rows (F16 halves the cache; attention reads it back as float), in the backend's memory,
// charged to the ledger account "kv_cache". Backend ops write and read the rows (StoreKv,
// Attention); this class keeps which tokens they hold. Positions [0, n_past) are valid; a forward pass of n tokens writes rows
// [n_past, n_past + n) and then advances n_past.
//
// MLA (deepseek) stores the decompressed per-head keys and values, like ordinary attention
// with n_head_kv == n_head (simple and exact; the compressed latent cache is a later
// optimisation).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "format/dtype.h"

namespace substrate {

struct ModelHParams;

class KvCache {
 public:
  // type: DType::kF32 (exact) or DType::kF16. `backend` must outlive the cache.
  static Expected<KvCache> Create(const ModelHParams& hp, int64_t n_ctx, Backend& backend,
                                  DType type = DType::kF32);
  // Bytes the cache of `n_ctx` positions takes (what Create charges), for budgets.
  static uint64_t Bytes(const ModelHParams& hp, int64_t n_ctx, DType type);

  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_past() const { return static_cast<int64_t>(tokens_.size()); }
  // Tokens whose keys/values are stored, in position order (for prompt reuse).
  const std::vector<int32_t>& tokens() const { return tokens_; }

  DType type() const { return type_; }
  int64_t k_stride() const { return k_stride_; }  // elements per position row
  int64_t v_stride() const { return v_stride_; }
  // Layer `layer`'s rows, for the backend's ops.
  KvLayer layer(int layer) const;

  // Raw rows, for saving and restoring sessions: position p's key row of `layer` at
  // KeyBytes(layer) + p * k_row_bytes() (likewise values). Host memory: a backend whose memory
  // is not the host's copies through Download/Upload instead.
  int n_layer() const { return n_layer_; }
  size_t k_row_bytes() const { return static_cast<size_t>(k_stride_) * ElementBytes(); }
  size_t v_row_bytes() const { return static_cast<size_t>(v_stride_) * ElementBytes(); }
  uint8_t* KeyBytes(int layer) { return KRow(layer, 0); }
  uint8_t* ValueBytes(int layer) { return VRow(layer, 0); }
  // Declares positions [0, tokens.size()) to hold `tokens`, whose rows the caller has written.
  Status RestoreTokens(std::vector<int32_t> tokens);

  // Forgets positions >= n (n <= n_past): the next pass overwrites them.
  void Truncate(int64_t n) { tokens_.resize(static_cast<size_t>(n)); }
  void Clear() { tokens_.clear(); }
  // Records that `n` tokens were appended (called by Model::Forward).
  void Append(const int32_t* tokens, int64_t n) { tokens_.insert(tokens_.end(), tokens, tokens + n); }

  // The main stack's last hidden state (before the output norm) of each position a pass
  // evaluates, kept on the host for a next-n drafter (Model::ForwardNextn) when keep_hidden is
  // set: rows of positions [hidden_begin(), hidden_end()), `cols` floats each. A pass at pos0
  // keeps the rows before it when they touch it, else starts over at pos0; at most `max_rows`
  // are kept (the oldest go first; a pass's own rows always stay).
  void set_keep_hidden(bool on, int64_t max_rows) {
    keep_hidden_ = on;
    max_hidden_rows_ = max_rows;
  }
  bool keeps_hidden() const { return keep_hidden_; }
  // Room for rows [pos0, pos0 + n) (called by Model::Forward).
  float* HiddenRows(int64_t pos0, int64_t n, int64_t cols);
  int64_t hidden_begin() const { return hidden_pos0_; }
  int64_t hidden_end() const;
  // Whether the rows of positions [begin, end) are all kept.
  bool HoldsHidden(int64_t begin, int64_t end) const {
    return hidden_begin() <= begin && hidden_end() >= end;
  }
  // Row of position pos (hidden_begin() <= pos < hidden_end()).
  const float* HiddenRow(int64_t pos) const {
    return hidden_.data() + (pos - hidden_pos0_) * hidden_cols_;
  }
  // Forgets the rows before pos (the drafter has used them).
  void DropHiddenBefore(int64_t pos);

 private:
  size_t ElementBytes() const { return type_ == DType::kF16 ? 2 : 4; }
  uint8_t* KRow(int layer, int64_t pos) const;
  uint8_t* VRow(int layer, int64_t pos) const;

  DType type_ = DType::kF32;
  int n_layer_ = 0;
  int64_t n_ctx_ = 0;
  int64_t k_stride_ = 0, v_stride_ = 0;
  Buffer k_, v_;
  std::vector<int32_t> tokens_;
  bool keep_hidden_ = false;
  int64_t hidden_pos0_ = 0, hidden_cols_ = 0, max_hidden_rows_ = 0;
  std::vector<float> hidden_;
};

}  // namespace substrate
