// Shared building blocks of the forward pass (attention, dense FFN, MoE), used by the
// architectures (model/arch_*.cpp). They say what to compute; the Backend computes it. Every
// weight is reached through the WeightSource, between BeginOp/EndOp of the op that owns it
// (op_id.h), at that op's tier.
//
// Shapes in comments are row-major [rows, cols]: n = tokens in this pass, d = n_embd.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/aligned_buffer.h"
#include "model/hparams.h"
#include "model/kv_cache.h"
#include "model/layer_weights.h"
#include "model/op_id.h"
#include "model/weight_source.h"

namespace substrate {

struct TensorSlot;

// Grow-only buffers of a forward pass, charged to the ledger account "scratch": a decode step
// after the first allocates nothing. Activations live in backend memory; the routing
// bookkeeping (which expert takes which token) on the host.
class Scratch {
 public:
  enum Slot {
    kX, kXNorm, kQ, kK, kV, kAttnOut, kTmp, kGate, kUp, kLatentQ, kLatentKv, kLatentNorm, kKvB,
    kRouter, kGathered, kExpertOut, kMoeAcc, kVec, kLookNorm, kLookLogits, kExpertHidden,
    kSharedGate, kSharedUp, kLogits, kSlotCount
  };
  enum HostSlot {
    kSel, kSelWeight, kExpertList, kExpertOffset, kExpertTokens, kExpertTokWeight, kLookSel,
    kLookSelWeight, kLookList, kCachedExperts, kHostSlotCount
  };
  Scratch(Backend* backend, MemoryLedger* ledger) : backend_(backend), ledger_(ledger) {}
  // A [rows, cols] tensor for `slot` (contents kept only if no growth happens).
  Expected<Tensor> Get(Slot slot, int64_t rows, int64_t cols);
  // At least n elements of T (trivial, alignment <= 64) of host memory for `slot`, same rules.
  template <typename T>
  Expected<T*> Host(HostSlot slot, int64_t n) {
    ASSIGN_OR_RETURN(void* p, HostBytes(slot, static_cast<size_t>(n) * sizeof(T)));
    return static_cast<T*>(p);
  }

 private:
  Expected<void*> HostBytes(HostSlot slot, size_t bytes);
  Backend* backend_;
  MemoryLedger* ledger_;
  Buffer bufs_[kSlotCount];
  AlignedBuffer host_[kHostSlotCount];
};

// Sees the residual stream around each block of a pass (attention; dense FFN or MoE), named by
// the block's op (attn_op, ffn_op, or router_op for a MoE block): the signal verifier probes
// read. x is [n, d] in backend memory (host memory on the CPU backend). Called on the pass's
// thread; must not allocate in steady state (the token loop does not).
class PassObserver {
 public:
  virtual ~PassObserver() = default;
  virtual void BeforeBlock(int op, const Tensor& x) {}
  virtual void AfterBlock(int op, const Tensor& x) {}
  // Inside a MoE block, after routing and before any routed expert runs: the k experts the
  // pass's newest token (its last row) routes to, whose ops are expert_op0 + experts[i], their
  // gating weights and their input xn [n, d] (the normed residual stream).
  virtual void BeforeExperts(int expert_op0, const int32_t* experts, const float* weights, int k,
                             const Tensor& xn) {}
};

// One sequence's part of a pass: rows [row0, row0 + n) of the residual stream are its tokens at
// positions pos0.. (= cache->n_past() before the pass), whose keys and values go to `cache`.
// Every op but attention treats rows alike, so sequences share one read of each weight.
struct SequenceRows {
  KvCache* cache = nullptr;
  int64_t row0 = 0;
  int64_t n = 0;
  int64_t pos0 = 0;
};

struct ForwardContext {
  const ModelHParams* hp = nullptr;
  WeightSource* source = nullptr;
  Backend* be = nullptr;
  Scratch* scratch = nullptr;
  int64_t n = 0;                 // tokens in this pass, all sequences together
  const int32_t* pos = nullptr;  // [n] positions (host)
  const SequenceRows* seqs = nullptr;  // [n_seqs], their rows in order, covering [0, n)
  int n_seqs = 0;
  Tensor x;                      // [n, d] the residual stream
  const LayerWeights* layers = nullptr;  // every layer's ids (the router look-ahead needs L+1's)
  const OpSpec* ops = nullptr;           // Model::ops(): op index -> id (no string work per op)
  const uint8_t* tiers = nullptr;        // [ops] the tier each op runs at (Model::op_tiers)
  // Diagnosis mode (Model::Forward re-runs a pass in it when its output is not finite): each op
  // checks what it wrote and fails naming itself.
  bool check_finite = false;
  // Cache-aware routing (Model::set_cache_aware_routing): the selection bonus of an expert the
  // source has in memory; 0 routes exactly.
  float cached_bonus = 0;
  PassObserver* observer = nullptr;  // Model::set_observer (the MoE block tells it its routing)
  // Layer il's keys and values are the caches' layer il - kv_layer0 (a next-n pass: the caches
  // hold its layers only).
  int kv_layer0 = 0;

  // A look-ahead guess (the next layer's router, to hint its experts) runs on tier 0: it steers
  // reads, not logits, and must not wait for a residual that its op reads later anyway.
  bool guessing = false;

  // A weight of op `op` (its index in Model::ops()) at that op's tier.
  Expected<WeightHandle> Acquire(TensorId id, int op, int slice = -1) const {
    return source->Acquire(id, slice, guessing ? 0 : tiers[op]);
  }
  const std::string& op_id(int op) const { return ops[op].id; }
  // In diagnosis mode: an error naming op `op` when t holds a NaN or infinity.
  Status CheckFinite(const Tensor& t, int op) const;
};

// BeginOp/EndOp of op `op` (an index into Model::ops()) around its work, so an early error
// return still closes it.
class OpScope {
 public:
  OpScope(const ForwardContext& c, int op) : s_(c.source), id_(c.op_id(op)) { s_->BeginOp(id_); }
  ~OpScope() { s_->EndOp(id_); }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  WeightSource* s_;
  const std::string& id_;
};

// y [n, out] = W x [n, in] through the source, W of op `op`; W's shape must be [out, in]
// (Corruption naming the tensor otherwise). slice >= 0 picks one expert of a 3-D tensor.
Status Linear(ForwardContext& c, int op, TensorId w, const Tensor& x, const Tensor& y,
              int slice = -1);
// Several products of the same x (q, k and v; gate and up) as one batch: a backend runs them in
// one pass over its threads and quantizes x once. Each y is Linear's, bit for bit.
struct LinearTo {
  TensorId w;
  Tensor y;
};
Status Linears(ForwardContext& c, int op, const Tensor& x, std::initializer_list<LinearTo> outs,
               int slice = -1);
// y = RmsNorm(x) * w per row of width x.cols (w: a vector of op `op`).
Status NormRows(ForwardContext& c, int op, TensorId w, const Tensor& x, const Tensor& y);
// y += b per row, when the model has the bias b (kNoTensor: nothing).
Status AddBiasFrom(ForwardContext& c, int op, TensorId b, const Tensor& y);
// out = W_o attn (+ b_o); x += out (the end of every attention op).
Status OutputProjection(ForwardContext& c, const LayerWeights& w, const Tensor& attn);

// Standard multi-head attention (llama, qwen): norm, q/k/v (+bias), optional QK-norm, RoPE,
// causal attention over the KV cache, output projection, residual add. One op: block_N.attn.
Status AttentionBlock(ForwardContext& c, int il, const LayerWeights& w);
// Its tensors (ArchSpec::attention_tensors of llama and qwen).
std::vector<TensorSlot> StandardAttentionTensors(const ModelHParams& hp);
// n_rot even and within the head (llama, qwen).
Status CheckRopeDims(const ModelHParams& hp);

// Dense SwiGLU FFN with pre-norm and residual add (op block_N.ffn).
Status FfnBlock(ForwardContext& c, int il, const LayerWeights& w);
// Router, routed experts, shared expert, residual add (ops block_N.moe.*; moe_block.cpp).
Status MoeBlock(ForwardContext& c, int il, const LayerWeights& w);

// out [m, d] = down(silu(gate(x)) * up(x)) for x [m, d], weights of op `op`; widths from the
// tensors' shapes. slice >= 0 picks one expert of 3-D expert tensors.
Status SwiGluMlp(ForwardContext& c, int op, TensorId gate, TensorId up, TensorId down,
                 const Tensor& x, const Tensor& out, int slice = -1);

}  // namespace substrate
