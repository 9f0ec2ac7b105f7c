// Shared building blocks of the forward pass (attention, MLA, dense FFN, MoE), used by the
// per-family layer functions in arch_*.cpp. Every weight is reached through the WeightSource
// between BeginOp/EndOp of the op that owns it (see op_id.h).
//
// Shapes in comments are row-major [rows, cols]: n = tokens in this pass, d = n_embd.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/thread_pool.h"
#include "model/hparams.h"
#include "model/kv_cache.h"
#include "model/layer_weights.h"
#include "model/weight_source.h"

namespace substrate {

// Grow-only float buffers charged to the ledger account "scratch": a decode step after the
// first allocates nothing.
class Scratch {
 public:
  enum Slot {
    kX, kXNorm, kQ, kAttnOut, kTmp, kGate, kUp, kLatentQ, kLatentKv, kLatentNorm, kKvB,
    kRouter, kGathered, kExpertOut, kMoeAcc, kVec, kLogits,
    // MoE bookkeeping (routing, per-expert token lists, look-ahead, batched experts).
    kSel, kSelWeight, kExpertList, kExpertOffset, kExpertTokens, kExpertTokWeight, kRouterBias,
    kLookNorm, kLookLogits, kLookSel, kLookSelWeight, kLookList, kExpertHidden, kSharedGate,
    kSharedUp, kSlotCount
  };
  explicit Scratch(MemoryLedger* ledger) : ledger_(ledger) {}
  // At least n floats for `slot` (contents kept only if no growth happens).
  Expected<float*> Get(Slot slot, int64_t n) { return GetAs<float>(slot, n); }
  // At least n elements of T (trivial, alignment <= 64) for `slot`, same rules.
  template <typename T>
  Expected<T*> GetAs(Slot slot, int64_t n) {
    ASSIGN_OR_RETURN(void* p, GetBytes(slot, static_cast<size_t>(n) * sizeof(T)));
    return static_cast<T*>(p);
  }
  Expected<void*> GetBytes(Slot slot, size_t bytes);

 private:
  MemoryLedger* ledger_;
  AlignedBuffer bufs_[kSlotCount];
};

struct ForwardContext {
  const ModelHParams* hp = nullptr;
  WeightSource* source = nullptr;
  ThreadPool* pool = nullptr;
  KvCache* cache = nullptr;
  Scratch* scratch = nullptr;
  int64_t n = 0;               // tokens in this pass
  int64_t pos0 = 0;            // position of the first one (= cache->n_past() before the pass)
  const int32_t* pos = nullptr;  // [n] positions
  float* x = nullptr;          // [n, d] the residual stream
  std::vector<float>* vec = nullptr;  // small per-op vectors (norm weights, biases)
  const LayerWeights* layers = nullptr;  // every layer's ids (the router look-ahead needs L+1's)
};

// BeginOp/EndOp around one op, so an early error return still closes it.
class OpScope {
 public:
  OpScope(WeightSource* s, std::string id) : s_(s), id_(std::move(id)) { s_->BeginOp(id_); }
  ~OpScope() { s_->EndOp(id_); }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  WeightSource* s_;
  std::string id_;
};

// y = W x (+ bias) through the source; W's shape must be [rows = out, cols = in].
Status Linear(ForwardContext& c, TensorId w, const float* x, int64_t n, float* y,
              int64_t expect_in, int64_t expect_out, int slice = -1);
// Dequantizes a 1-D tensor of `n` elements into dst.
Status LoadVector(ForwardContext& c, TensorId id, int64_t n, float* dst);
// y = RmsNorm(x) * w over rows of width `width` (w from the source).
Status NormRows(ForwardContext& c, TensorId w, const float* x, int64_t width, int64_t rows,
                float* y);

// Standard multi-head attention (llama, qwen): norm, q/k/v (+bias), optional QK-norm, RoPE,
// causal attention over the KV cache, output projection, residual add. One op: block_N.attn.
Status AttentionBlock(ForwardContext& c, int il, const LayerWeights& w);
// DeepSeek multi-head latent attention, same contract.
Status MlaBlock(ForwardContext& c, int il, const LayerWeights& w);
// Dense SwiGLU FFN with pre-norm and residual add (op block_N.ffn).
Status FfnBlock(ForwardContext& c, int il, const LayerWeights& w);
// Router, routed experts, shared expert, residual add (ops block_N.moe.*; moe_block.cpp).
Status MoeBlock(ForwardContext& c, int il, const LayerWeights& w);

// out [m, d] = down(silu(gate(x)) * up(x)) for x [m, d]; widths from the tensors' shapes.
// slice >= 0 picks one expert of 3-D expert tensors.
Status SwiGluMlp(ForwardContext& c, TensorId gate, TensorId up, TensorId down, const float* x,
                 int64_t m, float* out, int slice = -1);

// Routing of one token: indices and weights of the selected experts (exposed for tests).
// Allocation-free after the first call on a thread.
void RouteToken(const ModelHParams& hp, const float* logits, const float* bias, int32_t* idx,
                float* weight);

}  // namespace substrate
