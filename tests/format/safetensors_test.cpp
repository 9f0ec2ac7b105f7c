#include <gtest/gtest.h>

#include "format/safetensors.h"
#include "test_util.h"

namespace substrate {
namespace {

using testing::TempDir;

std::string Safetensors(const std::string& header, size_t data_bytes) {
  std::string out;
  uint64_t n = header.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += header;
  out += std::string(data_bytes, '\x01');
  return out;
}

Expected<std::vector<SafetensorsEntry>> Parse(const std::string& bytes) {
  TempDir dir;
  std::string path = dir.File("m.safetensors");
  if (!testing::WriteBytesNoSync(path, bytes)) return Internal("write");
  auto f = RandomAccessFile::Open(path);
  if (!f.ok()) return f.status();
  return ReadSafetensorsHeader(**f);
}

TEST(Safetensors, ParsesValidHeader) {
  std::string h =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[16,28]},)"
      R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  auto e = Parse(Safetensors(h, 28));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_EQ(e->size(), 2u);
  EXPECT_EQ((*e)[0].name, "a");  // sorted by name
  EXPECT_EQ((*e)[1].type, DType::kBF16);
  EXPECT_EQ((*e)[1].shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ((*e)[1].offset, 8 + h.size() + 16);
  EXPECT_EQ((*e)[1].bytes, 12u);
}

TEST(Safetensors, RejectsBadHeaders) {
  auto msg = [](const std::string& bytes) {
    auto e = Parse(bytes);
    EXPECT_FALSE(e.ok());
    return e.ok() ? std::string() : e.status().message();
  };
  EXPECT_NE(msg("abc").find("too small"), std::string::npos);
  std::string huge_len(8, '\xff');
  EXPECT_NE(msg(huge_len + "{}").find("header length"), std::string::npos);
  EXPECT_NE(msg(Safetensors("{not json", 0)).find("not valid JSON"), std::string::npos);
  EXPECT_NE(msg(Safetensors("[1,2]", 0)).find("not a JSON object"), std::string::npos);
  EXPECT_NE(msg(Safetensors(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8))
                .find("outside the data section"),
            std::string::npos);
  EXPECT_NE(msg(Safetensors(R"({"a":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})", 16))
                .find("need"),
            std::string::npos);
  EXPECT_NE(msg(Safetensors(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                            R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                            24))
                .find("overlap"),
            std::string::npos);
  EXPECT_NE(msg(Safetensors(R"({"a":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16))
                .find("dtype I64"),
            std::string::npos);
  EXPECT_NE(msg(Safetensors(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,16]}})", 16))
                .find("shape"),
            std::string::npos);
  EXPECT_NE(msg(Safetensors(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", 16))
                .find("absurd"),
            std::string::npos);
  EXPECT_NE(msg(Safetensors(R"({"a":{"dtype":"F32","shape":[4]}})", 16)).find("data_offsets"),
            std::string::npos);
  EXPECT_NE(msg(Safetensors(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", 16))
                .find("outside"),
            std::string::npos);
}

TEST(Safetensors, EveryTruncationIsACleanError) {
  std::string h = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  std::string full = Safetensors(h, 16);
  ASSERT_TRUE(Parse(full).ok());
  for (size_t n = 0; n < full.size(); ++n) {
    auto e = Parse(full.substr(0, n));
    EXPECT_FALSE(e.ok()) << n;
  }
}

}  // namespace
}  // namespace substrate
