#include "runtime/verifier.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "format/model_file.h"
#include "kernels/interleaved.h"
#include "quant/quant.h"

namespace substrate {

void VerifierProbe::Observe(int op, float disagreement) {
  seen_[op] = stamp_;
  controller_->Observe(op, disagreement);
}

void VerifierProbe::NextToken() {
  TokenDone();
  // Calm observations neither escalate nor demote (EndToken decays): escalated() stays as is.
  for (int op : controller_->escalated())
    if (seen_[op] != stamp_) controller_->Observe(op, 0.0f);
  ++stamp_;
}

ScriptedVerifier::ScriptedVerifier(TierController* c, std::map<int, std::vector<float>> schedule)
    : VerifierProbe(c), schedule_(std::move(schedule)) {
  routed_.reserve(static_cast<size_t>(c->n_ops()));
}

float ScriptedVerifier::At(int op) const {
  const std::vector<float>& s = schedule_.at(op);
  return token_ < s.size() ? s[token_] : 0.0f;
}

void ScriptedVerifier::AfterBlock(int op, const Tensor& x) {
  if (schedule_.count(op)) Observe(op, At(op));
}

void ScriptedVerifier::BeforeExperts(int expert_op0, const int32_t* experts,
                                     const float* weights, int k, const Tensor& xn) {
  for (int i = 0; i < k; ++i)
    if (schedule_.count(expert_op0 + experts[i])) routed_.push_back(expert_op0 + experts[i]);
}

void ScriptedVerifier::TokenDone() {
  for (int op : routed_) Observe(op, At(op));
  routed_.clear();
  ++token_;
}

// ---- linear probes ----

Expected<LinearProbes> LinearProbes::Load(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 1ull << 30));
  LinearProbes p;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (j.value("format", "") != "substrate-probes")
      return Corruption(path + ": not a probes file (format substrate-probes)");
    p.target = j.value("target", "");
    for (auto it = j.at("ops").begin(); it != j.at("ops").end(); ++it) {
      Probe pr;
      pr.w = it.value().at("w").get<std::vector<float>>();
      pr.b = it.value().at("b").get<float>();
      pr.heldout_corr = it.value().value("heldout_corr", 0.0);
      pr.n_train = it.value().value("n_train", int64_t{0});
      p.ops[it.key()] = std::move(pr);
    }
  } catch (const nlohmann::json::exception& e) {
    return Corruption(path + ": malformed probes: " + e.what());
  }
  return p;
}

Status LinearProbes::Save(const std::string& path) const {
  nlohmann::json j = {{"format", "substrate-probes"}, {"target", target}};
  for (const auto& [id, pr] : ops)
    j["ops"][id] = {{"w", pr.w}, {"b", pr.b}, {"heldout_corr", pr.heldout_corr},
                    {"n_train", pr.n_train}};
  return WriteFileAtomic(path, j.dump());
}

Expected<std::unique_ptr<LinearProbeVerifier>> LinearProbeVerifier::Create(
    TierController* c, const Model& m, const LinearProbes& probes) {
  std::unique_ptr<LinearProbeVerifier> v(new LinearProbeVerifier(c));
  v->probes_ = probes;
  v->by_op_.assign(m.ops().size(), nullptr);
  for (const auto& [id, pr] : v->probes_.ops) {
    const int op = m.OpIndex(id);
    if (op < 0) return InvalidArgument("probes for op '" + id + "', which this model lacks");
    if (static_cast<int64_t>(pr.w.size()) != m.hparams().n_embd)
      return InvalidArgument("probe of op '" + id + "' has " + std::to_string(pr.w.size()) +
                             " weights; the model's hidden size is " +
                             std::to_string(m.hparams().n_embd));
    v->by_op_[op] = &pr;
  }
  return v;
}

void LinearProbeVerifier::AfterBlock(int op, const Tensor& x) {
  const LinearProbes::Probe* p = by_op_[op];
  if (!p) return;
  const float* row = x.data + (x.rows - 1) * x.cols;
  double s = p->b;
  for (int64_t i = 0; i < x.cols; ++i) s += double(p->w[i]) * row[i];
  Observe(op, static_cast<float>(std::max(0.0, s)));
}

// ---- residual samples ----

namespace {

// Row r of a view's tier-0 bytes and, with `residuals`, the residual tiers added, as floats.
void RowOf(const WeightView& v, int64_t r, bool residuals, float* out, std::vector<float>& tmp) {
  const uint64_t row_bytes = *RowBytes(v.type, static_cast<uint64_t>(v.cols));
  if (v.layout == WeightLayout::kRows) {
    DequantizeRow(v.type, v.data + row_bytes * r, out, v.cols);
  } else {  // a skeleton the backend interleaved (residuals are always plain rows)
    std::vector<uint8_t> plain(row_bytes);
    DeinterleaveRow(v.layout, v.data, v.cols, r, plain.data());
    DequantizeRow(v.type, plain.data(), out, v.cols);
  }
  if (!residuals) return;
  tmp.resize(static_cast<size_t>(v.cols));
  for (int k = 0; k < v.n_residuals; ++k) {
    const DType t = v.residual_type[k];
    DequantizeRow(t, v.residual[k] + *RowBytes(t, static_cast<uint64_t>(v.cols)) * r, tmp.data(), v.cols);
    for (int64_t i = 0; i < v.cols; ++i) out[i] += tmp[i];
  }
}

}  // namespace

Expected<std::unique_ptr<ResidualSampleVerifier>> ResidualSampleVerifier::Create(
    TierController* c, Model& m, int top_tier, int rows, MemoryLedger* ledger, int expert_rows) {
  std::unique_ptr<ResidualSampleVerifier> v(new ResidualSampleVerifier(c));
  v->eps_ = m.hparams().norm_eps;
  const int64_t d = m.hparams().n_embd;
  v->by_op_.resize(m.ops().size());
  v->xn_.resize(static_cast<size_t>(d));
  WeightSource& src = *m.source();
  std::vector<uint8_t> saved = m.op_tiers();
  std::vector<float> tmp;
  uint64_t bytes = 0;
  // norm kNoTensor: the op's input is normed already (a routed expert's); slice: its expert.
  auto sample = [&](int op, TensorId norm, TensorId w, int n_rows, int slice) -> Status {
    if (op < 0 || w == kNoTensor || n_rows <= 0 || (norm == kNoTensor && slice < 0))
      return Status::Ok();
    // A streaming source reads what the op's tier asks for: ask for the top one meanwhile.
    m.op_tiers()[op] = static_cast<uint8_t>(top_tier);
    // An expert inside its op's window, as the forward pass acquires it: a streaming source
    // reads it into an expert slot, not into a buffer of its own per expert.
    const std::string& id = m.ops()[op].id;
    if (slice >= 0) src.BeginOp(id);
    struct End {
      WeightSource* s;
      const std::string& id;
      ~End() {
        if (s) s->EndOp(id);
      }
    } end{slice >= 0 ? &src : nullptr, id};
    WeightHandle nh;
    if (norm != kNoTensor) {
      ASSIGN_OR_RETURN(nh, src.Acquire(norm, -1, 0));
    }
    ASSIGN_OR_RETURN(WeightHandle wh, src.Acquire(w, slice, top_tier));
    const WeightView& wv = wh.view();
    if (wv.cols != d || wv.n_residuals == 0) return Status::Ok();
    auto s = std::make_unique<Sample>();
    if (norm != kNoTensor) {
      s->norm.resize(static_cast<size_t>(d));
      RowOf(nh.view(), 0, false, s->norm.data(), tmp);
    }
    const int n = static_cast<int>(std::min<int64_t>(n_rows, wv.rows));
    s->skeleton.resize(static_cast<size_t>(n * d));
    s->residual.resize(static_cast<size_t>(n * d));
    for (int i = 0; i < n; ++i) {
      const int64_t r = i * wv.rows / n;
      float* sk = s->skeleton.data() + i * d;
      float* re = s->residual.data() + i * d;
      RowOf(wv, r, false, sk, tmp);
      RowOf(wv, r, true, re, tmp);
      for (int64_t k = 0; k < d; ++k) re[k] -= sk[k];
    }
    bytes += (s->norm.size() + s->skeleton.size() + s->residual.size()) * sizeof(float);
    v->by_op_[op] = std::move(s);
    return Status::Ok();
  };
  Status st;
  for (const LayerWeights& w : m.layers()) {
    const TensorId attn_in = w.wq != kNoTensor ? w.wq : w.wq_a != kNoTensor ? w.wq_a : w.wkv_a;
    st = sample(w.attn_op, w.attn_norm, attn_in, rows, -1);
    if (st.ok()) st = sample(w.ffn_op, w.ffn_norm, w.ffn_gate, rows, -1);
    if (st.ok()) st = sample(w.router_op, w.ffn_norm, w.gate_shexp, rows, -1);
    for (int e = 0; st.ok() && w.expert_op0 >= 0 && e < m.hparams().n_expert; ++e)
      st = sample(w.expert_op0 + e, kNoTensor, w.gate_exps, expert_rows, e);
    if (!st.ok()) break;
  }
  m.op_tiers() = saved;
  RETURN_IF_ERROR(st);
  if (ledger) {
    ASSIGN_OR_RETURN(v->charge_, ledger->Charge("verifier", bytes));
  }
  return v;
}

void ResidualSampleVerifier::BeforeBlock(int op, const Tensor& x) {
  const Sample* s = by_op_[op].get();
  if (!s) return;
  const int64_t d = x.cols;
  const float* row = x.data + (x.rows - 1) * d;
  double ss = 0;
  for (int64_t i = 0; i < d; ++i) ss += double(row[i]) * row[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / d + eps_));
  for (int64_t i = 0; i < d; ++i) xn_[i] = row[i] * scale * s->norm[i];
  Observe(op, Ratio(*s, d));
}

void ResidualSampleVerifier::BeforeExperts(int expert_op0, const int32_t* experts,
                                           const float* weights, int k, const Tensor& xn) {
  const int64_t d = xn.cols;
  std::copy(xn.data + (xn.rows - 1) * d, xn.data + xn.rows * d, xn_.begin());
  for (int i = 0; i < k; ++i) {
    const int op = expert_op0 + experts[i];
    // The expert's share of the block's output is its gating weight: so is its share of the error.
    if (const Sample* s = by_op_[op].get()) Observe(op, weights[i] * Ratio(*s, d));
  }
}

float ResidualSampleVerifier::Ratio(const Sample& s, int64_t d) const {
  double num = 0, den = 0;
  const int64_t n = static_cast<int64_t>(s.skeleton.size()) / d;
  for (int64_t r = 0; r < n; ++r) {
    const float* sk = s.skeleton.data() + r * d;
    const float* re = s.residual.data() + r * d;
    double a = 0, b = 0;
    for (int64_t i = 0; i < d; ++i) {
      a += double(sk[i]) * xn_[i];
      b += double(re[i]) * xn_[i];
    }
    den += a * a;
    num += b * b;
  }
  return static_cast<float>(std::sqrt(num / (den + 1e-30)));
}

}  // namespace substrate
