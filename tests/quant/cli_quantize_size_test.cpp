// End to end: `substrate quantize IN OUT --size BYTES -f TEXT` calibrates, plans and writes a
// file whose size is the prediction to the byte and within 0.1 % below the target; the cached
// profile replans without the text; `compile --target-file-bytes` + `quantize --plan` (no
// TYPE) with the same statistics writes the same bytes; a target below the smallest file is an
// error naming the minimum.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>
#include <string>

#include "format/model_file.h"
#include "quant/cli_util.h"
#include "quant/quantize_model.h"

namespace substrate {
namespace {

using testing::CmdResult;
using testing::Exists;
using testing::SizeOf;
using testing::Substrate;
using testing::TempPath;

const std::string kShared = std::string(SUBSTRATE_SHARED_DIR);
const std::string kBf16 = kShared + "/gguf/tiny-coder-bf16.gguf";
const std::string kText = kShared + "/text/heldout.txt";
// Small and quick: 128-token chunks, few of them, few sensitivity groups.
const std::string kCal = " -c 128 --stats-chunks 4 --measure-chunks 1 --groups 6 -t 2";

class CliQuantizeSize : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Exists(kBf16) || !Exists(kText)) GTEST_SKIP() << "fixtures not found in " << kShared;
    if (!Exists(SUBSTRATE_BINARY)) GTEST_SKIP() << "substrate binary not built";
  }
};

uint64_t PredictedBytesIn(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex("wrote \\S+: (\\d+) bytes"))) return 0;
  return std::stoull(m[1]);
}

TEST_F(CliQuantizeSize, FileIsThePredictionAndWithinATenthOfAPercentBelowTarget) {
  const uint64_t target = SizeOf(kShared + "/gguf/tiny-coder-Q4_K_M.gguf");
  ASSERT_GT(target, 0u);
  const std::string out = TempPath("size.gguf"), profile = out + ".profile.json";
  CmdResult r = Substrate("quantize " + kBf16 + " " + out + " --size " + std::to_string(target) +
                          " -f " + kText + kCal);
  ASSERT_EQ(r.code, 0) << r.output;
  const uint64_t written = SizeOf(out);
  EXPECT_EQ(written, PredictedBytesIn(r.output)) << r.output;
  EXPECT_LE(written, target);
  EXPECT_GE(written, target - target / 1000) << r.output;
  EXPECT_NE(r.output.find("predicted KLD"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("attn_q "), std::string::npos) << r.output;  // the mix, per kind
  auto file = ModelFile::Open(out);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const Metadata& md = (*file)->metadata();
  EXPECT_EQ(md.GetInt("general.file_type", -1), 15) << "nearest llama.cpp type: Q4_K_M";
  EXPECT_NE(md.GetString(kQuantizePlanKey, "").find("predicted_kld="), std::string::npos);
  ASSERT_TRUE(Exists(profile));
  ASSERT_TRUE(Exists(out + ".profile.imatrix.gguf"));

  // Replanning from the cached profile needs no text; a smaller target, a smaller file.
  const std::string out2 = TempPath("size2.gguf");
  const uint64_t target2 = SizeOf(kShared + "/gguf/tiny-coder-Q3_K_M.gguf");
  r = Substrate("quantize " + kBf16 + " " + out2 + " --size " + std::to_string(target2) +
                " --profile " + profile + " -t 2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(SizeOf(out2), PredictedBytesIn(r.output));
  EXPECT_LE(SizeOf(out2), target2);
  EXPECT_GE(SizeOf(out2), target2 - target2 / 1000);

  // --bpw: bits per weight of the whole model, the same rule.
  {
    auto bf16 = ModelFile::Open(kBf16);
    ASSERT_TRUE(bf16.ok());
    uint64_t params = 0;
    for (const TensorInfo& t : (*bf16)->tensors()) params += t.n_elements();
    const uint64_t target_bpw = params * 45 / 80;  // 4.5 bits
    const std::string out_bpw = TempPath("size_bpw.gguf");
    r = Substrate("quantize " + kBf16 + " " + out_bpw + " --bpw 4.5 --profile " + profile + " -t 2");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(SizeOf(out_bpw), PredictedBytesIn(r.output));
    EXPECT_LE(SizeOf(out_bpw), target_bpw);
    EXPECT_GE(SizeOf(out_bpw), target_bpw - target_bpw / 1000) << r.output;
    std::remove(out_bpw.c_str());
  }

  // The same budget through compile + quantize --plan (no TYPE), same statistics: same bytes.
  const std::string plan = TempPath("fileplan.json"), out3 = TempPath("size3.gguf");
  r = Substrate("compile " + profile + " --target-file-bytes " + std::to_string(target) + " -o " + plan);
  ASSERT_EQ(r.code, 0) << r.output;
  r = Substrate("quantize " + kBf16 + " " + out3 + " --plan " + plan + " --imatrix " + out +
                ".profile.imatrix.gguf -t 2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(SizeOf(out3), written);
  std::string a, b;
  {
    FILE* f = std::fopen(out.c_str(), "rb");
    FILE* g = std::fopen(out3.c_str(), "rb");
    ASSERT_TRUE(f && g);
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) a.append(buf, n);
    while ((n = std::fread(buf, 1, sizeof buf, g)) > 0) b.append(buf, n);
    std::fclose(f);
    std::fclose(g);
  }
  EXPECT_TRUE(a == b) << "compile + quantize --plan must write what quantize --size wrote";

  // The rate-distortion report from the cached profile: the predicted curve, this file and
  // llama.cpp's mixes as points, each measured on the text (one short chunk: quick, not a figure).
  const std::string out5 = TempPath("size5.gguf"), svg = TempPath("rd.svg");
  r = Substrate("quantize " + kBf16 + " " + out5 + " --size " + std::to_string(target) + " --profile " +
                profile + " --report " + svg + " --report-text " + kText + " --report-chunks 1 -c 128 -t 2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(SizeOf(out5), written);
  std::string pic;
  {
    FILE* f = std::fopen(svg.c_str(), "rb");
    ASSERT_TRUE(f) << r.output;
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) pic.append(buf, n);
    std::fclose(f);
  }
  EXPECT_EQ(pic.rfind("<svg", 0), 0u);
  EXPECT_NE(pic.find("</svg>"), std::string::npos);
  EXPECT_NE(pic.find("<polyline"), std::string::npos) << "the predicted curve";
  for (const char* mix : {"Q2_K", "Q4_K_M", "Q6_K"}) {
    EXPECT_NE(pic.find("<title>" + std::string(mix) + ": measured"), std::string::npos) << mix;
    // The printed table: each mix at its bytes with a measured KLD (a number, not "-").
    EXPECT_TRUE(std::regex_search(r.output, std::regex(std::string("\\n  ") + mix +
                                                        " +\\d+ bytes +predicted KLD \\S+ +measured \\d")))
        << mix << "\n" << r.output;
  }

  // Below the smallest file: an error naming the minimum, nothing written.
  const std::string out4 = TempPath("tiny.gguf");
  r = Substrate("quantize " + kBf16 + " " + out4 + " --size 1000 --profile " + profile);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(std::regex_search(r.output, std::regex("smallest file .*: \\d+ bytes"))) << r.output;
  EXPECT_FALSE(Exists(out4));

  for (const std::string& f : {out, out2, out3, out5, svg, plan, profile, out + ".profile.imatrix.gguf",
                               out + ".profile.partial.json"})
    std::remove(f.c_str());
}

TEST_F(CliQuantizeSize, BadRequestsFailCleanly) {
  const std::string out = TempPath("bad_size.gguf");
  CmdResult r = Substrate("quantize " + kBf16 + " " + out + " --size 4M");  // no text, no profile
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("-f CALIBRATION_TEXT"), std::string::npos) << r.output;
  r = Substrate("quantize " + kBf16 + " " + out + " --size 4M --bpw 4 -f " + kText);
  EXPECT_NE(r.code, 0);
  r = Substrate("quantize " + kBf16 + " " + out + " --size lots -f " + kText);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("lots"), std::string::npos) << r.output;
  r = Substrate("quantize " + kBf16 + " " + out + " Q4_K_M --size 4M -f " + kText);
  EXPECT_NE(r.code, 0);
  EXPECT_FALSE(Exists(out));
}

}  // namespace
}  // namespace substrate
