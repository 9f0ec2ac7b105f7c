#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "core/file_io.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace substrate {

Expected<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(int q, Half(h));
  *out = q;
  return Status::Ok();
}

TEST(Status, PropagatesThroughMacros) {
  int q = 0;
  EXPECT_TRUE(Quarter(8, &q).ok());
  EXPECT_EQ(q, 2);
  Status s = Quarter(6, &q);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "Invalid argument: odd: 3");
}

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 7, 1000, 4097}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, 16, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

// More workers than cores, and jobs of a few items that the caller often finishes before a
// worker wakes: late workers must find the job closed (never run a finished job's body, never
// take a chunk twice), and each job's results must be complete when ParallelFor returns.
TEST(ThreadPool, LateWorkersNeverTouchAFinishedJob) {
  ThreadPool pool(6);
  std::vector<int> hits(64);
  for (int round = 0; round < 20000; ++round) {
    const int64_t n = 1 + round % 64;
    std::fill(hits.begin(), hits.begin() + n, 0);
    std::atomic<bool> returned{false};
    pool.ParallelFor(n, 1, [&](int64_t b, int64_t e, int) {
      ASSERT_FALSE(returned.load()) << "a chunk ran after ParallelFor returned";
      for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
    });
    returned = true;
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << "round " << round << " i=" << i;
  }
}

// Workers told to rest (a thread about to block on a read) sleep instead of polling; the next
// job must still wake them: each job's first item waits until a worker has run the other.
TEST(ThreadPool, RestedWorkersJoinTheNextJob) {
  ThreadPool pool(2);
  for (int round = 0; round < 200; ++round) {
    ThreadPool::RestSpinners();
    if (round % 2) std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::atomic<bool> worker_ran{false};
    bool waited_in_vain = false;
    pool.ParallelFor(2, 1, [&](int64_t b, int64_t, int thread) {
      if (thread != 0) {
        worker_ran = true;
        return;
      }
      if (b != 0) return;
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!worker_ran.load() && std::chrono::steady_clock::now() < give_up)
        std::this_thread::yield();
      waited_in_vain = !worker_ran.load();
    });
    ASSERT_FALSE(waited_in_vain) << "round " << round << ": the rested worker never woke";
  }
}

TEST(FileIO, AtomicWriteAndBoundedReads) {
  std::string path = testing::TempDir() + "/substrate_fileio_test.bin";
  ASSERT_TRUE(WriteFileAtomic(path, "hello world").ok());
  auto f = RandomAccessFile::Open(path);
  ASSERT_TRUE(f.ok());
  char buf[5];
  ASSERT_TRUE((*f)->Read(6, 5, buf).ok());
  EXPECT_EQ(std::string(buf, 5), "world");
  Status past = (*f)->Read(8, 5, buf);
  EXPECT_EQ(past.code(), StatusCode::kCorruption);
  EXPECT_NE(past.message().find("past the end"), std::string::npos);
  EXPECT_EQ(RandomAccessFile::Open(path + ".missing").status().code(), StatusCode::kNotFound);
  std::remove(path.c_str());
}

TEST(FileIO, UncommittedWriterLeavesNothing) {
  std::string path = testing::TempDir() + "/substrate_uncommitted.bin";
  {
    auto w = AtomicFileWriter::Create(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append("partial").ok());
  }
  EXPECT_FALSE(FileExists(path));
}

}  // namespace substrate
