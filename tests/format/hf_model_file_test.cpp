#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "format/float_convert.h"
#include "format/gguf_reader.h"
#include "format/hf_internal.h"
#include "format/hf_model_file.h"
#include "test_util.h"

namespace substrate {
namespace {

using testing::SharedPath;

const char* kAllModels[] = {"tiny-random-llama",    "tiny-random-qwen2",     "tiny-random-qwen3",
                            "tiny-random-mixtral",  "tiny-random-qwen2-moe", "tiny-random-qwen3-moe",
                            "tiny-random-deepseek-v3", "tiny-coder",         "tiny-coder-moe"};

// Keys we write that the early-2025 converter did not (documented in hf_metadata.cpp).
bool IsExtensionKey(const std::string& k) {
  return k.find("expert_weights_norm") != std::string::npos ||
         k.find("expert_group") != std::string::npos;
}

std::string ReadAll(const ModelFile& m, const TensorInfo& t) {
  std::string b(t.bytes, '\0');
  Status s = m.ReadTensor(t, b.data());
  EXPECT_TRUE(s.ok()) << s.ToString();
  return b;
}

// The HF folder must present exactly the reference GGUF's catalog: names, order, shapes, metadata;
// tensor bytes equal after the converter's type policy (1-D tensors in F32).
void CompareWithReference(const std::string& model, const std::string& gguf) {
  std::string dir = SharedPath("models/" + model), ref_path = SharedPath("gguf/" + gguf);
  if (!FileExists(dir) || !FileExists(ref_path)) GTEST_SKIP() << "fixtures absent";
  auto hf = ModelFile::Open(dir);
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  auto ref = ModelFile::Open(ref_path);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  const auto& a = (*hf)->tensors();
  const auto& b = (*ref)->tensors();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name) << i;
    EXPECT_EQ(a[i].ne, b[i].ne) << a[i].name;
    std::string x = ReadAll(**hf, a[i]), y = ReadAll(**ref, b[i]);
    if (a[i].type != b[i].type) {
      ASSERT_EQ(b[i].type, DType::kF32) << a[i].name;
      std::string conv(a[i].n_elements() * 4, '\0');
      ASSERT_TRUE(ConvertFloats(a[i].type, x.data(), DType::kF32, conv.data(), a[i].n_elements()).ok());
      x = conv;
    }
    EXPECT_TRUE(x == y) << "bytes differ: " << a[i].name;
  }
  const Metadata& ma = (*hf)->metadata();
  const Metadata& mb = (*ref)->metadata();
  for (const auto& k : mb.keys()) {
    const MetaValue* v = ma.Find(k);
    ASSERT_NE(v, nullptr) << "missing key " << k;
    EXPECT_TRUE(*v == *mb.Find(k)) << k << ": " << MetaValueToString(*v) << " vs "
                                   << MetaValueToString(*mb.Find(k));
  }
  for (const auto& k : ma.keys())
    EXPECT_TRUE(mb.Has(k) || IsExtensionKey(k)) << "extra key " << k;
}

TEST(HfModelFile, TinyCoderMatchesReferenceGguf) { CompareWithReference("tiny-coder", "tiny-coder-bf16.gguf"); }

TEST(HfModelFile, TinyCoderMoeMatchesReferenceGguf) {
  CompareWithReference("tiny-coder-moe", "tiny-coder-moe-bf16.gguf");
}

TEST(HfModelFile, AllFoldersOpen) {
  for (const char* name : kAllModels) {
    std::string dir = SharedPath(std::string("models/") + name);
    if (!FileExists(dir)) GTEST_SKIP() << "fixtures absent";
    auto m = ModelFile::Open(dir);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status().ToString();
    const Metadata& md = (*m)->metadata();
    std::string arch = *md.GetString("general.architecture");
    int64_t n_layer = *md.GetInt(arch + ".block_count");
    EXPECT_GT(n_layer, 0) << name;
    EXPECT_TRUE(md.Has(arch + ".rope.freq_base")) << name;
    EXPECT_TRUE(md.Has(arch + ".attention.layer_norm_rms_epsilon")) << name;
    EXPECT_NE((*m)->Find("token_embd.weight"), nullptr) << name;
    EXPECT_NE((*m)->Find("output_norm.weight"), nullptr) << name;
    for (int64_t l = 0; l < n_layer; ++l)
      EXPECT_NE((*m)->Find("blk." + std::to_string(l) + ".attn_norm.weight"), nullptr) << name;
    // Every tensor reads.
    for (const auto& t : (*m)->tensors()) {
      std::string b(t.bytes, '\0');
      ASSERT_TRUE((*m)->ReadTensor(t, b.data()).ok()) << name << " " << t.name;
    }
  }
}

TEST(HfModelFile, ArchitectureDetails) {
  std::string base = SharedPath("models/");
  if (!FileExists(base + "tiny-random-mixtral")) GTEST_SKIP() << "fixtures absent";
  {
    auto m = ModelFile::Open(base + "tiny-random-mixtral");
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const Metadata& md = (*m)->metadata();
    EXPECT_EQ(*md.GetString("general.architecture"), "llama");
    EXPECT_EQ(*md.GetInt("llama.expert_count"), 8);
    EXPECT_EQ(*md.GetInt("llama.expert_used_count"), 2);
    EXPECT_EQ(*md.GetInt("llama.rope.dimension_count"), 16);
    EXPECT_FLOAT_EQ(static_cast<float>(*md.GetFloat("llama.rope.freq_base")), 1e6f);
    const TensorInfo* g = (*m)->Find("blk.1.ffn_gate_exps.weight");
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->ne, (std::vector<uint64_t>{64, 128, 8}));
    EXPECT_EQ(g->parts.size(), 8u);
    const TensorInfo* q = (*m)->Find("blk.0.attn_q.weight");
    EXPECT_EQ(q->transform, TensorTransform::kPermuteRopeHeads);
    EXPECT_EQ(q->transform_arg, 4);
    EXPECT_EQ((*m)->Find("blk.0.attn_k.weight")->transform_arg, 2);
    EXPECT_EQ((*m)->Find("blk.0.attn_v.weight")->transform, TensorTransform::kNone);
    // A slice is one expert: the same bytes as that expert's part.
    std::string s(g->slice_bytes(), '\0'), p(g->parts[5].bytes, '\0');
    ASSERT_TRUE((*m)->ReadSlice(*g, 5, s.data()).ok());
    ASSERT_TRUE((*m)->file(g->parts[5].file).Read(g->parts[5].offset, p.size(), p.data()).ok());
    EXPECT_TRUE(s == p);
  }
  {
    auto m = ModelFile::Open(base + "tiny-random-qwen2");
    ASSERT_TRUE(m.ok());
    EXPECT_EQ((*m)->Find("blk.0.attn_q.weight")->transform, TensorTransform::kNone);  // no permute
    EXPECT_NE((*m)->Find("blk.0.attn_q.bias"), nullptr);
  }
  {
    auto m = ModelFile::Open(base + "tiny-random-deepseek-v3");
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const Metadata& md = (*m)->metadata();
    EXPECT_EQ(*md.GetString("general.architecture"), "deepseek2");
    EXPECT_EQ(*md.GetInt("deepseek2.leading_dense_block_count"), 1);
    EXPECT_EQ(*md.GetInt("deepseek2.attention.q_lora_rank"), 48);
    EXPECT_EQ(*md.GetInt("deepseek2.attention.kv_lora_rank"), 32);
    EXPECT_EQ(*md.GetInt("deepseek2.attention.key_length"), 24);
    EXPECT_EQ(*md.GetInt("deepseek2.attention.value_length"), 16);
    EXPECT_EQ(*md.GetInt("deepseek2.rope.dimension_count"), 8);
    EXPECT_EQ(*md.GetInt("deepseek2.expert_count"), 8);
    EXPECT_EQ(*md.GetInt("deepseek2.expert_shared_count"), 1);
    EXPECT_EQ(*md.GetInt("deepseek2.expert_gating_func"), 2);
    EXPECT_EQ(*md.GetInt("deepseek2.expert_group_count"), 2);
    EXPECT_EQ(*md.GetInt("deepseek2.expert_group_used_count"), 1);
    EXPECT_FLOAT_EQ(static_cast<float>(*md.GetFloat("deepseek2.expert_weights_scale")), 2.5f);
    EXPECT_TRUE(*md.GetBool("deepseek2.expert_weights_norm"));
    EXPECT_NE((*m)->Find("blk.0.ffn_gate.weight"), nullptr);  // dense first layer
    EXPECT_NE((*m)->Find("blk.1.exp_probs_b.bias"), nullptr);
    const TensorInfo* kvb = (*m)->Find("blk.2.attn_kv_b.weight");
    ASSERT_NE(kvb, nullptr);
    EXPECT_EQ(kvb->ne, (std::vector<uint64_t>{32, 128}));  // unsplit: 4 heads x (16 nope + 16 v)
    EXPECT_EQ((*m)->Find("blk.2.attn_kv_a_mqa.weight")->ne, (std::vector<uint64_t>{64, 40}));
    EXPECT_NE((*m)->Find("blk.2.ffn_down_shexp.weight"), nullptr);
    EXPECT_EQ((*m)->Find("blk.3.attn_norm.weight"), nullptr);
  }
  {
    auto m = ModelFile::Open(base + "tiny-random-qwen3-moe");
    ASSERT_TRUE(m.ok());
    const Metadata& md = (*m)->metadata();
    EXPECT_EQ(*md.GetInt("qwen3moe.expert_count"), 8);
    EXPECT_EQ(*md.GetInt("qwen3moe.expert_feed_forward_length"), 32);
    EXPECT_EQ(*md.GetInt("qwen3moe.attention.key_length"), 16);
    EXPECT_NE((*m)->Find("blk.1.attn_k_norm.weight"), nullptr);
  }
}

TEST(HfModelFile, RopePermutationMatchesConverter) {
  // 2 heads of 4 rows each, 1 byte per row: rows h*4 + [0,1,2,3] (halves [0,1] and [2,3])
  // become interleaved pairs [0,2,1,3].
  uint8_t in[8] = {0, 1, 2, 3, 4, 5, 6, 7}, out[8];
  ASSERT_TRUE(PermuteRopeRows(in, out, 8, 1, 2).ok());
  const uint8_t want[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  EXPECT_EQ(std::memcmp(out, want, 8), 0);
  EXPECT_FALSE(PermuteRopeRows(in, out, 6, 1, 4).ok());
}

TEST(HfModelFile, PermutedRead) {
  std::string dir = SharedPath("models/tiny-random-llama");
  SKIP_IF_NO_SHARED(dir);
  auto m = ModelFile::Open(dir);
  ASSERT_TRUE(m.ok());
  const TensorInfo* k = (*m)->Find("blk.0.attn_k.weight");  // [64 in, 32 out], 2 kv heads
  ASSERT_NE(k, nullptr);
  std::vector<float> raw(64 * 32), got(64 * 32);
  ASSERT_TRUE((*m)->file(0).Read(k->parts[0].offset, k->bytes, raw.data()).ok());
  ASSERT_TRUE((*m)->ReadTensor(*k, got.data()).ok());
  // Head 1 (rows 16..31): output row 16 + 2*i + j = input row 16 + j*8 + i.
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 2; ++j)
      EXPECT_EQ(got[(16 + 2 * i + j) * 64 + 3], raw[(16 + j * 8 + i) * 64 + 3]);
}

TEST(HfModelFile, Names) {
  EXPECT_EQ(hf::TitleFromFolderName("tiny-coder"), "Tiny Coder");
  EXPECT_EQ(hf::TitleFromFolderName("tiny-coder-moe"), "Tiny Coder Moe");
  EXPECT_EQ(hf::TitleFromFolderName("qwen2-7b-v1.5"), "Qwen2 7b v1.5");
  EXPECT_EQ(hf::TitleFromFolderName("Meta-Llama"), "Meta Llama");
}

TEST(HfModelFile, BadFolders) {
  testing::TempDir dir;
  auto m = ModelFile::Open(dir.path());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  testing::WriteBytes(dir.File("config.json"), "{\"model_type\": \"llama\"");
  EXPECT_EQ(ModelFile::Open(dir.path()).status().code(), StatusCode::kCorruption);
  testing::WriteBytes(dir.File("config.json"), "{\"model_type\": \"gpt_bigcode\"}");
  EXPECT_EQ(ModelFile::Open(dir.path()).status().code(), StatusCode::kUnimplemented);
  testing::WriteBytes(dir.File("config.json"),
                      R"({"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 4,
                          "num_attention_heads": 1})");
  EXPECT_EQ(ModelFile::Open(dir.path()).status().code(), StatusCode::kNotFound);  // no weights
  EXPECT_EQ(ModelFile::Open(dir.File("nope.gguf")).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace substrate
