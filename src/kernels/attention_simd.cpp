#include "kernels/attention_simd.h"

#include "kernels/cpu_features.h"

namespace substrate {

bool AttentionSimd(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
                   const float* k, int64_t k_stride, const float* v, int64_t v_stride, float* out,
                   ThreadPool& pool) {
  if (ActiveIsa() < Isa::kAvx2 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv != 0) return false;
  if (ActiveIsa() >= Isa::kAvx512) {
    AttentionAvx512(s, q, n_tokens, pos0, k, k_stride, v, v_stride, out, pool);
  } else {
    AttentionAvx2(s, q, n_tokens, pos0, k, k_stride, v, v_stride, out, pool);
  }
  return true;
}

}  // namespace substrate
