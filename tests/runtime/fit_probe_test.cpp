// What `substrate fit` predicts from: the plan's reads split into streamed dense ops and routed
// expert misses (ResidencyManager::PredictReads, from a dry run), and ProbeOpReads reading a list
// of ops the way the prefetch worker does (every span of each op, in turn, cycling through the
// list past a warm-up that is not counted, until its byte and time minimums are passed or its
// maximum is reached).
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "format/model_file.h"
#include "model/op_id.h"
#include "runtime/read_probe.h"
#include "runtime/residency_manager.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;

const std::string kMoe = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/tiny-coder-moe-Q8_0.gguf";

class FitProbe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kMoe)) GTEST_SKIP() << "no fixture " << kMoe;
  }
  static std::unique_ptr<StoreIndex> Index() {
    StoreIndexOptions io;
    io.max_tier = 0;
    io.checksums = false;
    auto index = StoreIndex::OpenGguf(kMoe, io);
    EXPECT_TRUE(index.ok()) << index.status().ToString();
    return index.ok() ? std::move(*index) : nullptr;
  }
  // A dry-run plan of the file under `budget`, with a run's reserve for 256 positions.
  static std::unique_ptr<ResidencyManager> DryRun(uint64_t budget) {
    MemoryLedger ledger;
    ResidencyOptions ro;
    ro.budget_bytes = budget;
    auto file = ModelFile::Open(kMoe);
    EXPECT_TRUE(file.ok());
    if (!file.ok()) return nullptr;
    auto hp = ModelHParams::FromMetadata((*file)->metadata());
    EXPECT_TRUE(hp.ok());
    if (!hp.ok()) return nullptr;
    ro.reserve_bytes = EstimateRunReserve(*hp, 256, 256);  // as `fit -c 256` reserves
    ro.dry_run = true;
    ro.embedding_rows = false;  // held, so that budgets near the minimum stream dense ops
    auto m = ResidencyManager::OpenGguf(kMoe, &ledger, ro);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(*m) : nullptr;
  }
};

uint64_t SpanBytes(const StoreOp& op) {
  uint64_t n = 0;
  for (const StoreOp::Span& s : op.spans[0]) n += s.bytes;
  return n;
}

TEST_F(FitProbe, PredictReadsSplitsStreamedOpsAndExpertMisses) {
  auto m = DryRun(23ull << 20);  // just above the minimum: some dense ops stream
  ASSERT_TRUE(m);
  const ResidencyStats st = m->stats();
  ASSERT_GT(st.n_ops_streamed, 0);
  ASSERT_GT(st.n_ops_expert, st.expert_slots);  // some experts miss
  const auto r = m->PredictReads();
  EXPECT_EQ(r.bytes_per_token, r.dense_bytes_per_token + r.expert_bytes_per_token);
  EXPECT_GT(r.expert_bytes_per_token, 0u);
  // The streamed ops are the plan's, each once, in forward order, and their bytes are the
  // dense part (one tier: a slab read is the op's spans).
  EXPECT_EQ(static_cast<int>(r.streamed_ops.size()), st.n_ops_streamed);
  uint64_t dense = 0;
  std::set<int> seen;
  for (int o : r.streamed_ops) {
    dense += m->index().ops()[o].SlabBytes(0);
    EXPECT_TRUE(seen.insert(o).second) << m->index().ops()[o].id;
  }
  EXPECT_EQ(dense, r.dense_bytes_per_token);
  auto hp = ModelHParams::FromMetadata(m->metadata());
  ASSERT_TRUE(hp.ok());
  std::vector<std::string> forward;
  auto has = [&](const std::string& n) { return m->index().Resolve(n) != kNoTensor; };
  for (const OpSpec& spec : ListOps(*hp, has)) forward.push_back(spec.id);
  size_t at = 0;
  for (int o : r.streamed_ops) {
    const std::string& id = m->index().ops()[o].id;
    while (at < forward.size() && forward[at] != id) ++at;
    EXPECT_LT(at, forward.size()) << id << " out of forward order";
  }
  EXPECT_EQ(static_cast<int>(r.expert_ops.size()), st.n_ops_expert);
  for (int o : r.expert_ops)
    EXPECT_NE(m->index().ops()[o].id.find(".moe.expert_"), std::string::npos);
}

TEST_F(FitProbe, PredictReadsOfAResidentPlanReadNothingDense) {
  auto m = DryRun(1ull << 30);
  ASSERT_TRUE(m);
  const auto r = m->PredictReads();
  EXPECT_TRUE(r.streamed_ops.empty());
  EXPECT_EQ(r.dense_bytes_per_token, 0u);
  EXPECT_EQ(r.bytes_per_token, r.expert_bytes_per_token);
}

TEST_F(FitProbe, ReadsEachOpsSpansInTurnUntilItsMinimum) {
  auto index = Index();
  ASSERT_TRUE(index);
  std::vector<int> ops;
  uint64_t total = 0;
  for (int o = 0; o < static_cast<int>(index->ops().size()) && ops.size() < 3; ++o)
    if (SpanBytes(index->ops()[o]) > 0) {
      ops.push_back(o);
      total += SpanBytes(index->ops()[o]);
    }
  ASSERT_EQ(ops.size(), 3u);
  const uint64_t first = SpanBytes(index->ops()[ops[0]]);
  MemoryLedger ledger;
  // No minimum: one op.
  auto one = ProbeOpReads(*index, ops, 0, 0, 0, 1ull << 40, 1 << 20, IoMode::kAuto, &ledger);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->n_ops, 1);
  EXPECT_EQ(one->bytes, first);
  EXPECT_GT(one->seconds, 0);
  EXPECT_GE(one->seconds, one->check_seconds);
  // A minimum past the list: around it, and on to the first op again.
  auto wrap = ProbeOpReads(*index, ops, 0, total + 1, 0, 1ull << 40, 4096, IoMode::kAuto, &ledger);
  ASSERT_TRUE(wrap.ok()) << wrap.status().ToString();
  EXPECT_EQ(wrap->n_ops, 4);
  EXPECT_EQ(wrap->bytes, total + first);
  EXPECT_NEAR(wrap->bytes_per_s, wrap->bytes / wrap->seconds, 1e-6 * wrap->bytes_per_s);
  // The maximum stops it though the minimum is not reached.
  auto capped = ProbeOpReads(*index, ops, 0, 1ull << 40, 0, first, 1 << 20, IoMode::kAuto, &ledger);
  ASSERT_TRUE(capped.ok()) << capped.status().ToString();
  EXPECT_EQ(capped->n_ops, 1);
  // Its buffer was charged and given back.
  EXPECT_GT(ledger.peak(), 0u);
  EXPECT_EQ(ledger.current(), 0u);
}

TEST_F(FitProbe, TheWarmUpsReadsAreNotCounted) {
  auto index = Index();
  ASSERT_TRUE(index);
  std::vector<int> ops;
  for (int o = 0; o < static_cast<int>(index->ops().size()) && ops.size() < 3; ++o)
    if (SpanBytes(index->ops()[o]) > 0) ops.push_back(o);
  ASSERT_EQ(ops.size(), 3u);
  const uint64_t a = SpanBytes(index->ops()[ops[0]]), b = SpanBytes(index->ops()[ops[1]]),
                 c = SpanBytes(index->ops()[ops[2]]);
  // A warm-up over as soon as one op is read: that op is the warm-up, the next one counted.
  auto p = ProbeOpReads(*index, ops, 1e-9, 0, 0, 1ull << 40, 1 << 20, IoMode::kAuto, nullptr);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->n_ops, 2);
  EXPECT_EQ(p->warmup_bytes, a);
  EXPECT_EQ(p->bytes, b);
  // A warm-up the maximum cuts short: what was read is counted, there is nothing else.
  auto cut = ProbeOpReads(*index, ops, 1e6, 0, 0, a + b + c, 1 << 20, IoMode::kAuto, nullptr);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  EXPECT_EQ(cut->n_ops, 3);
  EXPECT_EQ(cut->warmup_bytes, 0u);
  EXPECT_EQ(cut->bytes, a + b + c);
  EXPECT_GT(cut->bytes_per_s, 0);
}

TEST_F(FitProbe, RefusesOpsNotInTheIndexAndAnEmptyList) {
  auto index = Index();
  ASSERT_TRUE(index);
  const int n = static_cast<int>(index->ops().size());
  EXPECT_EQ(ProbeOpReads(*index, {n}, 0, 0, 0, 1 << 20, 1 << 20, IoMode::kAuto, nullptr)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ProbeOpReads(*index, {}, 0, 0, 0, 1 << 20, 1 << 20, IoMode::kAuto, nullptr)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace substrate
