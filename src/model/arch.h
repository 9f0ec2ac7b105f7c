// The architecture registry: one file per architecture (model/arch_<name>.cpp) says everything
// the engine needs to know about it — the GGUF architecture names it runs, its own
// hyperparameters, its attention op's tensors (each written once: name, shape, required or
// not) and its layer function. The forward pass (Model), ListOps (compiler, store, runtime) and
// the KV cache read it from here; the build lists every arch_*.cpp, so adding an architecture is
// adding one file (and its tests).
//
// The FFN and MoE ops are shared by every architecture (FfnTensors/MoeTensors below).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/layer_weights.h"

namespace substrate {

class Metadata;
class WeightSource;
struct ModelHParams;
struct ForwardContext;

// One tensor an op may acquire: blk.L.<base>.<suffix>, stored in LayerWeights::*field.
struct TensorSlot {
  const char* base;
  const char* suffix;  // "weight" or "bias"
  TensorId LayerWeights::*field;
  bool required;
  // Expected shape, innermost first; 0 accepts any size there.
  std::vector<uint64_t> shape;
};

struct ArchSpec {
  const char* name;                    // the family, for messages
  std::vector<std::string> gguf_names;  // general.architecture values it runs
  // Reads what is particular to the architecture (RoPE style, MLA ranks, routing defaults...)
  // after the common hyperparameters are read; checks them.
  Status (*read_hparams)(const Metadata& md, ModelHParams* hp) = nullptr;
  // The attention op's tensors of a layer, in the order they are acquired.
  std::vector<TensorSlot> (*attention_tensors)(const ModelHParams& hp) = nullptr;
  // Checks across the resolved tensors of a layer (e.g. qwen3 needs its QK-norms); may be null.
  Status (*check_layer)(const ModelHParams& hp, int il, const LayerWeights& w) = nullptr;
  // The attention op of layer il (the FFN or MoE op that follows is shared).
  Status (*attention)(ForwardContext& c, int il, const LayerWeights& w) = nullptr;
  // KV rows hold one key/value per query head (MLA caches decompressed heads).
  bool kv_per_query_head = false;
};

// The spec that runs `gguf_arch`, or Unimplemented naming the supported ones.
Expected<const ArchSpec*> FindArch(const std::string& gguf_arch);

// The tensors of the shared ops of layer il: dense FFN, MoE router, routed experts (3-D
// tensors, one slice per expert), shared expert.
std::vector<TensorSlot> FfnTensors(const ModelHParams& hp);
std::vector<TensorSlot> MoeRouterTensors(const ModelHParams& hp);
std::vector<TensorSlot> MoeExpertTensors(const ModelHParams& hp);
std::vector<TensorSlot> MoeSharedTensors(const ModelHParams& hp);
// A next-n (MTP) layer's own tensors besides its block: blk.N.nextn.* (op block_N.nextn).
std::vector<TensorSlot> NextnTensors(const ModelHParams& hp);

// Resolves `slots` of layer il into *w (shapes checked: a malformed file fails here, not in a
// kernel). A missing required tensor is NotFound naming it.
Status ResolveSlots(const WeightSource& s, int il, const std::vector<TensorSlot>& slots,
                    LayerWeights* w);

// A tensor outside the layers (token_embd, output...): its id with shape and type checked, or
// NotFound / kNoTensor when the model lacks it.
Expected<TensorId> RequireTensor(const WeightSource& s, const std::string& name,
                                 const std::vector<uint64_t>& ne);
Expected<TensorId> OptionalTensor(const WeightSource& s, const std::string& name,
                                  const std::vector<uint64_t>& ne);

}  // namespace substrate
