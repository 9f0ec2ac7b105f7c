// The tiered store: a ladder Q4_K + Q8_0 + F16 over tiny-coder-moe's bf16 weights reproduces
// golden.json's greedy continuation at the top tier; damaged stores fail with clear errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "core/memory_ledger.h"
#include "core/thread_pool.h"
#include "format/model_file.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/sampler.h"
#include "store/crc32c.h"
#include "store/pack.h"
#include "store/store_fixture.h"
#include "store/store_weight_source.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace substrate::testing;

std::string Shared() { return SUBSTRATE_SHARED_DIR; }

json Manifest(const std::string& dir) {
  std::ifstream in(dir + "/manifest.json");
  return json::parse(in);
}

TEST(Crc32c, KnownAnswers) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  // Continuation equals one pass.
  EXPECT_EQ(Crc32c("6789", 4, Crc32c("12345", 5)), 0xE3069283u);
}

// Lengths on both sides of every path (three chains of 8 KiB blocks, of 256-byte blocks, one
// chain, single bytes), at odd offsets and continued from odd split points, against the
// polynomial computed a bit at a time: a wrong join of the chains, or a wrong block length,
// fails it.
TEST(Crc32c, EqualsTheBitwiseDefinitionAtEveryLength) {
  const auto bitwise = [](const uint8_t* p, size_t n, uint32_t crc) {
    crc = ~crc;
    for (size_t i = 0; i < n; ++i) {
      crc ^= p[i];
      for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    return ~crc;
  };
  std::vector<uint8_t> data(3 * 8192 * 3 + 1000);
  uint32_t x = 12345;
  for (uint8_t& b : data) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 24);
  // Every path this CPU has (the carry-less one takes whole 256-byte steps from 1 KiB on).
  for (int path = 0; path <= static_cast<int>(BestCrc32cPath()); ++path) {
    const Crc32cPath before = SetCrc32cPathForTesting(static_cast<Crc32cPath>(path));
    for (size_t n : {size_t{0}, size_t{7}, size_t{767}, size_t{768}, size_t{769}, size_t{1023},
                     size_t{1024}, size_t{1025}, size_t{1280}, size_t{3000}, size_t{24575},
                     size_t{24576}, size_t{24577}, size_t{49152 + 768 + 13}, data.size() - 3}) {
      const uint8_t* p = data.data() + 3;
      const uint32_t want = bitwise(p, n, 0);
      EXPECT_EQ(Crc32c(p, n), want) << "path " << path << ", " << n << " bytes";
      const size_t cut = n / 3 + 1 < n ? n / 3 + 1 : 0;
      EXPECT_EQ(Crc32c(p + cut, n - cut, Crc32c(p, cut)), want)
          << "path " << path << ", " << n << " bytes split at " << cut;
      EXPECT_EQ(Crc32c(p, n, 0x12345678u), bitwise(p, n, 0x12345678u)) << "path " << path;
    }
    SetCrc32cPathForTesting(before);
  }
}

// Greedy continuation through the store at `tier` (resident, or streaming).
std::vector<int32_t> Greedy(const std::string& store, int tier, const std::vector<int32_t>& prompt,
                            size_t n, MemoryLedger* ledger, bool streaming = false) {
  StoreOptions o;
  o.streaming = streaming;
  o.max_tier = tier;
  o.serve_tier = tier;
  auto src = StoreWeightSource::Open(store, ledger, o);
  EXPECT_TRUE(src.ok()) << src.status().ToString();
  if (!src.ok()) return {};
  Status err;
  auto got = GreedyThrough(src->get(), (*src)->metadata(), ledger, prompt, n, &err);
  EXPECT_TRUE(err.ok()) << err.ToString();
  return got;
}

TEST(Store, TopTierReproducesGoldenGreedy) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-moe-bf16.gguf";
  std::ifstream in(Shared() + "/models/tiny-coder-moe/golden.json");
  ASSERT_TRUE(in) << "no golden.json";
  json golden = json::parse(in);
  const auto prompt = golden["greedy"]["prompt"].get<std::vector<int32_t>>();
  const auto want = golden["greedy"]["continuation"].get<std::vector<int32_t>>();
  MemoryLedger ledger;
  EXPECT_EQ(Greedy(PackedTinyMoeStore(), 2, prompt, want.size(), &ledger), want);
  // Every data range is 4096-aligned, and the ledger saw the weights.
  for (const json& e : Manifest(PackedTinyMoeStore())["entries"])
    ASSERT_EQ(e["offset"].get<uint64_t>() % kStoreAlignment, 0u);
  EXPECT_GT(ledger.Accounts()["weights"].peak, 0u);
}

// Streaming (read on Acquire, free at EndOp) under a ledger cap of a quarter of the weights' size:
// the same continuation, and the weights never all resident.
TEST(Store, StreamingUnderCapReproducesGolden) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  std::ifstream in(Shared() + "/models/tiny-coder-moe/golden.json");
  ASSERT_TRUE(in) << "no golden.json";
  json golden = json::parse(in);
  const auto prompt = golden["greedy"]["prompt"].get<std::vector<int32_t>>();
  const auto want = golden["greedy"]["continuation"].get<std::vector<int32_t>>();
  MemoryLedger full;
  auto resident = StoreWeightSource::Open(PackedTinyMoeStore(), &full);
  ASSERT_TRUE(resident.ok());
  const uint64_t weights = (*resident)->loaded_bytes();
  resident->reset();
  MemoryLedger capped(weights / 4);
  EXPECT_EQ(Greedy(PackedTinyMoeStore(), 2, prompt, want.size(), &capped, true), want);
  EXPECT_LE(capped.peak(), weights / 4);
  std::printf("streaming: weights %llu B, cap %llu B, ledger peak %llu B (stream peak %llu B)\n",
              static_cast<unsigned long long>(weights),
              static_cast<unsigned long long>(weights / 4),
              static_cast<unsigned long long>(capped.peak()),
              static_cast<unsigned long long>(capped.Accounts()["stream"].peak));
  EXPECT_GT(capped.Accounts()["stream"].peak, 0u);
  EXPECT_EQ(capped.Accounts()["weights"].peak, 0u);
}

TEST(Store, SkeletonOnlyLoadsLess) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  MemoryLedger l0, l2;
  StoreOptions o0;
  o0.max_tier = 0;
  o0.serve_tier = 0;
  auto s0 = StoreWeightSource::Open(PackedTinyMoeStore(), &l0, o0);
  auto s2 = StoreWeightSource::Open(PackedTinyMoeStore(), &l2);
  ASSERT_TRUE(s0.ok() && s2.ok());
  EXPECT_LT((*s0)->loaded_bytes() * 2, (*s2)->loaded_bytes());  // token_embd stays raw
  EXPECT_EQ((*s2)->n_tiers(), 3);
  // A cap below the skeleton's size is refused with OutOfMemory, not a crash.
  MemoryLedger tiny(1 << 20);
  auto s = StoreWeightSource::Open(PackedTinyMoeStore(), &tiny, o0);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kOutOfMemory) << s.status().ToString();
}

TEST(Store, MissingManifest) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  const std::string d = CopyPackedStore("nomanifest");
  fs::remove(d + "/manifest.json");
  MemoryLedger l;
  auto s = StoreWeightSource::Open(d, &l);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_NE(s.status().ToString().find("manifest.json"), std::string::npos);
  fs::remove_all(d);
}

TEST(Store, MalformedManifest) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  const std::string d = CopyPackedStore("badmanifest");
  for (const std::string& text :
       {std::string("{\"format\": \"substrate-store\", "), std::string("[1,2,3]"),
        std::string("{\"format\":\"substrate-store\",\"schema_version\":99}"),
        std::string("{\"format\":\"substrate-store\",\"schema_version\":1,"
                    "\"tiers\":[\"Q4_K\"],\"model\":\"model.gguf\","
                    "\"tensors\":[{\"name\":\"x\"}],\"entries\":[]}")}) {
    ASSERT_TRUE(WriteFileAtomic(d + "/manifest.json", text).ok());
    MemoryLedger l;
    auto s = StoreWeightSource::Open(d, &l);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_EQ(s.status().code(), StatusCode::kCorruption) << s.status().ToString();
    EXPECT_NE(s.status().ToString().find("manifest.json"), std::string::npos);
  }
  fs::remove_all(d);
}

TEST(Store, TruncatedFile) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  const std::string d = CopyPackedStore("truncated");
  const json m = Manifest(d);
  const json& last = m["entries"].back();
  const std::string file = last["file"];
  fs::resize_file(d + "/" + file, last["offset"].get<uint64_t>() + 10);
  MemoryLedger l;
  auto s = StoreWeightSource::Open(d, &l);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kCorruption);
  const std::string msg = s.status().ToString();
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find(last["tensor"].get<std::string>()), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  fs::remove_all(d);
}

TEST(Store, ChecksumMismatch) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  const std::string d = CopyPackedStore("badcrc");
  const json m = Manifest(d);
  const json& e = m["entries"][m["entries"].size() / 2];
  const std::string file = e["file"];
  {
    std::fstream f(d + "/" + file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(e["offset"].get<uint64_t>()));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(static_cast<std::streamoff>(e["offset"].get<uint64_t>()));
    f.write(&c, 1);
  }
  MemoryLedger l;
  auto s = StoreWeightSource::Open(d, &l);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kCorruption);
  const std::string msg = s.status().ToString();
  EXPECT_NE(msg.find("checksum mismatch"), std::string::npos) << msg;
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find(e["tensor"].get<std::string>()), std::string::npos) << msg;
  fs::remove_all(d);
}

}  // namespace
}  // namespace substrate
