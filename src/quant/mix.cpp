#include "quant/mix.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <numeric>

#include "quant/quant.h"

namespace substrate {
namespace {

// llama.cpp's LLAMA_FTYPE ids.
enum FType : uint32_t {
  kAllF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 7, kQ5_0 = 8, kQ5_1 = 9, kQ2_K = 10,
  kQ3_K_S = 11, kQ3_K_M = 12, kQ3_K_L = 13, kQ4_K_S = 14, kQ4_K_M = 15, kQ5_K_S = 16,
  kQ5_K_M = 17, kQ6_K = 18, kQ2_K_S = 21, kIQ4_NL = 25, kIQ4_XS = 30, kBF16 = 32,
};

constexpr std::array<FileType, 20> kFileTypes = {{
    {"F32", kAllF32, DType::kF32},      {"F16", kF16, DType::kF16},
    {"BF16", kBF16, DType::kBF16},      {"Q4_0", kQ4_0, DType::kQ4_0},
    {"Q4_1", kQ4_1, DType::kQ4_1},      {"Q5_0", kQ5_0, DType::kQ5_0},
    {"Q5_1", kQ5_1, DType::kQ5_1},      {"Q8_0", kQ8_0, DType::kQ8_0},
    {"Q2_K", kQ2_K, DType::kQ2_K},      {"Q2_K_S", kQ2_K_S, DType::kQ2_K},
    {"Q3_K_S", kQ3_K_S, DType::kQ3_K},  {"Q3_K_M", kQ3_K_M, DType::kQ3_K},
    {"Q3_K_L", kQ3_K_L, DType::kQ3_K},  {"Q4_K_S", kQ4_K_S, DType::kQ4_K},
    {"Q4_K_M", kQ4_K_M, DType::kQ4_K},  {"Q5_K_S", kQ5_K_S, DType::kQ5_K},
    {"Q5_K_M", kQ5_K_M, DType::kQ5_K},  {"Q6_K", kQ6_K, DType::kQ6_K},
    {"IQ4_NL", kIQ4_NL, DType::kIQ4_NL}, {"IQ4_XS", kIQ4_XS, DType::kIQ4_XS},
}};

enum class Category {
  kTokenEmbd, kAttnQ, kAttnV, kAttnK, kAttnOutput, kFfnUp, kFfnGate, kFfnDown, kOutput, kOther
};

bool Has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

Category CategoryOf(const std::string& name) {
  if (name == "output.weight") return Category::kOutput;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight")
    return Category::kTokenEmbd;
  // A fused qkv and MLA's kv_b carry the values: llama.cpp treats them as attn_v.
  if (Has(name, "attn_qkv.weight") || Has(name, "attn_kv_b.weight") || Has(name, "attn_v.weight"))
    return Category::kAttnV;
  if (Has(name, "attn_k.weight")) return Category::kAttnK;
  if (Has(name, "attn_q.weight")) return Category::kAttnQ;
  if (Has(name, "attn_output.weight")) return Category::kAttnOutput;
  if (Has(name, "ffn_up")) return Category::kFfnUp;
  if (Has(name, "ffn_gate")) return Category::kFfnGate;
  if (Has(name, "ffn_down")) return Category::kFfnDown;
  return Category::kOther;
}

int LayerOf(const std::string& name) {
  int layer = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1) return -1;
  return layer;
}

bool IsQuantized(DType t) { return GetDTypeTraits(t).block_size > 1; }
int BlockSize(DType t) { return static_cast<int>(GetDTypeTraits(t).block_size); }

// Layers that get more bits in the _M mixes: the first and last eighth, and every third one
// in between.
bool UseMoreBits(int i_layer, int n_layers) {
  return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

struct State {
  int n_attention_wv = 0, i_attention_wv = 0, i_ffn_down = 0;
  bool tied_embeddings = true;
};

// The rule of llama_tensor_get_type for the file types we produce.
DType RuleType(const MixModelInfo& m, State& qs, const MixTensor& t, uint32_t ftype,
               DType new_type) {
  const Category cat = CategoryOf(t.name);
  const int n_gqa = m.n_head_kv > 0 ? m.n_head / m.n_head_kv : 0;
  const bool is_70b = m.arch == "llama" && m.n_layer == 80;  // llama.cpp's LLM_TYPE_70B
  const int n_layer = m.n_layer;
  // Dense models count ffn_down tensors; MoE models read the layer from the name (expert
  // tensors need not come in layer order).
  auto ffn_layer = [&](int counter) { return m.n_expert > 1 ? LayerOf(t.name) : counter; };

  if (cat == Category::kOutput || (qs.tied_embeddings && cat == Category::kTokenEmbd)) {
    const uint64_t nx = t.ne.empty() ? 0 : t.ne[0];
    if (m.arch == "falcon" || nx % static_cast<uint64_t>(BlockSize(new_type)) != 0)
      return DType::kQ8_0;
    return new_type != DType::kQ8_0 ? DType::kQ6_K : new_type;
  }
  if (cat == Category::kTokenEmbd) return new_type;
  if (cat == Category::kAttnV) {
    if (ftype == kQ2_K) new_type = n_gqa >= 4 ? DType::kQ4_K : DType::kQ3_K;
    else if (ftype == kQ2_K_S && n_gqa >= 4) new_type = DType::kQ4_K;
    else if (ftype == kQ3_K_M) new_type = qs.i_attention_wv < 2 ? DType::kQ5_K : DType::kQ4_K;
    else if (ftype == kQ3_K_L) new_type = DType::kQ5_K;
    else if ((ftype == kIQ4_NL || ftype == kIQ4_XS) && n_gqa >= 4) new_type = DType::kQ5_K;
    else if ((ftype == kQ4_K_M || ftype == kQ5_K_M) &&
             UseMoreBits(qs.i_attention_wv, qs.n_attention_wv))
      new_type = DType::kQ6_K;
    else if (ftype == kQ4_K_S && qs.i_attention_wv < 4) new_type = DType::kQ5_K;
    if (is_70b && (new_type == DType::kQ3_K || new_type == DType::kQ4_K)) new_type = DType::kQ5_K;
    if (m.n_expert == 8) new_type = DType::kQ8_0;
    ++qs.i_attention_wv;
    return new_type;
  }
  if (cat == Category::kAttnK) return m.n_expert == 8 ? DType::kQ8_0 : new_type;
  if (cat == Category::kFfnDown) {
    const int i_layer = ffn_layer(qs.i_ffn_down);
    const bool falcon = m.arch == "falcon";
    if (ftype == kQ2_K) new_type = DType::kQ3_K;
    else if (ftype == kQ2_K_S) {
      if (i_layer < n_layer / 8) new_type = DType::kQ4_K;
    } else if (ftype == kQ3_K_M) {
      new_type = i_layer < n_layer / 16                        ? DType::kQ5_K
                 : !falcon || UseMoreBits(i_layer, n_layer) ? DType::kQ4_K
                                                               : DType::kQ3_K;
    } else if (ftype == kQ3_K_L) {
      new_type = falcon ? DType::kQ4_K : DType::kQ5_K;
    } else if (ftype == kQ4_K_M) {
      if (falcon)
        new_type = i_layer < n_layer / 16          ? DType::kQ6_K
                   : UseMoreBits(i_layer, n_layer) ? DType::kQ5_K
                                                   : DType::kQ4_K;
      else if (UseMoreBits(i_layer, n_layer))
        new_type = DType::kQ6_K;
    } else if (i_layer < n_layer / 8 && (ftype == kIQ4_NL || ftype == kIQ4_XS)) {
      new_type = DType::kQ5_K;  // llama.cpp: only without an imatrix, which we never have
    } else if (ftype == kQ5_K_M && UseMoreBits(i_layer, n_layer)) {
      new_type = DType::kQ6_K;
    } else if (ftype == kQ4_K_S && !falcon && i_layer < n_layer / 8) {
      new_type = DType::kQ5_K;
    }
    ++qs.i_ffn_down;
    return new_type;
  }
  if (cat == Category::kAttnOutput) {
    if (m.arch != "falcon") {
      if (m.n_expert == 8) {
        if (ftype == kQ2_K || ftype == kQ3_K_S || ftype == kQ3_K_M || ftype == kIQ4_NL ||
            ftype == kQ4_K_S || ftype == kQ4_K_M || ftype == kIQ4_XS)
          new_type = DType::kQ5_K;
      } else {
        if (ftype == kQ2_K) new_type = DType::kQ3_K;
        else if (ftype == kQ3_K_M) new_type = DType::kQ4_K;
        else if (ftype == kQ3_K_L) new_type = DType::kQ5_K;
      }
    } else if (ftype == kQ3_K_L) {
      new_type = DType::kQ4_K;
    }
  }
  return new_type;
}

// A row length the type cannot hold falls back to a 32-element type of similar size, and to
// F16 when even that does not fit.
DType Fallback(const MixTensor& t, DType type, bool* fell_back) {
  const uint64_t ncols = t.ne.empty() ? 0 : t.ne[0];
  if (ncols % static_cast<uint64_t>(BlockSize(type)) == 0) return type;
  *fell_back = true;
  DType r = DType::kF16;
  switch (type) {
    case DType::kIQ4_XS: r = DType::kIQ4_NL; break;
    case DType::kQ2_K: case DType::kQ3_K: r = DType::kQ4_0; break;
    case DType::kQ4_K: r = DType::kQ5_0; break;
    case DType::kQ5_K: r = DType::kQ5_1; break;
    case DType::kQ6_K: r = DType::kQ8_0; break;
    default: break;
  }
  return ncols % static_cast<uint64_t>(BlockSize(r)) == 0 ? r : DType::kF16;
}

int NDims(const MixTensor& t) {  // as ggml_n_dims: trailing 1s do not count
  int n = 1;
  for (int i = 0; i < static_cast<int>(t.ne.size()); ++i)
    if (t.ne[static_cast<size_t>(i)] > 1) n = i + 1;
  return n;
}

}  // namespace

std::optional<FileType> FileTypeFromName(std::string_view name) {
  std::string u(name);
  for (auto& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (u == "Q3_K") u = "Q3_K_M";  // llama-quantize's aliases
  if (u == "Q4_K") u = "Q4_K_M";
  if (u == "Q5_K") u = "Q5_K_M";
  for (const auto& f : kFileTypes)
    if (u == f.name) return f;
  return std::nullopt;
}

std::vector<std::string> FileTypeNames() {
  std::vector<std::string> names;
  for (const auto& f : kFileTypes) names.emplace_back(f.name);
  return names;
}

bool TensorAllowsQuantization(const MixTensor& t) {
  if (NDims(t) < 2) return false;
  const std::string& n = t.name;
  if (n.size() < 6 || n.compare(n.size() - 6, 6, "weight") != 0) return false;
  for (const char* keep : {"_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight",
                           "altup", "laurel", "per_layer_model_proj", "ssm_conv1d",
                           "shortconv.conv.weight", "time_mix_", "attn_rel_b.weight",
                           ".position_embd", ".rel_pos", ".patch_embd"})
    if (Has(n, keep)) return false;
  return n != "position_embd.weight" && n != "token_types.weight";
}

Expected<std::vector<TensorChoice>> ChooseTensorTypes(const MixModelInfo& model,
                                                      const std::vector<MixTensor>& tensors,
                                                      const FileType& ftype,
                                                      const std::map<std::string, DType>* overrides) {
  if (overrides) {
    for (const auto& [name, type] : *overrides) {
      const std::string& wanted = name;  // clang 14 cannot capture a structured binding
      if (std::none_of(tensors.begin(), tensors.end(),
                       [&](const MixTensor& t) { return t.name == wanted; }))
        return NotFound("quantize: override names tensor '" + name + "' that the model lacks");
      if (!CanQuantize(type))
        return Unimplemented("quantize: override for '" + name + "': cannot quantize to " +
                             DTypeName(type));
    }
  }
  State qs;
  for (const auto& t : tensors) {
    if (CategoryOf(t.name) == Category::kAttnV) ++qs.n_attention_wv;
    if (CategoryOf(t.name) == Category::kOutput) qs.tied_embeddings = false;
  }
  // llama.cpp's visiting order: by block number (non-block tensors first), then by name.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int la = LayerOf(tensors[a].name), lb = LayerOf(tensors[b].name);
    if (la != lb) return la < lb;
    return tensors[a].name < tensors[b].name;
  });

  std::vector<TensorChoice> out(tensors.size());
  for (size_t idx : order) {
    const MixTensor& t = tensors[idx];
    TensorChoice& c = out[idx];
    const auto ov = overrides ? overrides->find(t.name) : std::map<std::string, DType>::const_iterator{};
    if (overrides && ov != overrides->end()) {
      c.type = Fallback(t, ov->second, &c.fallback);
      c.quantize = c.type != t.type;
      continue;
    }
    if (!TensorAllowsQuantization(t)) {
      c.type = t.type;
      continue;
    }
    DType type = ftype.default_type;
    if (IsQuantized(type)) {
      if (model.n_expert > 1 && CategoryOf(t.name) == Category::kFfnDown) {
        const int layer = LayerOf(t.name);
        if (layer < 0 || layer >= model.n_layer)
          return InvalidArgument("quantize: cannot place tensor '" + t.name + "' in a layer of " +
                                 std::to_string(model.n_layer));
      }
      type = Fallback(t, RuleType(model, qs, t, ftype.id, type), &c.fallback);
    }
    c.type = type;
    c.quantize = type != t.type;
  }
  return out;
}

}  // namespace substrate
