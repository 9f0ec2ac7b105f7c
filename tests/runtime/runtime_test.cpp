// The out-of-core runtime: tiny-coder-moe packed through a ladder that reproduces bf16 gives the
// golden greedy continuation through the ResidencyManager under a ledger cap below its weights'
// size (ops streamed through slabs with prefetch, experts through the cache), the ledger peak
// stays under the cap, and damaged stores or a killed run end cleanly.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "compiler/plan_bundle.h"
#include "core/fault_env.h"
#include "core/file_io.h"
#include "core/memory_ledger.h"
#include "core/thread_pool.h"
#include "format/model_file.h"
#include "kernels/cpu_features.h"
#include "kernels/interleaved.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/op_id.h"
#include "model/sampler.h"
#include "runtime/expert_cache.h"
#include "runtime/plan_fixture.h"
#include "runtime/prefetch_scheduler.h"
#include "runtime/residency_manager.h"
#include "store/pack.h"
#include "store/store_index.h"

extern char** environ;

namespace substrate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace substrate::testing;

std::string Shared() { return SUBSTRATE_SHARED_DIR; }

json Golden() {
  std::ifstream in(Shared() + "/models/tiny-coder-moe/golden.json");
  return json::parse(in);
}

ResidencyOptions SmallRun() {
  ResidencyOptions o;
  o.reserve_bytes = 4ull << 20;  // KV for 256 positions and scratch of tiny-coder-moe: < 2 MiB
  o.prefetch_depth = 2;
  return o;
}

// Through m: the first n tokens of the golden greedy continuation, and no error.
void ExpectGoldenStart(ResidencyManager* m, MemoryLedger* ledger, size_t n) {
  const json g = Golden();
  const auto prompt = g["greedy"]["prompt"].get<std::vector<int32_t>>();
  const auto want = g["greedy"]["continuation"].get<std::vector<int32_t>>();
  Status err;
  EXPECT_EQ(GreedyThrough(m, m->metadata(), ledger, prompt, n, &err),
            std::vector<int32_t>(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(n)));
  EXPECT_TRUE(err.ok()) << err.ToString();
}

TEST(Runtime, GoldenGreedyUnderCapWithPrefetch) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-moe-bf16.gguf";
  const json g = Golden();
  const auto prompt = g["greedy"]["prompt"].get<std::vector<int32_t>>();
  const auto want = g["greedy"]["continuation"].get<std::vector<int32_t>>();
  // The cap leaves 2 MiB less than the dense ops and the reserve need: the largest dense ops stay
  // resident, the others stream through slabs, and the expert cache holds a few experts.
  const uint64_t weights = StoreDataBytes(PackedTinyMoeStore());
  ResidencyOptions o = SmallRun();
  o.embedding_rows = false;  // the embedding held too, so that dense ops stream through slabs
  uint64_t dense = 0;  // every dense op resident, as a generous budget gives
  {
    MemoryLedger roomy(weights * 2);
    auto m = ResidencyManager::Open(PackedTinyMoeStore(), &roomy, o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    dense = (*m)->stats().resident_bytes;
  }
  const uint64_t cap = dense + o.reserve_bytes - (2ull << 20);
  ASSERT_LT(cap, weights);
  MemoryLedger ledger(cap);
  o.trace_path = StoreTestPath("trace.jsonl");
  auto m = ResidencyManager::Open(PackedTinyMoeStore(), &ledger, o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Status err;
  EXPECT_EQ(GreedyThrough(m->get(), (*m)->metadata(), &ledger, prompt, want.size(), &err), want);
  EXPECT_TRUE(err.ok()) << err.ToString();
  const ResidencyStats s = (*m)->stats();
  EXPECT_GT(s.n_ops_streamed, 0);
  EXPECT_LT(s.expert_slots, s.n_ops_expert);
  EXPECT_EQ(s.n_slabs, 3);
  EXPECT_GT(s.hits, 0u) << "no streamed op was ready when it began: prefetch did not run ahead";
  EXPECT_GT(s.stream_bytes_read, 0u);
  EXPECT_GT(s.expert_hits + s.expert_misses + s.expert_late, 0u);
  EXPECT_GT(s.expert_hint_used, 0u) << "no hinted read was used";
  EXPECT_LE(s.expert_hint_used, s.expert_hinted);
  EXPECT_LE(ledger.peak(), cap);
  const auto acc = ledger.Accounts();
  EXPECT_GT(acc.at("stream_slabs").peak, 0u);
  EXPECT_GT(acc.at("expert_cache").peak, 0u);
  ASSERT_TRUE((*m)->FlushTrace().ok());
  std::ifstream trace(o.trace_path);
  std::string line;
  int ops = 0, reads = 0;
  while (std::getline(trace, line)) {
    json e = json::parse(line);
    ops += e["ev"] == "op";
    reads += e["ev"] == "read";
  }
  EXPECT_GT(ops, 0);
  EXPECT_GT(reads, 0);
  m->reset();
  fs::remove(o.trace_path);
}

// Guessed expert reads that the layer's real routing does not name are dropped while still
// queued (slow reads through one reader keep a queue), and the output stays the golden one.
TEST(Runtime, WrongGuessesAreDroppedBeforeTheyRun) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-moe-bf16.gguf";
  FaultEnv env;
  FaultEnv::Fault slow;
  slow.kind = FaultEnv::Kind::kSlowRead;
  slow.delay_ms = 2;
  env.Add(slow);
  ResidencyOptions o = SmallRun();
  o.env = &env;
  o.io_threads = 1;
  o.lookahead_layers = 2;
  o.expert_slots = 24;
  MemoryLedger ledger(StoreDataBytes(PackedTinyMoeStore()));
  auto m = ResidencyManager::Open(PackedTinyMoeStore(), &ledger, o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectGoldenStart(m->get(), &ledger, 8);
  const ResidencyStats s = (*m)->stats();
  EXPECT_GT(s.expert_hint_dropped, 0u) << "no queued wrong guess was dropped";
  EXPECT_LE(s.expert_hint_used + s.expert_hint_dropped, s.expert_hinted);
}

// PrefetchScheduler::Abandon: a queued read is dropped (its ticket idle); a running one stops at
// its next range or before its checksums and fails as cancelled, never reporting bytes it did
// not verify; one left alone arrives whole. One reader whose reads each sleep 150 ms first.
TEST(Runtime, AbandonedReadsStopAndFail) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture tiny-coder-moe-bf16.gguf";
  FaultEnv env;
  env.Add({FaultEnv::Kind::kSlowRead, "", 0, -1, 150, 0});
  StoreIndexOptions io;
  io.env = &env;
  auto index = StoreIndex::Open(PackedTinyMoeStore(), io);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  PrefetchScheduler sched(**index, IoMode::kPread, 1, nullptr, RuntimeClock::now(), &env);
  const auto& ops = (*index)->ops();
  ASSERT_GE(ops.size(), 3u);
  ReadTicket tickets[3];
  std::vector<std::vector<uint8_t>> dst(3);
  for (int i = 0; i < 3; ++i) {
    dst[i].assign(ops[i].SlabBytes(0), 0);
    ReadRequest r;
    r.deadline = i;  // EDF: in this order
    r.op = i;
    r.dst = dst[i].data();
    r.ticket = &tickets[i];
    sched.Submit(r);
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (tickets[0].state.load() != ReadTicket::kRunning &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(tickets[0].state.load(), ReadTicket::kRunning);
  EXPECT_EQ(sched.Abandon(&tickets[0]), ReadTicket::kRunning);
  EXPECT_EQ(sched.Abandon(&tickets[1]), ReadTicket::kQueued);
  EXPECT_EQ(tickets[1].state.load(), ReadTicket::kIdle);
  const Status first = sched.Wait(&tickets[0], nullptr);
  EXPECT_EQ(first.code(), StatusCode::kCancelled) << first.ToString();
  EXPECT_EQ(sched.Abandon(&tickets[0]), ReadTicket::kIdle);  // failed already: nothing to stop
  EXPECT_TRUE(sched.Wait(&tickets[2], nullptr).ok());
  EXPECT_EQ(sched.bytes_read(), ops[2].SlabBytes(0)) << "only the read left alone counts";
}

// A plan's resident set is what the manager keeps: here the routers, embedding and output head
// resident, every other dense op streamed (evicted after itself, prefetched from token start).
TEST(Runtime, PlanChoosesTheResidentSet) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  auto index = StoreIndex::Open(PackedTinyMoeStore());
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  auto hp = ModelHParams::FromMetadata((*index)->meta().metadata());
  ASSERT_TRUE(hp.ok());
  PlanCounts counts;
  auto path = WriteTinyMoePlan(
      [](OpKind k) {
        return k != OpKind::kMoeRouter && k != OpKind::kTokenEmbd && k != OpKind::kOutput;
      },
      [](const std::string&) { return std::optional<std::string>(""); }, "plan.json", &counts);
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  const int n_streamed = counts.streamed, n_resident = counts.resident;

  const json g = Golden();
  const auto prompt = g["greedy"]["prompt"].get<std::vector<int32_t>>();
  const auto want = g["greedy"]["continuation"].get<std::vector<int32_t>>();
  ResidencyOptions o = SmallRun();
  o.plan_path = *path;
  MemoryLedger ledger(StoreDataBytes(PackedTinyMoeStore()));
  auto m = ResidencyManager::Open(PackedTinyMoeStore(), &ledger, o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->stats().n_ops_streamed, n_streamed);
  EXPECT_GE((*m)->stats().n_ops_resident, n_resident);
  Status err;
  EXPECT_EQ(GreedyThrough(m->get(), (*m)->metadata(), &ledger, prompt, 6, &err),
            std::vector<int32_t>(want.begin(), want.begin() + 6));
  EXPECT_TRUE(err.ok()) << err.ToString();
  EXPECT_LE(ledger.peak(), ledger.cap());
  fs::remove(*path);
}

TEST(Runtime, PreadAndBothCachePoliciesGiveTheGoldenStart) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  for (auto policy : {ExpertCache::Policy::kLru, ExpertCache::Policy::kDecayed}) {
    SCOPED_TRACE(policy == ExpertCache::Policy::kLru ? "lru" : "decayed");
    ResidencyOptions o = SmallRun();
    o.io_mode = IoMode::kPread;
    o.direct_io = false;
    o.expert_slots = 6;  // few slots: many misses and evictions
    o.expert_policy = policy;
    o.lookahead_layers = 1;
    o.prefetch_depth = 1;
    MemoryLedger ledger(StoreDataBytes(PackedTinyMoeStore()) * 3 / 5);
    auto m = ResidencyManager::Open(PackedTinyMoeStore(), &ledger, o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ((*m)->stats().expert_policy, policy);
    ExpectGoldenStart(m->get(), &ledger, 8);
    EXPECT_GT((*m)->stats().expert_misses + (*m)->stats().expert_late, 0u);
    EXPECT_FALSE((*m)->stats().uring);
  }
}

// Whether this CPU's tier computes on the packed experts' (Q4_K) interleaved layout: AVX-512, and
// AVX2 since it has Q4_K's kernel.
bool ComputesOnExpertLayout() {
  return InterleavedKernelFor(WeightLayout::kQ4_KInterleaved, ActiveIsa());
}

// Experts read into the cache's slots and rearranged there into the backend's layout (where the
// CPU computes on it: the interleaved one, with the residual tiers on top), by the reading threads
// or by the compute threads before their first product, give the golden tokens, with many misses
// and evictions.
TEST(Runtime, ExpertsRearrangedAsReadGiveTheGoldenTokens) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  for (bool reading_threads : {true, false}) {
    SCOPED_TRACE(reading_threads ? "on the reading threads" : "at first use");
    MemoryLedger ledger(StoreDataBytes(PackedTinyMoeStore()) * 3 / 5);
    CpuBackend backend(&StoreTestPool(), &ledger);
    ResidencyOptions o = SmallRun();
    o.expert_slots = 6;
    o.backend = &backend;
    o.adopt_expert_reads = reading_threads;
    auto m = ResidencyManager::Open(PackedTinyMoeStore(), &ledger, o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ExpectGoldenStart(m->get(), &ledger, 8);
    const ResidencyStats s = (*m)->stats();
    EXPECT_GT(s.expert_misses + s.expert_late, 0u);
    if (ComputesOnExpertLayout()) {
      EXPECT_GT(s.expert_relayouts, 0u) << "no expert read was rearranged";
    } else {
      EXPECT_EQ(s.expert_relayouts, 0u);
    }
  }
}

// tiny-coder-moe packed with each expert's tier 0 in the CPU kernels' layout (--cpu-layout).
const std::string& PackedCpuLayoutStore() {
  static const std::string dir = [] {
    PackOptions po;
    po.cpu_layout = true;
    return PackOnce("tiny-coder-moe-bf16", "packed_cpu_layout", po);
  }();
  static const RemoveAtExit cleanup{dir};
  return dir;
}

// A store holding the experts in the CPU kernels' layout: the manifest names it on the experts'
// skeletons only; their reads need no rearranging where the backend computes on that layout
// (ComputesOnExpertLayout), are put back into rows where it does not (decode layout off), and are
// computed on as stored without a backend; the golden tokens every way. A mislabelled range (rows
// read as interleaved) gives other tokens, so the layout is what the kernels read.
TEST(Runtime, ExpertsStoredInTheCpuLayoutGiveTheGoldenTokens) {
  if (PackedCpuLayoutStore().empty()) GTEST_SKIP() << "no fixture";
  std::ifstream in(PackedCpuLayoutStore() + "/manifest.json");
  const json manifest = json::parse(in);
  int interleaved = 0;
  for (const json& e : manifest["entries"]) {
    if (!e.contains("layout")) continue;
    ++interleaved;
    EXPECT_GE(e["slice"].get<int>(), 0) << e.dump();
    EXPECT_EQ(e["tier"].get<int>(), 0) << e.dump();
  }
  EXPECT_GT(interleaved, 0) << "no expert stored in the CPU layout";
  for (int mode = 0; mode < 4; ++mode) {
    SCOPED_TRACE(mode);
    MemoryLedger ledger(StoreDataBytes(PackedCpuLayoutStore()) * 3 / 5);
    CpuBackendOptions bo;
    bo.decode_layout = mode != 2;
    CpuBackend backend(&StoreTestPool(), &ledger, bo);
    ResidencyOptions o = SmallRun();
    o.expert_slots = 6;
    o.backend = mode == 3 ? nullptr : &backend;
    o.adopt_expert_reads = mode == 0;
    auto m = ResidencyManager::Open(PackedCpuLayoutStore(), &ledger, o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_TRUE((*m)->index().has_interleaved());
    ExpectGoldenStart(m->get(), &ledger, 8);
    const ResidencyStats s = (*m)->stats();
    EXPECT_GT(s.expert_misses + s.expert_late, 0u);
    if (mode == 2 || (mode < 2 && !ComputesOnExpertLayout())) {
      EXPECT_GT(s.expert_relayouts, 0u) << "experts put back into rows";
    } else {
      EXPECT_EQ(s.expert_relayouts, 0u) << "experts rearranged although stored in the layout";
    }
  }
  // The rows store's manifest with its experts' skeletons labelled interleaved.
  const std::string d = CopyPackedStore("mislabelled");
  {
    std::ifstream rin(d + "/manifest.json");
    json m = json::parse(rin);
    for (json& e : m["entries"])
      if (e["slice"].get<int>() >= 0 && e["tier"].get<int>() == 0) {
        const std::string type = e["type"];
        if (type == "Q4_K") e["layout"] = "q4_k_x16";
      }
    ASSERT_TRUE(WriteFileAtomic(d + "/manifest.json", m.dump(1)).ok());
  }
  MemoryLedger ledger(StoreDataBytes(d) * 3 / 5);
  ResidencyOptions o = SmallRun();
  o.expert_slots = 6;
  auto m = ResidencyManager::Open(d, &ledger, o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const json g = Golden();
  Status err;
  const auto prompt = g["greedy"]["prompt"].get<std::vector<int32_t>>();
  const auto want = g["greedy"]["continuation"].get<std::vector<int32_t>>();
  EXPECT_NE(GreedyThrough(m->get(), (*m)->metadata(), &ledger, prompt, 8, &err),
            std::vector<int32_t>(want.begin(), want.begin() + 8));
  m->reset();
  fs::remove_all(d);
}

// A layout the manifest names for a range that cannot take it is a corrupt manifest.
TEST(Runtime, LayoutThatDoesNotFitItsRangeIsCorruption) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  for (const std::string bad : {"q4_0_x16", "sideways"}) {
    const std::string d = CopyPackedStore("badlayout");
    std::ifstream rin(d + "/manifest.json");
    json m = json::parse(rin);
    m["entries"][0]["layout"] = bad;
    ASSERT_TRUE(WriteFileAtomic(d + "/manifest.json", m.dump(1)).ok());
    auto idx = StoreIndex::Open(d);
    ASSERT_FALSE(idx.ok()) << bad;
    EXPECT_EQ(idx.status().code(), StatusCode::kCorruption);
    EXPECT_NE(idx.status().ToString().find("layout '" + bad + "'"), std::string::npos)
        << idx.status().ToString();
    fs::remove_all(d);
  }
}

TEST(Runtime, BudgetTooSmallIsOutOfMemoryNamingIt) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  MemoryLedger ledger(1 << 20);
  auto m = ResidencyManager::Open(PackedTinyMoeStore(), &ledger, SmallRun());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(m.status().message().find("budget 1.00 MiB"), std::string::npos) << m.status().ToString();
  EXPECT_EQ(ledger.current(), 0u);
}

TEST(Runtime, FlippedByteInStreamedExpertIsCorruptionNamingFile) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  const std::string dir = CopyPackedStore("flip");
  // Every expert of layer 0: whichever the router picks is read at run time and fails.
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("block_0.moe.expert_", 0) != 0 || name.find(".t0.bin") == std::string::npos)
      continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    char c = 0;
    f.seekg(100);
    f.get(c);
    f.seekp(100);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  MemoryLedger ledger(StoreDataBytes(dir) * 3 / 5);
  auto m = ResidencyManager::Open(dir, &ledger, SmallRun());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Status err;
  GreedyThrough(m->get(), (*m)->metadata(), &ledger, {1, 2, 3}, 2, &err);
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.code(), StatusCode::kCorruption) << err.ToString();
  EXPECT_NE(err.message().find("block_0.moe.expert_"), std::string::npos) << err.ToString();
  EXPECT_NE(err.message().find("checksum mismatch"), std::string::npos) << err.ToString();
  EXPECT_NE(err.message().find("offset"), std::string::npos) << err.ToString();
  m->reset();  // worker threads join; no hang
  fs::remove_all(dir);
}

// Out of core the token embedding is read by rows (ResidencyOptions::embedding_rows): the
// budget holds everything else, its bytes go to the expert cache, each token reads its row's
// blocks, the output is the golden one within the cap, and the whole table is never handed out.
// A block changed under the session stops the pass with an error naming the file.
TEST(Runtime, EmbeddingReadByRowsGivesTheGoldenStartAndChecksItsBlocks) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  const std::string dir = CopyPackedStore("rows");
  const uint64_t cap = StoreDataBytes(dir) * 3 / 5;
  int held_slots = 0;
  {
    MemoryLedger ledger(cap);
    ResidencyOptions o = SmallRun();
    o.embedding_rows = false;
    auto m = ResidencyManager::Open(dir, &ledger, o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_FALSE((*m)->ReadsRows((*m)->Resolve("token_embd.weight")));
    held_slots = (*m)->stats().expert_slots;
  }
  MemoryLedger ledger(cap);
  auto m = ResidencyManager::Open(dir, &ledger, SmallRun());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const TensorId embd = (*m)->Resolve("token_embd.weight");
  ASSERT_TRUE((*m)->ReadsRows(embd));
  const auto whole = (*m)->Acquire(embd);
  ASSERT_FALSE(whole.ok());
  EXPECT_NE(whole.status().message().find("read by rows"), std::string::npos);
  const ResidencyStats opened = (*m)->stats();
  EXPECT_EQ(opened.rows_op_bytes, (*m)->OpBytes(OpIdTokenEmbd(), 0));
  EXPECT_GT(opened.expert_slots, held_slots) << "the embedding's bytes did not go to the cache";

  const size_t n = 8;
  ExpectGoldenStart(m->get(), &ledger, n);
  const ResidencyStats s = (*m)->stats();
  const size_t prompt = Golden()["greedy"]["prompt"].size();
  EXPECT_EQ(s.rows_read, prompt + n);  // every token evaluated, once
  EXPECT_LE(s.row_bytes_read, s.rows_read * 2 * RowReader::kBlockBytes);
  EXPECT_LE(ledger.peak(), cap);

  // Token 5's row changes on disk: its next read fails its block's checksum.
  const TensorInfo& info = (*m)->Info(embd);
  const uint64_t row_bytes = *RowBytes(info.type, info.ne[0]);
  {
    std::fstream f(dir + "/token_embd.t0.bin", std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(5 * row_bytes + 3);
    f.seekg(at);
    char c = 0;
    f.get(c);
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  Status err;
  GreedyThrough(m->get(), (*m)->metadata(), &ledger, {5}, 1, &err);
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.code(), StatusCode::kCorruption) << err.ToString();
  EXPECT_NE(err.message().find("token_embd.t0.bin"), std::string::npos) << err.ToString();
  EXPECT_NE(err.message().find("checksum mismatch"), std::string::npos) << err.ToString();
  m->reset();
  fs::remove_all(dir);
}

TEST(Runtime, FlippedByteInResidentOpFailsOpenCleanly) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  const std::string dir = CopyPackedStore("flip_resident");
  {
    std::fstream f(dir + "/output.t0.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4097);
    f.put('\x7f');
  }
  MemoryLedger ledger(StoreDataBytes(dir) * 2);  // everything dense is resident, read at open
  auto m = ResidencyManager::Open(dir, &ledger, SmallRun());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kCorruption) << m.status().ToString();
  EXPECT_NE(m.status().message().find("output.t0.bin"), std::string::npos) << m.status().ToString();
  EXPECT_EQ(ledger.current(), 0u);  // nothing left charged
  fs::remove_all(dir);
}

TEST(Runtime, TruncatedFileIsCorruptionAtOpen) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  const std::string dir = CopyPackedStore("trunc");
  fs::resize_file(dir + "/block_1.attn.t2.bin", 1000);
  MemoryLedger ledger(StoreDataBytes(PackedTinyMoeStore()));
  auto m = ResidencyManager::Open(dir, &ledger, SmallRun());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kCorruption);
  EXPECT_NE(m.status().message().find("block_1.attn.t2.bin"), std::string::npos)
      << m.status().ToString();
  EXPECT_NE(m.status().message().find("truncated"), std::string::npos) << m.status().ToString();
  fs::remove_all(dir);
}

TEST(Runtime, KilledRunLeavesNoTempFileAndStoreStillOpens) {
  if (PackedTinyMoeStore().empty()) GTEST_SKIP() << "no fixture";
  const std::string bin = SUBSTRATE_BINARY;
  if (!fs::exists(bin)) GTEST_SKIP() << "no substrate binary";
  // A run of several seconds: a thousand tokens with a fifth of the experts cached.
  const std::string cap = std::to_string(StoreDataBytes(PackedTinyMoeStore()) * 3 / 5 + (24 << 20));
  std::vector<std::string> args = {bin, "run", "--store", PackedTinyMoeStore(), "--max-ram", cap,
                                   "-c", "1024", "-p", "def main():", "-n", "1000"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  ASSERT_EQ(posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // loaded and streaming
  kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status)) << "the run ended before the kill; make it longer";
  for (const auto& e : fs::directory_iterator(PackedTinyMoeStore()))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  MemoryLedger ledger(StoreDataBytes(PackedTinyMoeStore()));
  auto m = ResidencyManager::Open(PackedTinyMoeStore(), &ledger, SmallRun());
  EXPECT_TRUE(m.ok()) << m.status().ToString();
}

TEST(ExpertCache, LruSkipsPinnedAndInFlightSlots) {
  MemoryLedger ledger;
  auto c = ExpertCache::Create(3, 4096, 10, &ledger, ExpertCache::Policy::kLru);
  ASSERT_TRUE(c.ok());
  ExpertCache& ec = **c;
  EXPECT_EQ(ledger.Accounts().at("expert_cache").current, 3u * 4096);
  for (int op = 0; op < 3; ++op) ec.Assign(ec.TakeVictim(0), op, 0);
  EXPECT_EQ(ec.Find(1), 1);
  ec.Touch(ec.Find(0));            // 1 is now least recently used
  ec.slot(ec.Find(1)).pins = 1;    // ... but pinned: 2 goes
  int v = ec.TakeVictim(0);
  EXPECT_EQ(v, 2);
  EXPECT_EQ(ec.Find(2), -1);
  ec.Assign(v, 7, 0);
  ec.slot(ec.Find(7)).ticket.state = ReadTicket::kRunning;
  ec.slot(ec.Find(0)).pins = 1;
  EXPECT_EQ(ec.TakeVictim(0), -1);  // everything pinned or being read
}

TEST(ExpertCache, AGuessTakesOnlySlotsUnusedSinceItsBound) {
  MemoryLedger ledger;
  auto c = ExpertCache::Create(3, 4096, 10, &ledger, ExpertCache::Policy::kLru);
  ASSERT_TRUE(c.ok());
  ExpertCache& ec = **c;
  for (int op = 0; op < 3; ++op) ec.Assign(ec.TakeVictim(0), op, 0, /*pos=*/10 * op);
  ec.Touch(ec.Find(0), 25);  // 0 used at 25; 1 read at 10, 2 at 20
  // Least recently used is 1 (position 10); with the bound at 10 it is protected, and so is
  // everything used since: no victim for a guess.
  EXPECT_EQ(ec.TakeVictim(0, /*used_before=*/10), -1);
  EXPECT_EQ(ec.Find(1), 1);
  // Bound 15: only 1 (position 10) may go.
  EXPECT_EQ(ec.TakeVictim(0, 15), 1);
  EXPECT_EQ(ec.Find(1), -1);
  // Without a bound, least recently used: 2 (filled before 0's use and 5's filling), though
  // filled at a later position than the bound above would allow.
  ec.Assign(1, 5, 0, 30);
  EXPECT_EQ(ec.TakeVictim(0), 2);
}

// Decayed use counts: an expert used often a little while ago outlives one used once just now
// (LRU would keep the latter), and an expert read again keeps the uses it had before its eviction.
TEST(ExpertCache, DecayedCountsKeepFrequentExpertsAndRememberEvictedOnes) {
  MemoryLedger ledger;
  {
    auto c = ExpertCache::Create(2, 4096, 10, &ledger, ExpertCache::Policy::kDecayed,
                                 /*half_life=*/4);
    ASSERT_TRUE(c.ok());
    ExpertCache& ec = **c;
    ec.Assign(ec.TakeVictim(0), 0, 0);
    for (int i = 0; i < 3; ++i) ec.Touch(ec.Find(0));  // uses at 1, 2, 3
    ec.Assign(ec.TakeVictim(0), 1, 0);
    ec.Touch(ec.Find(1));  // one use at 4: 1 against 2^-3/4 + 2^-2/4 + 2^-1/4 = 2.14
    const int s1 = ec.Find(1);
    EXPECT_EQ(ec.TakeVictim(0), s1);
    EXPECT_GE(ec.Find(0), 0);
  }
  // Half-life far away: about plain counts. Three slots; op 0 (6 uses, the earliest) is evicted,
  // a fresh op 3 used once comes and goes, op 0 is read back and used once: 7 uses, more than
  // op 1's 6, so op 1 goes. Without its history op 0 would count 1 and go itself.
  auto c = ExpertCache::Create(3, 4096, 10, &ledger, ExpertCache::Policy::kDecayed, 1e9);
  ASSERT_TRUE(c.ok());
  ExpertCache& ec = **c;
  const int uses[3] = {6, 6, 7};
  for (int op = 0; op < 3; ++op) {
    ec.Assign(ec.TakeVictim(0), op, 0);
    for (int i = 0; i < uses[op]; ++i) ec.Touch(ec.Find(op));
  }
  const int s0 = ec.Find(0), s1 = ec.Find(1);
  EXPECT_EQ(ec.TakeVictim(0), s0);
  ec.Assign(s0, 3, 0);
  ec.Touch(s0);
  EXPECT_EQ(ec.TakeVictim(0), s0);  // op 3: one use
  ec.Assign(s0, 0, 0);
  ec.Touch(s0);
  EXPECT_EQ(ec.TakeVictim(0), s1);
}

// A read hinted and not yet begun is not a victim while anything else can go: under decayed
// counts an expert never used before would otherwise be the first to leave, before its use.
TEST(ExpertCache, HintedReadsAwaitingTheirUseAreTakenLast) {
  MemoryLedger ledger;
  for (auto policy : {ExpertCache::Policy::kLru, ExpertCache::Policy::kDecayed}) {
    auto c = ExpertCache::Create(2, 4096, 10, &ledger, policy, 4);
    ASSERT_TRUE(c.ok());
    ExpertCache& ec = **c;
    ec.Assign(ec.TakeVictim(0), 0, 0);
    ec.Touch(ec.Find(0));
    ec.Assign(ec.TakeVictim(0), 1, 0);  // a guess: read, not yet used
    ec.slot(ec.Find(1)).hint_unused = true;
    EXPECT_EQ(ec.TakeVictim(0), 0);  // op 0's slot, though op 1 is colder (never used)
    ec.Assign(0, 2, 0);
    ec.slot(0).hint_unused = true;
    EXPECT_GE(ec.TakeVictim(0), 0) << "with nothing else, an awaited read still goes";
  }
}

TEST(TraceReport, SummarizesAndRejectsMalformedLines) {
  const std::string bin = SUBSTRATE_BINARY;
  if (!fs::exists(bin)) GTEST_SKIP() << "no substrate binary";
  const std::string good = StoreTestPath("good.jsonl"), bad = StoreTestPath("bad.jsonl");
  {
    std::ofstream f(good);
    f << R"({"ev":"op","op":"block_0.attn","where":"stream","tier":0,"bytes":4096,"start_us":0,"end_us":10,"hit":false,"stall_us":7})"
      << "\n"
      << R"({"ev":"read","op":"block_0.attn","file":"block_0.attn.t0.bin","offset":0,"bytes":4096,"start_us":0,"end_us":4,"direct":true,"uring":false})"
      << "\n";
    std::ofstream b(bad);
    b << R"({"ev":"op","op":"output","where":"resident","tier":0,"bytes":1,"start_us":0,"end_us":1,"hit":true,"stall_us":0})"
      << "\n{\"ev\":\"op\",\n";
  }
  auto run = [&](const std::string& args) {
    const std::string out = StoreTestPath("report.txt");
    const int rc = std::system((bin + " trace-report " + args + " > " + out + " 2>&1").c_str());
    std::ifstream in(out);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    fs::remove(out);
    return std::make_pair(rc, text);
  };
  auto [rc, text] = run(good + " --json");
  ASSERT_EQ(rc, 0) << text;
  json j = json::parse(text);
  EXPECT_EQ(j["ops"]["attn"]["misses"], 1);
  EXPECT_EQ(j["ops"]["attn"]["stall_us"], 7);
  EXPECT_EQ(j["reads"]["bytes"], 4096);
  EXPECT_EQ(j["top_stalls"][0]["op"], "block_0.attn");
  auto [rc2, text2] = run(bad);
  EXPECT_NE(rc2, 0);
  EXPECT_NE(text2.find("line 2"), std::string::npos) << text2;
  fs::remove(good);
  fs::remove(bad);
}

}  // namespace
}  // namespace substrate
