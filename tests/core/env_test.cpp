// The Env seam: the real PosixEnv, and FaultEnv's slow, failing, short-reading and full disks
// under the readers (RandomAccessFile::Read, both IoReaders, O_DIRECT or not) and the atomic
// writer (a full disk, a failing fsync or rename leaves the previous file as it was, and a
// clear error). Stale temporary files of killed writers go at the next write of their target.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/fault_env.h"
#include "core/file_io.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;
using Kind = FaultEnv::Kind;

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/substrate_env_test_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string File(const std::string& name) const { return path + "/" + name; }
  std::string path;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Bytes that differ at every offset, so a misplaced chunk shows.
std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 2654435761u) >> 13);
  return s;
}

std::vector<std::string> Children(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(PosixEnv, WritesRenamesListsAndReads) {
  TempDir d;
  Env* env = Env::Default();
  auto w = env->NewWritableFile(d.File("a"));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->Append("abc", 3).ok());
  ASSERT_TRUE((*w)->Sync().ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_FALSE((*w)->Append("x", 1).ok());  // closed
  ASSERT_TRUE(env->RenameFile(d.File("a"), d.File("b")).ok());
  EXPECT_FALSE(env->FileExists(d.File("a")));
  EXPECT_TRUE(env->FileExists(d.File("b")));
  auto kids = env->GetChildren(d.path);
  ASSERT_TRUE(kids.ok());
  EXPECT_EQ(*kids, std::vector<std::string>{"b"});
  auto f = env->NewRandomAccessFile(d.File("b"), false);
  ASSERT_TRUE(f.ok());
  EXPECT_GE((*f)->fd(), 0);
  char buf[3];
  ASSERT_TRUE((*f)->Read(0, 3, buf).ok());
  EXPECT_EQ(std::string(buf, 3), "abc");
  EXPECT_EQ(env->NewRandomAccessFile(d.File("none"), false).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(env->NewRandomAccessFile(d.path, false).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(env->RenameFile(d.File("none"), d.File("c")).ok());
  EXPECT_FALSE(env->GetChildren(d.File("none")).ok());
}

// Short reads (a byte, or a page under O_DIRECT, at a time) are resumed by every reader and
// give the same bytes; an EIO in the middle of a range is an IOError naming the file.
TEST(FaultEnv, ReadersResumeShortReadsAndReportEio) {
  TempDir d;
  const std::string data = Pattern((3u << 20) + 100);  // several io_uring chunks, a ragged end
  const std::string path = d.File("data.bin");
  ASSERT_TRUE(WriteFileAtomic(path, data).ok());
  for (const bool direct : {false, true}) {
    for (const IoMode mode : {IoMode::kPread, IoMode::kUring}) {
      SCOPED_TRACE(std::string(direct ? "direct " : "buffered ") +
                   (mode == IoMode::kPread ? "pread" : "uring"));
      FaultEnv env;
      auto f = env.NewRandomAccessFile(path, direct);
      ASSERT_TRUE(f.ok());
      auto io = env.NewIoReader(mode);
      auto buf = AlignedBuffer::Allocate(data.size() + 4096, nullptr, "test");
      ASSERT_TRUE(buf.ok());
      // Clean: the real descriptor (io_uring reads it itself).
      EXPECT_GE((*f)->fd(), 0);
      ASSERT_TRUE(io->Read(**f, 0, data.size(), buf->data()).ok());
      EXPECT_EQ(std::string(reinterpret_cast<char*>(buf->data()), data.size()), data);

      env.Add({Kind::kShortRead, "data.bin", 0, -1, 0, 1});
      EXPECT_EQ((*f)->fd(), -1);
      std::memset(buf->data(), 0, data.size());
      Status st = io->Read(**f, 4096, data.size() - 4096, buf->data());
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(std::string(reinterpret_cast<char*>(buf->data()), data.size() - 4096),
                data.substr(4096));
      EXPECT_GT(env.injected(Kind::kShortRead), 10);
      if (!direct) {  // O_DIRECT reads need aligned buffers: the IoReader's case above
        std::string small(5000, '\0');
        ASSERT_TRUE((*f)->Read(8192, small.size(), small.data()).ok());
        EXPECT_EQ(small, data.substr(8192, small.size()));
      }

      // EIO after the first 8 KiB of a range.
      env.Clear();
      env.Add({Kind::kReadError, "data.bin", 0, -1, 0, 8192});
      st = io->Read(**f, 0, data.size(), buf->data());
      EXPECT_EQ(st.code(), StatusCode::kIOError) << st.ToString();
      EXPECT_NE(st.message().find("data.bin"), std::string::npos) << st.ToString();
      EXPECT_NE(st.message().find("Input/output error"), std::string::npos) << st.ToString();
      // Once the fault is gone, the same file and reader read again.
      env.Clear();
      ASSERT_TRUE(io->Read(**f, 0, data.size(), buf->data()).ok());
      EXPECT_EQ(std::string(reinterpret_cast<char*>(buf->data()), data.size()), data);
    }
  }
}

TEST(FaultEnv, SlowReadsAreSlowAndSkipAndTimesCount) {
  TempDir d;
  const std::string path = d.File("slow.bin");
  ASSERT_TRUE(WriteFileAtomic(path, Pattern(10000)).ok());
  FaultEnv env;
  env.Add({Kind::kSlowRead, "slow", 1, 2, 30, 0});  // the 2nd and 3rd reads sleep 30 ms
  auto f = env.NewRandomAccessFile(path, false);
  ASSERT_TRUE(f.ok());
  char b[16];
  std::vector<double> ms;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE((*f)->Read(0, sizeof b, b).ok());
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  EXPECT_LT(ms[0], 25);
  EXPECT_GE(ms[1], 29);
  EXPECT_GE(ms[2], 29);
  EXPECT_LT(ms[3], 25);
  EXPECT_EQ(env.injected(Kind::kSlowRead), 2);
}

// The previous file survives every way a write can fail, the temporary file goes, and the
// error names what failed.
TEST(FaultEnv, FailedAtomicWritesLeaveThePreviousFile) {
  TempDir d;
  const std::string path = d.File("target.bin");
  const std::string old_contents = "the previous contents";
  ASSERT_TRUE(WriteFileAtomic(path, old_contents).ok());
  const std::string big = Pattern(20u << 20);  // over the writer's 8 MiB buffer

  struct Case {
    FaultEnv::Fault fault;
    const char* error;
  };
  for (const Case& c :
       {Case{{Kind::kNoSpace, "target.bin", 0, -1, 0, 1u << 20}, "No space left on device"},
        Case{{Kind::kNoSpace, "target.bin", 0, -1, 0, 0}, "No space left on device"},
        Case{{Kind::kSyncError, "target.bin", 0, -1, 0, 0}, "fsync"},
        Case{{Kind::kRenameError, "target.bin", 0, -1, 0, 0}, "rename"}}) {
    for (const size_t n : {size_t{100}, big.size()}) {
      SCOPED_TRACE(std::string(c.error) + " " + std::to_string(n));
      FaultEnv env;
      env.Add(c.fault);
      Status st = WriteFileAtomic(path, std::string_view(big).substr(0, n), &env);
      if (c.fault.kind == Kind::kNoSpace && c.fault.bytes >= n) {
        EXPECT_TRUE(st.ok());  // it fitted
        ASSERT_TRUE(WriteFileAtomic(path, old_contents).ok());
        continue;
      }
      EXPECT_EQ(st.code(), StatusCode::kIOError) << st.ToString();
      EXPECT_NE(st.message().find(c.error), std::string::npos) << st.ToString();
      EXPECT_NE(st.message().find("target.bin"), std::string::npos) << st.ToString();
      EXPECT_EQ(Slurp(path), old_contents);
      EXPECT_EQ(Children(d.path), std::vector<std::string>{"target.bin"});  // no temp left
    }
  }
  // The same writer through the real disk still works.
  ASSERT_TRUE(WriteFileAtomic(path, "new").ok());
  EXPECT_EQ(Slurp(path), "new");
}

// A pid that existed and is gone: a child that exited and was reaped.
long DeadPid() {
  const pid_t p = fork();
  if (p == 0) _exit(0);
  int st = 0;
  waitpid(p, &st, 0);
  return p;
}

// Issue: killed atomic writes leave `*.tmp.PID` (13 MB for a session) that nothing removed.
TEST(FileIO, NextWriteRemovesStaleTempsOfDeadWritersOnly) {
  TempDir d;
  const std::string path = d.File("session.bin");
  const long dead = DeadPid();
  const long alive = static_cast<long>(getppid());  // our parent: alive while we run
  for (const std::string& name :
       {"session.bin.tmp." + std::to_string(dead), "session.bin.tmp." + std::to_string(alive),
        "other.bin.tmp." + std::to_string(dead), "session.bin.tmp.x" + std::to_string(dead)})
    std::ofstream(d.File(name)) << "leftover";
  ASSERT_TRUE(WriteFileAtomic(path, "saved").ok());
  EXPECT_EQ(Children(d.path),
            (std::vector<std::string>{"other.bin.tmp." + std::to_string(dead), "session.bin",
                                      "session.bin.tmp." + std::to_string(alive),
                                      "session.bin.tmp.x" + std::to_string(dead)}));
  // A failed write removes none (nor its own temp is left).
  FaultEnv env;
  env.Add({Kind::kRenameError, "session.bin", 0, -1, 0, 0});
  std::ofstream(d.File("session.bin.tmp." + std::to_string(dead))) << "leftover";
  EXPECT_FALSE(WriteFileAtomic(path, "again", &env).ok());
  EXPECT_TRUE(fs::exists(d.File("session.bin.tmp." + std::to_string(dead))));
  EXPECT_EQ(Slurp(path), "saved");
}

}  // namespace
}  // namespace substrate
