// A GGUF read in place as the out-of-core runtime's store (StoreIndex::OpenGguf): under a ledger
// cap below its weights, `Engine::Load(FILE.gguf, {max_ram})` streams the file's own bytes and
// gives the golden greedy continuation of tiny-coder and tiny-coder-moe (bf16 files) and the
// resident run's tokens (Q4_K_M), under the cap; the checksum record is taken once and reused;
// a file changed under a running session stops it with a clear error; a budget below the
// minimum names the minimum. A split GGUF (gguf-split's layout) is one model: resident and read
// in place from any part's name, one checksum record for all parts, a missing part or one of
// another split a clear error. A file system that refuses O_DIRECT is read buffered, with a
// warning, and its page cache dropped after each read.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/fault_env.h"
#include "format/gguf_reader.h"
#include "format/gguf_split.h"
#include "kernels/cpu_features.h"
#include "kernels/interleaved.h"
#include "runtime/engine.h"
#include "store/gguf_checksums.h"
#include "store/store_fixture.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::StoreTestPath;

std::string Gguf(const std::string& name) {
  return std::string(SUBSTRATE_SHARED_DIR) + "/gguf/" + name + ".gguf";
}

// Records of the read-only fixtures go to a temp cache folder, not the user's.
class GgufInPlace : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    static const std::string dir = StoreTestPath("gguf_cache");
    setenv("SUBSTRATE_CACHE_DIR", dir.c_str(), 1);
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(StoreTestPath("gguf_cache"), ec);
  }
};

uint64_t WeightBytes(const std::string& path) {
  auto f = ModelFile::Open(path);
  uint64_t n = 0;
  for (const TensorInfo& t : (*f)->tensors()) n += t.bytes;
  return n;
}

// What a run of 256 positions reserves beside the weights (Engine's reserve for n_ctx 256).
uint64_t Reserve(const std::string& path) {
  auto f = ModelFile::Open(path);
  auto hp = ModelHParams::FromMetadata((*f)->metadata());
  return EstimateRunReserve(*hp, 256, 256);
}

// A budget of `frac` of the weights beside the reserve.
uint64_t Cap(const std::string& path, double frac) {
  return static_cast<uint64_t>(WeightBytes(path) * frac) + Reserve(path);
}

struct GreedyRun {
  std::vector<int32_t> tokens;
  Status status;
  bool in_place = false;
  int streamed = 0;  // ops read while it runs: dense ops through slabs, experts, the embedding's rows
  int n_files = 0;      // the runtime's data files (a split GGUF's parts)
  bool direct = false;  // the runtime read with O_DIRECT
  uint64_t peak = 0;
};

// A run of 256 positions under max_ram (0: none), charged to `ledger`.
EngineOptions RunOptions(uint64_t max_ram, MemoryLedger* ledger) {
  EngineOptions o;
  o.ledger = ledger;
  o.max_ram = max_ram;
  o.n_ctx = 256;
  o.require_tokenizer = false;
  return o;
}

GreedyRun Greedy(const std::string& path, uint64_t max_ram, const std::vector<int32_t>& prompt, int n,
           const std::function<void()>& after_open = nullptr, Env* env = nullptr) {
  GreedyRun r;
  MemoryLedger ledger;
  EngineOptions o = RunOptions(max_ram, &ledger);
  o.residency.env = env;
  auto e = Engine::Load(path, o);
  if (!e.ok()) {
    r.status = e.status();
    return r;
  }
  if ((*e)->runtime()) {
    r.in_place = !(*e)->runtime()->index().gguf_path().empty();
    const ResidencyStats s = (*e)->runtime()->stats();
    r.streamed = s.n_ops_streamed + std::max(0, s.n_ops_expert - s.expert_slots) +
                 (s.rows_op_bytes > 0 ? 1 : 0);
    r.n_files = static_cast<int>((*e)->runtime()->index().n_files());
    r.direct = (*e)->runtime()->stats().direct;
  }
  if (after_open) after_open();
  auto s = (*e)->NewSession(256);
  if (!s.ok()) {
    r.status = s.status();
    return r;
  }
  GenerateOptions g;
  g.max_tokens = n;
  g.stop_at_eog = false;
  auto st = (*e)->Generate(**s, prompt, g, [&](int32_t tok, const std::string&) {
    if (tok >= 0) r.tokens.push_back(tok);
    return true;
  });
  if (!st.ok()) r.status = st.status();
  r.peak = ledger.peak();
  return r;
}

json Golden(const std::string& model) {
  std::ifstream in(std::string(SUBSTRATE_SHARED_DIR) + "/models/" + model + "/golden.json");
  return json::parse(in);
}

// Budget: the weights' fraction `frac`, plus the run's reserve (a few MiB for 256 positions).
void ExpectGoldenInPlace(const std::string& model, double frac) {
  const std::string path = Gguf(model + "-bf16");
  if (!fs::exists(path)) GTEST_SKIP() << "no fixture " << path;
  const json g = Golden(model);
  const auto prompt = g["greedy"]["prompt"].get<std::vector<int32_t>>();
  const auto want = g["greedy"]["continuation"].get<std::vector<int32_t>>();
  const uint64_t weights = WeightBytes(path);
  const uint64_t cap = Cap(path, frac);
  ASSERT_LT(cap, weights + Reserve(path));
  GreedyRun r = Greedy(path, cap, prompt, static_cast<int>(want.size()));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_TRUE(r.in_place) << "a budget below the weights must read the GGUF in place";
  EXPECT_GT(r.streamed, 0);
  EXPECT_EQ(r.tokens, want);
  EXPECT_LE(r.peak, cap);
}

TEST_F(GgufInPlace, TinyCoderGoldenUnderCap) { ExpectGoldenInPlace("tiny-coder", 0.75); }

TEST_F(GgufInPlace, TinyCoderMoeGoldenUnderCap) { ExpectGoldenInPlace("tiny-coder-moe", 0.4); }

// A quantized file: the tokens of the resident run of the same file.
TEST_F(GgufInPlace, QuantizedMatchesResident) {
  const std::string path = Gguf("tiny-coder-moe-Q4_K_M");
  if (!fs::exists(path)) GTEST_SKIP() << "no fixture " << path;
  const auto prompt = Golden("tiny-coder-moe")["greedy"]["prompt"].get<std::vector<int32_t>>();
  GreedyRun resident = Greedy(path, 0, prompt, 24);
  ASSERT_TRUE(resident.status.ok()) << resident.status.ToString();
  EXPECT_FALSE(resident.in_place);
  const uint64_t cap = Cap(path, 0.5);
  GreedyRun streamed = Greedy(path, cap, prompt, 24);
  ASSERT_TRUE(streamed.status.ok()) << streamed.status.ToString();
  EXPECT_TRUE(streamed.in_place);
  EXPECT_EQ(streamed.tokens, resident.tokens);
  EXPECT_LE(streamed.peak, cap);
}

// Experts read into the cache's slots run on the kernels resident experts get (rearranged once
// read, before their first product): the logits of every pass equal the resident run's, bit
// for bit, whichever reads were late.
TEST_F(GgufInPlace, StreamedExpertsComputeWhatResidentOnesCompute) {
  const std::string path = Gguf("tiny-coder-moe-Q8_0");
  if (!fs::exists(path)) GTEST_SKIP() << "no fixture " << path;
  const auto prompt = Golden("tiny-coder-moe")["greedy"]["prompt"].get<std::vector<int32_t>>();
  MemoryLedger resident_ledger, capped_ledger;
  const uint64_t cap = Cap(path, 0.5);
  auto resident = Engine::Load(path, RunOptions(0, &resident_ledger));
  auto capped = Engine::Load(path, RunOptions(cap, &capped_ledger));
  ASSERT_TRUE(resident.ok() && capped.ok());
  Engine& r = **resident;
  Engine& c = **capped;
  ASSERT_TRUE(c.runtime() != nullptr);
  ASSERT_EQ(r.runtime(), nullptr);
  auto sr = r.NewSession(256);
  auto sc = c.NewSession(256);
  ASSERT_TRUE(sr.ok() && sc.ok());
  ASSERT_TRUE(r.Prefill(**sr, prompt).ok());
  ASSERT_TRUE(c.Prefill(**sc, prompt).ok());
  ASSERT_EQ((*sc)->logits, (*sr)->logits) << "the prompt's pass";
  int32_t tok = 0;
  for (int t = 1; t <= 12; ++t) {
    tok = static_cast<int32_t>(std::max_element((*sr)->logits.begin(), (*sr)->logits.end()) -
                               (*sr)->logits.begin());
    ASSERT_TRUE(r.model().Forward(&tok, 1, (*sr)->cache, false, &(*sr)->logits).ok());
    ASSERT_TRUE(c.model().Forward(&tok, 1, (*sc)->cache, false, &(*sc)->logits).ok());
    ASSERT_EQ((*sc)->logits, (*sr)->logits) << "token " << t;
  }
  const ResidencyStats st = c.runtime()->stats();
  EXPECT_GT(st.expert_misses + st.expert_late + st.expert_hinted, 0u) << "experts were read";
  if (InterleavedKernelFor(WeightLayout::kQ8_0Interleaved, ActiveIsa())) {
    EXPECT_GT(st.expert_relayouts, 0u) << "expert reads rearranged into the decode layout";
  }
  EXPECT_LE(capped_ledger.peak(), cap);
}

// The record is written beside a writable file, reused while the file stays as it was, and
// taken again once it changed.
TEST_F(GgufInPlace, ChecksumRecordKeptAndRenewed) {
  const std::string src = Gguf("tiny-coder-Q4_0");
  if (!fs::exists(src)) GTEST_SKIP() << "no fixture " << src;
  const std::string path = StoreTestPath("record.gguf");
  fs::copy_file(src, path, fs::copy_options::overwrite_existing);
  const std::string record = path + ".crc32c.json";
  fs::remove(record);
  auto open = [&]() { return StoreIndex::OpenGguf(path); };
  auto a = open();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ((*a)->checksum_record(), record);
  ASSERT_TRUE(fs::exists(record));
  const auto written = fs::last_write_time(record);
  auto b = open();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(fs::last_write_time(record), written) << "a valid record is read, not rewritten";
  // Same size, other bytes in a weight: the file's key changed, so the record is taken again.
  const TensorInfo& t = (*a)->tensors()[(*a)->Resolve("blk.0.attn_q.weight")].info;
  {
    const int fd = ::open(path.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const char x = 0x5a;
    ASSERT_EQ(::pwrite(fd, &x, 1, static_cast<off_t>(t.parts[0].offset + 7)), 1);
    ::close(fd);
  }
  const uint32_t before = (*a)->tensors()[(*a)->Resolve("blk.0.attn_q.weight")].units[0].tier[0].crc;
  auto c = open();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NE((*c)->tensors()[(*c)->Resolve("blk.0.attn_q.weight")].units[0].tier[0].crc, before);
  fs::remove(path);
  fs::remove(record);
}

// A file rewritten under a running session: the next read of a changed range fails with an
// error naming the file and the tensor, instead of computing with mixed bytes.
TEST_F(GgufInPlace, FileChangedUnderSessionStopsIt) {
  const std::string src = Gguf("tiny-coder-moe-Q8_0");
  if (!fs::exists(src)) GTEST_SKIP() << "no fixture " << src;
  const std::string path = StoreTestPath("changed.gguf");
  fs::copy_file(src, path, fs::copy_options::overwrite_existing);
  const auto prompt = Golden("tiny-coder-moe")["greedy"]["prompt"].get<std::vector<int32_t>>();
  auto f = ModelFile::Open(path);
  ASSERT_TRUE(f.ok());
  // Every expert of layer 0 gets one byte flipped: whichever the router picks is read after it.
  std::vector<std::pair<uint64_t, uint64_t>> slices;
  for (const TensorInfo& t : (*f)->tensors())
    if (t.name == "blk.0.ffn_gate_exps.weight")
      for (uint64_t s = 0; s < t.outer(); ++s)
        slices.emplace_back(t.parts[0].offset + s * t.slice_bytes() + 100, 0);
  ASSERT_FALSE(slices.empty());
  GreedyRun r = Greedy(path, Cap(path, 0.4), prompt, 8, [&] {
    const int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    for (const auto& [off, unused] : slices) {
      unsigned char x = 0;
      ASSERT_EQ(::pread(fd, &x, 1, static_cast<off_t>(off)), 1);
      x ^= 0xff;
      ASSERT_EQ(::pwrite(fd, &x, 1, static_cast<off_t>(off)), 1);
    }
    ::close(fd);
  });
  EXPECT_TRUE(r.in_place);
  EXPECT_EQ(r.status.code(), StatusCode::kCorruption) << r.status.ToString();
  EXPECT_NE(r.status.message().find("ffn_gate_exps"), std::string::npos) << r.status.ToString();
  EXPECT_NE(r.status.message().find("changed"), std::string::npos) << r.status.ToString();
  fs::remove(path);
  fs::remove(path + ".crc32c.json");
}

TEST_F(GgufInPlace, BudgetBelowMinimumNamesIt) {
  const std::string path = Gguf("tiny-coder-moe-Q4_K_M");
  if (!fs::exists(path)) GTEST_SKIP() << "no fixture " << path;
  MemoryLedger ledger;
  EngineOptions o;
  o.ledger = &ledger;
  o.max_ram = 3ull << 20;
  o.n_ctx = 256;
  auto e = Engine::Load(path, o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kOutOfMemory) << e.status().ToString();
  EXPECT_NE(e.status().message().find("minimum of"), std::string::npos) << e.status().ToString();
}

TEST_F(GgufInPlace, TruncatedFileIsAClearError) {
  const std::string src = Gguf("tiny-coder-Q4_0");
  if (!fs::exists(src)) GTEST_SKIP() << "no fixture " << src;
  const std::string path = StoreTestPath("truncated.gguf");
  fs::copy_file(src, path, fs::copy_options::overwrite_existing);
  fs::resize_file(path, fs::file_size(path) - 5000);
  auto ix = StoreIndex::OpenGguf(path);
  ASSERT_FALSE(ix.ok());
  EXPECT_NE(ix.status().ToString().find("truncated"), std::string::npos) << ix.status().ToString();
  fs::remove(path);
}

// --- Split GGUFs -------------------------------------------------------------------------------

// `src` written as a split GGUF of three parts (by tensor count) in the temp folder.
std::vector<std::string> SplitInThree(const std::string& src, const std::string& name) {
  auto f = ModelFile::Open(src);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return {};
  GgufSplitOptions o;
  o.max_tensors = static_cast<int>(((*f)->tensors().size() + 2) / 3);
  auto parts = WriteGgufSplit(**f, StoreTestPath(name), o);
  EXPECT_TRUE(parts.ok()) << parts.status().ToString();
  return parts.ok() ? *parts : std::vector<std::string>{};
}

void RemoveSplit(const std::vector<std::string>& parts) {
  std::error_code ec;
  for (const std::string& p : parts) fs::remove(p, ec);
  if (!parts.empty()) fs::remove(parts[0] + ".crc32c.json", ec);
}

// Resident (opened by its first part's name) and streamed under a cap below its weights (opened
// by its last part's name, reading all three): the golden continuation.
void ExpectSplitGolden(const std::string& model, double frac) {
  const std::string src = Gguf(model + "-bf16");
  if (!fs::exists(src)) GTEST_SKIP() << "no fixture " << src;
  const std::vector<std::string> parts = SplitInThree(src, model + "_split");
  ASSERT_EQ(parts.size(), 3u);
  const json g = Golden(model);
  const auto prompt = g["greedy"]["prompt"].get<std::vector<int32_t>>();
  const auto want = g["greedy"]["continuation"].get<std::vector<int32_t>>();
  const int n = static_cast<int>(want.size());

  GreedyRun resident = Greedy(parts[0], 0, prompt, n);
  ASSERT_TRUE(resident.status.ok()) << resident.status.ToString();
  EXPECT_FALSE(resident.in_place);
  EXPECT_EQ(resident.tokens, want);

  const uint64_t cap = Cap(src, frac);
  ASSERT_LT(cap, WeightBytes(src) + Reserve(src));
  GreedyRun streamed = Greedy(parts[2], cap, prompt, n);
  ASSERT_TRUE(streamed.status.ok()) << streamed.status.ToString();
  EXPECT_TRUE(streamed.in_place);
  EXPECT_EQ(streamed.n_files, 3);
  EXPECT_GT(streamed.streamed, 0);
  EXPECT_EQ(streamed.tokens, want);
  EXPECT_LE(streamed.peak, cap);
  EXPECT_TRUE(fs::exists(parts[0] + ".crc32c.json")) << "one record, beside the first part";
  RemoveSplit(parts);
}

class GgufSplit : public GgufInPlace {};

TEST_F(GgufSplit, TinyCoderGoldenResidentAndStreamed) { ExpectSplitGolden("tiny-coder", 0.75); }

TEST_F(GgufSplit, TinyCoderMoeGoldenResidentAndStreamed) {
  ExpectSplitGolden("tiny-coder-moe", 0.4);
}

// The parts are laid out as llama.cpp's gguf-split writes them: the model's metadata in the
// first only, split.no / split.count (u16) and split.tensors.count (i32) in every one.
TEST_F(GgufSplit, PartsFollowGgufSplitLayout) {
  const std::string src = Gguf("tiny-coder-Q4_0");
  if (!fs::exists(src)) GTEST_SKIP() << "no fixture " << src;
  const std::vector<std::string> parts = SplitInThree(src, "layout");
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_NE(parts[1].find("-00002-of-00003.gguf"), std::string::npos) << parts[1];
  size_t tensors = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    std::ifstream in(parts[i], std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Metadata md;
    std::vector<TensorInfo> ts;
    ASSERT_TRUE(ParseGgufHeader(bytes, &md, &ts).ok()) << parts[i];
    tensors += ts.size();
    ASSERT_NE(md.Find(kGgufSplitNo), nullptr);
    EXPECT_EQ(md.Find(kGgufSplitNo)->type, GgufType::kUint16);
    EXPECT_EQ(md.Find(kGgufSplitCount)->type, GgufType::kUint16);
    EXPECT_EQ(md.Find(kGgufSplitTensorsCount)->type, GgufType::kInt32);
    EXPECT_EQ(md.GetInt(kGgufSplitNo, -1), static_cast<int64_t>(i));
    EXPECT_EQ(md.GetInt(kGgufSplitCount, -1), 3);
    EXPECT_EQ(md.Has("general.architecture"), i == 0);
  }
  auto merged = ModelFile::Open(parts[1]);
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  EXPECT_EQ((*merged)->path(), parts[0]);
  EXPECT_EQ((*merged)->tensors().size(), tensors);
  EXPECT_FALSE((*merged)->metadata().Has(kGgufSplitCount)) << "one model, not a split";
  RemoveSplit(parts);
}

TEST_F(GgufSplit, MissingPartNamesIt) {
  const std::string src = Gguf("tiny-coder-Q4_0");
  if (!fs::exists(src)) GTEST_SKIP() << "no fixture " << src;
  const std::vector<std::string> parts = SplitInThree(src, "missing");
  ASSERT_EQ(parts.size(), 3u);
  fs::remove(parts[1]);
  for (const std::string& given : {parts[0], parts[2]}) {
    MemoryLedger ledger;
    EngineOptions o;
    o.ledger = &ledger;
    auto e = Engine::Load(given, o);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), StatusCode::kNotFound) << e.status().ToString();
    EXPECT_NE(e.status().message().find(parts[1]), std::string::npos) << e.status().ToString();
    EXPECT_NE(e.status().message().find("missing"), std::string::npos) << e.status().ToString();
  }
  RemoveSplit(parts);
}

// A part of another model's split put in place of one of this split's: refused, naming it.
TEST_F(GgufSplit, PartOfAnotherSplitFails) {
  const std::string a = Gguf("tiny-coder-Q4_0"), b = Gguf("tiny-coder-moe-Q8_0");
  if (!fs::exists(a) || !fs::exists(b)) GTEST_SKIP() << "no fixtures " << a << ", " << b;
  const std::vector<std::string> mine = SplitInThree(a, "mine"), other = SplitInThree(b, "other");
  ASSERT_EQ(mine.size(), 3u);
  ASSERT_EQ(other.size(), 3u);
  fs::copy_file(other[1], mine[1], fs::copy_options::overwrite_existing);
  auto f = ModelFile::Open(mine[0]);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kCorruption) << f.status().ToString();
  EXPECT_NE(f.status().message().find(mine[1]), std::string::npos) << f.status().ToString();
  EXPECT_NE(f.status().message().find("another split"), std::string::npos) << f.status().ToString();
  // The same model split otherwise (another part holds other tensors): refused too.
  const std::vector<std::string> two = [&] {
    auto m = ModelFile::Open(a);
    GgufSplitOptions o;
    o.max_tensors = static_cast<int>((*m)->tensors().size() / 3 + 5);
    return *WriteGgufSplit(**m, StoreTestPath("mine_otherwise"), o);
  }();
  ASSERT_EQ(two.size(), 3u);
  fs::copy_file(two[1], mine[1], fs::copy_options::overwrite_existing);
  auto g = ModelFile::Open(mine[0]);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kCorruption) << g.status().ToString();
  EXPECT_NE(g.status().message().find("another split"), std::string::npos) << g.status().ToString();
  RemoveSplit(mine);
  RemoveSplit(other);
  RemoveSplit(two);
}

// The checksum record covers every part: a part changed since is noticed at open.
TEST_F(GgufSplit, ChecksumRecordCoversEveryPart) {
  const std::string src = Gguf("tiny-coder-Q4_0");
  if (!fs::exists(src)) GTEST_SKIP() << "no fixture " << src;
  const std::vector<std::string> parts = SplitInThree(src, "record");
  ASSERT_EQ(parts.size(), 3u);
  auto a = StoreIndex::OpenGguf(parts[0]);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ((*a)->checksum_record(), parts[0] + ".crc32c.json");
  // A tensor of the last part: one byte of it changed, the record is taken again.
  const StoreTensor* last = nullptr;
  for (const StoreTensor& t : (*a)->tensors())
    if (t.info.parts[0].file == 2 && !t.sliced && t.info.bytes > 64) last = &t;
  ASSERT_NE(last, nullptr);
  const uint32_t before = last->units[0].tier[0].crc;
  {
    const int fd = ::open(parts[2].c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    unsigned char x = 0;
    const off_t at = static_cast<off_t>(last->info.parts[0].offset + 9);
    ASSERT_EQ(::pread(fd, &x, 1, at), 1);
    x ^= 0xff;
    ASSERT_EQ(::pwrite(fd, &x, 1, at), 1);
    ::close(fd);
  }
  auto b = StoreIndex::OpenGguf(parts[2]);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const TensorId id = (*b)->Resolve(last->info.name);
  EXPECT_NE((*b)->tensors()[id].units[0].tier[0].crc, before);
  RemoveSplit(parts);
}

// --- A file system that refuses O_DIRECT ----------------------------------------------------------

// Bytes of `path` in the page cache.
uint64_t CachedBytes(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return 0;
  const size_t size = fs::file_size(path);
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return 0;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((size + page - 1) / page);
  uint64_t n = 0;
  if (::mincore(m, size, v.data()) == 0)
    for (unsigned char c : v) n += (c & 1) ? page : 0;
  ::munmap(m, size);
  return n;
}

// A file system without O_DIRECT, as the runtime sees one: every file opens buffered.
class NoDirectEnv : public FaultEnv {
 public:
  Expected<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path,
                                                                  bool direct_io) override {
    return FaultEnv::NewRandomAccessFile(path, false);
  }
};

// tmpfs refused O_DIRECT before Linux 6.6: such a copy runs buffered, with the warning. Where
// /dev/shm takes O_DIRECT there is nothing to fall back from (the next test covers the path).
TEST_F(GgufInPlace, TmpfsWithoutODirectFallsBack) {
  const std::string src = Gguf("tiny-coder-bf16");
  if (!fs::exists(src)) GTEST_SKIP() << "no fixture " << src;
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  const std::string path = "/dev/shm/substrate_test_" + std::to_string(getpid()) + "_tmpfs.gguf";
  std::error_code ec;
  if (!fs::copy_file(src, path, fs::copy_options::overwrite_existing, ec))
    GTEST_SKIP() << "cannot write to /dev/shm: " << ec.message();
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd >= 0) {
    ::close(fd);
    fs::remove(path);
    GTEST_SKIP() << "/dev/shm accepts O_DIRECT on this kernel";
  }
  const json g = Golden("tiny-coder");
  const auto want = g["greedy"]["continuation"].get<std::vector<int32_t>>();
  ::testing::internal::CaptureStderr();
  GreedyRun r = Greedy(path, Cap(path, 0.75), g["greedy"]["prompt"].get<std::vector<int32_t>>(),
                       static_cast<int>(want.size()));
  const std::string err = ::testing::internal::GetCapturedStderr();
  fs::remove(path);
  fs::remove(path + ".crc32c.json", ec);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_TRUE(r.in_place);
  EXPECT_FALSE(r.direct);
  EXPECT_EQ(r.tokens, want);
  EXPECT_NE(err.find("refuses O_DIRECT"), std::string::npos) << err;
}

// The same fallback on any file system: buffered reads, the warning, the golden continuation,
// and (where the page cache can drop a file's pages: not tmpfs) no more of the file cached
// afterwards than its header, so the cache does not grow with what is streamed.
TEST_F(GgufInPlace, ODirectRefusedReadsBufferedAndDropsTheCache) {
  const std::string src = Gguf("tiny-coder-bf16");
  if (!fs::exists(src)) GTEST_SKIP() << "no fixture " << src;
  const std::string path = StoreTestPath("no_direct.gguf");
  fs::copy_file(src, path, fs::copy_options::overwrite_existing);
  {
    // The copy leaves the file in the page cache: written out and dropped first.
    const int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  const json g = Golden("tiny-coder");
  const auto want = g["greedy"]["continuation"].get<std::vector<int32_t>>();
  NoDirectEnv env;
  ::testing::internal::CaptureStderr();
  GreedyRun r = Greedy(path, Cap(path, 0.75), g["greedy"]["prompt"].get<std::vector<int32_t>>(),
                       static_cast<int>(want.size()), nullptr, &env);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_TRUE(r.in_place);
  EXPECT_FALSE(r.direct);
  EXPECT_GT(r.streamed, 0);
  EXPECT_EQ(r.tokens, want);
  EXPECT_NE(err.find("refuses O_DIRECT"), std::string::npos) << err;
  struct statfs sf {};
  constexpr long kTmpfsMagic = 0x01021994;
  if (::statfs(path.c_str(), &sf) == 0 && sf.f_type != kTmpfsMagic) {
    const uint64_t weights = WeightBytes(path), cached = CachedBytes(path);
    EXPECT_LT(cached, weights / 4) << cached << " of the file's bytes stayed in the page cache";
  }
  fs::remove(path);
  fs::remove(path + ".crc32c.json");
}

}  // namespace
}  // namespace substrate
