// Routed experts. Prefill (many tokens per expert) runs expert after expert, each product a GEMM
// split over the pool. Decode (a few tokens) runs all selected experts of the layer together
// through MatMulBatch: one batch of every gate and up product (and the shared expert's), one of
// every down product, instead of three pool dispatches and three activation quantizations per
// expert. MatMulBatch gives each product MatMul's bits, so both paths give the same results.
//
// Ops: every selected expert's op is begun, in increasing expert order, and its tensors
// acquired inside it, before any expert computes; the ops end, in the same order, after all
// have computed. So a streaming source sees every read of the layer's experts up front (it can
// issue them together) and may free them at the first EndOp.
#include "model/expert_batch.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "format/model_file.h"
#include "model/op_id.h"

namespace substrate {
namespace {

// Passes with at most this many tokens run the experts together (decode, short verify
// windows); larger ones are GEMMs that each fill the pool on their own.
// SUBSTRATE_MOE_BATCH_TOKENS overrides it (0: never batch), for A/B benchmarks.
int64_t InitialBatchedMaxTokens() {
  const char* v = std::getenv("SUBSTRATE_MOE_BATCH_TOKENS");
  return v ? std::strtoll(v, nullptr, 10) : 4;
}
int64_t g_batched_max_tokens = InitialBatchedMaxTokens();

Status CheckShape(ForwardContext& c, TensorId id, const WeightView& v, int64_t in, int64_t out) {
  if (v.cols == in && v.rows == out) return Status::Ok();
  return Corruption("tensor '" + c.source->Info(id).name + "' expert slice is [" +
                    std::to_string(v.rows) + " x " + std::to_string(v.cols) + "], expected [" +
                    std::to_string(out) + " x " + std::to_string(in) + "]");
}

// The selected experts' ops stay open, and their handles held, until the batch is done; the
// destructor releases the handles, then ends the ops in the order they began (also on errors).
// Storage is per thread and grows once (a forward pass runs on one thread).
class OpenExperts {
 public:
  explicit OpenExperts(const ForwardContext& c) : c_(c) {
    handles.clear();
    begun.clear();
  }
  ~OpenExperts() {
    handles.clear();
    for (int op : begun) c_.source->EndOp(c_.op_id(op));
    begun.clear();
  }
  OpenExperts(const OpenExperts&) = delete;
  OpenExperts& operator=(const OpenExperts&) = delete;
  void Begin(int op) {
    c_.source->BeginOp(c_.op_id(op));
    begun.push_back(op);
  }

  static thread_local std::vector<WeightHandle> handles;

 private:
  static thread_local std::vector<int> begun;
  const ForwardContext& c_;
};
thread_local std::vector<WeightHandle> OpenExperts::handles;
thread_local std::vector<int> OpenExperts::begun;

Status RunBatched(ForwardContext& c, int il, const LayerWeights& w, const Tensor& xn,
                  const ExpertRouting& r, const Tensor& acc, const Tensor* shared_out) {
  const int64_t d = c.hp->n_embd, n = c.n;
  Backend& be = *c.be;
  const int ne = r.n_experts;
  const int64_t ff = static_cast<int64_t>(c.source->Info(w.gate_exps).ne[1]);
  const bool shared = shared_out != nullptr;
  const bool shared_gate = shared && w.gate_inp_shexp != kNoTensor;
  const int64_t ffs = shared ? static_cast<int64_t>(c.source->Info(w.gate_shexp).ne[1]) : 0;
  OpenExperts open(c);
  std::vector<WeightHandle>& h = OpenExperts::handles;
  h.reserve(static_cast<size_t>(3 * c.hp->n_expert + 4));
  for (int i = 0; i < ne; ++i) {
    const int e = r.experts[i];
    open.Begin(w.expert_op0 + e);
    for (TensorId id : {w.gate_exps, w.up_exps, w.down_exps}) {
      ASSIGN_OR_RETURN(WeightHandle hd, c.Acquire(id, w.expert_op0 + e, e));
      h.push_back(std::move(hd));
    }
    RETURN_IF_ERROR(CheckShape(c, w.gate_exps, h[3 * i].view(), d, ff));
    RETURN_IF_ERROR(CheckShape(c, w.up_exps, h[3 * i + 1].view(), d, ff));
    RETURN_IF_ERROR(CheckShape(c, w.down_exps, h[3 * i + 2].view(), ff, d));
  }
  // The shared expert joins the batch in its own op, after the routed ones (topological order).
  const size_t hs = h.size();  // its handles: gate, up, down, [sigmoid gate]
  if (shared) {
    open.Begin(w.shared_op);
    for (TensorId id : {w.gate_shexp, w.up_shexp, w.down_shexp, w.gate_inp_shexp}) {
      if (id == kNoTensor) continue;
      ASSIGN_OR_RETURN(WeightHandle hd, c.Acquire(id, w.shared_op));
      h.push_back(std::move(hd));
    }
    RETURN_IF_ERROR(CheckShape(c, w.gate_shexp, h[hs].view(), d, ffs));
    RETURN_IF_ERROR(CheckShape(c, w.up_shexp, h[hs + 1].view(), d, ffs));
    RETURN_IF_ERROR(CheckShape(c, w.down_shexp, h[hs + 2].view(), ffs, d));
    if (shared_gate) RETURN_IF_ERROR(CheckShape(c, w.gate_inp_shexp, h[hs + 3].view(), d, 1));
  }

  // Rows p of the gathered input / hidden / output belong to expert slot p's token
  // (tokens[p0 + p]); expert i's rows start at offset[experts[i]] - p0.
  const int64_t total = r.offset[r.experts[ne - 1] + 1] - r.offset[r.experts[0]];
  const int64_t p0 = r.offset[r.experts[0]];
  ASSIGN_OR_RETURN(Tensor xg, c.scratch->Get(Scratch::kGathered, total, d));
  ASSIGN_OR_RETURN(Tensor gs, c.scratch->Get(Scratch::kSharedGate, n, std::max<int64_t>(1, ffs)));
  ASSIGN_OR_RETURN(Tensor us, c.scratch->Get(Scratch::kSharedUp, n, std::max<int64_t>(1, ffs)));
  ASSIGN_OR_RETURN(Tensor sg, c.scratch->Get(Scratch::kVec, n, 1));
  ASSIGN_OR_RETURN(Tensor g, c.scratch->Get(Scratch::kGate, total, ff));
  ASSIGN_OR_RETURN(Tensor u, c.scratch->Get(Scratch::kUp, total, ff));
  ASSIGN_OR_RETURN(Tensor out, c.scratch->Get(Scratch::kExpertHidden, total, d));
  be.GatherRows(xn, r.tokens + p0, total, xg);

  // Gate and up of every expert (the shared one reads the tokens themselves, with its sigmoid
  // gate), then every down: two batches. Grow-once op lists.
  thread_local std::vector<MatMulOp> up_ops, down_ops;
  up_ops.clear();
  down_ops.clear();
  for (int i = 0; i < ne; ++i) {
    const int e = r.experts[i];
    const int64_t row0 = r.offset[e] - p0, m = r.offset[e + 1] - r.offset[e];
    up_ops.push_back({&h[3 * i].view(), xg.Rows(row0, m), g.Rows(row0, m)});
    up_ops.push_back({&h[3 * i + 1].view(), xg.Rows(row0, m), u.Rows(row0, m)});
    down_ops.push_back({&h[3 * i + 2].view(), g.Rows(row0, m), out.Rows(row0, m)});
  }
  if (shared) {
    up_ops.push_back({&h[hs].view(), xn, gs});
    up_ops.push_back({&h[hs + 1].view(), xn, us});
    if (shared_gate) up_ops.push_back({&h[hs + 3].view(), xn, sg});
    down_ops.push_back({&h[hs + 2].view(), gs, *shared_out});
  }
  be.MatMulBatch(up_ops.data(), static_cast<int>(up_ops.size()));
  be.SwiGlu(g, u, g);
  if (shared) be.SwiGlu(gs, us, gs);
  be.MatMulBatch(down_ops.data(), static_cast<int>(down_ops.size()));
  // qwen2moe: the shared expert's output is scaled by sigmoid(w . x) per token.
  if (shared_gate) be.ScaleRowsBySigmoid(*shared_out, sg);

  // Weighted sum in expert order, as the expert-by-expert path adds.
  be.ScatterAddRows(out, r.tokens + p0, r.weights + p0, total, acc);
  return Status::Ok();
}

Status RunOneByOne(ForwardContext& c, int il, const LayerWeights& w, const Tensor& xn,
                   const ExpertRouting& r, const Tensor& acc) {
  const int64_t d = c.hp->n_embd, n = c.n;
  ASSIGN_OR_RETURN(Tensor xg_all, c.scratch->Get(Scratch::kGathered, n, d));
  ASSIGN_OR_RETURN(Tensor out_all, c.scratch->Get(Scratch::kExpertOut, n, d));
  for (int i = 0; i < r.n_experts; ++i) {
    const int e = r.experts[i];
    const int32_t* toks = r.tokens + r.offset[e];
    const float* wts = r.weights + r.offset[e];
    const int64_t m = r.offset[e + 1] - r.offset[e];
    OpScope scope(c, w.expert_op0 + e);
    const Tensor xg = xg_all.Rows(0, m), out = out_all.Rows(0, m);
    c.be->GatherRows(xn, toks, m, xg);
    RETURN_IF_ERROR(
        SwiGluMlp(c, w.expert_op0 + e, w.gate_exps, w.up_exps, w.down_exps, xg, out, e));
    c.be->ScatterAddRows(out, toks, wts, m, acc);
  }
  return Status::Ok();
}

}  // namespace

int64_t SetBatchedExpertMaxTokens(int64_t n) { return std::exchange(g_batched_max_tokens, n); }

Status RunExperts(ForwardContext& c, int il, const LayerWeights& w, const Tensor& xn,
                  const ExpertRouting& r, const Tensor& acc, const Tensor& shared_out,
                  bool* shared_done) {
  *shared_done = false;
  if (r.n_experts > 0 && c.n <= g_batched_max_tokens) {
    const bool shared = w.gate_shexp != kNoTensor;
    RETURN_IF_ERROR(RunBatched(c, il, w, xn, r, acc, shared ? &shared_out : nullptr));
    *shared_done = shared;
    return Status::Ok();
  }
  return RunOneByOne(c, il, w, xn, r, acc);
}

}  // namespace substrate
