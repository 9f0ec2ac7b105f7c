// Packing onto a full disk or with a failing rename (core/fault_env.h): an IOError naming the
// file and the cause, the process alive, no temporary file left, and no manifest, so the half
// written store reads as incomplete (NotFound) rather than as checksum errors; a healthy pack
// afterwards gives a store that opens.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/fault_env.h"
#include "format/model_file.h"
#include "store/pack.h"
#include "store/store_index.h"
#include "store_fixture.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;
using Kind = FaultEnv::Kind;

bool HasTemp(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
  return false;
}

TEST(PackFault, FullDiskAndFailingRenamesLeaveAnIncompleteStoreNotABrokenOne) {
  const std::string model = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/tiny-coder-moe-Q8_0.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no fixture " << model;
  auto file = ModelFile::Open(model);
  ASSERT_TRUE(file.ok());
  const std::string out = testing::StoreTestPath("pack_fault");
  PackOptions o;
  o.keep_skeleton = true;
  o.residuals.clear();
  ASSERT_TRUE(PackStore(**file, out, o).ok());  // a store is there already
  ASSERT_TRUE(StoreIndex::Open(out).ok());

  for (const FaultEnv::Fault& f :
       {FaultEnv::Fault{Kind::kNoSpace, out, 0, -1, 0, 3u << 20},       // mid-way
        FaultEnv::Fault{Kind::kNoSpace, "model.gguf", 0, -1, 0, 1000},  // the metadata
        FaultEnv::Fault{Kind::kRenameError, "block_2.moe.router", 0, -1, 0, 0},
        FaultEnv::Fault{Kind::kRenameError, "manifest.json", 0, -1, 0, 0},  // the last file
        FaultEnv::Fault{Kind::kSyncError, "output", 0, -1, 0, 0}}) {
    SCOPED_TRACE(static_cast<int>(f.kind));
    SCOPED_TRACE(f.path_part);
    FaultEnv env;
    env.Add(f);
    o.env = &env;
    auto st = PackStore(**file, out, o);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), StatusCode::kIOError) << st.status().ToString();
    if (f.kind == Kind::kNoSpace) {
      EXPECT_NE(st.status().message().find("No space left on device"), std::string::npos)
          << st.status().ToString();
    }
    EXPECT_FALSE(HasTemp(out));
    auto opened = StoreIndex::Open(out);
    EXPECT_EQ(opened.status().code(), StatusCode::kNotFound) << opened.status().ToString();
    EXPECT_NE(opened.status().message().find("no manifest.json"), std::string::npos);
    o.env = nullptr;
  }
  // A healthy disk again: the store is whole.
  ASSERT_TRUE(PackStore(**file, out, o).ok());
  EXPECT_TRUE(StoreIndex::Open(out).ok());
  fs::remove_all(out);
}

}  // namespace
}  // namespace substrate
