// Causal multi-head attention over a K/V history (the KV cache, float32 or float16 rows), with
// grouped-query heads.
// Attention picks the SIMD version (attention_simd.h) where the CPU has it, else the scalar
// reference; both parallel over (token, head) pairs.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "format/dtype.h"

namespace substrate {

struct AttentionShape {
  int n_head = 0;     // query heads
  int n_head_kv = 0;  // key/value heads; query head h reads kv head h / (n_head / n_head_kv)
  int dk = 0;         // key (and query) head size
  int dv = 0;         // value head size
  float scale = 1.0f; // multiplies q.k before the softmax (usually 1/sqrt(dk))
};

// The cached keys and values: position p's key row at k + p * k_stride elements, its value row
// at v + p * v_stride; elements of `type`, F32 or F16 (read as float, so F16 rows only round the
// cached values).
struct KvRows {
  DType type = DType::kF32;
  const void* k = nullptr;
  int64_t k_stride = 0;
  const void* v = nullptr;
  int64_t v_stride = 0;
};

// q:   [n_tokens, n_head, dk], token t sits at position pos0 + t.
// kv:  key row p holds [n_head_kv, dk], value row p [n_head_kv, dv]; rows 0..pos0+n_tokens-1.
// out: [n_tokens, n_head, dv]. Token t attends to positions 0..pos0+t (causal).
void Attention(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
               const KvRows& kv, float* out, ThreadPool& pool);

// The scalar reference the SIMD version is tested against: float q.k, softmax with a double
// sum, value mix accumulated in double.
void AttentionReference(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
                        const KvRows& kv, float* out, ThreadPool& pool);

}  // namespace substrate
