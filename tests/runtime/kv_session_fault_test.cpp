// Saving a session onto a full disk or a failing rename (core/fault_env.h): an error naming the
// file and the cause, the previously saved session still there and still restorable, no
// temporary file left.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/fault_env.h"
#include "runtime/kv_session.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;
using Kind = FaultEnv::Kind;

std::vector<int32_t> Ids(Engine& e, const std::string& text) {
  auto ids = e.tokenizer()->Encode(text);
  return ids.ok() ? std::vector<int32_t>(ids->begin(), ids->end()) : std::vector<int32_t>{};
}

TEST(KvSessionFault, FullDiskOrFailingRenameKeepsThePreviousSession) {
  const std::string model = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/tiny-coder-Q8_0.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no fixture " << model;
  const fs::path dir = fs::temp_directory_path() / ("kv_fault_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "s.kv").string();
  MemoryLedger ledger;
  EngineOptions eo;
  eo.ledger = &ledger;
  auto e = Engine::Load(model, eo);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto s = (*e)->NewSession(256);
  ASSERT_TRUE(s.ok());
  GenerateOptions g;
  g.max_tokens = 8;
  auto none = [](int32_t, const std::string&) { return true; };
  ASSERT_TRUE((*e)->Generate(**s, Ids(**e, "def f(x):"), g, none).ok());
  ASSERT_TRUE(SaveKvSession(path, **e, **s).ok());
  const int64_t saved = (*s)->cache.n_past();
  const auto saved_bytes = fs::file_size(path);
  ASSERT_GT(saved_bytes, 60000u);

  // The conversation goes on; saving it again fails.
  ASSERT_TRUE((*e)->Generate(**s, Ids(**e, "def f(x):\n    return x\n\ndef g(y):"), g, none).ok());
  ASSERT_GT((*s)->cache.n_past(), saved);
  for (const FaultEnv::Fault& f : {FaultEnv::Fault{Kind::kNoSpace, "s.kv", 0, -1, 0, 30000},
                                   FaultEnv::Fault{Kind::kNoSpace, "s.kv", 0, -1, 0, 0},
                                   FaultEnv::Fault{Kind::kSyncError, "s.kv", 0, -1, 0, 0},
                                   FaultEnv::Fault{Kind::kRenameError, "s.kv", 0, -1, 0, 0}}) {
    SCOPED_TRACE(static_cast<int>(f.kind));
    FaultEnv env;
    env.Add(f);
    Status st = SaveKvSession(path, **e, **s, &env);
    EXPECT_EQ(st.code(), StatusCode::kIOError) << st.ToString();
    EXPECT_NE(st.message().find("s.kv"), std::string::npos) << st.ToString();
    if (f.kind == Kind::kNoSpace) {
      EXPECT_NE(st.message().find("No space left on device"), std::string::npos) << st.ToString();
    }
    // Only the previous file, unchanged and restorable.
    std::vector<std::string> names;
    for (const auto& ent : fs::directory_iterator(dir)) names.push_back(ent.path().filename());
    EXPECT_EQ(names, std::vector<std::string>{"s.kv"});
    EXPECT_EQ(fs::file_size(path), saved_bytes);
    auto fresh = (*e)->NewSession(256);
    ASSERT_TRUE(fresh.ok());
    std::string why;
    auto restored = LoadKvSession(path, **e, **fresh, &why);
    ASSERT_TRUE(restored.ok()) << restored.status().ToString();
    EXPECT_TRUE(*restored) << why;
    EXPECT_EQ((*fresh)->cache.n_past(), saved);
  }
  // A healthy disk saves the longer session.
  ASSERT_TRUE(SaveKvSession(path, **e, **s).ok());
  EXPECT_GT(fs::file_size(path), saved_bytes);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace substrate
