// DeepSeek V2/V3 (GGUF arch "deepseek2"): multi-head latent attention and a routed MoE.
//
//   q      = Wq_b . norm(Wq_a . x)                  [n, n_head, nope + rope]
//   latent = Wkv_a . x                              [n, kv_lora + rope]  (rope part: one shared key)
//   k, v   = Wkv_b . norm(latent[:kv_lora])         [n, n_head, nope + v]
//   x = x + Wo . Attention(q, [k_nope, RoPE(k_rope)], v)
//   x = x + FFN(norm(x))   the first leading_dense_block_count layers dense; then MoE with
//                          sigmoid scores, correction bias for selection only, group-limited
//                          top-k, renormalized weights x routed_scaling_factor, shared experts.
#include <cmath>

#include "format/model_file.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/op_id.h"

namespace substrate {
namespace {

Status Check(bool ok, const std::string& what) {
  return ok ? Status::Ok() : Corruption("model hyperparameters: " + what);
}

Status ReadHParams(const Metadata& md, ModelHParams* hp) {
  const std::string a = hp->arch + ".";
  // The rope dims are interleaved pairs in the checkpoint itself.
  hp->rope.style = RopeStyle::kNormal;
  hp->q_lora_rank = static_cast<int>(md.GetInt(a + "attention.q_lora_rank", 0));
  ASSIGN_OR_RETURN(int64_t kv_lora, md.GetInt(a + "attention.kv_lora_rank"));
  hp->kv_lora_rank = static_cast<int>(kv_lora);
  hp->n_ff_shexp = hp->n_ff_exp * md.GetInt(a + "expert_shared_count", 0);
  // V3 gates with sigmoid and renormalizes; V2 used softmax without renormalizing.
  hp->expert_weights_norm = hp->gating == GatingFunc::kSigmoid;
  // YaRN: deepseek scales the softmax by mscale^2 (yarn_log_multiplier, HF's mscale_all_dim)
  // instead of cos/sin.
  const double log_mul = md.GetFloat(a + "rope.scaling.yarn_log_multiplier", 0.0);
  if (hp->rope.yarn_factor > 0 && log_mul > 0) {
    const double m = 1.0 + log_mul * std::log(hp->rope.yarn_factor);
    hp->attn_scale *= static_cast<float>(m * m);
    hp->rope.attn_factor = 1.0f;
  }
  RETURN_IF_ERROR(Check(hp->n_rot > 0 && hp->n_rot < hp->head_dim_k && hp->n_rot % 2 == 0,
                        "rope dimension_count " + std::to_string(hp->n_rot) +
                            " with key_length " + std::to_string(hp->head_dim_k)));
  if (hp->n_expert_groups > 1) {
    RETURN_IF_ERROR(Check(hp->n_expert % hp->n_expert_groups == 0 && hp->n_group_used > 0 &&
                              hp->n_group_used <= hp->n_expert_groups,
                          "expert groups " + std::to_string(hp->n_expert_groups) + "/" +
                              std::to_string(hp->n_group_used)));
  }
  return Status::Ok();
}

std::vector<TensorSlot> MlaTensors(const ModelHParams& hp) {
  const uint64_t d = static_cast<uint64_t>(hp.n_embd);
  const uint64_t q_dim = static_cast<uint64_t>(hp.n_head) * hp.head_dim_k;
  const uint64_t lora = static_cast<uint64_t>(hp.kv_lora_rank);
  const uint64_t rot = static_cast<uint64_t>(hp.n_rot);
  const uint64_t kvb = static_cast<uint64_t>(hp.n_head) * (hp.nope_dim() + hp.head_dim_v);
  const uint64_t o_dim = static_cast<uint64_t>(hp.n_head) * hp.head_dim_v;
  const uint64_t ql = static_cast<uint64_t>(hp.q_lora_rank);
  const bool q_lora = hp.q_lora_rank > 0;
  std::vector<TensorSlot> s = {{"attn_norm", "weight", &LayerWeights::attn_norm, true, {d}}};
  if (q_lora) {
    s.push_back({"attn_q_a", "weight", &LayerWeights::wq_a, true, {d, ql}});
    s.push_back({"attn_q_a_norm", "weight", &LayerWeights::q_a_norm, true, {ql}});
    s.push_back({"attn_q_b", "weight", &LayerWeights::wq_b, true, {ql, q_dim}});
  } else {
    s.push_back({"attn_q", "weight", &LayerWeights::wq, true, {d, q_dim}});
  }
  s.push_back({"attn_kv_a_mqa", "weight", &LayerWeights::wkv_a, true, {d, lora + rot}});
  s.push_back({"attn_kv_a_norm", "weight", &LayerWeights::kv_a_norm, true, {lora}});
  s.push_back({"attn_kv_b", "weight", &LayerWeights::wkv_b, true, {lora, kvb}});
  s.push_back({"attn_output", "weight", &LayerWeights::wo, true, {o_dim, d}});
  return s;
}

// Multi-head latent attention: one op, block_N.attn, like AttentionBlock.
Status MlaBlock(ForwardContext& c, int il, const LayerWeights& w) {
  const ModelHParams& hp = *c.hp;
  Backend& be = *c.be;
  const int64_t d = hp.n_embd, n = c.n;
  const int dk = hp.head_dim_k, dv = hp.head_dim_v, nope = hp.nope_dim(), rot = hp.n_rot;
  const int64_t lora = hp.kv_lora_rank;
  const int op = w.attn_op;
  OpScope scope(c, op);

  ASSIGN_OR_RETURN(Tensor xn, c.scratch->Get(Scratch::kXNorm, n, d));
  RETURN_IF_ERROR(NormRows(c, op, w.attn_norm, c.x, xn));

  // q [n, n_head * (nope + rot)], through the low-rank q_a -> norm -> q_b when the model has it;
  // latent [n, lora + rot]: the compressed latent, then one shared rope key per token. The two
  // products of xn go as one batch.
  ASSIGN_OR_RETURN(Tensor q, c.scratch->Get(Scratch::kQ, n, int64_t{hp.n_head} * dk));
  ASSIGN_OR_RETURN(Tensor latent, c.scratch->Get(Scratch::kLatentKv, n, lora + rot));
  if (w.wq_a != kNoTensor) {
    ASSIGN_OR_RETURN(Tensor qa, c.scratch->Get(Scratch::kLatentQ, n, hp.q_lora_rank));
    RETURN_IF_ERROR(Linears(c, op, xn, {{w.wq_a, qa}, {w.wkv_a, latent}}));
    RETURN_IF_ERROR(NormRows(c, op, w.q_a_norm, qa, qa));
    RETURN_IF_ERROR(Linear(c, op, w.wq_b, qa, q));
  } else {
    RETURN_IF_ERROR(Linears(c, op, xn, {{w.wq, q}, {w.wkv_a, latent}}));
  }
  ASSIGN_OR_RETURN(Tensor kvn, c.scratch->Get(Scratch::kLatentNorm, n, lora));
  be.CopyColumns(latent, 0, kvn, 0, lora);
  RETURN_IF_ERROR(NormRows(c, op, w.kv_a_norm, kvn, kvn));
  // kvb [n, n_head * (nope + dv)]
  ASSIGN_OR_RETURN(Tensor kvb, c.scratch->Get(Scratch::kKvB, n, int64_t{hp.n_head} * (nope + dv)));
  RETURN_IF_ERROR(Linear(c, op, w.wkv_b, kvn, kvb));

  be.Rope(q, hp.n_head, dk, nope, c.pos, hp.rope);
  be.Rope(latent, 1, static_cast<int>(lora + rot), static_cast<int>(lora), c.pos, hp.rope);
  // Cache rows: k = [k_nope_h, k_rope] per head, v = v_h per head; each sequence its own cache.
  ASSIGN_OR_RETURN(Tensor attn, c.scratch->Get(Scratch::kAttnOut, n, int64_t{hp.n_head} * dv));
  for (int s = 0; s < c.n_seqs; ++s) {
    const SequenceRows& r = c.seqs[s];
    const KvLayer kv = r.cache->layer(il - c.kv_layer0);
    be.StoreMlaKv(kv, r.pos0, kvb.Rows(r.row0, r.n), latent.Rows(r.row0, r.n), lora,
                  {hp.n_head, nope, rot, dv});
    be.Attention({hp.n_head, hp.n_head, dk, dv, hp.attn_scale}, q.Rows(r.row0, r.n), kv, r.pos0,
                 attn.Rows(r.row0, r.n));
  }
  return OutputProjection(c, w, attn);
}

}  // namespace

extern const ArchSpec kArch_deepseek = {
    "deepseek",
    {"deepseek2", "deepseek3", "deepseek_v3", "deepseek-v3"},
    &ReadHParams,
    &MlaTensors,
    nullptr,
    &MlaBlock,
    /*kv_per_query_head=*/true,
};

}  // namespace substrate
