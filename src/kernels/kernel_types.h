// Plain parameter types of the kernels (no functions), shared with the layers above that
// describe work for them: the backend interface and the model's hyperparameters.
#pragma once

#include <cstdint>

#include "format/dtype.h"

namespace substrate {

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

enum class GatingFunc { kSoftmax, kSigmoid };

// How a router picks k of E experts per token.
struct RoutingParams {
  int n_expert = 0;
  int k = 0;
  GatingFunc gating = GatingFunc::kSoftmax;
  bool normalize = false;  // renormalize the k weights to sum 1
  float scale = 1.0f;      // then multiply them (deepseek's routed_scaling_factor)
  int n_groups = 0;        // grouped routing (deepseek): keep the best n_groups_used groups
  int n_groups_used = 0;
  // Cache-aware routing: an expert with cached[e] != 0 (its weights already in memory) gets
  // cached_bonus added to its selection score, not to its weight, so a near-tie goes to it.
  // Null: exact routing.
  const uint8_t* cached = nullptr;
  float cached_bonus = 0;
};

}  // namespace substrate
