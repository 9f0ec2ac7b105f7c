// PackStore's tier-0 choices: --skeleton keep reproduces the source bytes; a plan's tensor_types
// and per-op tier ladders decide each unit's types; a plan that misses an op, names an unknown
// type or a type that cannot hold a tensor's rows fails with a message naming it.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/file_io.h"
#include "core/memory_ledger.h"
#include "format/model_file.h"
#include "model/hparams.h"
#include "model/op_id.h"
#include "store/pack.h"
#include "store/store_fixture.h"
#include "store/store_weight_source.h"

namespace substrate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::StoreTestPath;

std::string Fixture(const std::string& name) {
  return std::string(SUBSTRATE_SHARED_DIR) + "/gguf/" + name;
}

json Manifest(const std::string& dir) {
  auto text = ReadFileToString(dir + "/manifest.json");
  EXPECT_TRUE(text.ok());
  return json::parse(text.ok() ? *text : "{}");
}

// Bytes of a manifest entry, read back from its store file.
std::vector<uint8_t> EntryBytes(const std::string& dir, const json& e) {
  auto f = RandomAccessFile::Open(dir + "/" + e["file"].get<std::string>());
  EXPECT_TRUE(f.ok());
  std::vector<uint8_t> b(e["bytes"].get<uint64_t>());
  EXPECT_TRUE((*f)->Read(e["offset"].get<uint64_t>(), b.size(), b.data()).ok());
  return b;
}

TEST(PackKeep, Tier0IsTheSourceBytes) {
  const std::string model = Fixture("tiny-coder-moe-Q4_K_M.gguf");
  if (!fs::exists(model)) GTEST_SKIP() << "no fixture " << model;
  auto file = ModelFile::Open(model);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const std::string out = StoreTestPath("keep");
  PackOptions o;
  o.keep_skeleton = true;
  o.residuals.clear();
  auto stats = PackStore(**file, out, o);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->tier_bytes[1], 0u);
  EXPECT_EQ(static_cast<int>(stats->copied_units), stats->n_units);

  const json m = Manifest(out);
  ASSERT_EQ(m["tiers"].size(), 1u);
  int checked = 0;
  std::set<std::string> types;
  for (const json& e : m["entries"]) {
    const TensorInfo* t = (*file)->Find(e["tensor"].get<std::string>());
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(e["type"].get<std::string>(), DTypeName(t->type)) << t->name;
    types.insert(DTypeName(t->type));
    const int slice = e["slice"].get<int>();
    std::vector<uint8_t> want(slice >= 0 ? t->slice_bytes() : t->bytes);
    if (slice >= 0) ASSERT_TRUE((*file)->ReadSlice(*t, slice, want.data()).ok());
    else ASSERT_TRUE((*file)->ReadTensor(*t, want.data()).ok());
    ASSERT_EQ(EntryBytes(out, e), want) << t->name << " slice " << slice;
    ++checked;
  }
  EXPECT_GT(checked, 100);
  EXPECT_GE(types.size(), 3u) << "the fixture should mix types (Q4_K, Q6_K, F32...)";
  MemoryLedger ledger;
  auto src = StoreWeightSource::Open(out, &ledger);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  fs::remove_all(out);
}

// A plan for tiny-coder-moe: every op with matrices gets a bundle; attention Q4_K -> Q8_0 ->
// F16, experts Q8_0 -> F16, everything else Q8_0 alone; one tensor_types override.
json MakePlan(const ModelFile& file, const std::string& skip_op = "") {
  auto hp = ModelHParams::FromMetadata(file.metadata());
  EXPECT_TRUE(hp.ok());
  json bundles = json::array();
  for (const OpSpec& op :
       ListOps(*hp, [&](const std::string& n) { return file.Find(n) != nullptr; })) {
    if (op.id == skip_op) continue;
    std::vector<std::string> ladder = {"Q8_0"};
    if (op.kind == OpKind::kAttention) ladder = {"Q4_K", "Q8_0", "F16"};
    if (op.kind == OpKind::kMoeExpert) ladder = {"Q8_0", "F16"};
    json tiers = json::array();
    for (size_t k = 0; k < ladder.size(); ++k)
      tiers.push_back({{"tier_index", k}, {"precision", ladder[k]}});
    bundles.push_back({{"op_id", op.id}, {"tiers", tiers}});
  }
  return json{{"op_bundles", bundles}, {"tensor_types", {{"blk.0.attn_q.weight", "Q6_K"}}}};
}

TEST(PackPlan, TypesComeFromThePlan) {
  const std::string model = Fixture("tiny-coder-moe-bf16.gguf");
  if (!fs::exists(model)) GTEST_SKIP() << "no fixture " << model;
  auto file = ModelFile::Open(model);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto plan = ParsePackPlan(MakePlan(**file).dump());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const std::string out = StoreTestPath("plan");
  PackOptions o;
  o.plan = &*plan;
  auto stats = PackStore(**file, out, o);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();

  std::map<std::pair<std::string, int>, std::string> type;  // (tensor#slice, tier) -> type
  const json manifest = Manifest(out);
  for (const json& e : manifest["entries"]) {
    const std::string key = e["tensor"].get<std::string>() + "#" + std::to_string(e["slice"].get<int>());
    type[{key, e["tier"].get<int>()}] = e["type"].get<std::string>();
  }
  EXPECT_EQ((type[{"blk.0.attn_q.weight#-1", 0}]), "Q6_K");  // tensor_types wins
  EXPECT_EQ((type[{"blk.0.attn_q.weight#-1", 1}]), "Q8_0");
  EXPECT_EQ((type[{"blk.0.attn_q.weight#-1", 2}]), "F16");
  EXPECT_EQ((type[{"blk.1.attn_k.weight#-1", 0}]), "Q4_K");  // the op's tier 0
  EXPECT_EQ((type[{"blk.2.ffn_down_exps.weight#5", 0}]), "Q8_0");
  EXPECT_EQ((type[{"blk.2.ffn_down_exps.weight#5", 1}]), "F16");
  EXPECT_EQ(type.count({"blk.2.ffn_down_exps.weight#5", 2}), 0u);
  EXPECT_EQ((type[{"blk.3.ffn_gate_inp.weight#-1", 0}]), "Q8_0");
  EXPECT_EQ(type.count({"blk.3.ffn_gate_inp.weight#-1", 1}), 0u);
  EXPECT_EQ((type[{"blk.0.attn_norm.weight#-1", 0}]), "F32");  // vectors as they are
  MemoryLedger ledger;
  auto src = StoreWeightSource::Open(out, &ledger);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ((*src)->n_tiers(), 3);
  fs::remove_all(out);
}

TEST(PackPlan, BadPlansFailNamingTheProblem) {
  const std::string model = Fixture("tiny-coder-moe-bf16.gguf");
  if (!fs::exists(model)) GTEST_SKIP() << "no fixture " << model;
  auto file = ModelFile::Open(model);
  ASSERT_TRUE(file.ok());
  const std::string out = StoreTestPath("badplan");
  PackOptions o;

  auto missing = ParsePackPlan(MakePlan(**file, "block_3.attn").dump());
  ASSERT_TRUE(missing.ok());
  o.plan = &*missing;
  auto st = PackStore(**file, out, o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().ToString().find("block_3.attn"), std::string::npos) << st.status().ToString();
  EXPECT_FALSE(fs::exists(out + "/manifest.json"));

  json j = MakePlan(**file);
  j["op_bundles"].push_back({{"op_id", "block_99.attn"}, {"tiers", {{{"precision", "Q8_0"}}}}});
  auto extra = ParsePackPlan(j.dump());
  ASSERT_TRUE(extra.ok());
  o.plan = &*extra;
  st = PackStore(**file, out, o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().ToString().find("block_99.attn"), std::string::npos) << st.status().ToString();

  j = MakePlan(**file);
  j["tensor_types"]["blk.1.ffn_down_exps.weight"] = "Q4_K";  // rows of 64: no Q4_K block fits
  auto narrow = ParsePackPlan(j.dump());
  ASSERT_TRUE(narrow.ok());
  o.plan = &*narrow;
  st = PackStore(**file, out, o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().ToString().find("blk.1.ffn_down_exps.weight"), std::string::npos)
      << st.status().ToString();

  j = MakePlan(**file);
  j["op_bundles"][1]["tiers"][0]["precision"] = "Q9_Z";
  EXPECT_FALSE(ParsePackPlan(j.dump()).ok());
  EXPECT_FALSE(ParsePackPlan("{not json").ok());
  EXPECT_FALSE(ParsePackPlan("{\"tensor_types\": {}}").ok());  // no op_bundles
  j = MakePlan(**file);
  j["tensor_types"]["blk.0.attn_k.weight"] = 7;
  EXPECT_FALSE(ParsePackPlan(j.dump()).ok());
  fs::remove_all(out);
}

}  // namespace
}  // namespace substrate
