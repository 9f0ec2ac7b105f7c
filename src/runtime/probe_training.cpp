#include "runtime/probe_training.h"

#include <cmath>
#include <random>

namespace substrate {
namespace {

// Copies every block's residual stream after it (all rows) during one pass.
class StreamRecorder : public PassObserver {
 public:
  explicit StreamRecorder(size_t n_ops) : before_(n_ops), after_(n_ops) {}
  void BeforeBlock(int op, const Tensor& x) override { Keep(before_[op], x); }
  void AfterBlock(int op, const Tensor& x) override { Keep(after_[op], x); }
  const std::vector<float>& before(int op) const { return before_[op]; }
  const std::vector<float>& after(int op) const { return after_[op]; }

 private:
  static void Keep(std::vector<float>& v, const Tensor& x) { v.assign(x.data, x.data + x.size()); }
  std::vector<std::vector<float>> before_, after_;
};

double Norm(const float* a, int64_t d) {
  double s = 0;
  for (int64_t i = 0; i < d; ++i) s += double(a[i]) * a[i];
  return std::sqrt(s);
}

double Dist(const float* a, const float* b, int64_t d) {
  double s = 0;
  for (int64_t i = 0; i < d; ++i) s += double(a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s);
}

// Solves (A + lambda I) w = b in place (A symmetric positive semi-definite, n x n) by Cholesky.
Status SolveRidge(std::vector<double> a, std::vector<double> b, int n, double lambda,
                  std::vector<double>* w) {
  for (int i = 0; i < n; ++i) a[static_cast<size_t>(i) * n + i] += lambda;
  for (int j = 0; j < n; ++j) {
    double d = a[static_cast<size_t>(j) * n + j];
    for (int k = 0; k < j; ++k) d -= a[static_cast<size_t>(j) * n + k] * a[static_cast<size_t>(j) * n + k];
    if (!(d > 0)) return Internal("probe training: the ridge system is not positive definite");
    d = std::sqrt(d);
    a[static_cast<size_t>(j) * n + j] = d;
    for (int i = j + 1; i < n; ++i) {
      double s = a[static_cast<size_t>(i) * n + j];
      for (int k = 0; k < j; ++k) s -= a[static_cast<size_t>(i) * n + k] * a[static_cast<size_t>(j) * n + k];
      a[static_cast<size_t>(i) * n + j] = s / d;
    }
  }
  for (int i = 0; i < n; ++i) {  // L y = b
    double s = b[i];
    for (int k = 0; k < i; ++k) s -= a[static_cast<size_t>(i) * n + k] * b[k];
    b[i] = s / a[static_cast<size_t>(i) * n + i];
  }
  for (int i = n - 1; i >= 0; --i) {  // L^T w = y
    double s = b[i];
    for (int k = i + 1; k < n; ++k) s -= a[static_cast<size_t>(k) * n + i] * b[k];
    b[i] = s / a[static_cast<size_t>(i) * n + i];
  }
  *w = std::move(b);
  return Status::Ok();
}

}  // namespace

Expected<LinearProbes> TrainProbes(Engine& e, const std::vector<int32_t>& tokens,
                                   const ProbeTrainingOptions& opt) {
  Model& m = e.model();
  const int top = e.weights().DefaultTier();
  if (top < 1 || e.weights().OpBytes(m.ops().front().id, top) == 0)
    return InvalidArgument("probe training compares tier 0 with the top tier: give a store "
                           "with residual tiers (--store)");
  const int64_t d = m.hparams().n_embd, ctx = opt.n_ctx;
  const int64_t n_chunks = std::min<int64_t>(opt.max_chunks, static_cast<int64_t>(tokens.size()) / ctx);
  if (n_chunks < 2) return InvalidArgument("probe training needs at least two chunks of text");
  const int64_t n_train = std::max<int64_t>(1, static_cast<int64_t>(n_chunks * (1 - opt.holdout)));
  // The features: x itself, or its projection on f fixed random +-1/sqrt(f) directions.
  const int f = d > opt.features ? opt.features : static_cast<int>(d);
  std::vector<float> proj;
  if (f < d) {
    std::mt19937 rng(1234);
    proj.resize(static_cast<size_t>(f * d));
    const float s = 1.0f / std::sqrt(static_cast<float>(f));
    for (float& p : proj) p = (rng() & 1) ? s : -s;
  }
  auto features = [&](const float* x, std::vector<double>& z) {
    z.assign(static_cast<size_t>(f) + 1, 1.0);  // last: the bias
    if (proj.empty()) {
      for (int64_t i = 0; i < d; ++i) z[i] = x[i];
      return;
    }
    for (int j = 0; j < f; ++j) {
      double s = 0;
      for (int64_t i = 0; i < d; ++i) s += double(proj[static_cast<size_t>(j) * d + i]) * x[i];
      z[j] = s;
    }
  };

  // The watched ops: blocks (what the observer reports).
  std::vector<int> blocks;
  for (const LayerWeights& w : m.layers())
    for (int op : {w.attn_op, w.ffn_op, w.router_op})
      if (op >= 0) blocks.push_back(op);
  const int n = f + 1;
  struct Acc {
    std::vector<double> xtx, xty;
    std::vector<std::pair<std::vector<double>, double>> held;  // held-out (features, target)
    int64_t count = 0;
  };
  std::vector<Acc> acc(m.ops().size());
  for (int op : blocks) {
    acc[op].xtx.assign(static_cast<size_t>(n) * n, 0.0);
    acc[op].xty.assign(static_cast<size_t>(n), 0.0);
  }

  StreamRecorder low(m.ops().size()), high(m.ops().size());
  const std::vector<uint8_t> saved = m.op_tiers();
  std::vector<float> logits;
  std::vector<double> z;
  Status st;
  for (int64_t c = 0; c < n_chunks && st.ok(); ++c) {
    const int32_t* chunk = tokens.data() + c * ctx;
    for (int pass = 0; pass < 2 && st.ok(); ++pass) {
      std::fill(m.op_tiers().begin(), m.op_tiers().end(), static_cast<uint8_t>(pass ? top : 0));
      m.set_observer(pass ? &high : &low);
      auto cache = KvCache::Create(m.hparams(), ctx, m.backend());
      if (!cache.ok()) {
        st = cache.status();
        break;
      }
      st = m.Forward(chunk, ctx, *cache, false, &logits);
    }
    m.set_observer(nullptr);
    for (int op : blocks) {
      Acc& a = acc[op];
      for (int64_t t = 0; t < ctx && st.ok(); ++t) {
        const float* x0a = low.after(op).data() + t * d;
        const float* x1a = high.after(op).data() + t * d;
        const float* x0b = low.before(op).data() + t * d;
        const float* x1b = high.before(op).data() + t * d;
        const double y = (Dist(x1a, x0a, d) - Dist(x1b, x0b, d)) / std::max(Norm(x0a, d), 1e-12);
        features(x0a, z);
        if (c < n_train) {
          for (int i = 0; i < n; ++i) {
            a.xty[i] += z[i] * y;
            for (int j = 0; j <= i; ++j) a.xtx[static_cast<size_t>(i) * n + j] += z[i] * z[j];
          }
          ++a.count;
        } else {
          a.held.emplace_back(z, y);
        }
      }
    }
  }
  m.op_tiers() = saved;
  RETURN_IF_ERROR(st);

  LinearProbes out;
  out.target = "marginal relative L2 drift of the residual stream across the block, top tier vs "
               "tier 0 (every op at that tier), predicted from the tier-0 stream after the block";
  for (int op : blocks) {
    Acc& a = acc[op];
    for (int i = 0; i < n; ++i)
      for (int j = i + 1; j < n; ++j) a.xtx[static_cast<size_t>(i) * n + j] = a.xtx[static_cast<size_t>(j) * n + i];
    double diag = 0;
    for (int i = 0; i < n; ++i) diag += a.xtx[static_cast<size_t>(i) * n + i];
    std::vector<double> w;
    RETURN_IF_ERROR(SolveRidge(a.xtx, a.xty, n, opt.ridge * diag / n + 1e-12, &w));
    LinearProbes::Probe p;
    p.n_train = a.count;
    p.b = static_cast<float>(w[f]);
    p.w.assign(static_cast<size_t>(d), 0.0f);
    if (proj.empty()) {
      for (int64_t i = 0; i < d; ++i) p.w[i] = static_cast<float>(w[i]);
    } else {  // back to the hidden space: w = P^T w_f
      for (int j = 0; j < f; ++j)
        for (int64_t i = 0; i < d; ++i) p.w[i] += static_cast<float>(w[j] * proj[static_cast<size_t>(j) * d + i]);
    }
    // Pearson correlation of prediction and target on the held-out chunks.
    double sp = 0, sy = 0, spp = 0, syy = 0, spy = 0;
    for (const auto& [zz, y] : a.held) {
      double pred = 0;
      for (int i = 0; i < n; ++i) pred += w[i] * zz[i];
      sp += pred, sy += y, spp += pred * pred, syy += y * y, spy += pred * y;
    }
    const double k = static_cast<double>(a.held.size());
    const double cov = spy / k - sp / k * sy / k;
    const double var = (spp / k - sp / k * sp / k) * (syy / k - sy / k * sy / k);
    p.heldout_corr = k > 1 && var > 0 ? cov / std::sqrt(var) : 0.0;
    out.ops[m.ops()[op].id] = std::move(p);
  }
  return out;
}

}  // namespace substrate
