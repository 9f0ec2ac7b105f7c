// GGUF metadata synthesized from config.json, key by key and in the order llama.cpp's
// convert_hf_to_gguf.py (early 2025) writes them, so a converted file matches the reference
// GGUFs. Where that converter reads a key only from an older config layout, both layouts are
// read (transformers 5 writes rope_parameters.rope_theta where older checkpoints have
// rope_theta). Extensions beyond that converter are marked "extension" below.
#include <cctype>
#include <cmath>
#include <cstdio>

#include "format/hf_internal.h"

namespace substrate::hf {
namespace {

using nlohmann::json;

std::optional<double> RopeTheta(const json& c) {
  if (auto v = ConfigFloat(c, "rope_theta")) return v;
  if (auto rp = c.find("rope_parameters"); rp != c.end() && rp->is_object())
    return ConfigFloat(*rp, "rope_theta");
  return std::nullopt;
}

// rope_scaling (older configs) or rope_parameters (transformers 5) when it is not "default".
std::optional<json> RopeScaling(const json& c) {
  if (auto rs = c.find("rope_scaling"); rs != c.end() && rs->is_object()) return *rs;
  if (auto rp = c.find("rope_parameters"); rp != c.end() && rp->is_object()) {
    auto t = rp->find("rope_type");
    if (t != rp->end() && t->is_string() && t->get<std::string>() != "default") return *rp;
  }
  return std::nullopt;
}

std::string ScalingType(const json& rs) {
  for (const char* k : {"type", "rope_type"})
    if (auto t = rs.find(k); t != rs.end() && t->is_string()) return t->get<std::string>();
  return "";
}

// Python's str.title() on one word, as the converter's id_to_title uses it.
std::string PyTitle(const std::string& w) {
  std::string out = w;
  bool prev_cased = false;
  for (char& ch : out) {
    unsigned char c = static_cast<unsigned char>(ch);
    bool cased = std::isalpha(c);
    if (cased) ch = static_cast<char>(prev_cased ? std::tolower(c) : std::toupper(c));
    prev_cased = cased;
  }
  return out;
}

bool PyIsLower(const std::string& w) {
  bool any = false;
  for (unsigned char c : w) {
    if (std::isupper(c)) return false;
    if (std::islower(c)) any = true;
  }
  return any;
}

// "v2", "v1.5" or anything starting with a digit keeps its case.
bool LooksLikeVersionOrNumber(const std::string& w) {
  if (w.empty()) return false;
  if (std::isdigit(static_cast<unsigned char>(w[0]))) return true;
  if (w[0] != 'v' || w.size() < 2) return false;
  bool need_digit = true;
  for (size_t i = 1; i < w.size(); ++i) {
    char c = w[i];
    if (std::isdigit(static_cast<unsigned char>(c))) need_digit = false;
    else if (c == '.' && !need_digit) need_digit = true;
    else return false;
  }
  return !need_digit;
}

// The converter's model_weight_count_rounded_notation(n, min_digits=2).
std::string RoundedCount(uint64_t n) {
  double scaled;
  const char* suffix;
  if (n > 1e12) { scaled = n * 1e-12; suffix = "T"; }
  else if (n > 1e9) { scaled = n * 1e-9; suffix = "B"; }
  else if (n > 1e6) { scaled = n * 1e-6; suffix = "M"; }
  else { scaled = n * 1e-3; suffix = "K"; }
  // Digits of round(scaled) without leading zeros (Python rounds half to even).
  double r = std::nearbyint(scaled);
  std::string digits = r == 0 ? "" : std::to_string(static_cast<long long>(r));
  int fix = std::max(2 - static_cast<int>(digits.size()), 0);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f%s", fix, scaled, suffix);
  return buf;
}

}  // namespace

std::string TitleFromFolderName(const std::string& folder) {
  std::string s = folder;
  for (char& c : s) if (c == '-') c = ' ';
  std::string out, word;
  auto flush = [&]() {
    if (word.empty()) return;
    if (!out.empty()) out += ' ';
    out += PyIsLower(word) && !LooksLikeVersionOrNumber(word) ? PyTitle(word) : word;
    word.clear();
  };
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c))) flush();
    else word += c;
  }
  flush();
  return out;
}

std::string SizeLabel(const std::vector<TensorInfo>& tensors) {
  uint64_t total = 0, shared = 0, expert = 0, expert_sum = 0, n_expert_tensors = 0;
  for (const auto& t : tensors) {
    uint64_t n = t.n_elements();
    if (t.name.find("_exps.") != std::string::npos && t.ne.size() >= 3) {
      uint64_t count = t.ne[2];
      if (count) expert += n / count;
      expert_sum += count;
      ++n_expert_tensors;
    } else {
      shared += n;
    }
    total += n;
  }
  uint64_t expert_count = n_expert_tensors ? expert_sum / n_expert_tensors : 0;
  if (expert_count > 0) return std::to_string(expert_count) + "x" + RoundedCount(shared + expert);
  return RoundedCount(total);
}

Status BuildMetadata(const std::string& dir, const json& c, const ArchSpec& arch,
                     const std::vector<TensorInfo>& tensors, uint32_t file_type, Metadata* md) {
  const std::string& A = arch.gguf_arch;
  auto u32 = [&](const std::string& key, std::optional<int64_t> v) {
    if (v && *v >= 0 && *v <= UINT32_MAX) md->Set(key, MetaValue::U32(static_cast<uint32_t>(*v)));
  };
  auto f32 = [&](const std::string& key, std::optional<double> v) {
    if (v) md->Set(key, MetaValue::F32(static_cast<float>(*v)));
  };

  md->Set("general.architecture", MetaValue::Str(A));
  md->Set("general.type", MetaValue::Str("model"));
  std::string folder = dir;
  while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  folder = folder.substr(folder.find_last_of('/') == std::string::npos ? 0 : folder.find_last_of('/') + 1);
  if (!folder.empty() && folder != "." && folder != "..")
    md->Set("general.name", MetaValue::Str(TitleFromFolderName(folder)));
  md->Set("general.size_label", MetaValue::Str(SizeLabel(tensors)));

  // The converter's base set_gguf_parameters.
  u32(A + ".block_count", ConfigInt(c, "num_hidden_layers"));
  u32(A + ".context_length", ConfigInt(c, "max_position_embeddings"));
  u32(A + ".embedding_length", ConfigInt(c, "hidden_size"));
  u32(A + ".feed_forward_length", ConfigInt(c, "intermediate_size"));
  u32(A + ".attention.head_count", ConfigInt(c, "num_attention_heads"));
  u32(A + ".attention.head_count_kv", ConfigInt(c, "num_key_value_heads"));
  f32(A + ".rope.freq_base", RopeTheta(c));
  f32(A + ".attention.layer_norm_rms_epsilon", ConfigFloat(c, "rms_norm_eps"));
  u32(A + ".expert_count", ConfigInt(c, "num_local_experts"));
  u32(A + ".expert_used_count", ConfigInt(c, "num_experts_per_tok"));
  if (A != "deepseek2") {  // deepseek2 writes its own (MLA) key/value lengths below
    auto hd = ConfigInt(c, "head_dim");
    u32(A + ".attention.key_length", hd);
    u32(A + ".attention.value_length", hd);
  }
  md->Set("general.file_type", MetaValue::U32(file_type));

  auto rs = RopeScaling(c);
  std::string rs_type = rs ? ScalingType(*rs) : "";
  const double factor = rs ? ConfigFloat(*rs, "factor").value_or(0.0) : 0.0;

  if (A == "llama") {
    u32(A + ".vocab_size", ConfigInt(c, "vocab_size"));
    auto hd = ConfigInt(c, "head_dim");
    auto embd = ConfigInt(c, "hidden_size"), heads = ConfigInt(c, "num_attention_heads");
    if (!hd && embd && heads && *heads > 0) hd = *embd / *heads;
    u32(A + ".rope.dimension_count", hd);
    if (rs_type == "linear" && factor > 0) {
      md->Set(A + ".rope.scaling.type", MetaValue::Str("linear"));
      md->Set(A + ".rope.scaling.factor", MetaValue::F32(static_cast<float>(factor)));
    }
  } else if (A == "qwen2" || A == "qwen3" || A == "qwen2moe" || A == "qwen3moe") {
    if (rs_type == "yarn" && factor > 0) {
      md->Set(A + ".rope.scaling.type", MetaValue::Str("yarn"));
      md->Set(A + ".rope.scaling.factor", MetaValue::F32(static_cast<float>(factor)));
      u32(A + ".rope.scaling.original_context_length",
          ConfigInt(*rs, "original_max_position_embeddings"));
    }
    if (A == "qwen2moe" || A == "qwen3moe") {
      u32(A + ".expert_count", ConfigInt(c, "num_experts"));
      u32(A + ".expert_feed_forward_length", ConfigInt(c, "moe_intermediate_size"));
      u32(A + ".expert_shared_feed_forward_length", ConfigInt(c, "shared_expert_intermediate_size"));
    }
  } else if (A == "deepseek2") {
    u32(A + ".leading_dense_block_count", ConfigInt(c, "first_k_dense_replace"));
    u32(A + ".vocab_size", ConfigInt(c, "vocab_size"));
    u32(A + ".attention.q_lora_rank", ConfigInt(c, "q_lora_rank"));
    u32(A + ".attention.kv_lora_rank", ConfigInt(c, "kv_lora_rank"));
    auto nope = ConfigInt(c, "qk_nope_head_dim"), rope = ConfigInt(c, "qk_rope_head_dim");
    if (nope && rope) u32(A + ".attention.key_length", *nope + *rope);
    u32(A + ".attention.value_length", ConfigInt(c, "v_head_dim"));
    u32(A + ".expert_feed_forward_length", ConfigInt(c, "moe_intermediate_size"));
    u32(A + ".expert_count", ConfigInt(c, "n_routed_experts"));
    u32(A + ".expert_shared_count", ConfigInt(c, "n_shared_experts"));
    f32(A + ".expert_weights_scale", ConfigFloat(c, "routed_scaling_factor"));
    if (auto n = ConfigInt(c, "norm_topk_prob")) md->Set(A + ".expert_weights_norm", MetaValue::Bool(*n != 0));
    // Gating: 1 = softmax, 2 = sigmoid. DeepSeek-V3 always scores with a sigmoid; transformers 5
    // configs no longer spell out scoring_func.
    std::string scoring = arch.model_type == "deepseek_v3" ? "sigmoid" : "softmax";
    if (auto sf = c.find("scoring_func"); sf != c.end() && sf->is_string()) scoring = sf->get<std::string>();
    if (scoring == "sigmoid") md->Set(A + ".expert_gating_func", MetaValue::U32(2));
    else if (scoring == "softmax") md->Set(A + ".expert_gating_func", MetaValue::U32(1));
    else return Unimplemented("deepseek: scoring_func '" + scoring + "' is not supported");
    u32(A + ".rope.dimension_count", rope);
    if (rs_type == "yarn" && factor > 0) {
      md->Set(A + ".rope.scaling.type", MetaValue::Str("yarn"));
      md->Set(A + ".rope.scaling.factor", MetaValue::F32(static_cast<float>(factor)));
      u32(A + ".rope.scaling.original_context_length",
          ConfigInt(*rs, "original_max_position_embeddings"));
      if (auto ms = ConfigFloat(*rs, "mscale_all_dim"))
        f32(A + ".rope.scaling.yarn_log_multiplier", 0.1 * *ms);
    }
    // Extension (later llama.cpp names): group-limited routing, which V3 uses.
    u32(A + ".expert_group_count", ConfigInt(c, "n_group"));
    u32(A + ".expert_group_used_count", ConfigInt(c, "topk_group"));
  }
  // Extension: whether routing weights of the chosen experts are renormalized (llama.cpp hardcodes
  // this per arch; writing it keeps the model code honest for checkpoints that differ).
  if ((A == "qwen2moe" || A == "qwen3moe" || A == "llama") && ConfigInt(c, "norm_topk_prob")) {
    md->Set(A + ".expert_weights_norm", MetaValue::Bool(*ConfigInt(c, "norm_topk_prob") != 0));
  }

  RETURN_IF_ERROR(AddTokenizerMetadata(dir, c, md));
  md->Set("general.quantization_version", MetaValue::U32(2));
  return Status::Ok();
}

}  // namespace substrate::hf
