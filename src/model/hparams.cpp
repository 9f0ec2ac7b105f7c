#include "model/hparams.h"

#include <cmath>

#include "format/model_file.h"
#include "model/arch.h"

namespace substrate {
namespace {

Status Check(bool ok, const std::string& what) {
  return ok ? Status::Ok() : Corruption("model hyperparameters: " + what);
}

}  // namespace

ModelHParams NextnCacheHParams(const ModelHParams& hp) {
  ModelHParams one = hp;
  one.n_layer = 1;
  return one;
}

bool IsNextnTensor(const std::string& name, int first_nextn_layer) {
  if (first_nextn_layer < 0 || name.compare(0, 4, "blk.") != 0) return false;
  int layer = 0;
  size_t i = 4;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && layer < (1 << 20); ++i)
    layer = layer * 10 + (name[i] - '0');
  return i > 4 && i < name.size() && name[i] == '.' && layer >= first_nextn_layer;
}

int FirstNextnLayer(const Metadata& md) {
  const std::string a = md.GetString("general.architecture", "") + ".";
  const int64_t n = md.GetInt(a + "nextn_predict_layers", 0), blocks = md.GetInt(a + "block_count", 0);
  return n > 0 && n < blocks ? static_cast<int>(blocks - n) : -1;
}

Expected<ModelHParams> ModelHParams::FromMetadata(const Metadata& md) {
  ModelHParams hp;
  ASSIGN_OR_RETURN(hp.arch, md.GetString("general.architecture"));
  ASSIGN_OR_RETURN(hp.spec, FindArch(hp.arch));
  const std::string a = hp.arch + ".";

  ASSIGN_OR_RETURN(hp.n_embd, md.GetInt(a + "embedding_length"));
  ASSIGN_OR_RETURN(int64_t n_layer, md.GetInt(a + "block_count"));
  ASSIGN_OR_RETURN(int64_t n_head, md.GetInt(a + "attention.head_count"));
  hp.n_nextn = static_cast<int>(md.GetInt(a + "nextn_predict_layers", 0));
  RETURN_IF_ERROR(Check(hp.n_nextn >= 0 && hp.n_nextn < n_layer,
                        "nextn_predict_layers " + std::to_string(hp.n_nextn) + " with block_count " +
                            std::to_string(n_layer)));
  hp.n_layer = static_cast<int>(n_layer - hp.n_nextn);
  hp.n_head = static_cast<int>(n_head);
  hp.n_head_kv = static_cast<int>(md.GetInt(a + "attention.head_count_kv", n_head));
  hp.n_ff = md.GetInt(a + "feed_forward_length", 0);
  hp.n_ctx_train = md.GetInt(a + "context_length", 4096);
  hp.norm_eps = static_cast<float>(md.GetFloat(a + "attention.layer_norm_rms_epsilon", 1e-6));
  hp.n_vocab = md.GetInt(a + "vocab_size", 0);
  if (hp.n_vocab == 0) {
    if (const MetaValue* toks = md.Find("tokenizer.ggml.tokens"); toks && toks->is_array())
      hp.n_vocab = static_cast<int64_t>(toks->array().size());
  }

  RETURN_IF_ERROR(Check(hp.n_embd > 0 && hp.n_embd < (1 << 20), "embedding_length " +
                                                                    std::to_string(hp.n_embd)));
  RETURN_IF_ERROR(Check(hp.n_layer > 0 && hp.n_layer < 4096, "block_count " +
                                                                  std::to_string(hp.n_layer)));
  RETURN_IF_ERROR(Check(hp.n_head > 0 && hp.n_head_kv > 0 && hp.n_head % hp.n_head_kv == 0,
                        "head_count " + std::to_string(hp.n_head) + " not a multiple of " +
                            "head_count_kv " + std::to_string(hp.n_head_kv)));

  const int64_t default_head = hp.n_embd / hp.n_head;
  hp.head_dim_k = static_cast<int>(md.GetInt(a + "attention.key_length", default_head));
  hp.head_dim_v = static_cast<int>(md.GetInt(a + "attention.value_length", hp.head_dim_k));

  // MoE.
  hp.n_expert = static_cast<int>(md.GetInt(a + "expert_count", 0));
  hp.n_expert_used = static_cast<int>(md.GetInt(a + "expert_used_count", 0));
  hp.n_ff_exp = md.GetInt(a + "expert_feed_forward_length", hp.n_ff);
  hp.n_leading_dense = static_cast<int>(md.GetInt(a + "leading_dense_block_count", 0));
  hp.expert_weights_scale = static_cast<float>(md.GetFloat(a + "expert_weights_scale", 1.0));
  hp.n_expert_groups = static_cast<int>(md.GetInt(a + "expert_group_count", 0));
  hp.n_group_used = static_cast<int>(md.GetInt(a + "expert_group_used_count", 0));
  if (hp.n_expert > 0) {
    RETURN_IF_ERROR(Check(hp.n_expert_used > 0 && hp.n_expert_used <= hp.n_expert,
                          "expert_used_count " + std::to_string(hp.n_expert_used) +
                              " with expert_count " + std::to_string(hp.n_expert)));
  }

  // RoPE: the pairing (RopeStyle) is the architecture's (read_hparams).
  hp.rope.freq_base = static_cast<float>(md.GetFloat(a + "rope.freq_base", 10000.0));
  hp.n_rot = static_cast<int>(md.GetInt(a + "rope.dimension_count", hp.head_dim_k));
  hp.rope.n_rot = hp.n_rot;
  const std::string scaling = md.GetString(a + "rope.scaling.type", "none");
  double factor = md.GetFloat(a + "rope.scaling.factor", 0.0);
  if (factor == 0.0) {
    const double scale = md.GetFloat(a + "rope.scale_linear", 0.0);
    if (scale > 0) factor = scale;
  }
  if (scaling == "linear" && factor > 0) {
    hp.rope.freq_scale = static_cast<float>(1.0 / factor);
  } else if (scaling == "yarn" && factor > 1) {
    hp.rope.yarn_factor = static_cast<float>(factor);
    hp.rope.yarn_orig_ctx =
        static_cast<int>(md.GetInt(a + "rope.scaling.original_context_length", hp.n_ctx_train));
    hp.rope.yarn_beta_fast = static_cast<float>(md.GetFloat(a + "rope.scaling.yarn_beta_fast", 32));
    hp.rope.yarn_beta_slow = static_cast<float>(md.GetFloat(a + "rope.scaling.yarn_beta_slow", 1));
    // YaRN scales cos/sin by 0.1 ln(factor) + 1 (deepseek moves that into the softmax scale).
    hp.rope.attn_factor = static_cast<float>(1.0 + 0.1 * std::log(factor));
  } else if (scaling != "none" && scaling != "linear" && scaling != "yarn") {
    return Unimplemented("rope scaling type '" + scaling + "'");
  }

  RETURN_IF_ERROR(Check(hp.head_dim_k > 0 && hp.head_dim_v > 0 && hp.head_dim_k <= 4096 &&
                            hp.head_dim_v <= 4096,
                        "head size " + std::to_string(hp.head_dim_k)));
  hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim_k));
  // The expert gating function (1 softmax, 2 sigmoid); architectures set their default.
  hp.gating = md.GetInt(a + "expert_gating_func", 0) == 2 ? GatingFunc::kSigmoid
                                                          : GatingFunc::kSoftmax;
  RETURN_IF_ERROR(hp.spec->read_hparams(md, &hp));
  if (md.Has(a + "expert_weights_norm")) {
    ASSIGN_OR_RETURN(hp.expert_weights_norm, md.GetBool(a + "expert_weights_norm"));
  }
  return hp;
}

RoutingParams ModelHParams::routing() const {
  RoutingParams p;
  p.n_expert = n_expert;
  p.k = n_expert_used;
  p.gating = gating;
  p.normalize = expert_weights_norm;
  p.scale = expert_weights_scale;
  p.n_groups = n_expert_groups;
  p.n_groups_used = n_group_used;
  return p;
}

}  // namespace substrate
