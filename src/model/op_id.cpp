#include "model/op_id.h"

#include "model/arch.h"
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
std::string OpIdNextn(int layer) { return "block_" + std::to_string(layer) + ".nextn"; }

std::string BlockTensor(int layer, const std::string& base, const std::string& suffix) {
  return "blk." + std::to_string(layer) + "." + base + "." + suffix;
}

std::vector<OpSpec> ListOps(const ModelHParams& hp,
                            const std::function<bool(const std::string&)>& has_tensor) {
  const ArchSpec* spec = hp.spec;
  if (!spec) {
    auto found = FindArch(hp.arch);
    spec = found.ok() ? *found : nullptr;
  }
  std::vector<OpSpec> ops;
  // An op's tensors are the slots of the registry (model/arch.h) the model has.
  auto op_of = [&](std::string id, OpKind kind, int il, int expert,
                   const std::vector<TensorSlot>& slots) {
    OpSpec op{std::move(id), kind, il, expert, {}};
    for (const TensorSlot& t : slots) {
      const std::string name = BlockTensor(il, t.base, t.suffix);
      if (has_tensor(name)) op.tensors.push_back({name, expert});
    }
    return op;
  };
  ops.push_back({OpIdTokenEmbd(), OpKind::kTokenEmbd, -1, -1, {{"token_embd.weight", -1}}});
  auto layer_ops = [&](int il) {
    if (spec) {
      ops.push_back(op_of(OpIdAttention(il), OpKind::kAttention, il, -1,
                          spec->attention_tensors(hp)));
    }
    if (!hp.is_moe_layer(il)) {
      ops.push_back(op_of(OpIdFfn(il), OpKind::kFfn, il, -1, FfnTensors(hp)));
      return;
    }
    ops.push_back(op_of(OpIdMoeRouter(il), OpKind::kMoeRouter, il, -1, MoeRouterTensors(hp)));
    const std::vector<TensorSlot> expert = MoeExpertTensors(hp);
    for (int e = 0; e < hp.n_expert; ++e)
      ops.push_back(op_of(OpIdMoeExpert(il, e), OpKind::kMoeExpert, il, e, expert));
    OpSpec shared = op_of(OpIdMoeShared(il), OpKind::kMoeShared, il, -1, MoeSharedTensors(hp));
    if (!shared.tensors.empty()) ops.push_back(std::move(shared));
  };
  for (int il = 0; il < hp.n_layer; ++il) layer_ops(il);
  OpSpec out{OpIdOutput(), OpKind::kOutput, -1, -1, {}};
  if (has_tensor("output_norm.weight")) out.tensors.push_back({"output_norm.weight", -1});
  // An untied vocabulary head, or the embeddings (tied).
  out.tensors.push_back({has_tensor("output.weight") ? "output.weight" : "token_embd.weight", -1});
  ops.push_back(std::move(out));
  if (!hp.list_nextn) return ops;
  for (int il = hp.n_layer; il < hp.n_layer + hp.n_nextn; ++il) {
    layer_ops(il);
    ops.push_back(op_of(OpIdNextn(il), OpKind::kNextn, il, -1, NextnTensors(hp)));
  }
  return ops;
}

}  // namespace substrate
