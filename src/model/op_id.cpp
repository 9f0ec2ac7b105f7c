#include "model/op_id.h"

#include "model/hparams.h"

namespace substrate {

std::string OpIdTokenEmbd() { return "token_embd"; }
std::string OpIdAttention(int layer) { return "block_" + std::to_string(layer) + ".attn"; }
std::string OpIdFfn(int layer) { return "block_" + std::to_string(layer) + ".ffn"; }
std::string OpIdMoeRouter(int layer) { return "block_" + std::to_string(layer) + ".moe.router"; }
std::string OpIdMoeExpert(int layer, int expert) {
  return "block_" + std::to_string(layer) + ".moe.expert_" + std::to_string(expert);
}
std::string OpIdMoeShared(int layer) { return "block_" + std::to_string(layer) + ".moe.shared"; }
std::string OpIdOutput() { return "output"; }

std::string BlockTensor(int layer, const std::string& base, const std::string& suffix) {
  return "blk." + std::to_string(layer) + "." + base + "." + suffix;
}

std::vector<OpSpec> ListOps(const ModelHParams& hp,
                            const std::function<bool(const std::string&)>& has_tensor) {
  std::vector<OpSpec> ops;
  auto add_if = [&](OpSpec& op, const std::string& name, int slice = -1) {
    if (has_tensor(name)) op.tensors.push_back({name, slice});
  };
  ops.push_back({OpIdTokenEmbd(), OpKind::kTokenEmbd, -1, -1, {{"token_embd.weight", -1}}});
  for (int il = 0; il < hp.n_layer; ++il) {
    OpSpec attn{OpIdAttention(il), OpKind::kAttention, il, -1, {}};
    for (const char* base : {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm",
                             "attn_k_norm", "attn_q_a", "attn_q_a_norm", "attn_q_b",
                             "attn_kv_a_mqa", "attn_kv_a_norm", "attn_kv_b", "attn_output"}) {
      add_if(attn, BlockTensor(il, base));
    }
    for (const char* base : {"attn_q", "attn_k", "attn_v", "attn_output"})
      add_if(attn, BlockTensor(il, base, "bias"));
    ops.push_back(std::move(attn));

    if (!hp.is_moe_layer(il)) {
      OpSpec ffn{OpIdFfn(il), OpKind::kFfn, il, -1, {}};
      for (const char* base : {"ffn_norm", "ffn_gate", "ffn_up", "ffn_down"})
        add_if(ffn, BlockTensor(il, base));
      ops.push_back(std::move(ffn));
      continue;
    }
    OpSpec router{OpIdMoeRouter(il), OpKind::kMoeRouter, il, -1, {}};
    add_if(router, BlockTensor(il, "ffn_norm"));
    add_if(router, BlockTensor(il, "ffn_gate_inp"));
    add_if(router, BlockTensor(il, "exp_probs_b", "bias"));
    ops.push_back(std::move(router));
    for (int e = 0; e < hp.n_expert; ++e) {
      OpSpec ex{OpIdMoeExpert(il, e), OpKind::kMoeExpert, il, e, {}};
      for (const char* base : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"})
        add_if(ex, BlockTensor(il, base), e);
      ops.push_back(std::move(ex));
    }
    OpSpec shared{OpIdMoeShared(il), OpKind::kMoeShared, il, -1, {}};
    for (const char* base : {"ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
                             "ffn_gate_inp_shexp"}) {
      add_if(shared, BlockTensor(il, base));
    }
    if (!shared.tensors.empty()) ops.push_back(std::move(shared));
  }
  OpSpec out{OpIdOutput(), OpKind::kOutput, -1, -1, {}};
  add_if(out, "output_norm.weight");
  if (has_tensor("output.weight")) {
    out.tensors.push_back({"output.weight", -1});
  } else {
    out.tensors.push_back({"token_embd.weight", -1});  // tied embeddings
  }
  ops.push_back(std::move(out));
  return ops;
}

}  // namespace substrate
