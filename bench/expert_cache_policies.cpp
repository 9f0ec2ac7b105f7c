// Expert-cache policies against the offline optimum (issue 17): a MoE model decodes a text one
// token at a time (teacher-forced, resident) while a recording weight source keeps the routing
// trace — per decode step and MoE layer, the experts the router picked and the look-ahead's
// guess (layer L+1's router on layer L's hidden state). The trace then drives one cache of S
// slots shared by every layer's experts, as the runtime's ExpertCache is, under:
//   lru        least recently used (the runtime's kLru)
//   frequency  least used (uses counted across evictions), ties by recency
//   decayed    least used with each use's weight halving every 8 tokens' uses, ties by recency
//              (the runtime's kDecayed, ResidencyOptions::expert_half_life_tokens)
//   cycle      the expert whose layer comes back last (layers run in a fixed cycle: the one
//              just run is needed again last), ties by recency
//   lookahead  cycle, and the look-ahead's guess for the next layer is never evicted
//   belady     the offline optimum: evict the expert whose next use is farthest (or never)
//   prefetch   cycle, and the look-ahead's guess for the next layer is read into the cache
//              as soon as it is known (one layer early), so more experts are there when used
// (Protecting the guess from eviction changes nothing under cycle, which keeps the next layer's
// experts last anyway: the look-ahead helps by when a read starts, not by what is evicted.)
// The experts a layer uses at once are pinned while it runs. Printed as JSON: per cache size,
// each policy's share of experts found in the cache when used and its expert reads per token;
// the predictors' precision/recall (look-ahead guess, previous token's routing at the same
// layer) against what was routed.
//
//   bench_expert_cache_policies -m MODEL.gguf --text FILE [--tokens 512] [--prefill 32]
//                               [--skip-chars 0] [--slots 12.5,25,50,75] [-t 2]
// --slots: percentages of all routed experts. Without a tokenizer (synth files) the text's
// bytes stand in for token ids.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "core/memory_ledger.h"
#include "core/thread_pool.h"
#include "format/model_file.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/op_id.h"
#include "model/resident_weight_source.h"
#include "runtime/residency_manager.h"
#include "tokenizer/tokenizer.h"

using namespace substrate;

namespace {

using Set = std::vector<int>;  // experts, increasing
struct Step {
  std::vector<Set> real, guess;  // per layer (empty: not a MoE layer / no guess)
};

// Forwards everything to the resident source and records the hints of one-token passes.
class RecordingSource : public WeightSource {
 public:
  // guessed[L]: the look-ahead guesses layer L (layer L-1 is a MoE layer).
  RecordingSource(WeightSource* inner, std::vector<bool> guessed)
      : inner_(inner), guessed_(std::move(guessed)) {}
  TensorId Resolve(const std::string& name) const override { return inner_->Resolve(name); }
  const TensorInfo& Info(TensorId id) const override { return inner_->Info(id); }
  Expected<WeightHandle> Acquire(TensorId id, int slice, int tier) override {
    return inner_->Acquire(id, slice, tier);
  }
  bool ReadsRows(TensorId id) const override { return inner_->ReadsRows(id); }
  Status ReadRows(TensorId id, const int32_t* rows, int64_t n, uint8_t* dst) override {
    return inner_->ReadRows(id, rows, n, dst);
  }
  int DefaultTier() const override { return inner_->DefaultTier(); }
  int LookaheadLayers() const override { return 1; }
  void BeginOp(const std::string& op) override {
    if (op == OpIdTokenEmbd()) {
      const size_t n = guessed_.size();
      cur_ = Step{std::vector<Set>(n), std::vector<Set>(n)};
      guess_done_.assign(n, false);
    }
  }
  // Per pass and layer the guess comes first (from the previous layer's router), then the real
  // routing (weight_source.h).
  void HintExperts(int layer, const int32_t* experts, int n) override {
    Set s(experts, experts + n);
    if (guessed_[layer] && !guess_done_[layer]) {
      cur_.guess[layer] = std::move(s);
      guess_done_[layer] = true;
    } else {
      cur_.real[layer] = std::move(s);
    }
  }
  void EndPass(bool record) {
    if (record) steps.push_back(cur_);
  }
  std::vector<Step> steps;

 private:
  WeightSource* inner_;
  std::vector<bool> guessed_, guess_done_;
  Step cur_;
};

// One access sequence: (layer, expert) keys in order, with the batch each belongs to.
struct Trace {
  std::vector<int> key, batch;   // key = layer * E + expert
  std::vector<int> batch_begin;  // first access of each batch
  std::vector<int> batch_layer, batch_step;
};

Trace Flatten(const std::vector<Step>& steps, int E) {
  Trace t;
  for (size_t s = 0; s < steps.size(); ++s)
    for (size_t l = 0; l < steps[s].real.size(); ++l) {
      if (steps[s].real[l].empty()) continue;
      t.batch_begin.push_back(static_cast<int>(t.key.size()));
      t.batch_layer.push_back(static_cast<int>(l));
      t.batch_step.push_back(static_cast<int>(s));
      for (int e : steps[s].real[l]) {
        t.key.push_back(static_cast<int>(l) * E + e);
        t.batch.push_back(static_cast<int>(t.batch_begin.size()) - 1);
      }
    }
  return t;
}

enum class Policy { kLru, kFrequency, kDecayed, kCycle, kPrefetch, kBelady };

// Batches until layer j runs again, seen from layer `cur` (running now) in a cycle of L layers.
int Distance(int j, int cur, int L) {
  return j > cur ? j - cur : j + L - cur;
}

struct SimResult {
  double hit_rate = 0;  // accesses found in the cache (read earlier, or prefetched)
  double reads_per_step = 0;
};

// A cache of `slots` over the trace: a miss (or a prefetch) fills it; a full cache evicts a
// victim outside the running layer's batch.
SimResult Simulate(const Trace& t, const std::vector<Step>& steps, int E, int n_keys, int slots,
                   Policy p, double half_life) {
  const int n = static_cast<int>(t.key.size());
  const int L = static_cast<int>(steps.empty() ? 1 : steps[0].real.size());
  constexpr int kNever = std::numeric_limits<int>::max();
  std::vector<int> next_use(n, kNever);
  {
    std::vector<int> last(n_keys, kNever);
    for (int i = n - 1; i >= 0; --i) {
      next_use[i] = last[t.key[i]];
      last[t.key[i]] = i;
    }
  }
  std::vector<char> cached(n_keys, 0);
  std::vector<long long> last_use(n_keys, -1), uses(n_keys, 0);
  std::vector<double> heat(n_keys, kNeverUsed);
  std::vector<int> next_of(n_keys, kNever), pinned(n_keys, -1), in_cache;
  long long hits = 0, reads = 0;
  int layer = 0, b = -1;
  // Victim: the worst cached key by the policy, never one pinned by the running batch.
  auto evict = [&]() {
    int best = -1;
    for (int c = 0; c < static_cast<int>(in_cache.size()); ++c) {
      const int x = in_cache[c];
      if (pinned[x] == b) continue;
      if (best < 0) {
        best = c;
        continue;
      }
      const int y = in_cache[best];
      bool worse = false;
      switch (p) {
        case Policy::kLru:
          worse = last_use[x] < last_use[y];
          break;
        case Policy::kFrequency:
          worse = uses[x] < uses[y] || (uses[x] == uses[y] && last_use[x] < last_use[y]);
          break;
        case Policy::kDecayed:
          worse = heat[x] < heat[y] || (heat[x] == heat[y] && last_use[x] < last_use[y]);
          break;
        case Policy::kCycle:
        case Policy::kPrefetch: {
          const int dx = Distance(x / E, layer, L), dy = Distance(y / E, layer, L);
          worse = dx != dy ? dx > dy : last_use[x] < last_use[y];
          break;
        }
        case Policy::kBelady:
          worse = next_of[x] > next_of[y];
          break;
      }
      if (worse) best = c;
    }
    if (best < 0) return false;
    cached[in_cache[best]] = 0;
    in_cache[best] = in_cache.back();
    in_cache.pop_back();
    return true;
  };
  auto fill = [&](int k) {
    if (static_cast<int>(in_cache.size()) >= slots && !evict()) return;
    cached[k] = 1;
    in_cache.push_back(k);
    ++reads;
  };
  for (int i = 0; i < n; ++i) {
    if (t.batch[i] != b) {
      b = t.batch[i];
      layer = t.batch_layer[b];
      for (int j = i; j < n && t.batch[j] == b; ++j) pinned[t.key[j]] = b;
    }
    const int k = t.key[i];
    next_of[k] = next_use[i];
    ++uses[k];
    heat[k] = DecayedUseKey(heat[k], static_cast<uint64_t>(i) + 1, half_life);
    if (cached[k])
      ++hits;
    else
      fill(k);
    last_use[k] = i;
    // The layer's last access: its router has guessed the next layer; prefetch reads it now.
    if (p == Policy::kPrefetch && (i + 1 == n || t.batch[i + 1] != b)) {
      const Step& st = steps[t.batch_step[b]];
      const int nl = layer + 1;
      if (nl < L)
        for (int e : st.guess[nl])
          if (!cached[nl * E + e]) fill(nl * E + e);
    }
  }
  SimResult r;
  r.hit_rate = n ? static_cast<double>(hits) / n : 0;
  r.reads_per_step = steps.empty() ? 0 : static_cast<double>(reads) / steps.size();
  return r;
}

// Share of routed experts a predictor named (recall) and of named ones routed (precision).
nlohmann::json Score(const std::vector<Step>& steps, bool previous_token) {
  long long named = 0, routed = 0, both = 0;
  for (size_t s = 0; s < steps.size(); ++s)
    for (size_t l = 0; l < steps[s].real.size(); ++l) {
      const Set& r = steps[s].real[l];
      if (r.empty()) continue;
      const Set* g = nullptr;
      if (previous_token) {
        if (s > 0) g = &steps[s - 1].real[l];
      } else if (!steps[s].guess[l].empty()) {
        g = &steps[s].guess[l];
      }
      if (!g) continue;
      named += static_cast<long long>(g->size());
      routed += static_cast<long long>(r.size());
      for (int e : *g) both += std::binary_search(r.begin(), r.end(), e);
    }
  return {{"precision", named ? static_cast<double>(both) / named : 0},
          {"recall", routed ? static_cast<double>(both) / routed : 0},
          {"layer_steps_scored", routed}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, text_path, slots_arg = "12.5,25,50,75";
  int tokens = 512, prefill = 32, threads = 2;
  size_t skip = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "-m")
      model_path = v;
    else if (k == "--text")
      text_path = v;
    else if (k == "--tokens")
      tokens = std::stoi(v);
    else if (k == "--prefill")
      prefill = std::stoi(v);
    else if (k == "--skip-chars")
      skip = std::stoul(v);
    else if (k == "--slots")
      slots_arg = v;
    else if (k == "-t")
      threads = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (model_path.empty() || text_path.empty()) {
    std::fprintf(stderr, "usage: bench_expert_cache_policies -m MODEL.gguf --text FILE\n");
    return 2;
  }
  MemoryLedger ledger;
  ThreadPool pool(threads);
  auto file = ModelFile::Open(model_path);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
    return 1;
  }
  auto src = ResidentWeightSource::Load(**file, &ledger);
  if (!src.ok()) {
    std::fprintf(stderr, "%s\n", src.status().ToString().c_str());
    return 1;
  }
  auto probe = Model::Create((*file)->metadata(), src->get(), &pool, &ledger);
  if (!probe.ok()) {
    std::fprintf(stderr, "%s\n", probe.status().ToString().c_str());
    return 1;
  }
  const ModelHParams hp = (*probe)->hparams();
  probe->reset();
  if (hp.n_expert <= 0) {
    std::fprintf(stderr, "%s is not a MoE model\n", model_path.c_str());
    return 1;
  }
  std::vector<bool> guessed(static_cast<size_t>(hp.n_layer), false);
  for (int l = 1; l < hp.n_layer; ++l) guessed[l] = hp.is_moe_layer(l - 1) && hp.is_moe_layer(l);
  RecordingSource rec(src->get(), guessed);
  auto model = Model::Create((*file)->metadata(), &rec, &pool, &ledger);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }

  auto text = ReadFileToString(text_path);
  if (!text.ok()) {
    std::fprintf(stderr, "%s\n", text.status().ToString().c_str());
    return 1;
  }
  const std::string body = text->substr(std::min(skip, text->size()));
  std::vector<int32_t> toks;
  if (auto tok = Tokenizer::FromMetadata((*file)->metadata()); tok.ok()) {
    auto ids = (*tok)->Encode(body.substr(0, static_cast<size_t>(tokens + prefill) * 12));
    if (ids.ok()) toks.assign(ids->begin(), ids->end());
  } else {
    for (unsigned char c : body) toks.push_back(static_cast<int32_t>(c) % hp.n_vocab);
  }
  toks.resize(std::min<size_t>(toks.size(), static_cast<size_t>(tokens + prefill)));
  if (static_cast<int>(toks.size()) <= prefill) {
    std::fprintf(stderr, "text too short\n");
    return 1;
  }

  auto cache = KvCache::Create(hp, static_cast<int64_t>(toks.size()) + 8, (*model)->backend());
  if (!cache.ok()) {
    std::fprintf(stderr, "%s\n", cache.status().ToString().c_str());
    return 1;
  }
  std::vector<float> logits;
  if (auto s = (*model)->Forward(toks.data(), prefill, *cache, false, &logits); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  rec.EndPass(false);
  for (size_t i = static_cast<size_t>(prefill); i < toks.size(); ++i) {
    if (auto s = (*model)->Forward(&toks[i], 1, *cache, false, &logits); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    rec.EndPass(true);
  }

  const int E = hp.n_expert;
  int moe_layers = 0;
  for (int l = 0; l < hp.n_layer; ++l) moe_layers += hp.is_moe_layer(l);
  const int n_keys = hp.n_layer * E, all = moe_layers * E;
  const Trace t = Flatten(rec.steps, E);
  nlohmann::json sizes = nlohmann::json::array();
  std::stringstream ss(slots_arg);
  std::string pct;
  while (std::getline(ss, pct, ',')) {
    const int slots =
        std::max(hp.n_expert_used, static_cast<int>(all * std::stod(pct) / 100 + 0.5));
    nlohmann::json row = {{"slots", slots}, {"share_of_experts", static_cast<double>(slots) / all}};
    // The runtime's half-life, in uses: a decode step uses k experts of every MoE layer.
    const double half_life =
        ResidencyOptions().expert_half_life_tokens * moe_layers * hp.n_expert_used;
    for (auto [name, p] : {std::pair{"lru", Policy::kLru},
                           {"frequency", Policy::kFrequency},
                           {"decayed", Policy::kDecayed},
                           {"cycle", Policy::kCycle},
                           {"prefetch", Policy::kPrefetch},
                           {"belady", Policy::kBelady}}) {
      const SimResult r = Simulate(t, rec.steps, E, n_keys, slots, p, half_life);
      row[name] = {{"hit_rate", r.hit_rate}, {"reads_per_token", r.reads_per_step}};
    }
    sizes.push_back(row);
  }
  nlohmann::json out = {{"model", model_path},
                        {"decode_steps", rec.steps.size()},
                        {"moe_layers", moe_layers},
                        {"experts_per_layer", E},
                        {"experts_per_token", hp.n_expert_used},
                        {"accesses", t.key.size()},
                        {"hit_rate", sizes},
                        {"lookahead_guess", Score(rec.steps, false)},
                        {"previous_token_same_layer", Score(rec.steps, true)}};
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
