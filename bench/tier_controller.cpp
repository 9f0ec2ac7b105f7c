// The TierController's own cost in the token loop: ns per Observe (no tier change), per
// switch (an Observe that escalates, and the EndToken that decays it back), and per token of a
// realistic shape (every watched op observed once, then EndToken). Goal: <= 100 ns per call.
//
//   bench_tier_controller [--ops 96] [--tokens 200000]
#include "runtime/tier_controller.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

using namespace substrate;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

TierController Make(std::vector<uint8_t>* tiers, int n, int persistence, int k) {
  TierControllerOptions o;
  o.threshold = 0.5f;
  o.persistence = persistence;
  o.max_concurrent = k;
  o.pool_bytes = 1ull << 40;
  std::vector<std::vector<uint64_t>> cost(static_cast<size_t>(n), {0, 1000, 3000});
  return TierController::Create(tiers, std::vector<uint8_t>(static_cast<size_t>(n), 2), cost, o,
                                nullptr)
      .value();
}

}  // namespace

int main(int argc, char** argv) {
  int n = 96;  // a 32-layer model's attention, FFN and router ops
  long tokens = 200000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--ops")) n = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atol(argv[i + 1]);
  }
  if (n < 2 || tokens < 1) {
    std::fprintf(stderr, "usage: bench_tier_controller [--ops N>=2] [--tokens T>=1]\n");
    return 2;
  }
  nlohmann::json out;
  volatile float sink = 0;

  {  // Observe below the threshold: the common case, no switch.
    std::vector<uint8_t> tiers(static_cast<size_t>(n), 0);
    TierController c = Make(&tiers, n, 4, 8);
    const double t0 = Now();
    for (long t = 0; t < tokens; ++t)
      for (int op = 0; op < n; ++op) c.Observe(op, 0.1f + 1e-9f * static_cast<float>(op));
    const double ns = (Now() - t0) * 1e9 / static_cast<double>(tokens * n);
    out["observe_ns"] = ns;
    sink = sink + static_cast<float>(c.tier(0));
  }
  {  // Switches: persistence 1, every token escalates op 0 and decays it back at EndToken.
    std::vector<uint8_t> tiers(static_cast<size_t>(n), 0);
    TierController c = Make(&tiers, n, 1, 8);
    const double t0 = Now();
    for (long t = 0; t < tokens; ++t) {
      c.Observe(0, 0.9f);  // escalate
      c.Observe(0, 0.1f);  // calm
      c.EndToken();        // decay
    }
    const double per_pair = (Now() - t0) * 1e9 / static_cast<double>(tokens);
    if (c.stats().escalations != static_cast<uint64_t>(tokens) ||
        c.stats().decays != static_cast<uint64_t>(tokens)) {
      std::fprintf(stderr, "bench_tier_controller: the switch loop did not switch every token\n");
      return 1;
    }
    out["switch_ns"] = per_pair / 2;  // an escalation and a decay per token
  }
  {  // A token: every op observed with a varying signal, some escalating, then EndToken.
    std::vector<uint8_t> tiers(static_cast<size_t>(n), 0);
    TierController c = Make(&tiers, n, 2, 8);
    uint32_t x = 12345;
    const double t0 = Now();
    for (long t = 0; t < tokens / 10; ++t) {
      for (int op = 0; op < n; ++op) {
        x = x * 1664525u + 1013904223u;
        c.Observe(op, static_cast<float>(x >> 8) / 16777216.0f * 0.6f);
      }
      c.EndToken();
    }
    const double per_token = (Now() - t0) * 1e9 / static_cast<double>(tokens / 10);
    out["token_ns"] = per_token;
    out["token_ns_per_op"] = per_token / n;
    out["escalations"] = c.stats().escalations;
    out["evictions"] = c.stats().evictions;
  }
  out["ops"] = n;
  out["goal_ns"] = 100;
  out["observe_ratio_to_goal"] = out["observe_ns"].get<double>() / 100.0;
  out["switch_ratio_to_goal"] = out["switch_ns"].get<double>() / 100.0;
  std::printf("%s\n", out.dump(2).c_str());
  return sink < 0 ? 1 : 0;
}
