// End to end: `substrate quantize` writes a GGUF whose tensors equal llama-quantize's file, and
// bad input (unknown type, missing file, bad plan, a plan naming no tensor) fails with a message
// and a non-zero exit without leaving an output file behind.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "quant/cli_util.h"
#include "quant/gguf_fixture.h"

namespace substrate {
namespace {

const std::string kDir = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/";

using testing::CmdResult;
using testing::Exists;
using testing::Substrate;
using testing::TempPath;

class CliQuantize : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Exists(kDir + "tiny-coder-bf16.gguf")) GTEST_SKIP() << "fixtures not found in " << kDir;
    if (!Exists(SUBSTRATE_BINARY)) GTEST_SKIP() << "substrate binary not built";
  }
};

TEST_F(CliQuantize, Q3_K_MFileMatchesReference) {
  const std::string out = TempPath("q3km.gguf");
  CmdResult r = Substrate("quantize " + kDir + "tiny-coder-bf16.gguf " + out + " Q3_K_M --threads 2");
  ASSERT_EQ(r.code, 0) << r.output;
  testing::FixtureModel ours, ref;
  ASSERT_TRUE(testing::LoadFixture(out, &ours));
  ASSERT_TRUE(testing::LoadFixture(kDir + "tiny-coder-Q3_K_M.gguf", &ref));
  EXPECT_EQ(ours.ints["general.file_type"], ref.ints["general.file_type"]);
  ASSERT_EQ(ours.tensors.size(), ref.tensors.size());
  for (size_t i = 0; i < ours.tensors.size(); ++i) {
    EXPECT_EQ(ours.tensors[i].name, ref.tensors[i].name);
    EXPECT_EQ(ours.tensors[i].type, ref.tensors[i].type) << ours.tensors[i].name;
    EXPECT_TRUE(ours.tensors[i].data == ref.tensors[i].data) << ours.tensors[i].name;
  }
  std::remove(out.c_str());
}

TEST_F(CliQuantize, PlanOverridesTypes) {
  const std::string plan = TempPath("plan.json");
  const std::string out = TempPath("plan.gguf");
  std::ofstream(plan) << R"({"tensor_types": {"blk.0.attn_q.weight": "IQ4_XS", "blk.1.ffn_up.weight": "Q8_0"}})";
  CmdResult r = Substrate("quantize " + kDir + "tiny-coder-bf16.gguf " + out + " Q4_0 --plan " + plan);
  ASSERT_EQ(r.code, 0) << r.output;
  testing::FixtureModel m;
  ASSERT_TRUE(testing::LoadFixture(out, &m));
  EXPECT_EQ(m.Find("blk.0.attn_q.weight")->type, DType::kIQ4_XS);
  EXPECT_EQ(m.Find("blk.1.ffn_up.weight")->type, DType::kQ8_0);
  EXPECT_EQ(m.Find("blk.1.attn_q.weight")->type, DType::kQ4_0);
  std::remove(out.c_str());
  std::remove(plan.c_str());
}

TEST_F(CliQuantize, BadInputFailsCleanly) {
  const std::string out = TempPath("bad.gguf");
  const std::string in = kDir + "tiny-coder-bf16.gguf ";
  CmdResult r = Substrate("quantize " + in + out + " Q7_K");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("unknown type 'Q7_K'"), std::string::npos) << r.output;
  r = Substrate("quantize /nonexistent/model.gguf " + out + " Q4_0");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("nonexistent"), std::string::npos) << r.output;
  const std::string plan = TempPath("badplan.json");
  std::ofstream(plan) << R"({"tensor_types": {"no.such.tensor": "Q8_0"}})";
  r = Substrate("quantize " + in + out + " Q4_0 --plan " + plan);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("no.such.tensor"), std::string::npos) << r.output;
  std::ofstream(plan) << "{not json";
  r = Substrate("quantize " + in + out + " Q4_0 --plan " + plan);
  EXPECT_NE(r.code, 0);
  EXPECT_FALSE(Exists(out)) << "a failed run must not leave an output file";
  r = Substrate("quantize " + in);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("usage"), std::string::npos) << r.output;
  std::remove(plan.c_str());
}

}  // namespace
}  // namespace substrate
