// HF tensor names -> GGUF canonical names, per architecture, as llama.cpp's convert_hf_to_gguf.py
// (early 2025) maps them.
//
//   model.embed_tokens.weight                 token_embd.weight
//   model.norm.weight                         output_norm.weight
//   lm_head.weight                            output.weight
//   model.layers.N.input_layernorm            blk.N.attn_norm
//   model.layers.N.post_attention_layernorm   blk.N.ffn_norm
//   self_attn.{q,k,v,o}_proj                  attn_q, attn_k, attn_v, attn_output
//   self_attn.{q,k}_norm (qwen3)              attn_q_norm, attn_k_norm
//   mlp.{gate,up,down}_proj                   ffn_gate, ffn_up, ffn_down
//   mlp.gate / block_sparse_moe.gate          ffn_gate_inp (router)
//   mlp.experts.E.{gate,up,down}_proj         ffn_{gate,up,down}_exps (3-D, one slice per E)
//   block_sparse_moe.experts.E.w1 / w3 / w2   ffn_gate_exps / ffn_up_exps / ffn_down_exps
//   mlp.shared_expert(s).{gate,up,down}_proj  ffn_{gate,up,down}_shexp
//   mlp.shared_expert_gate (qwen2moe)         ffn_gate_inp_shexp
//
// DeepSeek-V2/V3 (GGUF arch "deepseek2"), multi-head latent attention:
//   self_attn.q_a_proj            blk.N.attn_q_a        [hidden -> q_lora_rank]
//   self_attn.q_a_layernorm       blk.N.attn_q_a_norm
//   self_attn.q_b_proj            blk.N.attn_q_b        [q_lora_rank -> n_head * (nope + rope)]
//   self_attn.q_proj (no q lora)  blk.N.attn_q
//   self_attn.kv_a_proj_with_mqa  blk.N.attn_kv_a_mqa   [hidden -> kv_lora_rank + rope]
//   self_attn.kv_a_layernorm      blk.N.attn_kv_a_norm
//   self_attn.kv_b_proj           blk.N.attn_kv_b       kept UNSPLIT, as the early-2025 converter
//                                                       wrote it: [kv_lora_rank -> n_head *
//                                                       (qk_nope + v_head)], per head the k_nope
//                                                       rows then the v rows (HF layout)
//   mlp.gate.e_score_correction_bias  blk.N.exp_probs_b.bias  (noaux_tc routing bias)
//   layers >= num_hidden_layers (multi-token-prediction layers) are dropped.
// No q/k permutation for qwen2/qwen3/qwen*moe/deepseek2; llama and mixtral get it.
#include <cmath>
#include <cstdlib>

#include "format/hf_internal.h"

namespace substrate::hf {
namespace {

using nlohmann::json;

bool StartsWith(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool EndsWith(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// Parses a decimal index at s[pos...] up to the next '.', advancing pos past the dot.
std::optional<int64_t> Index(const std::string& s, size_t* pos) {
  size_t dot = s.find('.', *pos);
  if (dot == std::string::npos || dot == *pos || dot - *pos > 9) return std::nullopt;
  int64_t v = 0;
  for (size_t i = *pos; i < dot; ++i) {
    if (s[i] < '0' || s[i] > '9') return std::nullopt;
    v = v * 10 + (s[i] - '0');
  }
  *pos = dot + 1;
  return v;
}

struct Rule {
  const char* hf;    // suffix after "model.layers.N." without ".weight"/".bias"
  const char* gguf;  // name after "blk.N."
};

constexpr Rule kLayerRules[] = {
    {"input_layernorm", "attn_norm"},
    {"post_attention_layernorm", "ffn_norm"},
    {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"},
    {"self_attn.q_norm", "attn_q_norm"},
    {"self_attn.k_norm", "attn_k_norm"},
    {"mlp.gate_proj", "ffn_gate"},
    {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
    {"mlp.gate", "ffn_gate_inp"},
    {"block_sparse_moe.gate", "ffn_gate_inp"},
    {"mlp.shared_expert.gate_proj", "ffn_gate_shexp"},
    {"mlp.shared_expert.up_proj", "ffn_up_shexp"},
    {"mlp.shared_expert.down_proj", "ffn_down_shexp"},
    {"mlp.shared_experts.gate_proj", "ffn_gate_shexp"},
    {"mlp.shared_experts.up_proj", "ffn_up_shexp"},
    {"mlp.shared_experts.down_proj", "ffn_down_shexp"},
    {"mlp.shared_expert_gate", "ffn_gate_inp_shexp"},
    {"self_attn.q_a_proj", "attn_q_a"},
    {"self_attn.q_a_layernorm", "attn_q_a_norm"},
    {"self_attn.q_b_proj", "attn_q_b"},
    {"self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa"},
    {"self_attn.kv_a_layernorm", "attn_kv_a_norm"},
    {"self_attn.kv_b_proj", "attn_kv_b"},
};

}  // namespace

std::optional<int64_t> ConfigInt(const json& config, const std::string& key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_number_float()) {
    double d = it->get<double>();
    if (d >= -9.2e18 && d <= 9.2e18 && d == std::floor(d)) return static_cast<int64_t>(d);
  }
  if (it->is_boolean()) return it->get<bool>() ? 1 : 0;
  return std::nullopt;
}

std::optional<double> ConfigFloat(const json& config, const std::string& key) {
  auto it = config.find(key);
  if (it == config.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

Expected<ArchSpec> FindArch(const json& config) {
  std::string mt;
  if (auto it = config.find("model_type"); it != config.end() && it->is_string())
    mt = it->get<std::string>();
  ArchSpec a;
  a.model_type = mt;
  a.expert_order = {"down", "gate", "up"};
  if (mt == "llama" || mt == "mixtral") {
    a.gguf_arch = "llama";
    a.permute_qk = true;
    a.expert_order = {"gate", "down", "up"};  // Mixtral's w1, w2, w3
  } else if (mt == "qwen2") {
    a.gguf_arch = "qwen2";
  } else if (mt == "qwen3") {
    a.gguf_arch = "qwen3";
  } else if (mt == "qwen2_moe") {
    a.gguf_arch = "qwen2moe";
    a.duplicate_tied_output = true;
  } else if (mt == "qwen3_moe") {
    a.gguf_arch = "qwen3moe";
  } else if (mt == "deepseek_v3" || mt == "deepseek_v2") {
    a.gguf_arch = "deepseek2";
  } else {
    std::string archs;
    if (auto it = config.find("architectures"); it != config.end()) archs = it->dump();
    return Unimplemented("config.json: model_type '" + mt + "' (architectures " + archs +
                         ") is not supported; supported: llama, mixtral, qwen2, qwen3, "
                         "qwen2_moe, qwen3_moe, deepseek_v3");
  }
  return a;
}

Expected<MappedName> MapTensorName(const std::string& hf, const ArchSpec& arch, const json& config) {
  MappedName m;
  if (hf == "model.embed_tokens.weight") { m.name = "token_embd.weight"; return m; }
  if (hf == "model.norm.weight") { m.name = "output_norm.weight"; return m; }
  if (hf == "lm_head.weight") { m.name = "output.weight"; return m; }
  if (EndsWith(hf, "rotary_emb.inv_freq")) { m.skip = true; return m; }
  auto unknown = [&]() {
    return Unimplemented("cannot map tensor '" + hf + "' of a " + arch.model_type +
                         " model to a GGUF name");
  };
  const std::string prefix = "model.layers.";
  if (!StartsWith(hf, prefix)) return unknown();
  size_t pos = prefix.size();
  auto bid = Index(hf, &pos);
  if (!bid) return unknown();
  m.block = *bid;
  int64_t n_layer = ConfigInt(config, "num_hidden_layers").value_or(0);
  if (*bid >= n_layer) {  // DeepSeek-V3's multi-token-prediction layers
    m.skip = true;
    return m;
  }
  std::string rest = hf.substr(pos);
  std::string blk = "blk." + std::to_string(*bid) + ".";

  // Per-expert tensors.
  for (const char* ep : {"mlp.experts.", "block_sparse_moe.experts."}) {
    if (!StartsWith(rest, ep)) continue;
    size_t p = std::string(ep).size();
    auto e = Index(rest, &p);
    if (!e) return unknown();
    std::string w = rest.substr(p);
    std::string kind;
    if (w == "gate_proj.weight" || w == "w1.weight") kind = "gate";
    else if (w == "up_proj.weight" || w == "w3.weight") kind = "up";
    else if (w == "down_proj.weight" || w == "w2.weight") kind = "down";
    else return unknown();
    m.expert = *e;
    m.expert_kind = kind;
    m.name = blk + "ffn_" + kind + "_exps.weight";
    return m;
  }
  if (rest == "mlp.gate.e_score_correction_bias") {
    m.name = blk + "exp_probs_b.bias";
    return m;
  }
  std::string base, suffix;
  if (EndsWith(rest, ".weight")) { base = rest.substr(0, rest.size() - 7); suffix = ".weight"; }
  else if (EndsWith(rest, ".bias")) { base = rest.substr(0, rest.size() - 5); suffix = ".bias"; }
  else return unknown();
  for (const Rule& r : kLayerRules) {
    if (base != r.hf) continue;
    m.name = blk + r.gguf + suffix;
    if (arch.permute_qk) {
      int64_t n_head = ConfigInt(config, "num_attention_heads").value_or(0);
      int64_t n_kv = ConfigInt(config, "num_key_value_heads").value_or(n_head);
      if (base == "self_attn.q_proj") m.permute_heads = n_head;
      if (base == "self_attn.k_proj") m.permute_heads = n_kv;
    }
    return m;
  }
  return unknown();
}

}  // namespace substrate::hf
