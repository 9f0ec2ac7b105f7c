// Architecture hyperparameters, read from GGUF-style metadata ("qwen2.block_count", ...).
// A HF folder opened through ModelFile shows the same keys, so this is the only place that
// knows metadata key names.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "backend/types.h"

namespace substrate {

class Metadata;

struct ArchSpec;

struct ModelHParams {
  std::string arch;  // general.architecture, e.g. "qwen2moe"
  const ArchSpec* spec = nullptr;  // its entry in the architecture registry (model/arch.h)

  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int64_t n_embd = 0;
  int n_layer = 0;        // the main stack (block_count less the next-n layers after it)
  // Multi-token prediction (DeepSeek-V3, GLM-4.5: `<arch>.nextn_predict_layers`): layers
  // blk.n_layer .. + n_nextn - 1 that predict one token further from the main stack's last
  // hidden state. Plain decoding never runs them.
  int n_nextn = 0;
  // Whether ListOps lists the next-n layers' ops (Model::EnableNextn; off for every plan, store
  // and runtime, which then neither read nor charge them).
  bool list_nextn = false;
  int64_t n_ff = 0;       // dense FFN width
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim_k = 0;     // key/query head size (MLA: nope + rope)
  int head_dim_v = 0;     // value head size
  float norm_eps = 1e-6f;
  RopeParams rope;
  bool qk_norm = false;   // qwen3: RMSNorm of each q/k head before RoPE (tensors present)

  // Mixture of experts (n_expert == 0: dense).
  int n_expert = 0;
  int n_expert_used = 0;
  int64_t n_ff_exp = 0;          // width of one routed expert
  int64_t n_ff_shexp = 0;        // width of the shared expert(s) together (0: none)
  bool expert_weights_norm = false;  // renormalize the top-k weights to sum 1
  float expert_weights_scale = 1.0f; // deepseek's routed_scaling_factor
  GatingFunc gating = GatingFunc::kSoftmax;
  int n_expert_groups = 0;       // deepseek grouped routing (0 or 1: off)
  int n_group_used = 0;
  int n_leading_dense = 0;       // first layers use a dense FFN (deepseek)

  // MLA (deepseek).
  int q_lora_rank = 0;   // 0: q is a plain projection
  int kv_lora_rank = 0;
  int n_rot = 0;         // rope dims of each head (qk_rope_head_dim); nope = head_dim_k - n_rot

  bool is_moe_layer(int il) const { return n_expert > 0 && il >= n_leading_dense; }
  int nope_dim() const { return head_dim_k - n_rot; }
  float attn_scale = 0;  // q.k scale (1/sqrt(head_dim_k), YaRN-adjusted for deepseek)

  // How the router of a MoE layer picks its experts.
  RoutingParams routing() const;

  static Expected<ModelHParams> FromMetadata(const Metadata& md);
};

// The hyperparameters a next-n layer's own KV cache is made with (KvCache::Create, Bytes): its
// one layer.
ModelHParams NextnCacheHParams(const ModelHParams& hp);
// Whether `name` is a tensor of a next-n layer (blk.L.* with L >= first_nextn_layer).
bool IsNextnTensor(const std::string& name, int first_nextn_layer);
// The first next-n layer of the model `md` describes (block_count less nextn_predict_layers), or
// -1 when it has none.
int FirstNextnLayer(const Metadata& md);

}  // namespace substrate
