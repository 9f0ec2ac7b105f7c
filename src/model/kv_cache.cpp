#include "model/kv_cache.h"

#include "model/hparams.h"

namespace substrate {

Expected<KvCache> KvCache::Create(const ModelHParams& hp, int64_t n_ctx, MemoryLedger* ledger) {
  if (n_ctx <= 0 || n_ctx > (1 << 24))
    return InvalidArgument("context size " + std::to_string(n_ctx) + " out of range");
  KvCache c;
  c.n_ctx_ = n_ctx;
  const bool mla = hp.family == ArchFamily::kDeepseek;
  const int64_t kv_heads = mla ? hp.n_head : hp.n_head_kv;
  c.k_stride_ = kv_heads * hp.head_dim_k;
  c.v_stride_ = kv_heads * hp.head_dim_v;
  const uint64_t k_bytes = static_cast<uint64_t>(hp.n_layer) * n_ctx * c.k_stride_ * 4;
  const uint64_t v_bytes = static_cast<uint64_t>(hp.n_layer) * n_ctx * c.v_stride_ * 4;
  auto k = AlignedBuffer::Allocate(k_bytes, ledger, "kv_cache");
  if (!k.ok()) return k.status().WithContext("KV cache for " + std::to_string(n_ctx) + " tokens");
  auto v = AlignedBuffer::Allocate(v_bytes, ledger, "kv_cache");
  if (!v.ok()) return v.status().WithContext("KV cache for " + std::to_string(n_ctx) + " tokens");
  c.k_ = std::move(k).value();
  c.v_ = std::move(v).value();
  c.tokens_.reserve(static_cast<size_t>(n_ctx));
  return c;
}

}  // namespace substrate
