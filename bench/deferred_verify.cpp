// Deferred verification against its alternatives on one store, side by side in one process:
//   (a) the top tier every token          (d) the skeleton (draft tier) alone
//   (b) --verify all at W = 4, 8, 16       (c) --verify margin at three taus (W = 8)
// For each: tokens/s, time to first token, the verify counters, the share of tokens equal to
// (a)'s greedy output, and the judge measure of the seed: the top tier's mean log-probability
// of the generated text. Greedy; prompts are lines of a text file (heldout code for the trained
// models; random weights make the quality columns meaningless, not the speed ones). Each prompt
// runs every mode in turn ((a) first), so a disk whose rate drifts slows all modes alike.
//
//   bench_deferred_verify --store S --max-ram SIZE --prompts FILE [-n 48] [--count 6] [-c 512]
//                         [--modes a,b4,b8,b16,c0.5,c1,c2,d]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/memory_ledger.h"
#include "runtime/engine.h"

using namespace substrate;

namespace {

struct Args {
  std::string store, prompts, modes = "a,b4,b8,b16,c0.5,c1,c2,d";
  uint64_t max_ram = 0;
  int n = 48, count = 6, ctx = 512;
};

// Top-tier mean log-probability of `gen` after `prompt` (one pass over both, all logits).
double JudgeLogProb(Engine& e, const std::vector<int32_t>& prompt, const std::vector<int32_t>& gen) {
  if (gen.empty()) return 0;
  Model& m = e.model();
  std::fill(m.op_tiers().begin(), m.op_tiers().end(),
            static_cast<uint8_t>(e.weights().DefaultTier()));
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), gen.begin(), gen.end());
  auto cache = KvCache::Create(m.hparams(), static_cast<int64_t>(all.size()) + 1, m.backend());
  if (!cache.ok()) return NAN;
  std::vector<float> logits;
  if (!m.Forward(all.data(), static_cast<int64_t>(all.size()), *cache, true, &logits).ok()) return NAN;
  const int64_t V = m.hparams().n_vocab;
  double sum = 0;
  for (size_t i = 0; i < gen.size(); ++i) {
    const float* row = logits.data() + (prompt.size() - 1 + i) * V;
    double mx = row[0], z = 0;
    for (int64_t k = 1; k < V; ++k) mx = std::max<double>(mx, row[k]);
    for (int64_t k = 0; k < V; ++k) z += std::exp(row[k] - mx);
    sum += row[gen[i]] - mx - std::log(z);
  }
  return sum / static_cast<double>(gen.size());
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--store") a.store = v;
    else if (k == "--prompts") a.prompts = v;
    else if (k == "--modes") a.modes = v;
    else if (k == "-n") a.n = std::stoi(v);
    else if (k == "--count") a.count = std::stoi(v);
    else if (k == "-c") a.ctx = std::stoi(v);
    else if (k == "--max-ram") a.max_ram = *ParseBytes(v);
    else { std::fprintf(stderr, "unknown flag %s\n", k.c_str()); return 2; }
  }
  if (a.store.empty() || a.prompts.empty() || a.max_ram == 0) {
    std::fprintf(stderr, "usage: bench_deferred_verify --store S --max-ram SIZE --prompts FILE\n");
    return 2;
  }
  EngineOptions eo;
  eo.store = a.store;
  eo.max_ram = a.max_ram;
  eo.n_ctx = a.ctx;
  eo.require_tokenizer = false;
  // The skeletons resident, the residuals streamed but for those kept (as `run --verify` does).
  eo.residency.resident_max_tier = 0;
  eo.residency.keep_residuals = true;
  auto engine = Engine::Load("", eo);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return 1;
  }
  Engine& e = **engine;
  // Prompts: non-empty lines of at least 20 characters, the first --count of them.
  std::vector<std::vector<int32_t>> prompts;
  std::ifstream in(a.prompts);
  std::string line;
  const int64_t V = e.model().hparams().n_vocab;
  while (std::getline(in, line) && static_cast<int>(prompts.size()) < a.count) {
    if (line.size() < 20) continue;
    std::vector<int32_t> ids;
    if (e.tokenizer()) {
      auto t = e.tokenizer()->Encode(line, {.add_special = true, .parse_special = false});
      if (!t.ok()) continue;
      ids.assign(t->begin(), t->end());
    } else {
      for (size_t i = 0; i < std::min<size_t>(line.size(), 16); ++i)
        ids.push_back(static_cast<int32_t>((line[i] * 131 + i * 7) % V));
    }
    prompts.push_back(ids);
  }
  // Prompt by prompt, every mode in turn: a disk whose rate drifts over the minutes (a shared
  // VM's does) then slows every mode alike instead of the modes that ran in its slow minutes.
  struct ModeRun {
    std::string mode;
    GenerateOptions go;
    int plain_tier = 0;
    GenerateStats sum;
    double ttft = 0, judge = 0;
    int64_t equal = 0, total = 0;
    uint64_t read_bytes = 0;  // runtime reads during its generations (the judge's excluded)
  };
  std::vector<ModeRun> runs;
  std::stringstream modes(a.modes);
  std::string mode;
  const int top = e.weights().DefaultTier();
  while (std::getline(modes, mode, ',')) {
    ModeRun r;
    r.mode = mode;
    r.go.max_tokens = a.n;
    r.go.stop_at_eog = false;
    r.plain_tier = mode == "d" ? 0 : top;
    if (mode[0] == 'b') {
      r.go.verify.mode = VerifyOptions::Mode::kAll;
      r.go.verify.window = std::stoi(mode.substr(1));
    } else if (mode[0] == 'c') {
      r.go.verify.mode = VerifyOptions::Mode::kMargin;
      r.go.verify.window = 8;
      r.go.verify.tau = std::stof(mode.substr(1));
    }
    runs.push_back(r);
  }
  // (a) first: its tokens are every mode's reference.
  std::stable_partition(runs.begin(), runs.end(), [](const ModeRun& r) { return r.mode == "a"; });
  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    std::vector<int32_t> reference;
    for (ModeRun& r : runs) {
      std::fill(e.model().op_tiers().begin(), e.model().op_tiers().end(),
                static_cast<uint8_t>(r.plain_tier));
      auto s = e.NewSession(a.ctx);
      std::vector<int32_t> gen;
      const uint64_t read0 = e.runtime()->stats().stream_bytes_read;
      auto st = e.Generate(**s, prompts[pi], r.go, [&](int32_t t, const std::string&) {
        if (t >= 0) gen.push_back(t);
        return true;
      });
      if (!st.ok()) {
        std::fprintf(stderr, "%s: %s\n", r.mode.c_str(), st.status().ToString().c_str());
        return 1;
      }
      r.read_bytes += e.runtime()->stats().stream_bytes_read - read0;
      r.sum.Add(*st);
      r.ttft += st->first_token_seconds;
      if (r.mode == "a") reference = gen;
      if (!reference.empty()) {
        for (size_t i = 0; i < gen.size() && i < reference.size(); ++i)
          r.equal += gen[i] == reference[i];
        r.total += static_cast<int64_t>(reference.size());
      }
      // The judge's own pass reads the top tier too: not the mode's bytes.
      r.judge += JudgeLogProb(e, prompts[pi], gen);
    }
    std::fprintf(stderr, "prompt %zu of %zu done\n", pi + 1, prompts.size());
  }
  nlohmann::json out = nlohmann::json::array();
  for (const ModeRun& r : runs) {
    const double n = static_cast<double>(std::max<int64_t>(r.sum.n_generated, 1));
    const double seconds = r.sum.prompt_seconds + r.sum.decode_seconds;
    out.push_back({{"mode", r.mode},
                   {"tokens", r.sum.n_generated},
                   {"tokens_per_s", r.sum.n_generated / seconds},
                   {"decode_tokens_per_s", r.sum.n_generated / r.sum.decode_seconds},
                   {"decode_seconds", r.sum.decode_seconds},
                   {"first_token_seconds", r.ttft / prompts.size()},
                   {"drafted", r.sum.n_drafted},
                   {"verified", r.sum.n_verified},
                   {"verify_passes", r.sum.n_verify_passes},
                   {"verify_seconds", r.sum.verify_seconds},
                   {"rollbacks", r.sum.n_rollbacks},
                   {"rollback_lost", r.sum.n_rollback_lost},
                   {"verify_bytes_per_token", r.sum.verify_bytes / n},
                   {"read_bytes_per_token", r.read_bytes / n},
                   {"equal_to_top_tier", r.total ? static_cast<double>(r.equal) / r.total : 1.0},
                   {"judge_mean_logprob", r.judge / prompts.size()}});
  }
  nlohmann::json j = {{"store", a.store},
                      {"max_ram", a.max_ram},
                      {"ledger_peak", e.ledger().peak()},
                      {"n", a.n},
                      {"prompts", prompts.size()},
                      {"runtime", nlohmann::json::parse(e.runtime()->StatsJson())},
                      {"modes", out}};
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
}
