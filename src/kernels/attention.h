// Causal multi-head attention over a float K/V history (the KV cache), with grouped-query heads.
// Attention picks the SIMD version (attention_simd.h) where the CPU has it, else the scalar
// reference; both parallel over (token, head) pairs.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace substrate {

struct AttentionShape {
  int n_head = 0;     // query heads
  int n_head_kv = 0;  // key/value heads; query head h reads kv head h / (n_head / n_head_kv)
  int dk = 0;         // key (and query) head size
  int dv = 0;         // value head size
  float scale = 1.0f; // multiplies q.k before the softmax (usually 1/sqrt(dk))
};

// q:   [n_tokens, n_head, dk], token t sits at position pos0 + t.
// k:   row p (position p) at k + p * k_stride holds [n_head_kv, dk]; rows 0..pos0+n_tokens-1.
// v:   row p at v + p * v_stride holds [n_head_kv, dv].
// out: [n_tokens, n_head, dv]. Token t attends to positions 0..pos0+t (causal).
void Attention(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
               const float* k, int64_t k_stride, const float* v, int64_t v_stride, float* out,
               ThreadPool& pool);

// The scalar reference the SIMD version is tested against: float q.k, softmax with a double
// sum, value mix accumulated in double.
void AttentionReference(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
                        const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                        float* out, ThreadPool& pool);

}  // namespace substrate
