// Routed experts. Prefill (many tokens per expert) runs expert after expert, each product a GEMM
// split over the pool. Decode (a few tokens) runs all selected experts of the layer together
// through MatMulBatch: one batch of every gate and up product (and the shared expert's), one of
// every down product, instead of three pool dispatches and three activation quantizations per
// expert. MatMulBatch gives each product MatMul's bits, so both paths give the same results.
//
// Ops: every selected expert's op is begun, in increasing expert order, and its tensors
// acquired inside it, before any expert computes; the ops end, in the same order, after all
// have computed. So a streaming source sees every read of the layer's experts up front (it can
// issue them together) and may free them at the first EndOp. The exception: when a streaming
// source says some experts' reads are still in flight (WeightSource::ExpertsReady), the ready
// ones and the shared expert are begun and computed first, the late ones after.
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

// The rows of a batched decode step: rows p of the gathered input, gate, up and output belong
// to expert slot p's token (tokens[p0 + p]); expert e's rows start at offset[e] - p0.
struct BatchRows {
  Tensor xn, xg, g, u, out;  // xn: the tokens themselves (the shared expert's input)
  Tensor gs, us, sg;         // the shared expert's gate, up and sigmoid gate
  const Tensor* shared_out = nullptr;
  int64_t p0 = 0;
};

// Experts r.experts[i] for i in `which` (and the shared expert, when `with_shared`): their ops
// begun and tensors acquired (a streaming source waits here for reads still in flight), then
// one batch of every gate and up product, SwiGLU, and one batch of every down product.
Status RunGroup(ForwardContext& c, const LayerWeights& w, const ExpertRouting& r,
                const std::vector<int>& which, bool with_shared, const BatchRows& b,
                OpenExperts& open) {
  const int64_t d = c.hp->n_embd;
  const int64_t ff = static_cast<int64_t>(c.source->Info(w.gate_exps).ne[1]);
  const bool shared_gate = with_shared && w.gate_inp_shexp != kNoTensor;
  std::vector<WeightHandle>& h = OpenExperts::handles;
  const size_t h0 = h.size();
  for (int i : which) {
    const int e = r.experts[i];
    open.Begin(w.expert_op0 + e);
    for (TensorId id : {w.gate_exps, w.up_exps, w.down_exps}) {
      ASSIGN_OR_RETURN(WeightHandle hd, c.Acquire(id, w.expert_op0 + e, e));
      h.push_back(std::move(hd));
    }
    const size_t k = h.size() - 3;
    RETURN_IF_ERROR(CheckShape(c, w.gate_exps, h[k].view(), d, ff));
    RETURN_IF_ERROR(CheckShape(c, w.up_exps, h[k + 1].view(), d, ff));
    RETURN_IF_ERROR(CheckShape(c, w.down_exps, h[k + 2].view(), ff, d));
  }
  // The shared expert in its own op, after the group's routed ones (topological order).
  const size_t hs = h.size();  // its handles: gate, up, down, [sigmoid gate]
  int64_t ffs = 0;
  if (with_shared) {
    ffs = static_cast<int64_t>(c.source->Info(w.gate_shexp).ne[1]);
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

  // Grow-once op lists.
  Backend& be = *c.be;
  thread_local std::vector<MatMulOp> up_ops, down_ops;
  up_ops.clear();
  down_ops.clear();
  for (size_t j = 0; j < which.size(); ++j) {
    const int e = r.experts[which[j]];
    const int64_t row0 = r.offset[e] - b.p0, m = r.offset[e + 1] - r.offset[e];
    const size_t k = h0 + 3 * j;
    up_ops.push_back({&h[k].view(), b.xg.Rows(row0, m), b.g.Rows(row0, m)});
    up_ops.push_back({&h[k + 1].view(), b.xg.Rows(row0, m), b.u.Rows(row0, m)});
    down_ops.push_back({&h[k + 2].view(), b.g.Rows(row0, m), b.out.Rows(row0, m)});
  }
  if (with_shared) {
    up_ops.push_back({&h[hs].view(), b.xn, b.gs});
    up_ops.push_back({&h[hs + 1].view(), b.xn, b.us});
    if (shared_gate) up_ops.push_back({&h[hs + 3].view(), b.xn, b.sg});
    down_ops.push_back({&h[hs + 2].view(), b.gs, *b.shared_out});
  }
  be.MatMulBatch(up_ops.data(), static_cast<int>(up_ops.size()));
  if (static_cast<int>(which.size()) == r.n_experts) {
    be.SwiGlu(b.g, b.u, b.g);
  } else {  // element-wise: a group's rows alone give the same bits
    for (int i : which) {
      const int e = r.experts[i];
      const int64_t row0 = r.offset[e] - b.p0, m = r.offset[e + 1] - r.offset[e];
      be.SwiGlu(b.g.Rows(row0, m), b.u.Rows(row0, m), b.g.Rows(row0, m));
    }
  }
  if (with_shared) be.SwiGlu(b.gs, b.us, b.gs);
  be.MatMulBatch(down_ops.data(), static_cast<int>(down_ops.size()));
  // qwen2moe: the shared expert's output is scaled by sigmoid(w . x) per token.
  if (shared_gate) be.ScaleRowsBySigmoid(*b.shared_out, b.sg);
  return Status::Ok();
}

Status RunBatched(ForwardContext& c, int il, const LayerWeights& w, const Tensor& xn,
                  const ExpertRouting& r, const Tensor& acc, const Tensor* shared_out) {
  const int64_t d = c.hp->n_embd, n = c.n;
  const int ne = r.n_experts;
  const int64_t ff = static_cast<int64_t>(c.source->Info(w.gate_exps).ne[1]);
  const bool shared = shared_out != nullptr;
  const int64_t ffs = shared ? static_cast<int64_t>(c.source->Info(w.gate_shexp).ne[1]) : 0;
  OpenExperts open(c);
  OpenExperts::handles.reserve(static_cast<size_t>(3 * c.hp->n_expert + 4));

  BatchRows b;
  b.xn = xn;
  b.shared_out = shared_out;
  b.p0 = r.offset[r.experts[0]];
  const int64_t total = r.offset[r.experts[ne - 1] + 1] - b.p0;
  ASSIGN_OR_RETURN(b.xg, c.scratch->Get(Scratch::kGathered, total, d));
  ASSIGN_OR_RETURN(b.gs, c.scratch->Get(Scratch::kSharedGate, n, std::max<int64_t>(1, ffs)));
  ASSIGN_OR_RETURN(b.us, c.scratch->Get(Scratch::kSharedUp, n, std::max<int64_t>(1, ffs)));
  ASSIGN_OR_RETURN(b.sg, c.scratch->Get(Scratch::kVec, n, 1));
  ASSIGN_OR_RETURN(b.g, c.scratch->Get(Scratch::kGate, total, ff));
  ASSIGN_OR_RETURN(b.u, c.scratch->Get(Scratch::kUp, total, ff));
  ASSIGN_OR_RETURN(b.out, c.scratch->Get(Scratch::kExpertHidden, total, d));
  c.be->GatherRows(xn, r.tokens + b.p0, total, b.xg);

  // Experts whose reads are still in flight go last: the ready ones and the shared expert
  // compute meanwhile (two groups, each with its two batches). Each product's bits do not
  // depend on its batch, so the split changes no result.
  thread_local std::vector<uint8_t> ready;
  thread_local std::vector<int> now, later;
  ready.assign(static_cast<size_t>(ne), 1);
  now.clear();
  later.clear();
  c.source->ExpertsReady(il, r.experts, ne, ready.data());
  for (int i = 0; i < ne; ++i) (ready[static_cast<size_t>(i)] ? now : later).push_back(i);
  if (!now.empty() || shared) RETURN_IF_ERROR(RunGroup(c, w, r, now, shared, b, open));
  if (!later.empty()) RETURN_IF_ERROR(RunGroup(c, w, r, later, false, b, open));

  // Weighted sum in expert order, as the expert-by-expert path adds.
  c.be->ScatterAddRows(b.out, r.tokens + b.p0, r.weights + b.p0, total, acc);
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
  if (r.n_experts > 0 && c.n <= g_batched_max_tokens && !c.source->ObservesInputs()) {
    const bool shared = w.gate_shexp != kNoTensor;
    RETURN_IF_ERROR(RunBatched(c, il, w, xn, r, acc, shared ? &shared_out : nullptr));
    *shared_done = shared;
    return Status::Ok();
  }
  return RunOneByOne(c, il, w, xn, r, acc);
}

}  // namespace substrate
