// DeepSeek V2/V3 (GGUF arch "deepseek2"): multi-head latent attention and a routed MoE.
//
//   q      = Wq_b . norm(Wq_a . x)                  [n, n_head, nope + rope]
//   latent = Wkv_a . x                              [n, kv_lora + rope]  (rope part: one shared key)
//   k, v   = Wkv_b . norm(latent[:kv_lora])         [n, n_head, nope + v]
//   x = x + Wo . Attention(q, [k_nope, RoPE(k_rope)], v)
//   x = x + FFN(norm(x))   the first leading_dense_block_count layers dense; then MoE with
//                          sigmoid scores, correction bias for selection only, group-limited
//                          top-k, renormalized weights x routed_scaling_factor, shared experts.
#include "model/model.h"

namespace substrate {

Status ResolveDeepseekLayer(const WeightSource& s, const ModelHParams& hp, int il,
                            LayerWeights* w) {
  const uint64_t d = static_cast<uint64_t>(hp.n_embd);
  const uint64_t q_dim = static_cast<uint64_t>(hp.n_head) * hp.head_dim_k;
  const uint64_t lora = static_cast<uint64_t>(hp.kv_lora_rank);
  const uint64_t rot = static_cast<uint64_t>(hp.n_rot);
  const uint64_t kvb = static_cast<uint64_t>(hp.n_head) * (hp.nope_dim() + hp.head_dim_v);
  const uint64_t o_dim = static_cast<uint64_t>(hp.n_head) * hp.head_dim_v;
  ASSIGN_OR_RETURN(w->attn_norm, RequireTensor(s, BlockTensor(il, "attn_norm"), {d}));
  if (hp.q_lora_rank > 0) {
    const uint64_t ql = static_cast<uint64_t>(hp.q_lora_rank);
    ASSIGN_OR_RETURN(w->wq_a, RequireTensor(s, BlockTensor(il, "attn_q_a"), {d, ql}));
    ASSIGN_OR_RETURN(w->q_a_norm, RequireTensor(s, BlockTensor(il, "attn_q_a_norm"), {ql}));
    ASSIGN_OR_RETURN(w->wq_b, RequireTensor(s, BlockTensor(il, "attn_q_b"), {ql, q_dim}));
  } else {
    ASSIGN_OR_RETURN(w->wq, RequireTensor(s, BlockTensor(il, "attn_q"), {d, q_dim}));
  }
  ASSIGN_OR_RETURN(w->wkv_a, RequireTensor(s, BlockTensor(il, "attn_kv_a_mqa"), {d, lora + rot}));
  ASSIGN_OR_RETURN(w->kv_a_norm, RequireTensor(s, BlockTensor(il, "attn_kv_a_norm"), {lora}));
  ASSIGN_OR_RETURN(w->wkv_b, RequireTensor(s, BlockTensor(il, "attn_kv_b"), {lora, kvb}));
  ASSIGN_OR_RETURN(w->wo, RequireTensor(s, BlockTensor(il, "attn_output"), {o_dim, d}));
  return Status::Ok();
}

Status DeepseekLayer(ForwardContext& c, int il, const LayerWeights& w) {
  RETURN_IF_ERROR(MlaBlock(c, il, w));
  return c.hp->is_moe_layer(il) ? MoeBlock(c, il, w) : FfnBlock(c, il, w);
}

}  // namespace substrate
