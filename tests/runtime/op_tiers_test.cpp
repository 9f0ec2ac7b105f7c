// Per-op tiers: every op of the forward pass runs at its own tier of the store's ladder (the
// model's flat per-op table), honoured by the resident store source and by the out-of-core
// runtime, which reads residuals only for the ops that run above tier 0. A model over a mixed
// tier vector computes what a model over weights dequantized at those tiers computes; a change
// of the table between two tokens takes effect on the next token and allocates nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <unordered_map>
#include <nlohmann/json.hpp>

#include "kernels/matmul.h"
#include "model/model.h"
#include "model/resident_weight_source.h"
#include "runtime/alloc_counter.h"
#include "runtime/residency_manager.h"
#include "runtime/plan_fixture.h"
#include "store/store_fixture.h"
#include "store/store_weight_source.h"

namespace substrate {
namespace {

using namespace substrate::testing;

// Every tensor as F32, dequantized from `src` at the tier of the op that acquires it (each
// expert slice at its expert op's tier): what a forward pass at those tiers should compute.
class DequantizedSource : public WeightSource {
 public:
  static std::unique_ptr<DequantizedSource> Make(WeightSource& src, const std::vector<OpSpec>& ops,
                                                 const std::vector<uint8_t>& tiers) {
    auto d = std::make_unique<DequantizedSource>();
    for (size_t i = 0; i < ops.size(); ++i) {
      for (const OpTensorRef& ref : ops[i].tensors) {
        const TensorId id = src.Resolve(ref.name);
        if (id == kNoTensor) continue;
        auto [it, fresh] = d->ids_.try_emplace(ref.name, static_cast<TensorId>(d->infos_.size()));
        if (fresh) {
          TensorInfo info = src.Info(id);
          info.type = DType::kF32;
          info.bytes = info.n_elements() * 4;
          d->infos_.push_back(info);
          d->data_.emplace_back(info.n_elements());
        }
        auto h = src.Acquire(id, ref.slice, tiers[i]);
        EXPECT_TRUE(h.ok()) << h.status().ToString();
        if (!h.ok()) return nullptr;
        const WeightView& v = h->view();
        float* dst = d->data_[it->second].data() + (ref.slice >= 0 ? ref.slice * v.rows * v.cols : 0);
        for (int64_t r = 0; r < v.rows; ++r) DequantizeWeightRow(v, r, dst + r * v.cols);
      }
    }
    return d;
  }

  TensorId Resolve(const std::string& name) const override {
    auto it = ids_.find(name);
    return it == ids_.end() ? kNoTensor : it->second;
  }
  const TensorInfo& Info(TensorId id) const override { return infos_[id]; }
  Expected<WeightHandle> Acquire(TensorId id, int slice, int tier) override {
    ASSIGN_OR_RETURN(WeightView v, MakeWeightView(infos_[id],
                                                  reinterpret_cast<const uint8_t*>(data_[id].data()),
                                                  slice));
    return WeightHandle(this, v, 0);
  }

 private:
  std::unordered_map<std::string, TensorId> ids_;
  std::vector<TensorInfo> infos_;
  std::vector<std::vector<float>> data_;
};

std::vector<int32_t> Prompt() {
  std::ifstream in(std::string(SUBSTRATE_SHARED_DIR) + "/models/tiny-coder-moe/golden.json");
  return nlohmann::json::parse(in)["greedy"]["prompt"].get<std::vector<int32_t>>();
}

double Rms(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += double(a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(sum / static_cast<double>(a.size()));
}

std::vector<uint8_t> Pattern(size_t n, int shift) {
  std::vector<uint8_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint8_t>((i + shift) % 3);
  return t;
}

// Logits after `tokens` (continuing `cache`).
std::vector<float> Eval(Model& m, KvCache& cache, const std::vector<int32_t>& tokens) {
  std::vector<float> logits;
  Status st = m.Forward(tokens.data(), static_cast<int64_t>(tokens.size()), cache, false, &logits);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return logits;
}

struct Fixture {
  MemoryLedger ledger;
  std::unique_ptr<StoreWeightSource> src;
  std::unique_ptr<Model> model;
  bool Open() {
    if (PackedTinyMoeStore().empty()) return false;
    auto s = StoreWeightSource::Open(PackedTinyMoeStore(), &ledger);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return false;
    src = std::move(s).value();
    auto m = Model::Create(src->metadata(), src.get(), &StoreTestPool(), &ledger);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return false;
    model = std::move(m).value();
    return true;
  }
  std::unique_ptr<Model> Reference(WeightSource* s) {
    auto m = Model::Create(src->metadata(), s, &StoreTestPool(), &ledger);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(m).value() : nullptr;
  }
};

TEST(OpTiers, MixedTierVectorComputesTheWeightsDequantizedAtThoseTiers) {
  Fixture f;
  if (!f.Open()) GTEST_SKIP() << "no fixture tiny-coder-moe-bf16.gguf";
  const size_t n_ops = f.model->ops().size();
  EXPECT_EQ(f.model->op_tiers(), std::vector<uint8_t>(n_ops, 2));  // the store's default: top
  const std::vector<uint8_t> tiers = Pattern(n_ops, 0), other = Pattern(n_ops, 1);
  f.model->op_tiers() = tiers;
  auto ref_src = DequantizedSource::Make(*f.src, f.model->ops(), tiers);
  auto other_src = DequantizedSource::Make(*f.src, f.model->ops(), other);
  ASSERT_TRUE(ref_src && other_src);
  auto ref = f.Reference(ref_src.get()), wrong = f.Reference(other_src.get());
  ASSERT_TRUE(ref && wrong);
  const std::vector<int32_t> prompt = Prompt();
  auto logits_of = [&](Model& m) {
    auto cache = KvCache::Create(m.hparams(), 64, m.backend());
    EXPECT_TRUE(cache.ok());
    return Eval(m, *cache, prompt);
  };
  const std::vector<float> got = logits_of(*f.model), want = logits_of(*ref),
                           off = logits_of(*wrong);
  // The kernels round activations (8-bit for the quantized products), so even the top tier
  // differs from its dequantized weights by a little: that is the floor.
  const std::vector<uint8_t> top(n_ops, 2);
  f.model->op_tiers() = top;
  auto top_src = DequantizedSource::Make(*f.src, f.model->ops(), top);
  auto top_ref = f.Reference(top_src.get());
  ASSERT_TRUE(top_ref);
  const double floor = Rms(logits_of(*f.model), logits_of(*top_ref));
  const double d_want = Rms(got, want), d_off = Rms(got, off);
  EXPECT_LT(d_want, 1.5 * floor) << "floor " << floor << ", the wrong tiers " << d_off;
  EXPECT_GT(d_off, 3 * d_want);
}

TEST(OpTiers, ChangeBetweenTokensTakesEffectOnTheNextTokenWithoutAllocating) {
  Fixture f;
  if (!f.Open()) GTEST_SKIP() << "no fixture tiny-coder-moe-bf16.gguf";
  const size_t n_ops = f.model->ops().size();
  const std::vector<uint8_t> low(n_ops, 0), high(n_ops, 2);
  const std::vector<int32_t> prompt = Prompt();
  auto cache = KvCache::Create(f.model->hparams(), 64, f.model->backend());
  ASSERT_TRUE(cache.ok());
  // Warm up: both tier vectors once, so every buffer has grown.
  f.model->op_tiers() = low;
  Eval(*f.model, *cache, prompt);
  const int32_t t1 = 42, t2 = 1234;
  Eval(*f.model, *cache, {t1});
  f.model->op_tiers() = high;
  Eval(*f.model, *cache, {t2});
  cache->Truncate(static_cast<int64_t>(prompt.size()));

  f.model->op_tiers() = low;
  Eval(*f.model, *cache, {t1});
  std::vector<float> got(static_cast<size_t>(f.model->hparams().n_vocab));
  const uint64_t allocs = AllocationCount(), charged = f.ledger.current();
  std::copy(high.begin(), high.end(), f.model->op_tiers().begin());  // between tokens
  ASSERT_TRUE(f.model->Forward(&t2, 1, *cache, false, &got).ok());
  EXPECT_EQ(AllocationCount(), allocs) << "the decode step after a tier change allocated";
  EXPECT_EQ(f.ledger.current(), charged);

  // Reference: the prompt and t1 through weights at `low`, t2 through weights at `high`.
  auto low_src = DequantizedSource::Make(*f.src, f.model->ops(), low);
  auto high_src = DequantizedSource::Make(*f.src, f.model->ops(), high);
  auto ref_low = f.Reference(low_src.get()), ref_high = f.Reference(high_src.get());
  ASSERT_TRUE(ref_low && ref_high);
  auto ref_cache = KvCache::Create(ref_low->hparams(), 64, ref_low->backend());
  ASSERT_TRUE(ref_cache.ok());
  Eval(*ref_low, *ref_cache, prompt);
  Eval(*ref_low, *ref_cache, {t1});
  auto stay_cache = KvCache::Create(ref_low->hparams(), 64, ref_low->backend());
  ASSERT_TRUE(stay_cache.ok());
  Eval(*ref_low, *stay_cache, prompt);
  Eval(*ref_low, *stay_cache, {t1});
  const std::vector<float> want = Eval(*ref_high, *ref_cache, {t2});
  const std::vector<float> stayed = Eval(*ref_low, *stay_cache, {t2});
  // As above: within the kernels' rounding of the reference, far from the unchanged tiers.
  const double d_want = Rms(got, want), d_stay = Rms(got, stayed);
  EXPECT_LT(d_want, 0.06) << "vs no change: " << d_stay;
  EXPECT_GT(d_stay, 3 * d_want);
}

// The out-of-core runtime serves each op at its tier, streaming residuals only for ops above
// tier 0: the same logits, bit for bit, as the resident store source with the same tier vector,
// and fewer bytes read per token at lower tiers.
TEST(OpTiers, StreamedRuntimeServesEachOpAtItsTier) {
  Fixture f;
  if (!f.Open()) GTEST_SKIP() << "no fixture tiny-coder-moe-bf16.gguf";
  const size_t n_ops = f.model->ops().size();
  const std::vector<int32_t> prompt = Prompt();
  ResidencyOptions o;
  o.reserve_bytes = 4ull << 20;
  o.embedding_rows = false;  // dense ops through slabs, not the embedding read by rows
  uint64_t dense = 0;  // what a generous budget keeps: every dense op resident
  {
    MemoryLedger roomy(StoreDataBytes(PackedTinyMoeStore()) * 2);
    auto m = ResidencyManager::Open(PackedTinyMoeStore(), &roomy, o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    dense = (*m)->stats().resident_bytes;
  }
  // 2 MiB short of that: some dense ops stream through slabs.
  const uint64_t cap = dense + o.reserve_bytes - (2ull << 20);
  auto streamed = [&](const std::vector<uint8_t>& tiers, std::vector<float>* logits) {
    MemoryLedger ledger(cap);
    auto m = ResidencyManager::Open(PackedTinyMoeStore(), &ledger, o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return uint64_t{0};
    auto model = Model::Create((*m)->metadata(), m->get(), &StoreTestPool(), &ledger);
    EXPECT_TRUE(model.ok());
    (*model)->op_tiers() = tiers;
    auto cache = KvCache::Create((*model)->hparams(), 64, (*model)->backend());
    *logits = Eval(**model, *cache, prompt);
    for (int32_t t : {7, 300, 4000}) *logits = Eval(**model, *cache, {t});
    EXPECT_GT((*m)->stats().n_ops_streamed, 0);
    EXPECT_LE(ledger.peak(), cap);
    return (*m)->stats().stream_bytes_read;
  };
  auto resident = [&](const std::vector<uint8_t>& tiers) {
    f.model->op_tiers() = tiers;
    auto cache = KvCache::Create(f.model->hparams(), 64, f.model->backend());
    std::vector<float> logits = Eval(*f.model, *cache, prompt);
    for (int32_t t : {7, 300, 4000}) logits = Eval(*f.model, *cache, {t});
    return logits;
  };
  const std::vector<uint8_t> mixed = Pattern(n_ops, 1), low(n_ops, 0), top(n_ops, 2);
  std::vector<float> got;
  streamed(mixed, &got);
  EXPECT_EQ(got, resident(mixed));
  std::vector<float> low_logits, top_logits;
  const uint64_t low_bytes = streamed(low, &low_logits), top_bytes = streamed(top, &top_logits);
  EXPECT_EQ(low_logits, resident(low));
  EXPECT_EQ(top_logits, resident(top));
  // The Q4_K skeleton alone against skeleton + Q8_0 + F16 residuals (6x the bytes per op; the
  // misses differ with the routing).
  EXPECT_LT(low_bytes * 2, top_bytes) << low_bytes << " vs " << top_bytes;
}

// Skeletons resident, residuals streamed (ResidencyOptions::resident_max_tier = 0): what deferred
// verification and escalations run on. The top tier reads only the residuals of resident ops,
// and computes what the resident store computes, bit for bit; tier 0 reads no dense op at all.
TEST(OpTiers, ResidentSkeletonsStreamOnlyTheirResiduals) {
  Fixture f;
  if (!f.Open()) GTEST_SKIP() << "no fixture tiny-coder-moe-bf16.gguf";
  const size_t n_ops = f.model->ops().size();
  const std::vector<int32_t> prompt = Prompt();
  auto run = [&](const std::vector<uint8_t>& tiers, int keep, ResidencyStats* stats) {
    ResidencyOptions o;
    o.reserve_bytes = 4ull << 20;
    o.resident_max_tier = keep;
    MemoryLedger ledger(StoreDataBytes(PackedTinyMoeStore()) * 2);
    auto m = ResidencyManager::Open(PackedTinyMoeStore(), &ledger, o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return std::vector<float>();
    auto model = Model::Create((*m)->metadata(), m->get(), &StoreTestPool(), &ledger);
    EXPECT_TRUE(model.ok());
    (*model)->op_tiers() = tiers;
    auto cache = KvCache::Create((*model)->hparams(), 64, (*model)->backend());
    std::vector<float> logits = Eval(**model, *cache, prompt);
    for (int32_t t : {7, 300, 4000}) logits = Eval(**model, *cache, {t});
    *stats = (*m)->stats();
    return logits;
  };
  auto resident = [&](const std::vector<uint8_t>& tiers) {
    f.model->op_tiers() = tiers;
    auto cache = KvCache::Create(f.model->hparams(), 64, f.model->backend());
    std::vector<float> logits = Eval(*f.model, *cache, prompt);
    for (int32_t t : {7, 300, 4000}) logits = Eval(*f.model, *cache, {t});
    return logits;
  };
  const std::vector<uint8_t> top(n_ops, 2), low(n_ops, 0);
  ResidencyStats full, skel_top, skel_low;
  run(top, -1, &full);
  EXPECT_EQ(run(top, 0, &skel_top), resident(top));
  EXPECT_EQ(run(low, 0, &skel_low), resident(low));
  EXPECT_EQ(full.n_ops_streamed, 0);  // a roomy budget: every dense op resident
  EXPECT_EQ(skel_top.n_ops_streamed, 0);
  // Q4_K skeletons against skeleton + Q8_0 + F16 residuals.
  EXPECT_LT(skel_top.resident_bytes * 2, full.resident_bytes);
  EXPECT_GT(skel_top.hits + skel_top.misses, 0u) << "no residual was read through a slab";
  // Tier 0 reads only experts; the top tier adds every dense op's residuals, once per pass (four
  // passes: at least half of that, the rest covered by the expert reads' difference).
  EXPECT_EQ(skel_low.hits + skel_low.misses, 0u);
  const uint64_t residuals = full.resident_bytes - skel_top.resident_bytes;
  EXPECT_GT(skel_top.stream_bytes_read, skel_low.stream_bytes_read + 2 * residuals);
}

}  // namespace
}  // namespace substrate
