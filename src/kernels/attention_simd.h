// SIMD attention with the same contract as Attention (kernels/attention.h), which calls it:
// AVX2+FMA q.k dot products in float; the softmax and the value mix as the scalar reference
// does them (float exp, double sum, weights normalized in float, values accumulated in double,
// four doubles per vector), so the two differ only by the dot products' summation order. That
// matters: float value sums shifted logits of the tiny MoE models enough to flip near-tied
// expert routing against float64 references. One scratch row per thread (no allocation per call
// once warm). Returns false, doing nothing, when the CPU (or SUBSTRATE_ISA) has no AVX2, so a
// caller can write `if (!AttentionSimd(...)) <scalar path>`.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "kernels/attention.h"

namespace substrate {

bool AttentionSimd(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
                   const KvRows& kv, float* out, ThreadPool& pool);

// The bodies: AVX2 (attention_simd_avx2.cpp; needs AVX2 and FMA) and AVX-512
// (attention_simd_avx512.cpp; needs the kAvx512 tier). AttentionSimd picks the best.
void AttentionAvx2(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
                   const KvRows& kv, float* out, ThreadPool& pool);
void AttentionAvx512(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
                     const KvRows& kv, float* out, ThreadPool& pool);

// Blocked (flash-style) attention (attention_blocked_avx512.cpp; needs the kAvx512 tier, F32 or
// F16 rows, n_head a multiple of n_head_kv, dv <= kBlockedMaxDv): query rows of one KV head per
// work item, keys and values loaded once for all of them, online softmax with a vectorized exp,
// value sums in double. Its scores add in AttentionSimd's order; the softmax rounds differently.
// A row's bits are the same whichever pass (one token or many) computes it. Attention uses it
// wherever it can.
constexpr int kBlockedMaxDv = 512;
void AttentionBlockedAvx512(const AttentionShape& s, const float* q, int64_t n_tokens,
                            int64_t pos0, const KvRows& kv, float* out, ThreadPool& pool);

}  // namespace substrate
