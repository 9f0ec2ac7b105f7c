#include "kernels/attention_simd.h"

#include "kernels/cpu_features.h"

namespace substrate {

bool AttentionSimd(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
                   const KvRows& kv, float* out, ThreadPool& pool) {
  if (ActiveIsa() < Isa::kAvx2 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv != 0) return false;
  if (kv.type != DType::kF32 && kv.type != DType::kF16) return false;
  if (ActiveIsa() >= Isa::kAvx512) {
    AttentionAvx512(s, q, n_tokens, pos0, kv, out, pool);
  } else {
    AttentionAvx2(s, q, n_tokens, pos0, kv, out, pool);
  }
  return true;
}

}  // namespace substrate
