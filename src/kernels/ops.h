// Elementwise and per-row ops of the forward pass: norms, RoPE, softmax, activations.
// Scalar reference versions; SIMD variants may replace them later behind the same functions.
// All buffers are float32, row-major: `x[t * n + i]` is element i of row (token) t.
#pragma once

#include <cstdint>

namespace substrate {

// y[t, i] = x[t, i] / sqrt(mean_i(x[t, :]^2) + eps) * w[i]   (w may be nullptr: no scale).
// x and y may alias.
void RmsNorm(const float* x, const float* w, float eps, int64_t n, int64_t n_rows, float* y);

// How RoPE pairs the elements of a head: kNormal rotates (2i, 2i+1) (llama.cpp's "norm",
// used with GGUF-permuted llama weights and deepseek), kNeox rotates (i, i + n_rot/2) (qwen).
enum class RopeStyle { kNormal, kNeox };

struct RopeParams {
  RopeStyle style = RopeStyle::kNeox;
  int n_rot = 0;                 // rotated dimensions at the start of each head (<= head_dim)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;       // 1 / linear scaling factor
  // YaRN (rope_scaling type "yarn"): 0 means off.
  float yarn_factor = 0.0f;      // scaling factor (original ctx * factor = new ctx)
  int yarn_orig_ctx = 0;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  float attn_factor = 1.0f;      // multiplies cos/sin (YaRN's mscale)
};

// Rotates the first n_rot dims of each of n_heads heads (head stride head_dim) of every row,
// in place. x row t holds n_heads * head_dim floats at position pos[t].
void Rope(float* x, int64_t n_rows, int n_heads, int head_dim, const int32_t* pos,
          const RopeParams& p);

// In-place softmax over n elements (max-subtracted; -inf entries become 0).
void Softmax(float* x, int64_t n);

// out[i] = silu(gate[i]) * up[i]  (the SwiGLU of llama-family FFNs). out may alias gate or up.
void SwiGlu(const float* gate, const float* up, int64_t n, float* out);

float Silu(float x);
float Sigmoid(float x);

// y[i] += x[i]
void AddInPlace(float* y, const float* x, int64_t n);
// y[t, i] += b[i] for every row (bias add).
void AddBias(float* y, const float* b, int64_t n, int64_t n_rows);

}  // namespace substrate
