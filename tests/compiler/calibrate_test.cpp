// Calibration on the trained tiny-coder (../shared): the runner's KL of the reference Q4_K_M
// types matches the reference runtime's figure, and one op's loss falls with precision.
#include <gtest/gtest.h>

#include <string>

#include "compiler/calibrate.h"
#include "core/file_io.h"

namespace substrate::compiler {
namespace {

const std::string kShared = SUBSTRATE_SHARED_DIR;

std::unique_ptr<CalibrationRunner> OpenTinyCoder() {
  const std::string model = kShared + "/gguf/tiny-coder-bf16.gguf", text = kShared + "/text/heldout.txt";
  if (!FileExists(model) || !FileExists(text)) return nullptr;
  auto r = CalibrationRunner::Open(model, text, 512, 0);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(Calibrate, ReferenceQ4KMTypesReproduceTheReferenceKld) {
  auto runner = OpenTinyCoder();
  if (!runner) GTEST_SKIP() << "../shared/gguf/tiny-coder-bf16.gguf or text/heldout.txt absent";
  auto types = FileTensorTypes(kShared + "/gguf/tiny-coder-Q4_K_M.gguf");
  ASSERT_TRUE(types.ok()) << types.status().ToString();
  auto m = runner->Measure(*types, 8, 2);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  // Reference runtime, 60 chunks: 0.022918 (shared/README.md); two chunks scatter around it.
  EXPECT_GT(m->mean_kld, 0.012);
  EXPECT_LT(m->mean_kld, 0.040);
  EXPECT_GT(m->same_top, 0.85);
}

TEST(Calibrate, OneOpLossFallsWithPrecision) {
  auto runner = OpenTinyCoder();
  if (!runner) GTEST_SKIP() << "../shared/gguf/tiny-coder-bf16.gguf or text/heldout.txt absent";
  auto profile = runner->SkeletonProfile({DType::kQ2_K, DType::kQ8_0});
  ASSERT_TRUE(profile.ok());
  // token_embd owns the tied embedding; 6 layers x (attn, ffn); output has nothing left.
  EXPECT_EQ(profile->ops.size(), 13u);
  const OpProfile* ffn = nullptr;
  for (const auto& op : profile->ops)
    if (op.id == "block_2.ffn") ffn = &op;
  ASSERT_NE(ffn, nullptr);
  std::map<std::string, DType> q2, q8;
  for (const auto& t : ffn->tensors) q2[t.name] = DType::kQ2_K, q8[t.name] = DType::kQ8_0;
  auto a = runner->Measure(q2, 0, 1), b = runner->Measure(q8, 0, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT(a->mean_kld, 10 * b->mean_kld);
  EXPECT_GT(a->mean_kld, 0.001);
}

}  // namespace
}  // namespace substrate::compiler
