// Sessions on disk (runtime/kv_session.h): a saved conversation restores into a new session and
// a prompt extending it reuses every saved position, continuing exactly as the original session
// does (a cold run may differ in the last float bits: prefill and decode passes round apart);
// another model or KV type is refused with the reason; a damaged, truncated or foreign file is
// a Corruption error; nothing is left behind under a temporary name.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/kv_session.h"

namespace substrate {
namespace {

std::string Model(const char* name) { return std::string(SUBSTRATE_SHARED_DIR) + "/gguf/" + name; }

class KvSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(Model("tiny-coder-Q8_0.gguf"))) GTEST_SKIP() << "no fixtures";
    dir_ = std::filesystem::temp_directory_path() /
           ("kv_session_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "s.kv").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Engine> Load(const char* name, DType kv = DType::kF32) {
    EngineOptions eo;
    eo.ledger = &ledger_;
    eo.kv_type = kv;
    auto e = Engine::Load(Model(name), eo);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(*e) : nullptr;
  }
  // Greedy text of `prompt` in session s; *reused gets the positions Prefill reused.
  std::string Greedy(Engine& e, Session& s, const std::string& prompt, int64_t* reused = nullptr) {
    auto ids = e.tokenizer()->Encode(prompt);
    EXPECT_TRUE(ids.ok());
    GenerateOptions o;
    o.max_tokens = 16;
    std::string text;
    auto st = e.Generate(s, std::vector<int32_t>(ids->begin(), ids->end()), o,
                         [&](int32_t, const std::string& t) { text += t; return true; });
    EXPECT_TRUE(st.ok());
    if (reused) *reused = st->n_reused;
    return text;
  }

  // A session with a short exchange, saved to path_.
  void SaveShortSession(Engine& e) {
    auto s = e.NewSession(256);
    ASSERT_TRUE(s.ok());
    Greedy(e, **s, "def f(x):");
    ASSERT_TRUE(SaveKvSession(path_, e, **s).ok());
  }

  MemoryLedger ledger_;
  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(KvSessionTest, RestoredSessionReusesItsPositions) {
  for (DType kv : {DType::kF32, DType::kF16}) {
    auto e = Load("tiny-coder-Q8_0.gguf", kv);
    ASSERT_TRUE(e);
    const std::string first = "import os\n\ndef list_files(path):";
    auto s = e->NewSession(256);
    ASSERT_TRUE(s.ok());
    const std::string answer = Greedy(*e, **s, first);
    ASSERT_TRUE(SaveKvSession(path_, *e, **s).ok());
    const int64_t saved = (*s)->cache.n_past();
    ASSERT_GT(saved, 10);

    auto restored = e->NewSession(256);
    ASSERT_TRUE(restored.ok());
    std::string why;
    auto loaded = LoadKvSession(path_, *e, **restored, &why);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    ASSERT_TRUE(*loaded) << why;
    EXPECT_EQ((*restored)->cache.tokens(), (*s)->cache.tokens());
    KvCache& a = (*s)->cache;
    KvCache& b = (*restored)->cache;
    for (int l = 0; l < a.n_layer(); ++l) {
      EXPECT_EQ(0, std::memcmp(a.KeyBytes(l), b.KeyBytes(l), saved * a.k_row_bytes())) << l;
      EXPECT_EQ(0, std::memcmp(a.ValueBytes(l), b.ValueBytes(l), saved * a.v_row_bytes())) << l;
    }

    const std::string next = first + answer + "\n\ndef read_file(path):";
    int64_t reused = 0, reused_original = 0;
    const std::string warm = Greedy(*e, **restored, next, &reused);
    EXPECT_EQ(reused, saved);
    EXPECT_EQ(warm, Greedy(*e, **s, next, &reused_original));
    EXPECT_EQ(reused_original, saved);
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir_))
    EXPECT_EQ(entry.path().string(), path_) << "left behind";
}

TEST_F(KvSessionTest, OtherModelTypeOrContextIsRefusedWithTheReason) {
  auto e = Load("tiny-coder-Q8_0.gguf");
  ASSERT_TRUE(e);
  SaveShortSession(*e);
  std::string why;

  auto refused = [&](Engine& by, int64_t n_ctx, const char* reason) {
    auto s = by.NewSession(n_ctx);
    ASSERT_TRUE(s.ok());
    auto r = LoadKvSession(path_, by, **s, &why);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(*r);
    EXPECT_NE(why.find(reason), std::string::npos) << why;
    EXPECT_EQ((*s)->cache.n_past(), 0);
  };
  refused(*Load("tiny-coder-Q8_0.gguf", DType::kF16), 256, "--kv-type");
  refused(*e, 4, "context");
  refused(*Load("tiny-coder-Q4_0.gguf"), 256, "another model");  // same shapes, other types
}

TEST_F(KvSessionTest, DamagedFilesAreCorruptionErrors) {
  auto e = Load("tiny-coder-Q8_0.gguf");
  ASSERT_TRUE(e);
  SaveShortSession(*e);
  const auto size = std::filesystem::file_size(path_);
  auto expect_corrupt = [&](const std::string& file, const char* what) {
    auto fresh = e->NewSession(256);
    ASSERT_TRUE(fresh.ok());
    std::string why;
    auto r = LoadKvSession(file, *e, **fresh, &why);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << what;
    EXPECT_NE(r.status().message().find(file), std::string::npos) << r.status().message();
    EXPECT_EQ((*fresh)->cache.n_past(), 0) << what;
  };
  const std::string flipped = (dir_ / "flipped.kv").string();
  std::filesystem::copy_file(path_, flipped);
  {
    std::fstream f(flipped, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(size / 2));
    c = static_cast<char>(c ^ 0x40);
    f.write(&c, 1);
  }
  expect_corrupt(flipped, "flipped byte");
  const std::string cut = (dir_ / "cut.kv").string();
  std::filesystem::copy_file(path_, cut);
  std::filesystem::resize_file(cut, size - 100);
  expect_corrupt(cut, "truncated");
  const std::string text = (dir_ / "text.kv").string();
  std::ofstream(text) << "this is not a session file, but it is long enough to have a header";
  expect_corrupt(text, "foreign");
}

}  // namespace
}  // namespace substrate
