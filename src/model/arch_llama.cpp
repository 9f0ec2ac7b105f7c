// llama and mixtral (llama with experts): pre-norm layers of multi-head attention (GQA, RoPE on
// GGUF-permuted q/k, so adjacent pairs rotate) and a SwiGLU FFN or a MoE.
//
//   x = x + Wo . Attention(RoPE(Wq . norm(x)), RoPE(Wk . norm(x)), Wv . norm(x))
//   x = x + FFN(norm(x))       FFN = SwiGLU MLP, or MoE (router, top-k experts)
#include "format/model_file.h"
#include "model/arch.h"
#include "model/blocks.h"

namespace substrate {
namespace {

Status ReadHParams(const Metadata& md, ModelHParams* hp) {
  const std::string a = hp->arch + ".";
  hp->rope.style = RopeStyle::kNormal;
  hp->gating = GatingFunc::kSoftmax;
  hp->expert_weights_norm = true;  // mixtral renormalizes its top-k softmax weights
  hp->n_ff_shexp = md.GetInt(a + "expert_shared_feed_forward_length", 0);
  return CheckRopeDims(*hp);
}

}  // namespace

extern const ArchSpec kArch_llama = {
    "llama",
    {"llama", "mixtral"},
    &ReadHParams,
    &StandardAttentionTensors,
    nullptr,
    &AttentionBlock,
};

}  // namespace substrate
