// Mixture-of-experts layers: routing, the routing hints for expert-streaming sources (the real
// experts of a layer, and a look-ahead guess for the next one), the routed experts and the
// shared expert. Ops: block_L.moe.router, block_L.moe.expert_E (selected ones, increasing E),
// block_L.moe.shared.
//
// Every per-pass buffer comes from the ledger-charged Scratch, so a decode step allocates
// nothing once the first one has grown the buffers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "format/model_file.h"
#include "kernels/ops.h"
#include "model/blocks.h"
#include "model/expert_batch.h"
#include "model/op_id.h"

namespace substrate {
namespace {

// Index of the largest v[i] not yet taken, the lowest index among equals: the order a stable
// descending sort gives, without the sort's temporary buffer.
int ArgmaxFree(const float* v, const uint8_t* taken, int n) {
  int best = -1;
  for (int i = 0; i < n; ++i)
    if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
  return best;
}

// Per-thread routing work space, grown once.
struct RouteWork {
  std::vector<float> prob, choice, gscore;
  std::vector<uint8_t> taken, gtaken, keep;
  void Reserve(int E, int G) {
    if (prob.size() < static_cast<size_t>(E)) {
      prob.resize(E);
      choice.resize(E);
      taken.resize(E);
    }
    if (gscore.size() < static_cast<size_t>(G)) {
      gscore.resize(G);
      gtaken.resize(G);
      keep.resize(G);
    }
  }
};

// Routing of tokens [n] from router logits [n, E]: sel/sel_w [n, K].
void RouteTokens(const ModelHParams& hp, const float* logits, const float* bias, int64_t n,
                 int32_t* sel, float* sel_w) {
  const int E = hp.n_expert, K = hp.n_expert_used;
  for (int64_t t = 0; t < n; ++t) RouteToken(hp, logits + t * E, bias, sel + t * K, sel_w + t * K);
}

// The distinct experts of sel [count] in increasing order into `list`; returns how many.
// `mark` [E] is work space.
int UnionExperts(const int32_t* sel, int64_t count, int E, int32_t* mark, int32_t* list) {
  std::fill(mark, mark + E, 0);
  for (int64_t i = 0; i < count; ++i) mark[sel[i]] = 1;
  int n = 0;
  for (int e = 0; e < E; ++e)
    if (mark[e]) list[n++] = e;
  return n;
}

// Router of layer `il` applied to the residual stream x [n, d]: norm, logits, top-k.
// xn [n, d] receives the normed input; sel/sel_w [n, K] the choices.
Status Route(ForwardContext& c, const LayerWeights& w, float* xn, float* logits, float* bias,
             int32_t* sel, float* sel_w) {
  const ModelHParams& hp = *c.hp;
  const int64_t d = hp.n_embd, n = c.n;
  const int E = hp.n_expert;
  RETURN_IF_ERROR(NormRows(c, w.ffn_norm, c.x, d, n, xn));
  RETURN_IF_ERROR(Linear(c, w.gate_inp, xn, n, logits, d, E));
  if (w.exp_probs_b != kNoTensor) RETURN_IF_ERROR(LoadVector(c, w.exp_probs_b, E, bias));
  RouteTokens(hp, logits, w.exp_probs_b != kNoTensor ? bias : nullptr, n, sel, sel_w);
  return Status::Ok();
}

// The look-ahead: layer `next`'s router applied to the hidden state entering this layer's MoE,
// hinted as a guess for `next` (WeightSource::HintExperts).
Status HintLookahead(ForwardContext& c, int next) {
  const ModelHParams& hp = *c.hp;
  const int64_t d = hp.n_embd, n = c.n;
  const int E = hp.n_expert, K = hp.n_expert_used;
  ASSIGN_OR_RETURN(float* xn, c.scratch->Get(Scratch::kLookNorm, n * d));
  ASSIGN_OR_RETURN(float* logits, c.scratch->Get(Scratch::kLookLogits, n * E));
  ASSIGN_OR_RETURN(float* bias, c.scratch->Get(Scratch::kRouterBias, E));
  ASSIGN_OR_RETURN(int32_t* sel, c.scratch->GetAs<int32_t>(Scratch::kLookSel, n * K));
  ASSIGN_OR_RETURN(float* sel_w, c.scratch->Get(Scratch::kLookSelWeight, n * K));
  ASSIGN_OR_RETURN(int32_t* list, c.scratch->GetAs<int32_t>(Scratch::kLookList, 2 * E));
  RETURN_IF_ERROR(Route(c, c.layers[next], xn, logits, bias, sel, sel_w));
  const int m = UnionExperts(sel, n * K, E, list + E, list);
  c.source->HintExperts(next, list, m);
  return Status::Ok();
}

}  // namespace

void RouteToken(const ModelHParams& hp, const float* logits, const float* bias, int32_t* idx,
                float* weight) {
  const int E = hp.n_expert, K = hp.n_expert_used;
  const bool grouped = hp.n_expert_groups > 1 && hp.n_group_used < hp.n_expert_groups;
  thread_local RouteWork work;
  work.Reserve(E, grouped ? hp.n_expert_groups : 0);
  float* prob = work.prob.data();
  std::copy(logits, logits + E, prob);
  if (hp.gating == GatingFunc::kSigmoid) {
    for (int e = 0; e < E; ++e) prob[e] = Sigmoid(prob[e]);
  } else {
    Softmax(prob, E);
  }
  // Selection scores: deepseek-v3 adds its correction bias for choosing only.
  float* choice = work.choice.data();
  for (int e = 0; e < E; ++e) choice[e] = prob[e] + (bias ? bias[e] : 0.0f);
  if (grouped) {
    // Keep the best groups (v3: sum of each group's top two; v2: its max); others score 0,
    // as the reference implementation masks them.
    const int G = hp.n_expert_groups, per = E / G;
    for (int g = 0; g < G; ++g) {
      float m1 = -INFINITY, m2 = -INFINITY;
      for (int e = g * per; e < (g + 1) * per; ++e) {
        if (choice[e] > m1) {
          m2 = m1;
          m1 = choice[e];
        } else if (choice[e] > m2) {
          m2 = choice[e];
        }
      }
      work.gscore[g] = hp.gating == GatingFunc::kSigmoid ? m1 + (per > 1 ? m2 : 0.0f) : m1;
    }
    std::fill(work.gtaken.begin(), work.gtaken.begin() + G, 0);
    std::fill(work.keep.begin(), work.keep.begin() + G, 0);
    for (int i = 0; i < hp.n_group_used; ++i) {
      const int g = ArgmaxFree(work.gscore.data(), work.gtaken.data(), G);
      work.gtaken[g] = 1;
      work.keep[g] = 1;
    }
    for (int e = 0; e < E; ++e)
      if (!work.keep[e / per]) choice[e] = 0.0f;
  }
  uint8_t* taken = work.taken.data();
  std::fill(taken, taken + E, 0);
  double sum = 0;
  for (int k = 0; k < K; ++k) {
    const int e = ArgmaxFree(choice, taken, E);
    taken[e] = 1;
    idx[k] = e;
    weight[k] = prob[e];
    sum += weight[k];
  }
  if (hp.expert_weights_norm) {
    const float inv = static_cast<float>(1.0 / (sum + 1e-20));
    for (int k = 0; k < K; ++k) weight[k] *= inv;
  }
  for (int k = 0; k < K; ++k) weight[k] *= hp.expert_weights_scale;
}

Status MoeBlock(ForwardContext& c, int il, const LayerWeights& w) {
  const ModelHParams& hp = *c.hp;
  const int64_t d = hp.n_embd, n = c.n;
  const int E = hp.n_expert, K = hp.n_expert_used;
  ASSIGN_OR_RETURN(float* xn, c.scratch->Get(Scratch::kXNorm, n * d));
  ASSIGN_OR_RETURN(int32_t* sel, c.scratch->GetAs<int32_t>(Scratch::kSel, n * K));
  ASSIGN_OR_RETURN(float* sel_w, c.scratch->Get(Scratch::kSelWeight, n * K));
  // list [E] the selected experts, then [E] work space; offset [E + 1] into tokens/tok_w [n * K]:
  // the tokens of each expert (increasing) and their routing weights.
  ASSIGN_OR_RETURN(int32_t* list, c.scratch->GetAs<int32_t>(Scratch::kExpertList, 2 * E));
  ASSIGN_OR_RETURN(int32_t* offset, c.scratch->GetAs<int32_t>(Scratch::kExpertOffset, E + 1));
  ASSIGN_OR_RETURN(int32_t* tokens, c.scratch->GetAs<int32_t>(Scratch::kExpertTokens, n * K));
  ASSIGN_OR_RETURN(float* tok_w, c.scratch->Get(Scratch::kExpertTokWeight, n * K));
  int n_sel = 0;
  {
    OpScope op(c.source, OpIdMoeRouter(il));
    ASSIGN_OR_RETURN(float* logits, c.scratch->Get(Scratch::kRouter, n * E));
    ASSIGN_OR_RETURN(float* bias, c.scratch->Get(Scratch::kRouterBias, E));
    RETURN_IF_ERROR(Route(c, w, xn, logits, bias, sel, sel_w));
    n_sel = UnionExperts(sel, n * K, E, list + E, list);
    c.source->HintExperts(il, list, n_sel);
    if (c.layers && il + 1 < hp.n_layer && hp.is_moe_layer(il + 1) && c.source->WantsLookahead())
      RETURN_IF_ERROR(HintLookahead(c, il + 1));
  }
  // Counting sort of (token, weight) by expert; tokens stay in increasing order per expert.
  std::fill(offset, offset + E + 1, 0);
  for (int64_t i = 0; i < n * K; ++i) ++offset[sel[i] + 1];
  for (int e = 0; e < E; ++e) offset[e + 1] += offset[e];
  int32_t* fill = list + E;  // the work half of list: next free position per expert
  std::copy(offset, offset + E, fill);
  for (int64_t t = 0; t < n; ++t) {
    for (int k = 0; k < K; ++k) {
      const int32_t pos = fill[sel[t * K + k]]++;
      tokens[pos] = static_cast<int32_t>(t);
      tok_w[pos] = sel_w[t * K + k];
    }
  }

  ASSIGN_OR_RETURN(float* acc, c.scratch->Get(Scratch::kMoeAcc, n * d));
  std::fill(acc, acc + n * d, 0.0f);
  ASSIGN_OR_RETURN(float* out, c.scratch->Get(Scratch::kExpertOut, n * d));
  ExpertRouting routing{list, n_sel, offset, tokens, tok_w};
  bool shared_done = false;
  RETURN_IF_ERROR(RunExperts(c, il, w, xn, routing, acc, out, &shared_done));
  if (shared_done) {
    AddInPlace(acc, out, n * d);
  } else if (w.gate_shexp != kNoTensor) {
    OpScope op(c.source, OpIdMoeShared(il));
    RETURN_IF_ERROR(SwiGluMlp(c, w.gate_shexp, w.up_shexp, w.down_shexp, xn, n, out));
    if (w.gate_inp_shexp != kNoTensor) {
      // qwen2moe: the shared expert's output is scaled by sigmoid(w . x) per token.
      ASSIGN_OR_RETURN(float* g, c.scratch->Get(Scratch::kVec, n));
      RETURN_IF_ERROR(Linear(c, w.gate_inp_shexp, xn, n, g, d, 1));
      for (int64_t t = 0; t < n; ++t) {
        const float s = Sigmoid(g[t]);
        for (int64_t i = 0; i < d; ++i) out[t * d + i] *= s;
      }
    }
    AddInPlace(acc, out, n * d);
  }
  AddInPlace(c.x, acc, n * d);
  return Status::Ok();
}

}  // namespace substrate
