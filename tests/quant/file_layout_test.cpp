// LayoutQuantizedFile predicts the written GGUF's size to the byte (header, every tensor at its
// real type, padding), for mixes, per-tensor overrides, copied tensors and our plan key; and
// the reference files' sizes come out as llama-quantize wrote them.
#include <gtest/gtest.h>

#include <string>

#include "format/model_file.h"
#include "quant/cli_util.h"
#include "quant/mix.h"
#include "quant/quantize_model.h"

namespace substrate {
namespace {

const std::string kDir = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/";

TEST(FileLayout, PredictionEqualsTheWrittenFileToTheByte) {
  for (const char* model : {"tiny-coder-bf16.gguf", "tiny-coder-moe-bf16.gguf"}) {
    auto in = ModelFile::Open(kDir + model);
    if (!in.ok()) GTEST_SKIP() << "fixture " << model << " not found in " << kDir;
    std::map<std::string, DType> over = {{"blk.0.attn_q.weight", DType::kIQ4_XS},
                                         {"blk.1.attn_v.weight", DType::kQ2_K}};
    struct Setup {
      const char* ftype;
      bool overrides, copy, summary;
    } setups[] = {{"Q4_K_M", false, false, false}, {"Q2_K", true, false, true},
                  {"Q8_0", true, true, true},      {"Q3_K_S", false, false, true}};
    for (const Setup& s : setups) {
      QuantizeOptions o;
      o.ftype = *FileTypeFromName(s.ftype);
      o.overrides = s.overrides ? &over : nullptr;
      o.copy_unlisted = s.copy;
      o.progress = false;
      if (s.summary) o.extra_metadata.emplace_back(kQuantizePlanKey, MetaValue::Str("a plan summary of some length"));
      auto layout = LayoutQuantizedFile(**in, o);
      ASSERT_TRUE(layout.ok()) << layout.status().ToString();
      const std::string out = testing::TempPath(std::string("layout_") + s.ftype + ".gguf");
      GgufFileSink sink(out);
      auto r = QuantizeModel(**in, o, sink);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(testing::SizeOf(out), layout->file_bytes) << model << " " << s.ftype;
      std::remove(out.c_str());
    }
  }
}

TEST(FileLayout, ReferenceMixSizesMatchLlamaQuantize) {
  auto in = ModelFile::Open(kDir + "tiny-coder-bf16.gguf");
  if (!in.ok()) GTEST_SKIP() << "fixtures not found in " << kDir;
  for (const char* ftype : {"Q2_K", "Q3_K_M", "Q4_K_M", "Q6_K"}) {
    auto ref = ModelFile::Open(kDir + "tiny-coder-" + ftype + ".gguf");
    ASSERT_TRUE(ref.ok());
    uint64_t ref_data = 0, our_data = 0;
    for (const TensorInfo& t : (*ref)->tensors()) ref_data += AlignedTensorBytes(t.bytes, 32);
    QuantizeOptions o;
    o.ftype = *FileTypeFromName(ftype);
    auto layout = LayoutQuantizedFile(**in, o);
    ASSERT_TRUE(layout.ok());
    for (const TensorInfo& t : layout->tensors) our_data += AlignedTensorBytes(t.bytes, 32);
    EXPECT_EQ(our_data, ref_data) << ftype;  // the headers differ (metadata order), not the data
    auto nearest = NearestFileType(**in, testing::SizeOf(kDir + "tiny-coder-" + ftype + ".gguf"));
    ASSERT_TRUE(nearest.ok());
    EXPECT_STREQ(nearest->name, ftype);
  }
}

}  // namespace
}  // namespace substrate
