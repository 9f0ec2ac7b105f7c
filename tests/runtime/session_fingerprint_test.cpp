// A saved session belongs to the weights it was computed with: a copy of tiny-coder-Q8_0 with
// attn_k scaled by 1.3 and attn_v by 0.7 (same architecture, names, types and shapes) reused
// the original's --prompt-cache and answered differently from a cold run, with no note. Through
// the binary, as it was found; and the fingerprint itself (format/model_fingerprint.h).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "format/float_convert.h"
#include "format/model_fingerprint.h"
#include "store/store_fixture.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;

struct Result {
  int rc = -1;
  std::string out;
};

Result RunCli(const std::string& args) {
  Result r;
  FILE* p = popen((std::string(SUBSTRATE_BINARY) + " " + args + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// Multiplies every Q8_0 block scale of the tensors whose name contains `part` by `factor`.
void ScaleQ8(const std::string& path, const std::string& part, float factor) {
  auto f = ModelFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  int scaled = 0;
  for (const TensorInfo& t : (*f)->tensors()) {
    if (t.name.find(part) == std::string::npos) continue;
    ASSERT_EQ(t.type, DType::kQ8_0) << t.name;
    for (uint64_t b = 0; b < t.bytes / 34; ++b) {
      const auto at = static_cast<std::streamoff>(t.parts[0].offset + b * 34);
      uint16_t d = 0;
      io.seekg(at);
      io.read(reinterpret_cast<char*>(&d), 2);
      d = FloatToHalf(HalfToFloat(d) * factor);
      io.seekp(at);
      io.write(reinterpret_cast<const char*>(&d), 2);
    }
    ++scaled;
  }
  EXPECT_GT(scaled, 0) << part;
}

class SessionFingerprint : public ::testing::Test {
 protected:
  void SetUp() override {
    original_ = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/tiny-coder-Q8_0.gguf";
    if (!fs::exists(original_)) GTEST_SKIP() << "no fixture " << original_;
    dir_ = fs::temp_directory_path() / ("session_fp_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    copy_ = (dir_ / "scaled.gguf").string();
    fs::copy_file(original_, copy_);
    ScaleQ8(copy_, "attn_k.weight", 1.3f);
    ScaleQ8(copy_, "attn_v.weight", 0.7f);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string original_, copy_;
  fs::path dir_;
};

TEST_F(SessionFingerprint, SameShapesOtherWeightsDoNotShareASession) {
  const std::string cache = (dir_ / "s.bin").string();
  const std::string prompt = " -p \"def fibonacci(n):\" -n 12 ";
  Result saved = RunCli("run -m " + original_ + prompt + "--prompt-cache " + cache);
  ASSERT_EQ(saved.rc, 0) << saved.out;
  Result cold = RunCli("run -m " + copy_ + prompt);
  ASSERT_EQ(cold.rc, 0) << cold.out;
  Result reused = RunCli("run -m " + copy_ + prompt + "--prompt-cache " + cache);
  ASSERT_EQ(reused.rc, 0) << reused.out;
  EXPECT_NE(reused.out.find("not used: it was saved with another model"), std::string::npos)
      << reused.out;
  // What follows the note is the cold run's answer.
  EXPECT_NE(reused.out.find(cold.out), std::string::npos) << "cold:\n"
                                                          << cold.out << "\nreused:\n"
                                                          << reused.out;
  // The original still reuses its own session (and the copy's session now is the copy's).
  Result again = RunCli("run -m " + copy_ + prompt + "--prompt-cache " + cache);
  EXPECT_EQ(again.out.find("not used"), std::string::npos) << again.out;
}

TEST_F(SessionFingerprint, FingerprintSeesWeightsNotOnlyShapes) {
  auto a = ModelFile::Open(original_);
  auto b = ModelFile::Open(copy_);
  ASSERT_TRUE(a.ok() && b.ok());
  auto fa = WeightFingerprint(**a), fa2 = WeightFingerprint(**a), fb = WeightFingerprint(**b);
  ASSERT_TRUE(fa.ok() && fa2.ok() && fb.ok());
  EXPECT_EQ(*fa, *fa2);
  EXPECT_NE(*fa, *fb);
  // One byte changed: the first of a tensor's data (a sample; a byte between samples would not
  // be seen, by design).
  const std::string one = (dir_ / "one.gguf").string();
  fs::copy_file(original_, one);
  auto f = ModelFile::Open(one);
  ASSERT_TRUE(f.ok());
  const TensorInfo& t = (*f)->tensors().back();
  {
    std::fstream io(one, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(t.parts[0].offset));
    const char x = 0x5a;
    io.write(&x, 1);
  }
  auto g = ModelFile::Open(one);
  ASSERT_TRUE(g.ok());
  auto fg = WeightFingerprint(**g);
  ASSERT_TRUE(fg.ok());
  EXPECT_NE(*fg, *fa);
}

// A store's model.gguf has no tensors: its sessions are told apart by the manifest's checksums
// at the tier served (tier 0's KV rows are not tier 2's).
TEST(StoreSessionFingerprint, TheServedTierIsPartOfTheModel) {
  if (testing::PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  const std::string cache = testing::StoreTestPath("store_session.bin");
  const std::string run = "run --store " + testing::PackedTinyMoeStore() +
                          " --max-ram 1G -p \"def f(x):\" -n 4 --prompt-cache " + cache;
  ASSERT_EQ(RunCli(run + " --tier 0").rc, 0);
  Result same = RunCli(run + " --tier 0");
  EXPECT_EQ(same.rc, 0) << same.out;
  EXPECT_EQ(same.out.find("not used"), std::string::npos) << same.out;
  Result other = RunCli(run + " --tier 2");
  EXPECT_EQ(other.rc, 0) << other.out;
  EXPECT_NE(other.out.find("not used: it was saved with another model"), std::string::npos)
      << other.out;
  fs::remove(cache);
}

}  // namespace
}  // namespace substrate
