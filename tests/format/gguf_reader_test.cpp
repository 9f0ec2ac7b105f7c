#include <gtest/gtest.h>

#include "format/gguf_reader.h"
#include "format/model_file.h"
#include "test_util.h"

namespace substrate {
namespace {

using testing::GgufBytes;
using testing::SharedPath;
using testing::TempDir;

// A small valid file: 3 metadata keys (one a nested array), two F32 tensors.
std::string SmallGguf(uint32_t version = 3) {
  GgufBytes g;
  g.Header(2, 3, version);
  g.KvStr("general.architecture", "llama");
  g.KvU32("llama.block_count", 2);
  // array of arrays of i32: [[1, 2], [3]]
  g.Str("test.nested").Pod<uint32_t>(9).Pod<uint32_t>(9).Pod<uint64_t>(2);
  g.Pod<uint32_t>(5).Pod<uint64_t>(2).Pod<int32_t>(1).Pod<int32_t>(2);
  g.Pod<uint32_t>(5).Pod<uint64_t>(1).Pod<int32_t>(3);
  g.TensorInfo("a", {4, 2}, 0, 0);
  g.TensorInfo("b", {8}, 0, 32);
  g.PadTo(32);
  for (int i = 0; i < 8; ++i) g.Pod<float>(static_cast<float>(i));
  for (int i = 0; i < 8; ++i) g.Pod<float>(static_cast<float>(100 + i));
  return g.bytes();
}

Status OpenBytes(const std::string& bytes) {
  TempDir dir;
  std::string path = dir.File("x.gguf");
  if (!testing::WriteBytesNoSync(path, bytes)) return Internal("write");
  auto f = GgufFile::Open(path);
  return f.ok() ? Status::Ok() : f.status();
}

TEST(GgufReader, ReadsSmallFile) {
  TempDir dir;
  std::string path = dir.File("small.gguf");
  testing::WriteBytes(path, SmallGguf());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const Metadata& md = (*f)->metadata();
  EXPECT_EQ(md.keys().size(), 3u);
  EXPECT_EQ(*md.GetString("general.architecture"), "llama");
  EXPECT_EQ(*md.GetInt("llama.block_count"), 2);
  const MetaValue* nested = md.Find("test.nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->array().size(), 2u);
  EXPECT_EQ(nested->array_type, GgufType::kArray);
  EXPECT_EQ(nested->array()[1].array().size(), 1u);
  EXPECT_EQ(std::get<int64_t>(nested->array()[1].array()[0].value), 3);
  EXPECT_EQ(md.GetString("llama.block_count").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(md.GetInt("missing").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(md.GetInt("missing", 7), 7);

  ASSERT_EQ((*f)->tensors().size(), 2u);
  const TensorInfo* b = (*f)->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->bytes, 32u);
  std::vector<float> data(8);
  ASSERT_TRUE((*f)->ReadTensor(*b, data.data()).ok());
  EXPECT_EQ(data[3], 103.f);
  const TensorInfo* a = (*f)->Find("a");
  std::vector<float> row(4);
  ASSERT_TRUE((*f)->ReadSlice(*a, 1, row.data()).ok());
  EXPECT_EQ(row[0], 4.f);
  EXPECT_FALSE((*f)->ReadSlice(*a, 2, row.data()).ok());
}

TEST(GgufReader, ReadsVersion2) {
  EXPECT_TRUE(OpenBytes(SmallGguf(2)).ok());
  Status s = OpenBytes(SmallGguf(1));
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.ToString();
}

TEST(GgufReader, EveryTruncationIsACleanError) {
  std::string full = SmallGguf();
  for (size_t n = 0; n < full.size(); ++n) {
    Status s = OpenBytes(full.substr(0, n));
    ASSERT_FALSE(s.ok()) << "prefix of " << n << " bytes opened";
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << n << ": " << s.ToString();
  }
}

TEST(GgufReader, WrongMagic) {
  std::string b = SmallGguf();
  b[0] = 'X';
  Status s = OpenBytes(b);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("magic"), std::string::npos) << s.message();
}

TEST(GgufReader, AbsurdCounts) {
  GgufBytes g;
  g.Header(1ull << 60, 0);
  EXPECT_NE(OpenBytes(g.bytes()).message().find("tensor count"), std::string::npos);
  GgufBytes k;
  k.Header(0, 1ull << 62);
  EXPECT_NE(OpenBytes(k.bytes()).message().find("metadata count"), std::string::npos);
  // A string whose length is larger than the file.
  GgufBytes s;
  s.Header(0, 1).Str("k").Pod<uint32_t>(8).Pod<uint64_t>(1ull << 40);
  EXPECT_EQ(OpenBytes(s.bytes()).code(), StatusCode::kCorruption);
  // An array count far beyond the bytes left (must fail before allocating).
  GgufBytes a;
  a.Header(0, 1).Str("k").Pod<uint32_t>(9).Pod<uint32_t>(10).Pod<uint64_t>(1ull << 61);
  Status as = OpenBytes(a.bytes());
  EXPECT_EQ(as.code(), StatusCode::kCorruption);
  EXPECT_NE(as.message().find("array"), std::string::npos) << as.message();
  // Unknown value type.
  GgufBytes t;
  t.Header(0, 1).Str("k").Pod<uint32_t>(99);
  EXPECT_NE(OpenBytes(t.bytes()).message().find("unknown value type"), std::string::npos);
}

TEST(GgufReader, BadTensorInfos) {
  auto with_tensor = [](std::vector<uint64_t> ne, uint32_t type, uint64_t offset,
                        size_t data_bytes = 64) {
    GgufBytes g;
    g.Header(1, 0).TensorInfo("t", ne, type, offset).PadTo(32);
    g.Raw(std::string(data_bytes, '\0'));
    return OpenBytes(g.bytes());
  };
  EXPECT_TRUE(with_tensor({4, 2}, 0, 0).ok());
  Status dims = with_tensor({1, 1, 1, 1, 1}, 0, 0);
  EXPECT_NE(dims.message().find("dimensions"), std::string::npos) << dims.message();
  Status huge = with_tensor({1ull << 40, 1ull << 40}, 0, 0);
  EXPECT_NE(huge.message().find("absurd"), std::string::npos) << huge.message();
  Status type = with_tensor({4}, 4, 0);
  EXPECT_NE(type.message().find("unknown type"), std::string::npos) << type.message();
  Status block = with_tensor({33}, 8, 0);  // Q8_0 rows must be multiples of 32
  EXPECT_NE(block.message().find("block size"), std::string::npos) << block.message();
  Status past = with_tensor({4, 2}, 0, 64);
  EXPECT_NE(past.message().find("past the end"), std::string::npos) << past.message();
  Status unaligned = with_tensor({2}, 0, 4);
  EXPECT_NE(unaligned.message().find("alignment"), std::string::npos) << unaligned.message();

  GgufBytes o;
  o.Header(2, 0).TensorInfo("x", {16}, 0, 0).TensorInfo("y", {16}, 0, 32).PadTo(32);
  o.Raw(std::string(128, '\0'));
  Status overlap = OpenBytes(o.bytes());
  EXPECT_NE(overlap.message().find("overlap"), std::string::npos) << overlap.message();

  GgufBytes d;
  d.Header(2, 0).TensorInfo("x", {4}, 0, 0).TensorInfo("x", {4}, 0, 32).PadTo(32);
  d.Raw(std::string(64, '\0'));
  EXPECT_NE(OpenBytes(d.bytes()).message().find("duplicate"), std::string::npos);
}

TEST(GgufReader, CustomAlignment) {
  GgufBytes g;
  g.Header(1, 1).KvU32("general.alignment", 64).TensorInfo("t", {4}, 0, 0).PadTo(64);
  g.Raw(std::string(16, '\x01'));
  EXPECT_TRUE(OpenBytes(g.bytes()).ok());
  GgufBytes bad;
  bad.Header(0, 1).KvU32("general.alignment", 48);
  EXPECT_NE(OpenBytes(bad.bytes()).message().find("power of two"), std::string::npos);
}

TEST(GgufReader, ReferenceTinyCoder) {
  std::string path = SharedPath("gguf/tiny-coder-bf16.gguf");
  SKIP_IF_NO_SHARED(path);
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const Metadata& md = (*f)->metadata();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ(md.keys().size(), 23u);
  EXPECT_EQ((*f)->tensors().size(), 74u);
  EXPECT_EQ(*md.GetString("general.architecture"), "qwen2");
  EXPECT_EQ(*md.GetInt("qwen2.block_count"), 6);
  EXPECT_EQ(*md.GetInt("qwen2.embedding_length"), 256);
  EXPECT_FLOAT_EQ(static_cast<float>(*md.GetFloat("qwen2.rope.freq_base")), 10000.f);
  EXPECT_FLOAT_EQ(static_cast<float>(*md.GetFloat("qwen2.attention.layer_norm_rms_epsilon")), 1e-6f);
  auto tokens = md.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(tokens->size(), 8192u);
  EXPECT_EQ((*tokens)[1], "<|im_start|>");
  EXPECT_EQ(md.GetIntArray("tokenizer.ggml.token_type")->at(0), 3);
  const TensorInfo* emb = (*f)->Find("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->ne, (std::vector<uint64_t>{256, 8192}));
  EXPECT_EQ(emb->type, DType::kBF16);
  EXPECT_EQ(emb->bytes, 256u * 8192 * 2);
  EXPECT_EQ((*f)->data_offset() % 32, 0u);
  EXPECT_EQ(emb->parts[0].offset, (*f)->data_offset());
}

TEST(GgufReader, AllReferenceFilesOpen) {
  for (const char* name :
       {"tiny-coder-bf16", "tiny-coder-Q8_0", "tiny-coder-Q6_K", "tiny-coder-Q4_K_M",
        "tiny-coder-Q4_0", "tiny-coder-Q3_K_M", "tiny-coder-Q2_K", "tiny-coder-moe-bf16",
        "tiny-coder-moe-Q8_0", "tiny-coder-moe-Q4_K_M"}) {
    std::string path = SharedPath(std::string("gguf/") + name + ".gguf");
    if (!FileExists(path)) continue;
    auto f = ModelFile::Open(path);
    ASSERT_TRUE(f.ok()) << name << ": " << f.status().ToString();
    EXPECT_GT((*f)->tensors().size(), 70u) << name;
  }
  for (const char* name : {"gpt-2", "llama-spm", "phi-3", "deepseek-coder", "starcoder"}) {
    std::string path = SharedPath(std::string("tokenizers/ggml-vocab-") + name + ".gguf");
    if (!FileExists(path)) continue;
    auto f = ModelFile::Open(path);
    ASSERT_TRUE(f.ok()) << name << ": " << f.status().ToString();
    EXPECT_TRUE((*f)->metadata().Has("tokenizer.ggml.tokens")) << name;
  }
}

}  // namespace
}  // namespace substrate
