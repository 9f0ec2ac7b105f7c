// The per-tensor types of our mixes equal those of the reference files made by llama-quantize
// (dense and MoE, with row-length fallbacks), and overrides replace the rules.
#include <gtest/gtest.h>

#include <string>

#include "quant/gguf_fixture.h"
#include "quant/mix.h"

namespace substrate {
namespace {

const std::string kDir = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/";

MixModelInfo InfoOf(const testing::FixtureModel& m) {
  MixModelInfo info;
  info.arch = m.arch;
  auto get = [&](const std::string& k) {
    auto it = m.ints.find(m.arch + "." + k);
    return it == m.ints.end() ? 0 : static_cast<int>(it->second);
  };
  info.n_layer = get("block_count");
  info.n_head = get("attention.head_count");
  info.n_head_kv = get("attention.head_count_kv");
  info.n_expert = get("expert_count");
  return info;
}

std::vector<MixTensor> TensorsOf(const testing::FixtureModel& m) {
  std::vector<MixTensor> out;
  for (const auto& t : m.tensors) out.push_back({t.name, t.ne, t.type});
  return out;
}

struct Case {
  const char* file;
  const char* base;
  const char* ftype;
};

TEST(Mix, MatchesReferenceFiles) {
  const Case cases[] = {
      {"tiny-coder-Q8_0.gguf", "tiny-coder-bf16.gguf", "Q8_0"},
      {"tiny-coder-Q6_K.gguf", "tiny-coder-bf16.gguf", "Q6_K"},
      {"tiny-coder-Q4_K_M.gguf", "tiny-coder-bf16.gguf", "Q4_K_M"},
      {"tiny-coder-Q4_0.gguf", "tiny-coder-bf16.gguf", "Q4_0"},
      {"tiny-coder-Q3_K_M.gguf", "tiny-coder-bf16.gguf", "Q3_K_M"},
      {"tiny-coder-Q2_K.gguf", "tiny-coder-bf16.gguf", "Q2_K"},
      {"tiny-coder-moe-Q8_0.gguf", "tiny-coder-moe-bf16.gguf", "Q8_0"},
      {"tiny-coder-moe-Q4_K_M.gguf", "tiny-coder-moe-bf16.gguf", "Q4_K_M"},
  };
  testing::FixtureModel probe;
  if (!testing::LoadFixture(kDir + "tiny-coder-bf16.gguf", &probe))
    GTEST_SKIP() << "fixtures not found in " << kDir;
  for (const Case& c : cases) {
    testing::FixtureModel ref, base;
    ASSERT_TRUE(testing::LoadFixture(kDir + c.file, &ref)) << c.file;
    ASSERT_TRUE(testing::LoadFixture(kDir + c.base, &base)) << c.base;
    auto ftype = FileTypeFromName(c.ftype);
    ASSERT_TRUE(ftype.has_value());
    EXPECT_EQ(static_cast<int64_t>(ftype->id), ref.ints["general.file_type"]) << c.file;
    auto tensors = TensorsOf(base);
    auto choice = ChooseTensorTypes(InfoOf(base), tensors, *ftype);
    ASSERT_TRUE(choice.ok()) << choice.status().ToString();
    int fallbacks = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto* rt = ref.Find(tensors[i].name);
      ASSERT_NE(rt, nullptr) << tensors[i].name;
      EXPECT_EQ(DTypeName((*choice)[i].type), std::string(DTypeName(rt->type)))
          << c.file << " " << tensors[i].name;
      fallbacks += (*choice)[i].fallback;
    }
    if (std::string(c.file) == "tiny-coder-moe-Q4_K_M.gguf") {
      EXPECT_GT(fallbacks, 0);
    }
  }
}

TEST(Mix, OverridesReplaceRules) {
  MixModelInfo info{"llama", 2, 4, 4, 0};
  std::vector<MixTensor> t = {
      {"token_embd.weight", {256, 100}, DType::kF16},
      {"blk.0.attn_q.weight", {256, 256}, DType::kF16},
      {"blk.0.attn_norm.weight", {256}, DType::kF32},
      {"blk.0.ffn_down.weight", {96, 256}, DType::kF16},
      {"output.weight", {256, 100}, DType::kF16},
  };
  std::map<std::string, DType> ov = {{"blk.0.attn_q.weight", DType::kQ8_0},
                                     {"blk.0.ffn_down.weight", DType::kQ4_K}};
  auto c = ChooseTensorTypes(info, t, *FileTypeFromName("Q4_K_M"), &ov);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0].type, DType::kQ4_K);  // untied embedding: the default type
  EXPECT_EQ((*c)[1].type, DType::kQ8_0);
  EXPECT_EQ((*c)[2].type, DType::kF32);
  EXPECT_FALSE((*c)[2].quantize);
  EXPECT_EQ((*c)[3].type, DType::kQ5_0);  // Q4_K does not fit 96 columns: falls back
  EXPECT_TRUE((*c)[3].fallback);
  EXPECT_EQ((*c)[4].type, DType::kQ6_K);

  std::map<std::string, DType> bad = {{"blk.9.nothing", DType::kQ8_0}};
  EXPECT_FALSE(ChooseTensorTypes(info, t, *FileTypeFromName("Q4_K_M"), &bad).ok());
  std::map<std::string, DType> unsupported = {{"output.weight", DType::kIQ2_XXS}};
  EXPECT_FALSE(ChooseTensorTypes(info, t, *FileTypeFromName("Q4_K_M"), &unsupported).ok());
}

TEST(Mix, FileTypeNames) {
  EXPECT_EQ(FileTypeFromName("q4_k_m")->id, 15u);
  EXPECT_EQ(FileTypeFromName("Q4_K")->id, 15u);
  EXPECT_EQ(FileTypeFromName("bf16")->default_type, DType::kBF16);
  EXPECT_FALSE(FileTypeFromName("Q7_K").has_value());
}

}  // namespace
}  // namespace substrate

#include "quant/type_plan.h"

namespace substrate {
namespace {

TEST(TypePlan, ParsesBothFormsAndRejectsBadInput) {
  auto a = ParseTensorTypePlan(R"({"tensor_types": {"output.weight": "q6_k", "x": "Q8_0"}})");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->at("output.weight"), DType::kQ6_K);
  EXPECT_EQ(a->at("x"), DType::kQ8_0);
  auto b = ParseTensorTypePlan(R"({"blk.0.attn_q.weight": "IQ4_XS"})");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->at("blk.0.attn_q.weight"), DType::kIQ4_XS);
  EXPECT_EQ(ParseTensorTypePlan("{").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTensorTypePlan(R"({"x": 3})").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTensorTypePlan(R"({"x": "Q9_9"})").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTensorTypePlan(R"({"x": "IQ2_XXS"})").status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(ParseTensorTypePlan("[1,2]").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace substrate
