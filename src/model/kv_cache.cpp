#include "model/kv_cache.h"

#include <algorithm>

#include "model/arch.h"
#include "model/hparams.h"

namespace substrate {
namespace {

// Elements per position row of K and V: MLA (deepseek) caches decompressed per-head rows.
void RowElements(const ModelHParams& hp, int64_t* k, int64_t* v) {
  const int64_t kv_heads = hp.spec && hp.spec->kv_per_query_head ? hp.n_head : hp.n_head_kv;
  *k = kv_heads * hp.head_dim_k;
  *v = kv_heads * hp.head_dim_v;
}

}  // namespace

uint64_t KvCache::Bytes(const ModelHParams& hp, int64_t n_ctx, DType type) {
  int64_t k, v;
  RowElements(hp, &k, &v);
  return static_cast<uint64_t>(hp.n_layer) * static_cast<uint64_t>(n_ctx) *
         static_cast<uint64_t>(k + v) * (type == DType::kF16 ? 2 : 4);
}

Expected<KvCache> KvCache::Create(const ModelHParams& hp, int64_t n_ctx, Backend& backend,
                                  DType type) {
  if (n_ctx <= 0 || n_ctx > (1 << 24))
    return InvalidArgument("context size " + std::to_string(n_ctx) + " out of range");
  if (type != DType::kF32 && type != DType::kF16)
    return InvalidArgument(std::string("KV cache type ") + DTypeName(type) +
                           " is not supported (f32 or f16)");
  KvCache c;
  c.type_ = type;
  c.n_layer_ = hp.n_layer;
  c.n_ctx_ = n_ctx;
  RowElements(hp, &c.k_stride_, &c.v_stride_);
  const uint64_t per_layer = static_cast<uint64_t>(hp.n_layer) * static_cast<uint64_t>(n_ctx) *
                             c.ElementBytes();
  auto k = backend.Allocate(per_layer * c.k_stride_, "kv_cache");
  if (!k.ok()) return k.status().WithContext("KV cache for " + std::to_string(n_ctx) + " tokens");
  auto v = backend.Allocate(per_layer * c.v_stride_, "kv_cache");
  if (!v.ok()) return v.status().WithContext("KV cache for " + std::to_string(n_ctx) + " tokens");
  c.k_ = std::move(k).value();
  c.v_ = std::move(v).value();
  c.tokens_.reserve(static_cast<size_t>(n_ctx));
  return c;
}

uint8_t* KvCache::KRow(int layer, int64_t pos) const {
  return static_cast<uint8_t*>(k_.data()) +
         (static_cast<size_t>(layer) * n_ctx_ + pos) * k_stride_ * ElementBytes();
}

uint8_t* KvCache::VRow(int layer, int64_t pos) const {
  return static_cast<uint8_t*>(v_.data()) +
         (static_cast<size_t>(layer) * n_ctx_ + pos) * v_stride_ * ElementBytes();
}

float* KvCache::HiddenRows(int64_t pos0, int64_t n, int64_t cols) {
  if (cols != hidden_cols_ || pos0 < hidden_pos0_ || pos0 > hidden_end()) {
    hidden_.clear();
    hidden_pos0_ = pos0;
    hidden_cols_ = cols;
  }
  // Rows nobody took (deferred verification's passes, say) go before they pile up.
  if (pos0 + n - hidden_pos0_ > max_hidden_rows_)
    DropHiddenBefore(std::min(pos0, pos0 + n - max_hidden_rows_));
  hidden_.resize(static_cast<size_t>((pos0 + n - hidden_pos0_) * cols));
  return hidden_.data() + (pos0 - hidden_pos0_) * cols;
}

int64_t KvCache::hidden_end() const {
  return hidden_cols_ ? hidden_pos0_ + static_cast<int64_t>(hidden_.size()) / hidden_cols_
                      : hidden_pos0_;
}

void KvCache::DropHiddenBefore(int64_t pos) {
  if (pos <= hidden_pos0_ || hidden_cols_ == 0) return;
  const int64_t drop = std::min(pos, hidden_end()) - hidden_pos0_;
  hidden_.erase(hidden_.begin(), hidden_.begin() + drop * hidden_cols_);
  hidden_pos0_ += drop;
}

Status KvCache::RestoreTokens(std::vector<int32_t> tokens) {
  if (static_cast<int64_t>(tokens.size()) > n_ctx_)
    return InvalidArgument("KV cache: " + std::to_string(tokens.size()) +
                           " tokens do not fit the context of " + std::to_string(n_ctx_));
  tokens_ = std::move(tokens);
  return Status::Ok();
}

KvLayer KvCache::layer(int layer) const {
  return {type_, KRow(layer, 0), k_stride_, VRow(layer, 0), v_stride_};
}

}  // namespace substrate
