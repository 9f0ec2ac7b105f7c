// Known-answer vectors for the formats without a reference file (Q4_1, Q5_1, IQ4_NL, IQ4_XS):
// the expected bytes come from a separate float32 model of ggml's reference quantizers
// (round-to-nearest for Q4_1/Q5_1; the 15-scale search for IQ4), each operation rounded to
// float32 and each fp16 rounded to nearest-even, over inputs that are exact in float32.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "format/dtype.h"
#include "quant/quant.h"

namespace substrate {
namespace {

std::vector<float> Inputs() {
  std::vector<float> x;
  for (int j = 0; j < 32; ++j) x.push_back(static_cast<float>((j * 37) % 61 - 30) * 0.0625f);
  for (int j = 0; j < 32; ++j) x.push_back(static_cast<float>((j * 13) % 29 - 11) * 0.001953125f);
  for (int j = 0; j < 192; ++j) x.push_back(static_cast<float>((j * 7) % 23 - 9) * 0.25f);
  x[64 + 5] = 7.5f;
  return x;
}

std::string Hex(const std::vector<uint8_t>& b) {
  std::string s;
  char buf[3];
  for (uint8_t v : b) {
    std::snprintf(buf, sizeof(buf), "%02x", v);
    s += buf;
  }
  return s;
}

struct Vector {
  DType type;
  const char* hex;
};

const Vector kVectors[] = {
  {DType::kQ4_1,
      "003480bfb059e38d27b15af49d37c16af49e38c2771b80a530a71e85fc64db52c931a82e960d74eb333980c080234578"
      "123f67013457802356781245de3580c0ace1358adf2479ce1358acf1469be035de3580c058acf1469be0358ace1368bd"
      "0257ace1de3580c01368bd0257ace1358adf2479ce1358acde3580c0df2479ce1358acf1469be0358ace1368de3580c0"
      "9be0358ace1368bd0257ace1358adf24"},
  {DType::kQ5_1,
      "be2f80bf4a69adb560a3d71a4d71b4e82b5e82c5f93c60933a1780a554ad5a95604e2d1bf9d8c6a48371503e2c0be9d7"
      "083580c02820010400369be1247fdf0268be1146acf1258aad3180c0d9269b6c48e17b15bf48e28c16b059f38d27c06a"
      "ad3180c0934db6c9b059f38d27c06a049e37d17b04ae48e1ad3180c026db649337d17b04ae48e17b15bf48e28c16b059"
      "ad3180c06db2c936bf48e28c16b059f38d27c06a049e37d1ad3180c0d9649b6c27c06a049e37d17b04ae48e17b15bf48"},
  {DType::kIQ4_NL,
      "fb23c04af39e26c15bf39e27d16bf4ae38d1058cce47d059017b139c24be36d058e17a028eab4ba97654a98054ba9865"
      "4b987644a9866ba6420eb95310ca7521ec96320da8531eca5ea696320da8531eca6420db8531eca7420e56a6db8531ec"
      "a7420eb95310ca7521ec963283a610ca7521dc96320da8531eca6420db8555a6531eca6420db8531eca7420eb95310ca"},
  {DType::kIQ4_XS,
      "8e174a5508203332c04af39e26d05bf39e27d15cf4af28e1888888888888888888888888888888884ba97654a98054ba"
      "98654b987644a986420db95310ca7521dc96320da8531eca96310da8531eca6410db8531eda7420edb8531eda7420eb9"
      "5310da7521ec963110ca7521dc96320da8531eca6420db85531eca6410db8531eda7420eb95310da"},
};

TEST(KnownAnswer, QuantizedBytesMatch) {
  const std::vector<float> x = Inputs();
  for (const Vector& v : kVectors) {
    std::vector<uint8_t> q(*RowBytes(v.type, x.size()));
    QuantizeRow(v.type, x.data(), q.data(), static_cast<int64_t>(x.size()));
    EXPECT_EQ(Hex(q), v.hex) << DTypeName(v.type);
  }
}

}  // namespace
}  // namespace substrate
