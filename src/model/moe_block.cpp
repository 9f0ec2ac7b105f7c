// Mixture-of-experts layers: routing, the routing hints for expert-streaming sources (the real
// experts of a layer, and a look-ahead guess for the next one), the routed experts and the
// shared expert. Ops: block_L.moe.router, block_L.moe.expert_E (selected ones, increasing E),
// block_L.moe.shared. When the backend routes and runs the routed experts itself (a source that
// holds every expert, Backend::RoutedExperts), no expert op is begun: nothing is fetched.
//
// Every per-pass buffer comes from the ledger-charged Scratch, so a decode step allocates
// nothing once the first one has grown the buffers.
#include "backend/expert_routing.h"
#include "model/blocks.h"
#include "model/expert_batch.h"
#include "model/op_id.h"

namespace substrate {
namespace {

// Router of layer `il` (weights `w`) applied to the residual stream: xn [n, d] receives the
// normed input, logits [n, E] the router's scores.
Status RouterLogits(ForwardContext& c, const LayerWeights& w, const Tensor& xn,
                    const Tensor& logits) {
  RETURN_IF_ERROR(NormRows(c, w.router_op, w.ffn_norm, c.x, xn));
  return Linear(c, w.router_op, w.gate_inp, xn, logits);
}

// The choice of layer `il` from its logits: sel/sel_w [n, K] (host). With cache-aware routing,
// experts the source holds get the bonus in their selection score.
Status Choose(ForwardContext& c, const LayerWeights& w, int il, const Tensor& logits, int32_t* sel,
              float* sel_w) {
  WeightHandle bias;
  if (w.exp_probs_b != kNoTensor) {
    ASSIGN_OR_RETURN(bias, c.Acquire(w.exp_probs_b, w.router_op));
  }
  RoutingParams p = c.hp->routing();
  if (c.cached_bonus != 0) {
    ASSIGN_OR_RETURN(uint8_t * cached,
                     c.scratch->Host<uint8_t>(Scratch::kCachedExperts, p.n_expert));
    if (c.source->CachedExperts(il, cached)) {
      p.cached = cached;
      p.cached_bonus = c.cached_bonus;
    }
  }
  c.be->Route(logits, w.exp_probs_b != kNoTensor ? &bias.view() : nullptr, p, sel, sel_w);
  return Status::Ok();
}

// When the source holds every expert and nothing on the host needs the choice (an observer,
// cache-aware routing, calibration), the backend may route and run the routed experts itself
// (Backend::RoutedExperts): a GPU then never hands the choice to the host mid-pass. acc [n, d]
// receives their weighted sum. False when the backend declines.
Expected<bool> RoutedOnBackend(ForwardContext& c, const LayerWeights& w, const Tensor& xn,
                               const Tensor& logits, const Tensor& acc) {
  if (!c.source->ExpertsResident() || c.observer || c.cached_bonus != 0 ||
      c.source->ObservesInputs())
    return false;
  WeightHandle bias;
  if (w.exp_probs_b != kNoTensor) {
    ASSIGN_OR_RETURN(bias, c.Acquire(w.exp_probs_b, w.router_op));
  }
  // The whole stacks, at the tier of the layer's experts.
  ASSIGN_OR_RETURN(WeightHandle gate, c.Acquire(w.gate_exps, w.expert_op0));
  ASSIGN_OR_RETURN(WeightHandle up, c.Acquire(w.up_exps, w.expert_op0));
  ASSIGN_OR_RETURN(WeightHandle down, c.Acquire(w.down_exps, w.expert_op0));
  RoutedExpertsOp op;
  op.logits = logits;
  op.bias = w.exp_probs_b != kNoTensor ? &bias.view() : nullptr;
  op.routing = c.hp->routing();
  op.gate = &gate.view();
  op.up = &up.view();
  op.down = &down.view();
  op.xn = xn;
  op.acc = acc;
  return c.be->RoutedExperts(op);
}

// The look-ahead: layer `next`'s router applied to the hidden state entering this layer's MoE,
// hinted as a guess for `next` (WeightSource::HintExperts).
Status HintLookahead(ForwardContext& c, int next) {
  const ModelHParams& hp = *c.hp;
  const int64_t n = c.n;
  const int E = hp.n_expert, K = hp.n_expert_used;
  ASSIGN_OR_RETURN(Tensor xn, c.scratch->Get(Scratch::kLookNorm, n, hp.n_embd));
  ASSIGN_OR_RETURN(Tensor logits, c.scratch->Get(Scratch::kLookLogits, n, E));
  ASSIGN_OR_RETURN(int32_t* sel, c.scratch->Host<int32_t>(Scratch::kLookSel, n * K));
  ASSIGN_OR_RETURN(float* sel_w, c.scratch->Host<float>(Scratch::kLookSelWeight, n * K));
  ASSIGN_OR_RETURN(int32_t* list, c.scratch->Host<int32_t>(Scratch::kLookList, 2 * E));
  c.guessing = true;
  Status routed = RouterLogits(c, c.layers[next], xn, logits);
  if (routed.ok()) routed = Choose(c, c.layers[next], next, logits, sel, sel_w);
  c.guessing = false;
  RETURN_IF_ERROR(routed);
  const int m = UnionExperts(sel, n * K, E, list + E, list);
  c.source->HintExperts(next, list, m);
  return Status::Ok();
}

}  // namespace

Status MoeBlock(ForwardContext& c, int il, const LayerWeights& w) {
  const ModelHParams& hp = *c.hp;
  const int64_t d = hp.n_embd, n = c.n;
  const int E = hp.n_expert, K = hp.n_expert_used;
  ASSIGN_OR_RETURN(Tensor xn, c.scratch->Get(Scratch::kXNorm, n, d));
  ASSIGN_OR_RETURN(int32_t* sel, c.scratch->Host<int32_t>(Scratch::kSel, n * K));
  ASSIGN_OR_RETURN(float* sel_w, c.scratch->Host<float>(Scratch::kSelWeight, n * K));
  ExpertRoutingSpace space;
  ASSIGN_OR_RETURN(space.list, c.scratch->Host<int32_t>(Scratch::kExpertList, 2 * E));
  ASSIGN_OR_RETURN(space.offset, c.scratch->Host<int32_t>(Scratch::kExpertOffset, E + 1));
  ASSIGN_OR_RETURN(space.tokens, c.scratch->Host<int32_t>(Scratch::kExpertTokens, n * K));
  ASSIGN_OR_RETURN(space.weights, c.scratch->Host<float>(Scratch::kExpertTokWeight, n * K));
  ExpertRouting routing;
  ASSIGN_OR_RETURN(Tensor acc, c.scratch->Get(Scratch::kMoeAcc, n, d));
  bool on_backend = false;
  {
    OpScope scope(c, w.router_op);
    ASSIGN_OR_RETURN(Tensor logits, c.scratch->Get(Scratch::kRouter, n, E));
    RETURN_IF_ERROR(RouterLogits(c, w, xn, logits));
    RETURN_IF_ERROR(c.CheckFinite(logits, w.router_op));
    ASSIGN_OR_RETURN(on_backend, RoutedOnBackend(c, w, xn, logits, acc));
    if (!on_backend) {
      RETURN_IF_ERROR(Choose(c, w, il, logits, sel, sel_w));
      routing = GroupByExpert(sel, sel_w, n, K, E, space);
      if (c.observer)
        c.observer->BeforeExperts(w.expert_op0, sel + (n - 1) * K, sel_w + (n - 1) * K, K, xn);
      c.source->HintExperts(il, routing.experts, routing.n_experts);
      const int depth = c.layers ? c.source->LookaheadLayers() : 0;
      for (int next = il + 1; next <= il + depth && next < hp.n_layer; ++next)
        if (hp.is_moe_layer(next)) RETURN_IF_ERROR(HintLookahead(c, next));
    }
  }

  ASSIGN_OR_RETURN(Tensor out, c.scratch->Get(Scratch::kExpertOut, n, d));
  bool shared_done = false;
  if (on_backend) {
    // (the routed experts' output: named by the layer's first routed expert op)
    RETURN_IF_ERROR(c.CheckFinite(acc, w.expert_op0));
  } else {
    c.be->Fill(acc, 0.0f);
    RETURN_IF_ERROR(RunExperts(c, il, w, xn, routing, acc, out, &shared_done));
    RETURN_IF_ERROR(c.CheckFinite(acc, w.expert_op0 + routing.experts[0]));
  }
  if (shared_done) {
    RETURN_IF_ERROR(c.CheckFinite(out, w.shared_op));
    c.be->Add(acc, out);
  } else if (w.gate_shexp != kNoTensor) {
    OpScope scope(c, w.shared_op);
    RETURN_IF_ERROR(SwiGluMlp(c, w.shared_op, w.gate_shexp, w.up_shexp, w.down_shexp, xn, out));
    if (w.gate_inp_shexp != kNoTensor) {
      // qwen2moe: the shared expert's output is scaled by sigmoid(w . x) per token.
      ASSIGN_OR_RETURN(Tensor g, c.scratch->Get(Scratch::kVec, n, 1));
      RETURN_IF_ERROR(Linear(c, w.shared_op, w.gate_inp_shexp, xn, g));
      c.be->ScaleRowsBySigmoid(out, g);
    }
    RETURN_IF_ERROR(c.CheckFinite(out, w.shared_op));
    c.be->Add(acc, out);
  }
  c.be->Add(c.x, acc);
  return Status::Ok();
}

}  // namespace substrate
