// Greedy rate-distortion fill. Every check is recomputed from the full state (no running sums
// that drift), so the same request always walks the same path: a relax option computed from
// one fill is met exactly when the fill runs again under it.
#include "compiler/fill.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>
#include <set>

namespace substrate::compiler {
namespace {

double LossOf(const ModelProfile& p, const std::vector<int>& choice) {
  double q = 0;
  for (size_t i = 0; i < p.ops.size(); ++i) q += p.ops[i].options[choice[i]].quality_loss;
  return q;
}

// Streamed skeleton bytes alive while op p runs: its own and the next op's (being prefetched).
class StreamWindow {
 public:
  explicit StreamWindow(size_t n) : s_(n + 1, 0), pair_(n, 0) {
    for (size_t i = 0; i < n; ++i) sums_.insert(0);
  }
  void Set(size_t i, uint64_t bytes) {
    s_[i] = bytes;
    if (i > 0) Refresh(i - 1);
    if (i < pair_.size()) Refresh(i);
  }
  uint64_t Max() const { return sums_.empty() ? 0 : *sums_.rbegin(); }

 private:
  void Refresh(size_t p) {
    sums_.erase(sums_.find(pair_[p]));
    pair_[p] = s_[p] + s_[p + 1];
    sums_.insert(pair_[p]);
  }
  std::vector<uint64_t> s_, pair_;
  std::multiset<uint64_t> sums_;
};

struct Candidate {
  double ratio;
  size_t op;
  int target;
  uint64_t version;
  bool operator<(const Candidate& o) const {
    return ratio != o.ratio ? ratio < o.ratio : op > o.op;  // ties: earlier op first
  }
};

}  // namespace

double SecondsPerToken(const ModelProfile& profile, const Budget& budget,
                       const std::vector<int>& choice, const std::vector<bool>& streamed) {
  const size_t n = profile.ops.size();
  auto read_time = [&](size_t i, double bw) {
    const OpProfile& op = profile.ops[i];
    double bytes = op.activation_prob * static_cast<double>(op.options[choice[i]].bytes);
    if (bytes == 0) return 0.0;
    return bw > 0 ? bytes / bw : std::numeric_limits<double>::infinity();
  };
  double t = (n > 0 && streamed[0]) ? read_time(0, budget.ssd_read_bw) : 0.0;
  for (size_t i = 0; i < n; ++i) {
    double mem = budget.memory_read_bw > 0 ? read_time(i, budget.memory_read_bw) : 0.0;
    double ssd = (i + 1 < n && streamed[i + 1]) ? read_time(i + 1, budget.ssd_read_bw) : 0.0;
    t += std::max(mem, ssd);
  }
  return t;
}

FillResult RunFill(const ModelProfile& profile, const Budget& budget) {
  const size_t n = profile.ops.size();
  FillResult r;
  r.choice.assign(n, 0);
  r.streamed.assign(n, false);
  auto bytes = [&](size_t i, int c) { return profile.ops[i].options[c].bytes; };

  // 1. Skeleton: all cheapest, all resident; stream the least-used ops until it fits.
  r.resident_bytes = profile.overhead_bytes;
  for (size_t i = 0; i < n; ++i) r.resident_bytes += bytes(i, 0);
  StreamWindow window(n);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const OpProfile &x = profile.ops[a], &y = profile.ops[b];
    if (x.activation_prob != y.activation_prob) return x.activation_prob < y.activation_prob;
    return x.options[0].bytes > y.options[0].bytes;
  });
  const uint64_t limit = budget.max_ram_bytes;
  for (size_t k = 0; k < n && r.resident_bytes + window.Max() > limit; ++k) {
    size_t i = order[k];
    r.streamed[i] = true;
    r.resident_bytes -= bytes(i, 0);
    window.Set(i, bytes(i, 0));
  }
  r.window_bytes = window.Max();
  r.memory_ok = r.peak() <= limit;
  r.quality_loss = LossOf(profile, r.choice);
  r.curve.emplace_back(r.peak(), r.quality_loss);

  // 2. Greedy upgrades by quality gained per byte, best first.
  const double target = budget.target_tokens_per_second;
  auto tps_ok = [&](const std::vector<int>& choice) {
    if (target <= 0) return true;
    double t = SecondsPerToken(profile, budget, choice, r.streamed);
    return t > 0 && 1.0 / t >= target;
  };
  if (r.memory_ok && tps_ok(r.choice)) {
    std::vector<int> max_index(n);
    std::vector<uint64_t> version(n, 0);
    for (size_t i = 0; i < n; ++i) max_index[i] = static_cast<int>(profile.ops[i].options.size()) - 1;
    std::priority_queue<Candidate> heap;
    auto push_best = [&](size_t i) {
      const OpProfile& op = profile.ops[i];
      const int c = r.choice[i];
      double best = -1;
      int best_target = -1;
      for (int t = c + 1; t <= max_index[i]; ++t) {
        double gain = op.options[c].quality_loss - op.options[t].quality_loss;
        double cost = static_cast<double>(op.options[t].bytes - op.options[c].bytes);
        double ratio = gain / std::max(cost, 1.0) * (1.0 + op.sensitivity);
        if (ratio > best) best = ratio, best_target = t;
      }
      if (best_target >= 0) heap.push({best, i, best_target, ++version[i]});
    };
    for (size_t i = 0; i < n; ++i) push_best(i);
    while (!heap.empty() && r.quality_loss > budget.quality_loss_cap) {
      Candidate c = heap.top();
      heap.pop();
      if (c.version != version[c.op]) continue;  // superseded
      const size_t i = c.op;
      const int from = r.choice[i];
      const uint64_t grow = bytes(i, c.target) - bytes(i, from);
      uint64_t resident = r.resident_bytes, win = r.window_bytes;
      if (r.streamed[i]) {
        window.Set(i, bytes(i, c.target));
        win = window.Max();
      } else {
        resident += grow;
      }
      r.choice[i] = c.target;
      if (resident + win > limit || !tps_ok(r.choice)) {
        // RAM only fills up and tokens/s only falls, so this jump never becomes possible;
        // a smaller one for the same op still may.
        r.choice[i] = from;
        if (r.streamed[i]) window.Set(i, bytes(i, from));
        max_index[i] = c.target - 1;
        push_best(i);
        continue;
      }
      r.resident_bytes = resident;
      r.window_bytes = win;
      r.quality_loss = LossOf(profile, r.choice);
      r.curve.emplace_back(r.peak(), r.quality_loss);
      push_best(i);
    }
  }
  r.seconds_per_token = SecondsPerToken(profile, budget, r.choice, r.streamed);
  for (size_t i = 0; i < n; ++i)
    if (r.streamed[i])
      r.ssd_bytes_per_token +=
          profile.ops[i].activation_prob * static_cast<double>(bytes(i, r.choice[i]));
  return r;
}

}  // namespace substrate::compiler
