#include <gtest/gtest.h>

#include "format/gguf_reader.h"
#include "format/gguf_writer.h"
#include "test_util.h"

namespace substrate {
namespace {

using testing::SharedPath;
using testing::TempDir;

// Writes `in` back out through GgufWriter (same metadata order, tensors, alignment).
Status Rewrite(const ModelFile& in, const std::string& path) {
  GgufWriter w(path);
  w.SetMetadata(in.metadata());
  for (const auto& t : in.tensors()) RETURN_IF_ERROR(w.AddTensor(t.name, t.ne, t.type));
  std::string buf;
  for (const auto& t : in.tensors()) {
    buf.resize(t.bytes);
    RETURN_IF_ERROR(in.ReadTensor(t, buf.data()));
    // Uneven chunks exercise the streaming path.
    uint64_t half = t.bytes / 3;
    RETURN_IF_ERROR(w.WriteTensorData(buf.data(), half));
    RETURN_IF_ERROR(w.WriteTensorData(buf.data() + half, t.bytes - half));
  }
  return w.Finish();
}

TEST(GgufWriter, RoundTripsEverySharedGguf) {
  const char* names[] = {"tiny-coder-bf16", "tiny-coder-Q8_0", "tiny-coder-Q6_K", "tiny-coder-Q4_K_M",
                         "tiny-coder-Q4_0", "tiny-coder-Q3_K_M", "tiny-coder-Q2_K",
                         "tiny-coder-moe-bf16", "tiny-coder-moe-Q8_0", "tiny-coder-moe-Q4_K_M"};
  int tested = 0;
  for (const char* name : names) {
    std::string path = SharedPath(std::string("gguf/") + name + ".gguf");
    if (!FileExists(path)) continue;
    auto a = GgufFile::Open(path);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    TempDir dir;
    std::string out = dir.File("rt.gguf");
    Status s = Rewrite(**a, out);
    ASSERT_TRUE(s.ok()) << name << ": " << s.ToString();
    auto b = GgufFile::Open(out);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    const Metadata& ma = (*a)->metadata();
    const Metadata& mb = (*b)->metadata();
    ASSERT_EQ(ma.keys(), mb.keys()) << name;
    for (const auto& k : ma.keys()) EXPECT_TRUE(*ma.Find(k) == *mb.Find(k)) << name << " " << k;
    ASSERT_EQ((*a)->tensors().size(), (*b)->tensors().size());
    for (size_t i = 0; i < (*a)->tensors().size(); ++i) {
      const TensorInfo& x = (*a)->tensors()[i];
      const TensorInfo& y = (*b)->tensors()[i];
      EXPECT_EQ(x.name, y.name);
      EXPECT_EQ(x.ne, y.ne);
      EXPECT_EQ(x.type, y.type);
      EXPECT_EQ(x.parts[0].offset - (*a)->data_offset(), y.parts[0].offset - (*b)->data_offset());
      std::string bx(x.bytes, '\0'), by(y.bytes, '\0');
      ASSERT_TRUE((*a)->ReadTensor(x, bx.data()).ok());
      ASSERT_TRUE((*b)->ReadTensor(y, by.data()).ok());
      EXPECT_TRUE(bx == by) << name << " " << x.name;
    }
    // Same layout rules as the reference writers: the whole file is byte-identical.
    auto fa = ReadFileToString(path), fb = ReadFileToString(out);
    ASSERT_TRUE(fa.ok() && fb.ok());
    EXPECT_TRUE(*fa == *fb) << name << ": rewritten file differs from the original";
    ++tested;
  }
  if (tested == 0) GTEST_SKIP() << "no shared GGUF files";
}

TEST(GgufWriter, AlignmentAndErrors) {
  TempDir dir;
  Metadata md;
  md.Set("general.alignment", MetaValue::U32(64));
  md.Set("x.nested", MetaValue::Array(GgufType::kArray,
                                      {MetaValue::I32Array({1, 2}), MetaValue::I32Array({})}));
  md.Set("x.b", MetaValue::Bool(true));
  md.Set("x.f64", MetaValue::F64(0.1));
  GgufWriter w(dir.File("a.gguf"));
  w.SetMetadata(md);
  ASSERT_TRUE(w.AddTensor("t0", {3}, DType::kF32).ok());
  ASSERT_TRUE(w.AddTensor("t1", {32, 2}, DType::kQ8_0).ok());
  EXPECT_FALSE(w.AddTensor("t1", {4}, DType::kF32).ok());       // duplicate
  EXPECT_FALSE(w.AddTensor("bad", {33}, DType::kQ8_0).ok());    // not whole blocks
  EXPECT_FALSE(w.AddTensor("bad", {1, 1, 1, 1, 1}, DType::kF32).ok());
  std::string zeros(68, '\0');
  ASSERT_TRUE(w.WriteTensorData(zeros.data(), 12).ok());
  EXPECT_FALSE(w.Finish().ok());  // t1 incomplete: nothing appears under the final name
  EXPECT_FALSE(FileExists(dir.File("a.gguf")));

  GgufWriter w2(dir.File("b.gguf"));
  w2.SetMetadata(md);
  ASSERT_TRUE(w2.AddTensor("t0", {3}, DType::kF32).ok());
  ASSERT_TRUE(w2.AddTensor("t1", {32, 2}, DType::kQ8_0).ok());
  ASSERT_TRUE(w2.WriteTensorData(zeros.data(), 12 + 68).ok());
  EXPECT_FALSE(w2.WriteTensorData(zeros.data(), 1).ok());  // more than declared
  ASSERT_TRUE(w2.Finish().ok());
  auto f = GgufFile::Open(dir.File("b.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->data_offset() % 64, 0u);
  EXPECT_EQ((*f)->tensors()[1].parts[0].offset - (*f)->data_offset(), 64u);
  EXPECT_TRUE(*(*f)->metadata().Find("x.nested") == *md.Find("x.nested"));
  EXPECT_DOUBLE_EQ(*(*f)->metadata().GetFloat("x.f64"), 0.1);
}

}  // namespace
}  // namespace substrate
