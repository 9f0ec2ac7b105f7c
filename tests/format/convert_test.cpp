#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "format/convert.h"
#include "format/float_convert.h"
#include "format/gguf_reader.h"
#include "test_util.h"

namespace substrate {
namespace {

using testing::SharedPath;
using testing::TempDir;

TEST(FloatConvert, RoundTripsAndRounds) {
  // Every half converts to float and back unchanged (NaNs stay NaN).
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << h;
  }
  EXPECT_EQ(FloatToHalf(65504.f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.f), 0x7c00);       // ties to even -> infinity
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048), 0x3c00);  // tie to even (down)
  EXPECT_EQ(FloatToHalf(1.0f + 3.0f / 2048), 0x3c02);  // tie to even (up)
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0);     // tie -> 0
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 1);
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  float tie;
  uint32_t u = 0x3f808000;  // exactly between 0x3f80 and 0x3f81 -> even 0x3f80
  std::memcpy(&tie, &u, 4);
  EXPECT_EQ(FloatToBFloat16(tie), 0x3f80);
  u = 0x3f818000;
  std::memcpy(&tie, &u, 4);
  EXPECT_EQ(FloatToBFloat16(tie), 0x3f82);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));
}

// The acceptance test: converting tiny-coder gives the reference GGUF's tensors bit for bit.
TEST(Convert, TinyCoderIsBitIdenticalToReference) {
  std::string dir = SharedPath("models/tiny-coder"), ref = SharedPath("gguf/tiny-coder-bf16.gguf");
  SKIP_IF_NO_SHARED(ref);
  TempDir tmp;
  std::string out = tmp.File("tc.gguf");
  std::string cmd = std::string(SUBSTRATE_BINARY) + " convert " + dir + " -o " + out +
                    " --type bf16 > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto a = GgufFile::Open(out);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = GgufFile::Open(ref);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ((*a)->tensors().size(), (*b)->tensors().size());
  for (size_t i = 0; i < (*a)->tensors().size(); ++i) {
    const TensorInfo& x = (*a)->tensors()[i];
    const TensorInfo& y = (*b)->tensors()[i];
    ASSERT_EQ(x.name, y.name);
    EXPECT_EQ(x.ne, y.ne) << x.name;
    EXPECT_EQ(x.type, y.type) << x.name;
    EXPECT_EQ(x.parts[0].offset - (*a)->data_offset(), y.parts[0].offset - (*b)->data_offset());
    std::string bx(x.bytes, '\0'), by(y.bytes, '\0');
    ASSERT_TRUE((*a)->ReadTensor(x, bx.data()).ok());
    ASSERT_TRUE((*b)->ReadTensor(y, by.data()).ok());
    EXPECT_TRUE(bx == by) << x.name;
  }
  const Metadata& ma = (*a)->metadata();
  const Metadata& mb = (*b)->metadata();
  EXPECT_EQ(ma.keys().size(), mb.keys().size());
  for (const auto& k : mb.keys()) {
    ASSERT_TRUE(ma.Has(k)) << k;
    EXPECT_TRUE(*ma.Find(k) == *mb.Find(k)) << k;
  }
}

TEST(Convert, TinyCoderMoeMatchesReference) {
  std::string dir = SharedPath("models/tiny-coder-moe"), ref = SharedPath("gguf/tiny-coder-moe-bf16.gguf");
  SKIP_IF_NO_SHARED(ref);
  auto in = ModelFile::Open(dir);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  TempDir tmp;
  ASSERT_TRUE(ConvertToGguf(**in, tmp.File("m.gguf"), std::nullopt).ok());
  auto a = GgufFile::Open(tmp.File("m.gguf"));
  auto b = GgufFile::Open(ref);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ((*a)->tensors().size(), (*b)->tensors().size());
  for (size_t i = 0; i < (*a)->tensors().size(); ++i) {
    const TensorInfo& x = (*a)->tensors()[i];
    const TensorInfo& y = (*b)->tensors()[i];
    ASSERT_EQ(x.name, y.name);
    EXPECT_EQ(x.ne, y.ne);
    EXPECT_EQ(x.type, y.type) << x.name;
    std::string bx(x.bytes, '\0'), by(y.bytes, '\0');
    ASSERT_TRUE((*a)->ReadTensor(x, bx.data()).ok());
    ASSERT_TRUE((*b)->ReadTensor(y, by.data()).ok());
    EXPECT_TRUE(bx == by) << x.name;
  }
}

// Every HF folder converts (f32, f16, bf16) and the result re-opens with the same catalog; the
// data equals the source converted element by element.
TEST(Convert, AllFoldersConvertAndReopen) {
  const char* models[] = {"tiny-random-llama", "tiny-random-qwen2", "tiny-random-qwen3",
                          "tiny-random-mixtral", "tiny-random-qwen2-moe", "tiny-random-qwen3-moe",
                          "tiny-random-deepseek-v3", "tiny-coder", "tiny-coder-moe"};
  if (!FileExists(SharedPath("models"))) GTEST_SKIP() << "fixtures absent";
  TempDir tmp;
  for (const char* name : models) {
    auto in = ModelFile::Open(SharedPath(std::string("models/") + name));
    ASSERT_TRUE(in.ok()) << name << ": " << in.status().ToString();
    for (DType type : {DType::kF32, DType::kF16, DType::kBF16}) {
      std::string out = tmp.File(std::string(name) + ".gguf");
      Status s = ConvertToGguf(**in, out, type);
      ASSERT_TRUE(s.ok()) << name << ": " << s.ToString();
      auto g = ModelFile::Open(out);
      ASSERT_TRUE(g.ok()) << name << ": " << g.status().ToString();
      EXPECT_EQ(*(*g)->metadata().GetInt("general.file_type"), GgufFileType(type));
      const auto& src = (*in)->tensors();
      const auto& dst = (*g)->tensors();
      ASSERT_EQ(src.size(), dst.size()) << name;
      for (size_t i = 0; i < src.size(); ++i) {
        ASSERT_EQ(src[i].name, dst[i].name) << name;
        ASSERT_EQ(src[i].ne, dst[i].ne) << name << " " << src[i].name;
        ASSERT_EQ(dst[i].type, ConvertedType(src[i], type));
        std::string a(src[i].bytes, '\0'), b(dst[i].bytes, '\0'), c(dst[i].bytes, '\0');
        ASSERT_TRUE((*in)->ReadTensor(src[i], a.data()).ok());
        ASSERT_TRUE((*g)->ReadTensor(dst[i], b.data()).ok());
        ASSERT_TRUE(ConvertFloats(src[i].type, a.data(), dst[i].type, c.data(), src[i].n_elements()).ok());
        ASSERT_TRUE(b == c) << name << " " << src[i].name << " as " << DTypeName(type);
      }
      // Metadata survives, except the file type.
      for (const auto& k : (*in)->metadata().keys()) {
        if (k == "general.file_type") continue;
        ASSERT_TRUE((*g)->metadata().Has(k)) << name << " " << k;
      }
    }
  }
}

TEST(Convert, CliErrors) {
  std::string bin = SUBSTRATE_BINARY;
  EXPECT_NE(std::system((bin + " convert 2>/dev/null").c_str()), 0);
  EXPECT_NE(std::system((bin + " convert /nonexistent -o /tmp/x.gguf 2>/dev/null").c_str()), 0);
  std::string dir = SharedPath("models/tiny-random-llama");
  if (FileExists(dir)) {
    EXPECT_NE(std::system((bin + " convert " + dir + " -o /tmp/x.gguf --type q4_0 2>/dev/null").c_str()), 0);
  }
}

}  // namespace
}  // namespace substrate
