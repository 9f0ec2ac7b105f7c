// Elementwise and per-row ops of the forward pass: norms, RoPE, softmax, activations.
// Scalar reference versions; SIMD variants replace some behind the same functions (SwiGlu on
// the kAvx512 tier).
// All buffers are float32, row-major: `x[t * n + i]` is element i of row (token) t.
#pragma once

#include <cstdint>

#include "kernels/kernel_types.h"

namespace substrate {

// y[t, i] = x[t, i] / sqrt(mean_i(x[t, :]^2) + eps) * w[i]   (w may be nullptr: no scale).
// x and y may alias.
void RmsNorm(const float* x, const float* w, float eps, int64_t n, int64_t n_rows, float* y);

// Rotates the first n_rot dims of each of n_heads heads (head stride head_dim) of every row,
// in place. x row t holds n_heads * head_dim floats at position pos[t].
void Rope(float* x, int64_t n_rows, int n_heads, int head_dim, const int32_t* pos,
          const RopeParams& p);

// In-place softmax over n elements (max-subtracted; -inf entries become 0; any NaN makes every
// output NaN).
void Softmax(float* x, int64_t n);

// out[i] = silu(gate[i]) * up[i]  (the SwiGLU of llama-family FFNs). out may alias gate or up.
void SwiGlu(const float* gate, const float* up, int64_t n, float* out);

float Silu(float x);
float Sigmoid(float x);

// y[i] += x[i]
void AddInPlace(float* y, const float* x, int64_t n);
// y[t, i] += b[i] for every row (bias add).
void AddBias(float* y, const float* b, int64_t n, int64_t n_rows);

// The kAvx512 tier's SwiGlu (ops_avx512.cpp), which SwiGlu calls there: the same function with
// a polynomial exp (relative error ~1e-7).
namespace avx512 {
void SwiGlu(const float* gate, const float* up, int64_t n, float* out);
}  // namespace avx512

}  // namespace substrate
