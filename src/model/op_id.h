// Op ids: the stable names of the forward pass's units of work, shared by model, compiler, store
// and runtime (a PlanBundle op bundle, a store file and a trace event use the same id).
//
//   token_embd                  embedding lookup                 token_embd.weight
//   block_N.attn                attention (norm, q/k/v, rope,    blk.N.attn_*
//                               attention, output projection)
//   block_N.ffn                 dense FFN (norm, gate/up/down)   blk.N.ffn_norm, blk.N.ffn_{gate,up,down}
//   block_N.moe.router          norm + router logits             blk.N.ffn_norm, blk.N.ffn_gate_inp, exp_probs_b
//   block_N.moe.expert_E        one routed expert                slice E of blk.N.ffn_{gate,up,down}_exps
//   block_N.moe.shared          shared expert (+ sigmoid gate)   blk.N.ffn_*_shexp, blk.N.ffn_gate_inp_shexp
//   output                      final norm + vocabulary head     output_norm, output (or token_embd if tied)
//   block_N.nextn               a next-n (MTP) layer's input     blk.N.nextn.{enorm,hnorm,eh_proj,
//                               and head (N >= n_layer)          embed_tokens,shared_head_*}
//
// A next-n layer's ops (block_N.attn, its FFN or MoE ops, block_N.nextn) follow output, and only
// when hp.list_nextn: they run in passes of their own (Model::ForwardNextn).
//
// Ops run in the order ListOps returns (topological). Per token only the selected experts of a
// MoE layer run, in increasing expert index, between the router and the shared expert.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace substrate {

struct ModelHParams;

enum class OpKind { kTokenEmbd, kAttention, kFfn, kMoeRouter, kMoeExpert, kMoeShared, kOutput, kNextn };

std::string OpIdTokenEmbd();
std::string OpIdAttention(int layer);
std::string OpIdFfn(int layer);
std::string OpIdMoeRouter(int layer);
std::string OpIdMoeExpert(int layer, int expert);
std::string OpIdMoeShared(int layer);
std::string OpIdOutput();
std::string OpIdNextn(int layer);

// GGUF tensor name of a layer tensor: BlockTensor(5, "attn_q") == "blk.5.attn_q.weight";
// BlockTensor(5, "attn_q", "bias") == "blk.5.attn_q.bias".
std::string BlockTensor(int layer, const std::string& base, const std::string& suffix = "weight");

struct OpTensorRef {
  std::string name;  // GGUF canonical name
  int slice = -1;    // index of the outermost dimension (the expert) or -1 for the whole tensor
};

struct OpSpec {
  std::string id;
  OpKind kind = OpKind::kTokenEmbd;
  int layer = -1;   // -1 for token_embd / output
  int expert = -1;  // for kMoeExpert
  std::vector<OpTensorRef> tensors;  // every tensor the op acquires
};

// All ops of a model in topological order. `has_tensor` says which optional tensors (biases,
// QK-norms, shared experts, an untied output) the model file has.
std::vector<OpSpec> ListOps(const ModelHParams& hp,
                            const std::function<bool(const std::string&)>& has_tensor);

}  // namespace substrate
