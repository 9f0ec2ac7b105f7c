// The llama family: llama, mixtral, qwen2 (QKV bias), qwen3 (QK-norm), qwen2moe (shared expert
// with a sigmoid gate), qwen3moe (normalized top-k). One pre-norm layer:
//
//   x = x + Wo . Attention(RoPE(Wq . norm(x) + bq), RoPE(Wk . norm(x) + bk), Wv . norm(x) + bv)
//   x = x + FFN(norm(x))       FFN = SwiGLU MLP, or MoE (router, top-k experts, shared expert)
//
// Which optional parts a model has (biases, QK-norm, experts) comes from its tensors; the RoPE
// pairing (normal for GGUF-permuted llama weights, NeoX for qwen) from its architecture name.
#include "model/model.h"

namespace substrate {

Status ResolveLlamaLayer(const WeightSource& s, const ModelHParams& hp, int il, LayerWeights* w) {
  const uint64_t d = static_cast<uint64_t>(hp.n_embd);
  const uint64_t q_dim = static_cast<uint64_t>(hp.n_head) * hp.head_dim_k;
  const uint64_t k_dim = static_cast<uint64_t>(hp.n_head_kv) * hp.head_dim_k;
  const uint64_t v_dim = static_cast<uint64_t>(hp.n_head_kv) * hp.head_dim_v;
  const uint64_t o_dim = static_cast<uint64_t>(hp.n_head) * hp.head_dim_v;
  ASSIGN_OR_RETURN(w->attn_norm, RequireTensor(s, BlockTensor(il, "attn_norm"), {d}));
  ASSIGN_OR_RETURN(w->wq, RequireTensor(s, BlockTensor(il, "attn_q"), {d, q_dim}));
  ASSIGN_OR_RETURN(w->wk, RequireTensor(s, BlockTensor(il, "attn_k"), {d, k_dim}));
  ASSIGN_OR_RETURN(w->wv, RequireTensor(s, BlockTensor(il, "attn_v"), {d, v_dim}));
  ASSIGN_OR_RETURN(w->wo, RequireTensor(s, BlockTensor(il, "attn_output"), {o_dim, d}));
  ASSIGN_OR_RETURN(w->bq, OptionalTensor(s, BlockTensor(il, "attn_q", "bias"), {q_dim}));
  ASSIGN_OR_RETURN(w->bk, OptionalTensor(s, BlockTensor(il, "attn_k", "bias"), {k_dim}));
  ASSIGN_OR_RETURN(w->bv, OptionalTensor(s, BlockTensor(il, "attn_v", "bias"), {v_dim}));
  ASSIGN_OR_RETURN(w->bo, OptionalTensor(s, BlockTensor(il, "attn_output", "bias"), {d}));
  const uint64_t hd = static_cast<uint64_t>(hp.head_dim_k);
  ASSIGN_OR_RETURN(w->q_norm, OptionalTensor(s, BlockTensor(il, "attn_q_norm"), {hd}));
  ASSIGN_OR_RETURN(w->k_norm, OptionalTensor(s, BlockTensor(il, "attn_k_norm"), {hd}));
  if (hp.arch == "qwen3" || hp.arch == "qwen3moe") {
    if (w->q_norm == kNoTensor || w->k_norm == kNoTensor)
      return NotFound("qwen3 layer " + std::to_string(il) + " has no attn_q_norm/attn_k_norm");
  }
  return Status::Ok();
}

Status LlamaLayer(ForwardContext& c, int il, const LayerWeights& w) {
  RETURN_IF_ERROR(AttentionBlock(c, il, w));
  return c.hp->is_moe_layer(il) ? MoeBlock(c, il, w) : FfnBlock(c, il, w);
}

}  // namespace substrate
