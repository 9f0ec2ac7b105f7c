// The whole-model pipeline: quantizing the bf16 reference files with our mixes reproduces the
// reference files of llama-quantize tensor for tensor (names, order, types and bytes).
#include <gtest/gtest.h>

#include <string>

#include "core/memory_ledger.h"
#include "core/thread_pool.h"
#include "format/model_file.h"
#include "quant/gguf_fixture.h"
#include "quant/quant.h"
#include "quant/quantize_model.h"

namespace substrate {
namespace {

const std::string kDir = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/";

class MemorySink : public TensorSink {
 public:
  Status Begin(const Metadata& md, const std::vector<TensorInfo>& tensors) override {
    metadata = md;
    infos = tensors;
    data.assign(tensors.size(), {});
    return Status::Ok();
  }
  Status WriteTensorData(size_t index, const void* p, uint64_t bytes) override {
    if (index >= data.size()) return Internal("bad index");
    auto* b = static_cast<const uint8_t*>(p);
    data[index].insert(data[index].end(), b, b + bytes);
    return Status::Ok();
  }
  Status Finish() override {
    finished = true;
    return Status::Ok();
  }
  Metadata metadata;
  std::vector<TensorInfo> infos;
  std::vector<std::vector<uint8_t>> data;
  bool finished = false;
};

struct Case {
  const char* base;
  const char* ftype;
  const char* reference;
};

class QuantizeModelTest : public ::testing::TestWithParam<Case> {};

TEST_P(QuantizeModelTest, ReproducesReferenceFile) {
  const Case& c = GetParam();
  testing::FixtureModel ref;
  if (!testing::LoadFixture(kDir + c.reference, &ref))
    GTEST_SKIP() << "fixture " << c.reference << " not found in " << kDir;
  auto in = ModelFile::Open(kDir + c.base);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ThreadPool pool(2);
  MemoryLedger ledger(64ull << 20);  // a tensor at a time: far below the model's size
  QuantizeOptions opt;
  opt.ftype = *FileTypeFromName(c.ftype);
  opt.pool = &pool;
  opt.ledger = &ledger;
  opt.progress = false;
  MemorySink sink;
  auto report = QuantizeModel(**in, opt, sink);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(sink.finished);
  EXPECT_EQ(sink.metadata.GetInt("general.file_type", -1), ref.ints["general.file_type"]);
  EXPECT_EQ(sink.metadata.GetInt("general.quantization_version", -1), 2);
  ASSERT_EQ(sink.infos.size(), ref.tensors.size());
  size_t identical = 0;
  for (size_t i = 0; i < sink.infos.size(); ++i) {
    const TensorInfo& o = sink.infos[i];
    const auto& r = ref.tensors[i];
    EXPECT_EQ(o.name, r.name) << "tensor order differs at " << i;
    EXPECT_EQ(DTypeName(o.type), std::string(DTypeName(r.type))) << o.name;
    EXPECT_EQ(sink.data[i].size(), o.bytes) << o.name;
    if (sink.data[i] == r.data) ++identical;
    else ADD_FAILURE() << c.reference << ": tensor " << o.name << " bytes differ";
  }
  std::printf("  %s from %s: %zu of %zu tensors byte-identical, %.2f s, peak scratch %.1f MiB\n",
              c.ftype, c.base, identical, sink.infos.size(), report->seconds,
              static_cast<double>(ledger.peak()) / (1 << 20));
}

INSTANTIATE_TEST_SUITE_P(
    Reference, QuantizeModelTest,
    ::testing::Values(Case{"tiny-coder-bf16.gguf", "Q4_K_M", "tiny-coder-Q4_K_M.gguf"},
                      Case{"tiny-coder-bf16.gguf", "Q4_0", "tiny-coder-Q4_0.gguf"},
                      Case{"tiny-coder-bf16.gguf", "Q2_K", "tiny-coder-Q2_K.gguf"},
                      Case{"tiny-coder-moe-bf16.gguf", "Q4_K_M", "tiny-coder-moe-Q4_K_M.gguf"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string n = std::string(info.param.reference);
      for (auto& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

TEST(ConvertRows, RejectsRowsThatDoNotFit) {
  ThreadPool pool(1);
  std::vector<float> x(100);
  std::vector<uint8_t> y(1000);
  Status s = ConvertRows(DType::kF32, x.data(), DType::kQ4_K, y.data(), 1, 100, pool);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("Q4_K"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace substrate
