// The adaptive runtime's quality against static choices at the same peak bytes, on a trained
// model packed with residual tiers, over held-out text (chunks after the ones probes and the
// static choice were fitted on). Mean KL divergence of each policy's next-token distribution
// from the bf16 reference, token by token (decode passes, so tiers can change between tokens):
//   tier0        every op at the skeleton
//   static       the skeleton plus the pool spent on fixed escalations: blocks ranked by the
//                KLD their top tier removes alone (measured on the calibration chunks), per
//                residual byte, taken while the pool holds them (what a compiled plan does)
//   adaptive-*   the TierController with the residual-sample or the linear-probe verifier,
//                same pool (threshold and persistence swept)
//   top          every op at the top tier
// With --experts 1 a MoE's routed experts escalate too (adaptive: the residual sample watches
// the experts each token routes to, --expert-rows rows of each); with --static-experts 1 the
// static choice ranks them beside the blocks (one calibration run per expert: slow).
//
//   bench_adaptive_quality --store S --reference BF16.gguf --text heldout.txt --probes P.json
//                          [--pool-ops 2] [-c 128] [--calib 4] [--eval 8] [--skip 16]
//                          [--experts 0|1] [--expert-rows 4] [--static-experts 0|1]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "runtime/engine.h"

using namespace substrate;

namespace {

struct Args {
  std::string store, reference, text, probes;
  int pool_ops = 2, ctx = 128, calib = 4, eval = 8, skip = 16;
  int experts = 0, expert_rows = 4, static_experts = 0;
};

std::vector<double> LogSoftmax(const float* l, int64_t n) {
  double mx = l[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max<double>(mx, l[i]);
  double z = 0;
  for (int64_t i = 0; i < n; ++i) z += std::exp(l[i] - mx);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = l[i] - mx - std::log(z);
  return out;
}

double Kl(const std::vector<double>& p, const std::vector<double>& q) {
  double s = 0;
  for (size_t i = 0; i < p.size(); ++i) s += std::exp(p[i]) * (p[i] - q[i]);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--store") a.store = v;
    else if (k == "--reference") a.reference = v;
    else if (k == "--text") a.text = v;
    else if (k == "--probes") a.probes = v;
    else if (k == "--pool-ops") a.pool_ops = std::stoi(v);
    else if (k == "-c") a.ctx = std::stoi(v);
    else if (k == "--calib") a.calib = std::stoi(v);
    else if (k == "--eval") a.eval = std::stoi(v);
    else if (k == "--skip") a.skip = std::stoi(v);
    else if (k == "--experts") a.experts = std::stoi(v);
    else if (k == "--expert-rows") a.expert_rows = std::stoi(v);
    else if (k == "--static-experts") a.static_experts = std::stoi(v);
    else { std::fprintf(stderr, "unknown flag %s\n", k.c_str()); return 2; }
  }
  EngineOptions ro;
  auto ref = Engine::Load(a.reference, ro);
  EngineOptions so;
  so.store = a.store;
  so.max_ram = 1ull << 34;
  so.n_ctx = a.ctx;
  auto eng = Engine::Load("", so);
  if (!ref.ok() || !eng.ok()) {
    std::fprintf(stderr, "%s %s\n", ref.status().ToString().c_str(), eng.status().ToString().c_str());
    return 1;
  }
  Engine& e = **eng;
  Model& m = e.model();
  const int64_t V = m.hparams().n_vocab, C = a.ctx, half = C / 2;
  auto text = ReadFileToString(a.text);
  auto ids = (*ref)->tokenizer()->Encode(*text, {.add_special = false, .parse_special = false});
  std::vector<int32_t> tok(ids->begin(), ids->end());
  auto chunk = [&](int c) { return tok.data() + static_cast<int64_t>(c) * C; };

  // Reference log-probabilities of the scored positions (second half of each chunk).
  auto reference = [&](int c) {
    Model& rm = (*ref)->model();
    auto cache = KvCache::Create(rm.hparams(), C, rm.backend());
    std::vector<float> logits;
    (void)rm.Forward(chunk(c), C, *cache, true, &logits);
    std::vector<std::vector<double>> lp;
    for (int64_t t = half; t < C - 1; ++t) lp.push_back(LogSoftmax(logits.data() + t * V, V));
    return lp;
  };
  const int top = e.weights().DefaultTier();
  std::vector<int> blocks, experts;  // escalatable ops
  for (const LayerWeights& w : m.layers()) {
    for (int op : {w.attn_op, w.ffn_op, w.router_op})
      if (op >= 0) blocks.push_back(op);
    for (int x = 0; w.expert_op0 >= 0 && x < m.hparams().n_expert; ++x)
      experts.push_back(w.expert_op0 + x);
  }
  auto cost = [&](int op) {
    return e.weights().OpBytes(m.ops()[op].id, top) - e.weights().OpBytes(m.ops()[op].id, 0);
  };
  // The pool: twice the largest block's residual, with or without experts (the same bytes).
  uint64_t largest = 0;
  for (int op : blocks) largest = std::max(largest, cost(op));
  const uint64_t pool = largest * static_cast<uint64_t>(a.pool_ops);
  std::vector<int> adaptive_ops = blocks, static_ops = blocks;
  if (a.experts) adaptive_ops.insert(adaptive_ops.end(), experts.begin(), experts.end());
  if (a.static_experts) static_ops.insert(static_ops.end(), experts.begin(), experts.end());

  // Mean KLD over chunks [first, first + n) of a policy: `before` sets the tiers for token t
  // (given the verifier's view through the model's observer); decode token by token.
  auto evaluate = [&](int first, int n, const std::function<void(int64_t)>& before,
                      const std::function<void()>& after) {
    double sum = 0;
    int64_t count = 0;
    for (int c = first; c < first + n; ++c) {
      const auto lp = reference(c);
      auto cache = KvCache::Create(m.hparams(), C, m.backend());
      std::vector<float> logits;
      for (int64_t t = 0; t < C - 1; ++t) {
        before(t);
        (void)m.Forward(chunk(c) + t, 1, *cache, false, &logits);
        after();
        if (t >= half) {
          sum += Kl(lp[t - half], LogSoftmax(logits.data(), V));
          ++count;
        }
      }
    }
    return sum / static_cast<double>(count);
  };
  auto fixed = [&](const std::vector<uint8_t>& tiers) {
    return [&m, tiers](int64_t) { m.op_tiers() = tiers; };
  };
  const size_t n_ops = m.ops().size();
  const std::vector<uint8_t> low(n_ops, 0), high(n_ops, static_cast<uint8_t>(top));
  nlohmann::json out;
  out["pool_bytes"] = pool;
  out["pool_ops"] = a.pool_ops;
  const int eval0 = a.skip + a.calib;
  auto nothing = [] {};
  out["tier0"] = evaluate(eval0, a.eval, fixed(low), nothing);
  out["top"] = evaluate(eval0, a.eval, fixed(high), nothing);
  std::fprintf(stderr, "tier0 %g top %g\n", out["tier0"].get<double>(), out["top"].get<double>());

  // Static: each block's KLD reduction alone at the top tier, on the calibration chunks.
  const double base_kld = evaluate(a.skip, a.calib, fixed(low), nothing);
  std::vector<std::pair<double, int>> gain;
  for (int op : static_ops) {
    std::vector<uint8_t> t = low;
    t[op] = static_cast<uint8_t>(top);
    gain.push_back({(base_kld - evaluate(a.skip, a.calib, fixed(t), nothing)) / cost(op), op});
  }
  std::sort(gain.rbegin(), gain.rend());
  std::vector<uint8_t> chosen = low;
  uint64_t used = 0;
  for (const auto& [g, op] : gain) {
    if (used + cost(op) > pool) continue;
    chosen[op] = static_cast<uint8_t>(top);
    used += cost(op);
    out["static_ops"].push_back(m.ops()[op].id);
  }
  out["static"] = evaluate(eval0, a.eval, fixed(chosen), nothing);
  out["static_bytes"] = used;
  std::fprintf(stderr, "static %g\n", out["static"].get<double>());

  // Adaptive, each verifier, a few thresholds and persistences.
  auto adaptive = [&](const std::string& kind, float threshold, int persistence) {
    m.op_tiers() = low;
    std::vector<uint8_t> ceiling(n_ops, 0);
    std::vector<std::vector<uint64_t>> costs(n_ops, std::vector<uint64_t>(top + 1, 0));
    for (int op : adaptive_ops) {
      ceiling[op] = static_cast<uint8_t>(top);
      for (int k = 1; k <= top; ++k)
        costs[op][k] = e.weights().OpBytes(m.ops()[op].id, k) - e.weights().OpBytes(m.ops()[op].id, 0);
    }
    TierControllerOptions co;
    co.threshold = threshold;
    co.persistence = persistence;
    co.max_concurrent = static_cast<int>(adaptive_ops.size());
    co.pool_bytes = pool;
    auto ctl = TierController::Create(&m.op_tiers(), ceiling, costs, co, nullptr);
    struct Experts {
      const Model* m;
      uint64_t escalations = 0;
    } counted{&m};
    ctl->set_listener(
        [](void* ctx, int op, int, int, TierSwitch why) {
          auto* c = static_cast<Experts*>(ctx);
          if (why == TierSwitch::kEscalate && c->m->ops()[op].kind == OpKind::kMoeExpert)
            ++c->escalations;
        },
        &counted);
    std::unique_ptr<VerifierProbe> v;
    if (kind == "residual") {
      v = ResidualSampleVerifier::Create(&*ctl, m, top, 16, nullptr,
                                         a.experts ? a.expert_rows : 0)
              .value();
    } else {
      v = LinearProbeVerifier::Create(&*ctl, m, LinearProbes::Load(a.probes).value()).value();
    }
    m.set_observer(v.get());
    const double kld = evaluate(eval0, a.eval, [](int64_t) {}, [&] {
      v->NextToken();
      ctl->EndToken();
    });
    m.set_observer(nullptr);
    const auto& s = ctl->stats();
    return nlohmann::json{{"verifier", kind}, {"threshold", threshold}, {"persistence", persistence},
                          {"kld", kld}, {"escalations", s.escalations}, {"evictions", s.evictions},
                          {"expert_escalations", counted.escalations},
                          {"pool_peak", s.pool_peak}, {"escalated_peak", s.escalated_peak}};
  };
  for (const std::string kind : {"residual", "linear"}) {
    if (kind == "linear" && a.probes.empty()) continue;
    for (float th : kind == "residual" ? std::vector<float>{0.02f, 0.03f, 0.04f, 0.06f, 0.08f, 0.12f}
                                       : std::vector<float>{0.002f, 0.005f, 0.01f, 0.02f})
      for (int p : {1, 3}) {
        auto r = adaptive(kind, th, p);
        std::fprintf(stderr, "%s\n", r.dump().c_str());
        out["adaptive"].push_back(r);
      }
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
