// The qwen family: qwen2 (QKV biases), qwen3 (RMSNorm of each q/k head before RoPE), qwen2moe
// (routed experts plus a shared expert scaled by a sigmoid gate; top-k weights not
// renormalized), qwen3moe (renormalized top-k). The llama layer with NeoX RoPE (halves rotate).
#include "format/model_file.h"
#include "model/arch.h"
#include "model/blocks.h"

namespace substrate {
namespace {

Status ReadHParams(const Metadata& md, ModelHParams* hp) {
  const std::string a = hp->arch + ".";
  hp->rope.style = RopeStyle::kNeox;
  hp->gating = GatingFunc::kSoftmax;
  hp->expert_weights_norm = hp->arch != "qwen2moe";
  hp->n_ff_shexp = md.GetInt(a + "expert_shared_feed_forward_length", 0);
  return CheckRopeDims(*hp);
}

Status CheckLayer(const ModelHParams& hp, int il, const LayerWeights& w) {
  if ((hp.arch == "qwen3" || hp.arch == "qwen3moe") &&
      (w.q_norm == kNoTensor || w.k_norm == kNoTensor))
    return NotFound("qwen3 layer " + std::to_string(il) + " has no attn_q_norm/attn_k_norm");
  return Status::Ok();
}

}  // namespace

extern const ArchSpec kArch_qwen = {
    "qwen",
    {"qwen2", "qwen3", "qwen2moe", "qwen3moe"},
    &ReadHParams,
    &StandardAttentionTensors,
    &CheckLayer,
    &AttentionBlock,
};

}  // namespace substrate
