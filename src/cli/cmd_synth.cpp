// substrate synth: GGUF files with the exact tensor shapes and metadata of real models and
// random weights, quantized properly (values meaningless, speed real), for benchmarks on
// machines that cannot download the real thing.
//
// With --carry MODEL the weights are not random: a small trained dense model is placed inside
// the preset's shapes, zero everywhere else (see Carried below), so the file has a real model's
// size and cost per token and the small model's outputs (its margins, its agreement between
// quantization tiers), which random weights cannot have.
//
// Cheap by construction: for each (type, row length) a pool of 32 random rows is quantized with
// the reference quantizer once; every row of the file is then assembled from blocks drawn at
// random from that pool. Rows are made in parallel, written in order, a chunk at a time, so
// peak memory is one chunk whatever the model size.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "format/dtype.h"
#include "format/gguf_writer.h"
#include "format/model_file.h"
#include "model/hparams.h"
#include "quant/mix.h"
#include "quant/quant.h"

namespace substrate::cli {
namespace {

struct Preset {
  const char* name;
  const char* arch;     // general.architecture, as llama.cpp names it
  const char* display;  // general.name
  int64_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff;
  int64_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
  double rope_theta, rms_eps;
  int64_t n_ctx;
  bool qkv_bias, qk_norm;
  // Next-n (multi-token prediction) layers after the main ones (--nextn): each a main layer's
  // shapes plus nextn.{eh_proj,enorm,hnorm,shared_head_norm}, as DeepSeek-V3's GGUFs carry.
  int64_t n_nextn = 0;
};

// Shapes from each model's config.json.
const Preset kPresets[] = {
    {"llama3-8b", "llama", "Meta-Llama-3-8B (synthetic)", 128256, 4096, 32, 32, 8, 128, 14336,
     0, 0, 0, 0, 500000.0, 1e-5, 8192, false, false},
    {"qwen2moe-a2.7b", "qwen2moe", "Qwen1.5-MoE-A2.7B (synthetic)", 151936, 2048, 24, 16, 16, 128,
     5632, 60, 4, 1408, 5632, 1000000.0, 1e-6, 8192, true, false},
    {"qwen3-30b-a3b", "qwen3moe", "Qwen3-30B-A3B (synthetic)", 151936, 2048, 48, 32, 4, 128, 6144,
     128, 8, 768, 0, 1000000.0, 1e-6, 40960, false, true},
    {"mixtral-8x7b", "llama", "Mixtral-8x7B-v0.1 (synthetic)", 32000, 4096, 32, 32, 8, 128, 14336,
     8, 2, 14336, 0, 1000000.0, 1e-5, 32768, false, false},
    // Small enough for tests: a qwen2moe layout (biases, shared expert, 1.5x256-wide experts).
    {"test-tiny-moe", "qwen2moe", "tiny MoE (synthetic, for tests)", 1000, 256, 2, 4, 2, 64, 512,
     4, 2, 384, 512, 10000.0, 1e-6, 512, true, false},
    // Small enough for tests of --carry (tiny-coder fits inside: more layers, wider in each
    // dimension, four query heads per kv head, 96-wide heads).
    {"test-tiny-dense", "qwen2", "tiny dense (synthetic, for tests)", 1000, 384, 7, 8, 2, 96, 1024,
     0, 0, 0, 0, 10000.0, 1e-6, 512, true, false},
};

// ------------------------------------------------------------------ the model's tensors

struct SynthTensor {
  std::string name;
  std::vector<uint64_t> ne;
  DType type = DType::kF32;
  enum Fill { kOnes, kSmall, kWeight } fill = kWeight;
  uint64_t rows() const {
    uint64_t r = 1;
    for (size_t i = 1; i < ne.size(); ++i) r *= ne[i];
    return r;
  }
};

std::vector<SynthTensor> BuildTensors(const Preset& p) {
  using V = std::vector<uint64_t>;
  auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  std::vector<SynthTensor> t;
  auto add = [&](std::string name, V ne, SynthTensor::Fill fill) {
    SynthTensor s;
    s.name = std::move(name);
    s.ne = std::move(ne);
    s.fill = fill;
    s.type = fill == SynthTensor::kWeight ? DType::kF16 : DType::kF32;
    t.push_back(std::move(s));
  };
  const uint64_t e = u(p.n_embd), q = u(p.n_head * p.head_dim), kv = u(p.n_head_kv * p.head_dim);
  add("token_embd.weight", {e, u(p.n_vocab)}, SynthTensor::kWeight);
  for (int64_t l = 0; l < p.n_layer + p.n_nextn; ++l) {
    std::string b = "blk." + std::to_string(l) + ".";
    if (l >= p.n_layer) {
      add(b + "nextn.eh_proj.weight", {2 * e, e}, SynthTensor::kWeight);
      add(b + "nextn.enorm.weight", {e}, SynthTensor::kOnes);
      add(b + "nextn.hnorm.weight", {e}, SynthTensor::kOnes);
      add(b + "nextn.shared_head_norm.weight", {e}, SynthTensor::kOnes);
    }
    add(b + "attn_norm.weight", {e}, SynthTensor::kOnes);
    add(b + "attn_q.weight", {e, q}, SynthTensor::kWeight);
    add(b + "attn_k.weight", {e, kv}, SynthTensor::kWeight);
    add(b + "attn_v.weight", {e, kv}, SynthTensor::kWeight);
    if (p.qkv_bias) {
      add(b + "attn_q.bias", {q}, SynthTensor::kSmall);
      add(b + "attn_k.bias", {kv}, SynthTensor::kSmall);
      add(b + "attn_v.bias", {kv}, SynthTensor::kSmall);
    }
    if (p.qk_norm) {
      add(b + "attn_q_norm.weight", {u(p.head_dim)}, SynthTensor::kOnes);
      add(b + "attn_k_norm.weight", {u(p.head_dim)}, SynthTensor::kOnes);
    }
    add(b + "attn_output.weight", {q, e}, SynthTensor::kWeight);
    add(b + "ffn_norm.weight", {e}, SynthTensor::kOnes);
    if (p.n_expert == 0) {
      add(b + "ffn_gate.weight", {e, u(p.n_ff)}, SynthTensor::kWeight);
      add(b + "ffn_up.weight", {e, u(p.n_ff)}, SynthTensor::kWeight);
      add(b + "ffn_down.weight", {u(p.n_ff), e}, SynthTensor::kWeight);
      continue;
    }
    const uint64_t x = u(p.n_expert), f = u(p.n_ff_exp);
    add(b + "ffn_gate_inp.weight", {e, x}, SynthTensor::kSmall);
    add(b + "ffn_gate_exps.weight", {e, f, x}, SynthTensor::kWeight);
    add(b + "ffn_up_exps.weight", {e, f, x}, SynthTensor::kWeight);
    add(b + "ffn_down_exps.weight", {f, e, x}, SynthTensor::kWeight);
    if (p.n_ff_shexp > 0) {
      add(b + "ffn_gate_inp_shexp.weight", {e}, SynthTensor::kSmall);
      add(b + "ffn_gate_shexp.weight", {e, u(p.n_ff_shexp)}, SynthTensor::kWeight);
      add(b + "ffn_up_shexp.weight", {e, u(p.n_ff_shexp)}, SynthTensor::kWeight);
      add(b + "ffn_down_shexp.weight", {u(p.n_ff_shexp), e}, SynthTensor::kWeight);
    }
  }
  add("output_norm.weight", {e}, SynthTensor::kOnes);
  add("output.weight", {e, u(p.n_vocab)}, SynthTensor::kWeight);
  return t;
}

// A SentencePiece-style vocabulary (control tokens, 256 byte tokens, filler pieces): enough
// for any GGUF loader, including llama.cpp's, to build a tokenizer.
void AddVocab(Metadata& md, int64_t n_vocab) {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  tokens.reserve(static_cast<size_t>(n_vocab));
  auto push = [&](std::string s, int32_t type) {
    scores.push_back(-static_cast<float>(tokens.size()));
    tokens.push_back(std::move(s));
    types.push_back(type);
  };
  push("<unk>", 2);
  push("<s>", 3);
  push("</s>", 3);
  char buf[16];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    push(buf, 6);
  }
  while (static_cast<int64_t>(tokens.size()) < n_vocab)
    push("\xE2\x96\x81t" + std::to_string(tokens.size()), 1);
  md.Set("tokenizer.ggml.model", MetaValue::Str("llama"));
  md.Set("tokenizer.ggml.tokens", MetaValue::StrArray(tokens));
  md.Set("tokenizer.ggml.scores", MetaValue::F32Array(scores));
  md.Set("tokenizer.ggml.token_type", MetaValue::I32Array(types));
  md.Set("tokenizer.ggml.bos_token_id", MetaValue::U32(1));
  md.Set("tokenizer.ggml.eos_token_id", MetaValue::U32(2));
  md.Set("tokenizer.ggml.unknown_token_id", MetaValue::U32(0));
}

void AddHparams(Metadata& md, const Preset& p, uint32_t file_type) {
  const std::string a = p.arch;
  auto u32 = [&](const std::string& key, int64_t v) {
    md.Set(key, MetaValue::U32(static_cast<uint32_t>(v)));
  };
  auto f32 = [&](const std::string& key, double v) {
    md.Set(key, MetaValue::F32(static_cast<float>(v)));
  };
  md.Set("general.architecture", MetaValue::Str(a));
  md.Set("general.name", MetaValue::Str(p.display));
  u32("general.file_type", file_type);
  u32("general.quantization_version", 2);
  u32(a + ".context_length", p.n_ctx);
  u32(a + ".embedding_length", p.n_embd);
  u32(a + ".block_count", p.n_layer + p.n_nextn);
  if (p.n_nextn > 0) u32(a + ".nextn_predict_layers", p.n_nextn);
  u32(a + ".feed_forward_length", p.n_ff);
  u32(a + ".attention.head_count", p.n_head);
  u32(a + ".attention.head_count_kv", p.n_head_kv);
  u32(a + ".attention.key_length", p.head_dim);
  u32(a + ".attention.value_length", p.head_dim);
  f32(a + ".attention.layer_norm_rms_epsilon", p.rms_eps);
  f32(a + ".rope.freq_base", p.rope_theta);
  u32(a + ".rope.dimension_count", p.head_dim);
  u32(a + ".vocab_size", p.n_vocab);
  if (p.n_expert > 0) {
    u32(a + ".expert_count", p.n_expert);
    u32(a + ".expert_used_count", p.n_expert_used);
    if (a != "llama") u32(a + ".expert_feed_forward_length", p.n_ff_exp);
    if (p.n_ff_shexp > 0) u32(a + ".expert_shared_feed_forward_length", p.n_ff_shexp);
  }
}

// ------------------------------------------------------------------ random data

uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Roughly normal (sum of uniforms), scaled: cheap and enough for meaningless weights.
float RandomNormal(uint64_t& s) {
  uint64_t r = SplitMix(s);
  int sum = 0;
  for (int i = 0; i < 4; ++i) sum += static_cast<int>((r >> (16 * i)) & 0xFFFF);
  return (static_cast<float>(sum) - 2.0f * 65535.0f) / 37837.0f;  // ~unit variance
}

constexpr int kPoolRows = 32;
constexpr float kWeightStd = 0.02f;

// Quantized rows to draw blocks from, per (type, row length).
struct BlockPool {
  std::vector<uint8_t> bytes;
  uint64_t n_blocks = 0, block_bytes = 0;
};

BlockPool MakePool(DType type, uint64_t cols, uint64_t seed, ThreadPool& pool) {
  BlockPool p;
  uint64_t rb = *RowBytes(type, cols);
  p.block_bytes = GetDTypeTraits(type).block_bytes;
  p.n_blocks = rb / p.block_bytes * kPoolRows;
  p.bytes.resize(rb * kPoolRows);
  pool.ParallelFor(kPoolRows, 1, [&](int64_t r0, int64_t r1, int) {
    std::vector<float> f(cols);
    for (int64_t r = r0; r < r1; ++r) {
      uint64_t s = seed * 1000003 + static_cast<uint64_t>(r);
      for (auto& v : f) v = kWeightStd * RandomNormal(s);
      QuantizeRow(type, f.data(), p.bytes.data() + r * rb, static_cast<int64_t>(cols));
    }
  });
  return p;
}

void FillRows(const SynthTensor& t, const BlockPool* bp, uint64_t seed, uint64_t r0, uint64_t r1,
              uint8_t* out) {
  const uint64_t cols = t.ne[0], rb = *RowBytes(t.type, cols);
  for (uint64_t r = r0; r < r1; ++r) {
    uint64_t s = seed ^ (r * 0xD1B54A32D192ED03ull);
    uint8_t* dst = out + (r - r0) * rb;
    if (t.fill != SynthTensor::kWeight || !bp) {
      for (uint64_t c = 0; c < cols; ++c) {
        float v = t.fill == SynthTensor::kOnes    ? 1.0f + 0.05f * RandomNormal(s)
                  : t.fill == SynthTensor::kSmall ? 0.02f * RandomNormal(s)
                                                  : kWeightStd * RandomNormal(s);
        if (t.type == DType::kF32) {
          std::memcpy(dst + 4 * c, &v, 4);
        } else {
          uint16_t h = t.type == DType::kF16 ? Fp32ToFp16(v) : Fp32ToBf16(v);
          std::memcpy(dst + 2 * c, &h, 2);
        }
      }
      continue;
    }
    for (uint64_t b = 0; b < rb / bp->block_bytes; ++b) {
      uint64_t pick = SplitMix(s) % bp->n_blocks;
      std::memcpy(dst + b * bp->block_bytes, bp->bytes.data() + pick * bp->block_bytes,
                  bp->block_bytes);
    }
  }
}

// ------------------------------------------------------------------ a trained model carried

// A trained dense model inside larger shapes. Every dimension of the small model maps to one of
// the preset's; the rest is zero, so the padded part of the residual stream stays exactly zero
// and the small model's computation is what the large file computes:
//   - hidden, FFN and vocabulary indices keep their place (the vocabulary and its tokenizer are
//     the small model's);
//   - query head i (of kv head i / g) goes to head (i / g) * g' + i % g, kv head j to j (g, g':
//     query heads per kv head), so each keeps its kv head;
//   - within a head, a NEOX rotation's halves go to the two halves of the larger head (a normal
//     rotation's pairs keep their place), and the rotation base becomes base^(h' / h), so that
//     every rotated pair turns at its old angle;
//   - queries are scaled by sqrt(h' / h), which undoes the larger head's 1 / sqrt(h');
//   - RMSNorm weights are scaled by sqrt(d / d') and epsilon by d / d', which undoes the mean
//     over more (zero) elements;
//   - layers past the small model's are zero (their attention and FFN add nothing).
// Equal up to float rounding (a test checks the logits); bytes and compute are the preset's.
struct Carried {
  ModelHParams hp;
  Metadata tokenizer;  // the small model's tokenizer.* keys
  std::string arch, display;  // the preset's, pointing here
  struct Weight {
    std::vector<float> values;  // dequantized
    uint64_t cols = 0;          // ne[0]: the row length
  };
  std::map<std::string, Weight> weights;
  // Preset index -> small model's index, or -1 (padding), per kind of dimension.
  std::vector<int64_t> embd, q, kv, ff;
  float q_scale = 1, norm_scale = 1;
};

Status LoadCarried(const std::string& path, Preset* p, Carried* c) {
  ASSIGN_OR_RETURN(auto file, ModelFile::Open(path));
  ASSIGN_OR_RETURN(c->hp, ModelHParams::FromMetadata(file->metadata()));
  const ModelHParams& hp = c->hp;
  auto refuse = [&](const std::string& why) {
    return InvalidArgument("--carry " + path + ": " + why);
  };
  if (hp.n_expert > 0 || p->n_expert > 0)
    return refuse("only a dense model carried into a dense preset");
  if (hp.qk_norm || hp.q_lora_rank > 0 || hp.kv_lora_rank > 0 || hp.n_nextn > 0)
    return refuse("QK norms, MLA and next-n layers are not carried");
  if (hp.head_dim_k != hp.head_dim_v || hp.rope.n_rot != hp.head_dim_k ||
      hp.rope.freq_scale != 1.0f || hp.rope.yarn_factor != 0.0f)
    return refuse("needs equal key and value heads, rotated whole, without rope scaling");
  const int64_t g = hp.n_head / hp.n_head_kv, g2 = p->n_head / p->n_head_kv;
  if (hp.n_embd > p->n_embd || hp.n_ff > p->n_ff || hp.n_layer > p->n_layer ||
      hp.head_dim_k > p->head_dim || hp.n_head_kv > p->n_head_kv || g > g2)
    return refuse("larger than the preset in some dimension (hidden, FFN, layers, head size, "
                  "kv heads or query heads per kv head)");
  for (const std::string& key : file->metadata().keys())
    if (key.rfind("tokenizer.", 0) == 0) c->tokenizer.Set(key, *file->metadata().Find(key));
  for (const TensorInfo& t : file->tensors()) {
    if (!CanDequantize(t.type)) return refuse("tensor '" + t.name + "' of a type not read here");
    std::vector<uint8_t> raw(t.bytes);
    RETURN_IF_ERROR(file->ReadTensor(t, raw.data()));
    uint64_t n = 1;
    for (uint64_t x : t.ne) n *= x;
    Carried::Weight& w = c->weights[t.name];
    w.cols = t.ne[0];
    w.values.resize(n);
    const uint64_t row_bytes = *RowBytes(t.type, static_cast<int64_t>(w.cols));
    for (uint64_t r = 0; r < n / w.cols; ++r)
      DequantizeRow(t.type, raw.data() + r * row_bytes, w.values.data() + r * w.cols,
                    static_cast<int64_t>(w.cols));
  }

  const int64_t h = hp.head_dim_k, h2 = p->head_dim;
  auto in_head = [&](int64_t d) {  // a dimension of a small head in the larger one
    if (hp.rope.style == RopeStyle::kNormal || d < h / 2) return d;
    return h2 / 2 + d - h / 2;
  };
  auto identity = [](int64_t n, int64_t to) {
    std::vector<int64_t> m(static_cast<size_t>(to), -1);
    for (int64_t i = 0; i < n; ++i) m[static_cast<size_t>(i)] = i;
    return m;
  };
  c->embd = identity(hp.n_embd, p->n_embd);
  c->ff = identity(hp.n_ff, p->n_ff);
  c->q.assign(static_cast<size_t>(p->n_head * h2), -1);
  c->kv.assign(static_cast<size_t>(p->n_head_kv * h2), -1);
  for (int64_t i = 0; i < hp.n_head; ++i)
    for (int64_t d = 0; d < h; ++d)
      c->q[static_cast<size_t>(((i / g) * g2 + i % g) * h2 + in_head(d))] = i * h + d;
  for (int64_t j = 0; j < hp.n_head_kv; ++j)
    for (int64_t d = 0; d < h; ++d) c->kv[static_cast<size_t>(j * h2 + in_head(d))] = j * h + d;
  c->q_scale = static_cast<float>(std::sqrt(static_cast<double>(h2) / static_cast<double>(h)));
  c->norm_scale = static_cast<float>(
      std::sqrt(static_cast<double>(hp.n_embd) / static_cast<double>(p->n_embd)));

  c->arch = hp.arch;
  c->display = std::string(p->display) + " carrying " +
               file->metadata().GetString("general.name", path);
  p->arch = c->arch.c_str();
  p->display = c->display.c_str();
  p->n_vocab = hp.n_vocab;
  p->n_ctx = hp.n_ctx_train;
  p->rope_theta = std::pow(static_cast<double>(hp.rope.freq_base),
                           static_cast<double>(h2) / static_cast<double>(h));
  p->rms_eps = static_cast<double>(hp.norm_eps) * static_cast<double>(hp.n_embd) /
               static_cast<double>(p->n_embd);
  p->qkv_bias = c->weights.count("blk.0.attn_q.bias") != 0;
  p->qk_norm = false;
  // A tensor the preset has no place for (an output bias, rope factors...) would be dropped
  // and the file would compute something else.
  std::set<std::string> names;
  for (const SynthTensor& t : BuildTensors(*p)) names.insert(t.name);
  for (const auto& [name, w] : c->weights)
    if (!names.count(name)) return refuse("tensor '" + name + "' has no place in the preset");
  return Status::Ok();
}

// Where a tensor's rows come from: row r is the source's row rows[r] (rows null: row r itself,
// as the vocabulary's and the 1-D tensors' single row; -1: a zero row), element i its element
// cols[i] times scale (-1: pad). No source: every row is pad.
struct CarriedSource {
  const Carried::Weight* w = nullptr;
  const std::vector<int64_t>* rows = nullptr;
  const std::vector<int64_t>* cols = nullptr;
  float scale = 1, pad = 0;
};

CarriedSource SourceOf(const Carried& c, const std::string& tensor) {
  std::string name = tensor, src = tensor;
  int layer = -1;
  if (name.rfind("blk.", 0) == 0) {
    layer = std::stoi(name.substr(4));
    name = name.substr(name.find('.', 4) + 1);
  }
  CarriedSource s;
  // Norm weights over padding meet only zeros; ones keep them plain norms.
  const bool norm = name.find("norm.weight") != std::string::npos;
  if (norm) s.pad = 1;
  if (layer >= c.hp.n_layer) return s;  // a layer past the small model's: zero, its norms ones
  s.cols = &c.embd;
  if (name == "token_embd.weight" || name == "output.weight") {
    if (!c.weights.count(src)) src = "token_embd.weight";  // tied
  } else if (name == "attn_q.weight") {
    s.rows = &c.q, s.scale = c.q_scale;
  } else if (name == "attn_q.bias") {
    s.cols = &c.q, s.scale = c.q_scale;
  } else if (name == "attn_k.weight" || name == "attn_v.weight") {
    s.rows = &c.kv;
  } else if (name == "attn_k.bias" || name == "attn_v.bias") {
    s.cols = &c.kv;
  } else if (name == "attn_output.weight") {
    s.rows = &c.embd, s.cols = &c.q;
  } else if (name == "ffn_gate.weight" || name == "ffn_up.weight") {
    s.rows = &c.ff;
  } else if (name == "ffn_down.weight") {
    s.rows = &c.embd, s.cols = &c.ff;
  } else if (norm) {
    s.scale = c.norm_scale;
  }
  const auto w = c.weights.find(src);
  if (w == c.weights.end()) s.pad = 0;  // a tensor the small model lacks: zero
  else s.w = &w->second;
  return s;
}

// Row r (cols elements) from its source: false when it is all zero.
bool CarriedRow(const CarriedSource& s, uint64_t r, uint64_t cols, float* out) {
  const int64_t src_row = s.rows ? (*s.rows)[static_cast<size_t>(r)] : static_cast<int64_t>(r);
  if (!s.w || src_row < 0) {
    if (s.pad == 0) return false;
    std::fill(out, out + cols, s.pad);
    return true;
  }
  const float* in = s.w->values.data() + static_cast<uint64_t>(src_row) * s.w->cols;
  for (uint64_t i = 0; i < cols; ++i) {
    const int64_t j = (*s.cols)[static_cast<size_t>(i)];
    out[i] = j >= 0 ? s.scale * in[j] : s.pad;
  }
  return true;
}

// Rows [r0, r1) of t from its source, in t's type; zero rows copied from `zero`.
void FillCarriedRows(const CarriedSource& src, const SynthTensor& t,
                     const std::vector<uint8_t>& zero, uint64_t r0, uint64_t r1, uint8_t* out) {
  const uint64_t cols = t.ne[0], rb = *RowBytes(t.type, static_cast<int64_t>(cols));
  std::vector<float> f(cols);
  for (uint64_t r = r0; r < r1; ++r) {
    uint8_t* dst = out + (r - r0) * rb;
    if (!CarriedRow(src, r, cols, f.data())) {
      std::memcpy(dst, zero.data(), rb);
      continue;
    }
    if (t.type == DType::kF32) {
      std::memcpy(dst, f.data(), rb);
    } else {
      QuantizeRow(t.type, f.data(), dst, static_cast<int64_t>(cols));
    }
  }
}

// ------------------------------------------------------------------ the command

Status Synth(const Preset& preset, const FileType& ftype, const std::string& out_path,
             uint64_t seed, const Carried* carried, ThreadPool& pool) {
  std::vector<SynthTensor> tensors = BuildTensors(preset);
  std::vector<MixTensor> mix;
  for (const auto& t : tensors) mix.push_back({t.name, t.ne, t.type});
  MixModelInfo info{preset.arch, static_cast<int>(preset.n_layer + preset.n_nextn),
                    static_cast<int>(preset.n_head), static_cast<int>(preset.n_head_kv),
                    static_cast<int>(preset.n_expert)};
  ASSIGN_OR_RETURN(auto choices, ChooseTensorTypes(info, mix, ftype));
  for (size_t i = 0; i < tensors.size(); ++i) {
    tensors[i].type = choices[i].type;
    if (!RowBytes(tensors[i].type, tensors[i].ne[0]))
      return Internal("synth: tensor '" + tensors[i].name + "' row of " +
                      std::to_string(tensors[i].ne[0]) + " does not fit type " +
                      DTypeName(tensors[i].type));
  }

  // The header through the format layer's writer: metadata in insertion order, tensor infos,
  // then the data streamed a chunk at a time (GgufWriter pads each tensor to the alignment).
  Metadata md;
  AddHparams(md, preset, ftype.id);
  if (carried) {
    for (const std::string& key : carried->tokenizer.keys())
      md.Set(key, *carried->tokenizer.Find(key));
  } else {
    AddVocab(md, preset.n_vocab);
  }
  md.Set("general.alignment", MetaValue::U32(32));
  GgufWriter writer(out_path);
  writer.SetMetadata(md);
  uint64_t total = 0;
  for (const auto& t : tensors) {
    RETURN_IF_ERROR(writer.AddTensor(t.name, t.ne, t.type));
    total += *RowBytes(t.type, t.ne[0]) * t.rows();
  }

  std::map<std::pair<DType, uint64_t>, BlockPool> pools;
  std::vector<uint8_t> chunk;
  const uint64_t kChunkBytes = 32ull << 20;
  ProgressBar bar("synth " + std::string(preset.name) + " " + ftype.name, total);
  uint64_t done = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SynthTensor& t = tensors[i];
    const BlockPool* bp = nullptr;
    std::vector<uint8_t> zero;  // a carried tensor's zero row
    CarriedSource source;
    if (carried) {
      source = SourceOf(*carried, t.name);
      const std::vector<float> z(t.ne[0], 0.0f);
      zero.resize(*RowBytes(t.type, t.ne[0]));
      if (t.type == DType::kF32) std::memset(zero.data(), 0, zero.size());
      else QuantizeRow(t.type, z.data(), zero.data(), static_cast<int64_t>(t.ne[0]));
    } else if (t.fill == SynthTensor::kWeight && GetDTypeTraits(t.type).block_size > 1) {
      auto key = std::make_pair(t.type, t.ne[0]);
      auto it = pools.find(key);
      if (it == pools.end())
        it = pools.emplace(key, MakePool(t.type, t.ne[0], seed + pools.size(), pool)).first;
      bp = &it->second;
    }
    const uint64_t rb = *RowBytes(t.type, t.ne[0]), rows = t.rows();
    const uint64_t rows_per_chunk = std::max<uint64_t>(1, kChunkBytes / rb);
    for (uint64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
      uint64_t r1 = std::min(rows, r0 + rows_per_chunk);
      chunk.resize((r1 - r0) * rb);
      uint64_t tseed = seed * 0x9E3779B97F4A7C15ull + i;
      pool.ParallelFor(static_cast<int64_t>(r1 - r0), 64, [&](int64_t a, int64_t b, int) {
        if (carried)
          FillCarriedRows(source, t, zero, r0 + a, r0 + b, chunk.data() + a * rb);
        else
          FillRows(t, bp, tseed, r0 + a, r0 + b, chunk.data() + a * rb);
      });
      RETURN_IF_ERROR(writer.WriteTensorData(chunk.data(), chunk.size()));
      done += chunk.size();
      bar.Update(done, t.name);
    }
  }
  bar.Finish();
  return writer.Finish();
}

int RunSynth(const std::vector<std::string>& args) {
  std::string names;
  for (const auto& p : kPresets) names += std::string(names.empty() ? "" : ", ") + p.name;
  const std::string usage =
      "usage: substrate synth --preset NAME --type TYPE -o FILE.gguf [--layers N] [--nextn N]\n"
      "                       [--seed S] [--carry MODEL] [-t THREADS]\n"
      "Writes a GGUF with a real model's tensor shapes and metadata and random weights.\n"
      "--carry MODEL puts a small trained dense model (GGUF or HF folder) inside those shapes,\n"
      "zero elsewhere: the file computes what MODEL computes (its vocabulary and tokenizer\n"
      "included) at the preset's size, for speed figures with trained outputs.\n"
      "--nextn N adds N next-n (multi-token prediction) layers after the main ones, as\n"
      "DeepSeek-V3's GGUFs carry (what run, chat, serve and bench draft from).\n"
      "presets: " +
      names + "\nTYPE: a tensor type (Q8_0, Q4_0, F16...) or a mix (Q4_K_M, Q3_K_S...)\n";
  Flags f(args, {{"--preset", "--type", "-o", "--out", "--layers", "--nextn", "--seed", "-t",
                  "--threads", "--carry"}});
  if (!f.status().ok()) return UsageError("synth", f.status(), usage);
  if (f.help()) return std::fputs(usage.c_str(), stdout), 0;
  std::string preset_name = f.Get({"--preset"}), type_name = f.Get({"--type"}, "Q4_K_M");
  std::string out = f.Get({"-o", "--out"});
  const Preset* preset = nullptr;
  for (const auto& p : kPresets)
    if (preset_name == p.name) preset = &p;
  if (!preset)
    return PrintError("synth", InvalidArgument("unknown --preset '" + preset_name +
                                               "' (known: " + names + ")"));
  auto ftype = FileTypeFromName(type_name);
  if (!ftype) return PrintError("synth", InvalidArgument("unknown --type '" + type_name + "'"));
  if (out.empty()) return PrintError("synth", InvalidArgument("-o FILE.gguf is required"));
  auto layers = f.GetInt({"--layers"}, preset->n_layer);
  auto seed = f.GetInt({"--seed"}, 1);
  auto nextn = f.GetInt({"--nextn"}, 0);
  for (auto* e : {&layers, &seed, &nextn})
    if (!e->ok()) return PrintError("synth", e->status());
  auto threads = ThreadsFlag(f);
  if (!threads.ok()) return PrintError("synth", threads.status());
  if (*layers < 1 || *layers > preset->n_layer)
    return PrintError("synth", InvalidArgument("--layers must be in 1.." +
                                               std::to_string(preset->n_layer)));
  if (*nextn < 0 || *nextn > 4)
    return PrintError("synth", InvalidArgument("--nextn must be in 0..4"));
  Preset p = *preset;
  p.n_layer = *layers;
  p.n_nextn = *nextn;
  Carried carried;
  const std::string carry = f.Get({"--carry"});
  if (!carry.empty()) {
    if (p.n_nextn > 0) return PrintError("synth", InvalidArgument("--carry takes no --nextn"));
    Status st = LoadCarried(carry, &p, &carried);
    if (!st.ok()) return PrintError("synth", st);
  }
  ThreadPool local(*threads > 0 ? static_cast<int>(*threads) : 1);
  ThreadPool& pool = *threads > 0 ? local : ThreadPool::Default();
  Status st = Synth(p, *ftype, out, static_cast<uint64_t>(*seed),
                    carry.empty() ? nullptr : &carried, pool);
  if (!st.ok()) return PrintError("synth", st);
  std::fprintf(stderr, "synth: wrote %s (%s, %s, %lld layers)\n", out.c_str(), p.name,
               ftype->name, static_cast<long long>(p.n_layer));
  return 0;
}

CommandRegistrar reg("synth", "write a GGUF with a real model's shapes and random weights",
                     &RunSynth);

}  // namespace
}  // namespace substrate::cli
