// Causal multi-head attention over a K/V history (the KV cache, float32 or float16 rows), with
// grouped-query heads.
// Attention picks a SIMD version (attention_simd.h: blocked tiles with AVX-512, per (token, head)
// with AVX2) where the CPU has it, else the scalar reference. With any of them a row's result is
// the same whether one token or a whole prompt is in the pass.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "format/dtype.h"
#include "kernels/kernel_types.h"

namespace substrate {

// q:   [n_tokens, n_head, dk], token t sits at position pos0 + t.
// kv:  key row p holds [n_head_kv, dk], value row p [n_head_kv, dv]; rows 0..pos0+n_tokens-1.
// out: [n_tokens, n_head, dv]. Token t attends to positions 0..pos0+t (causal).
void Attention(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
               const KvRows& kv, float* out, ThreadPool& pool);

// Calls f(k, v) with kv's key and value rows at their element type: const float* for F32, const
// uint16_t* (fp16 bits) for F16. The kernels are templates over that type.
template <typename F>
void WithKvElements(const KvRows& kv, F&& f) {
  if (kv.type == DType::kF16) {
    f(static_cast<const uint16_t*>(kv.k), static_cast<const uint16_t*>(kv.v));
  } else {
    f(static_cast<const float*>(kv.k), static_cast<const float*>(kv.v));
  }
}

// The scalar reference the SIMD version is tested against: float q.k, softmax with a double
// sum, value mix accumulated in double.
void AttentionReference(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
                        const KvRows& kv, float* out, ThreadPool& pool);

}  // namespace substrate
