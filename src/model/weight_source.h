// The residency contract: the only way a forward pass reaches weight bytes.
//
// An op asks for the tensors it needs (at a tier, optionally one expert slice) and gets handles
// that stay valid until released. Whether the bytes came from RAM, a read from disk or an expert
// cache is the WeightSource's business, not the op's. This is what lets one forward pass run
// fully resident (ResidentWeightSource, model/), layer-streamed or expert-streamed (runtime/).
//
// Tensor names are GGUF's canonical names ("blk.5.attn_q.weight") whatever the file format;
// op ids ("block_5.attn", "block_5.moe.expert_17", "output") are the shared contract with the
// compiler, store and runtime (see model/op_id.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "format/dtype.h"
#include "model/op_id.h"
#include "quant/weight_view.h"

namespace substrate {

struct TensorInfo;  // format/: name, ne, type, file ranges

// Index of a tensor in a WeightSource, resolved once from its name (no string work per token).
using TensorId = int32_t;
constexpr TensorId kNoTensor = -1;
// Acquire's tier argument for "the tier the source serves by default" (DefaultTier()).
constexpr int kDefaultTier = -1;

class WeightSource;

// RAII: releases the view back to its source when destroyed.
class WeightHandle {
 public:
  WeightHandle() = default;
  WeightHandle(WeightSource* source, WeightView view, uint64_t token)
      : source_(source), view_(view), token_(token) {}
  WeightHandle(WeightHandle&& o) noexcept { *this = std::move(o); }
  WeightHandle& operator=(WeightHandle&& o) noexcept;
  WeightHandle(const WeightHandle&) = delete;
  WeightHandle& operator=(const WeightHandle&) = delete;
  ~WeightHandle() { Release(); }

  const WeightView& view() const { return view_; }
  const WeightView* operator->() const { return &view_; }
  void Release();

 private:
  WeightSource* source_ = nullptr;
  WeightView view_;
  uint64_t token_ = 0;  // source-defined (slot index, cache entry...)
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  // The tensor's id, or kNoTensor when the model has no such tensor.
  virtual TensorId Resolve(const std::string& name) const = 0;
  virtual const TensorInfo& Info(TensorId id) const = 0;

  // slice >= 0 selects one index of the outermost dimension (an expert of a 3-D expert tensor).
  // tier 0 is the skeleton, tier k adds the first k residuals: the view carries exactly
  // min(tier, what the source holds for the tensor) residuals (a source without residual tiers
  // serves tier 0 for any tier); kDefaultTier asks for DefaultTier().
  virtual Expected<WeightHandle> Acquire(TensorId id, int slice = -1,
                                         int tier = kDefaultTier) = 0;
  // The tier ops run at unless told otherwise (Model's per-op tier table starts here): the top
  // of the ladder a store was opened to serve; 0 for sources without residual tiers.
  virtual int DefaultTier() const { return 0; }
  // The model's per-op tier table (Model::op_tiers(), indexed like `ops`; valid while the model
  // lives), so a streaming source reads each op at the tier it will run at: residuals only for
  // ops above tier 0. The forward pass still passes the tier to every Acquire.
  virtual void BindOpTiers(const std::vector<OpSpec>& ops, const uint8_t* tiers) {}
  // Bytes op `op_id` holds at tiers 0..tier (a store's ladder: skeleton plus residuals), or 0
  // when the source does not know (no residual tiers).
  virtual uint64_t OpBytes(const std::string& op_id, int tier) const { return 0; }

  // Rows of a 2-D tensor the source keeps on disk and reads a few rows at a time (a token
  // embedding out of core): ReadsRows(id) says so, and then Acquire(id) fails and ReadRows
  // copies row rows[i] (its stored bytes: Info(id).type, ne[0] columns) to dst + i * row bytes.
  // False, the default, for a source that acquires every tensor whole.
  virtual bool ReadsRows(TensorId id) const { return false; }
  virtual Status ReadRows(TensorId id, const int32_t* rows, int64_t n, uint8_t* dst) {
    return Unimplemented("this weight source acquires tensors whole");
  }

  // Op boundaries, in topological order: a streaming source prefetches and evicts by them.
  virtual void BeginOp(const std::string& op_id) {}
  virtual void EndOp(const std::string& op_id) {}

  // MoE routing hints, so an expert-streaming source can read experts ahead of need (the default
  // ignores them). Per forward pass and MoE layer L, in this order:
  //  - inside block_L.moe.router, after routing: the experts layer L will acquire (the union over
  //    the pass's tokens, increasing, no duplicates), before any of them is acquired;
  //  - then, for d = 1 .. LookaheadLayers(), a guess for layer L+d (when it is a MoE layer):
  //    layer L+d's router (ffn_norm, ffn_gate_inp, exp_probs_b: acquired inside
  //    block_L.moe.router) applied to the hidden state entering layer L's MoE. Later layers
  //    guess again, nearer, and the real hint for L+d follows at its router, so per layer the
  //    hints of a pass before the last are guesses, farthest first; they may name experts never
  //    acquired. `experts` is valid only during the call.
  virtual void HintExperts(int layer, const int32_t* experts, int n) {}
  // How many layers ahead the model guesses (one small GEMV per MoE layer, token and layer of
  // look-ahead); 0, the default, so resident runs pay nothing.
  virtual int LookaheadLayers() const { return 0; }
  // Cache-aware routing: marks cached[0..n_expert) with the experts of `layer` whose weights are
  // in memory or being read, and returns true; false when the source keeps no expert cache
  // (resident: every expert is equally at hand). Called inside block_L.moe.router, before
  // the layer's hint.
  virtual bool CachedExperts(int layer, uint8_t* cached) { return false; }
  // Which of `experts` (n of layer `layer`) could be acquired now without waiting for a read:
  // ready[i] for experts[i]; false, the default, when the source cannot tell (resident: all
  // are). A decode step computes the ready ones (and the shared expert) while the rest arrive.
  virtual bool ExpertsReady(int layer, const int32_t* experts, int n, uint8_t* ready) {
    return false;
  }

  // Whether every expert of every layer is in memory for as long as the source lives, so that a
  // whole stacked expert tensor may be acquired and a backend may choose and read experts
  // itself (Backend::RoutedExperts) without the source seeing which. False, the default, for
  // sources that stream experts.
  virtual bool ExpertsResident() const { return false; }
  // Calibration: when ObservesInputs(), every matrix product reports its input rows before it
  // runs (n rows of `cols` floats meeting tensor `id`, expert `slice` or -1), so a source can
  // gather activation statistics; such passes run experts one by one. Off by default: free.
  virtual bool ObservesInputs() const { return false; }
  virtual void ObserveInput(TensorId id, int slice, const float* x, int64_t n, int64_t cols) {}

 protected:
  friend class WeightHandle;
  virtual void ReleaseView(const WeightView& view, uint64_t token) {}
};

inline WeightHandle& WeightHandle::operator=(WeightHandle&& o) noexcept {
  if (this != &o) {
    Release();
    source_ = std::exchange(o.source_, nullptr);
    view_ = o.view_;
    token_ = o.token_;
  }
  return *this;
}

inline void WeightHandle::Release() {
  if (source_) source_->ReleaseView(view_, token_);
  source_ = nullptr;
}

}  // namespace substrate
