#include "model/arch.h"

#include "format/model_file.h"
#include "model/hparams.h"
#include "model/op_id.h"
#include "model/weight_source.h"
#include "quant/quant.h"

namespace substrate {

// Every model/arch_*.cpp defines kArch_<name>; the build generates the list (CMakeLists.txt).
#define SUBSTRATE_ARCH(name) extern const ArchSpec kArch_##name;
#include "model/arch_list.inc"
#undef SUBSTRATE_ARCH

namespace {

const ArchSpec* const kArchs[] = {
#define SUBSTRATE_ARCH(name) &kArch_##name,
#include "model/arch_list.inc"
#undef SUBSTRATE_ARCH
};

std::string Shape(const std::vector<uint64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

// The id of `name` (kNoTensor when absent) with its shape and type checked.
Expected<TensorId> FindTensor(const WeightSource& s, const std::string& name,
                              const std::vector<uint64_t>& ne) {
  const TensorId id = s.Resolve(name);
  if (id == kNoTensor) return kNoTensor;
  const TensorInfo& info = s.Info(id);
  // A 0 in `ne` accepts any size there; trailing 1s are equivalent to a shorter shape.
  std::vector<uint64_t> have = info.ne;
  while (have.size() > ne.size() && have.back() == 1) have.pop_back();
  bool ok = have.size() == ne.size();
  for (size_t i = 0; ok && i < ne.size(); ++i) ok = ne[i] == 0 || ne[i] == have[i];
  if (!ok) {
    return Corruption("tensor '" + name + "' has shape " + Shape(info.ne) + ", expected " +
                      Shape(ne) + " (0 = any)");
  }
  if (!CanDequantize(info.type) || !RowBytes(info.type, info.ne.empty() ? 1 : info.ne[0])) {
    return Unimplemented("tensor '" + name + "' has type " + DTypeName(info.type) +
                         " which this build cannot compute with");
  }
  return id;
}

}  // namespace

Expected<const ArchSpec*> FindArch(const std::string& gguf_arch) {
  std::string known;
  for (const ArchSpec* a : kArchs) {
    for (const std::string& n : a->gguf_names) {
      if (n == gguf_arch) return a;
      known += (known.empty() ? "" : ", ") + n;
    }
  }
  return Unimplemented("unknown architecture '" + gguf_arch + "' (supported: " + known + ")");
}

std::vector<TensorSlot> FfnTensors(const ModelHParams& hp) {
  const uint64_t d = static_cast<uint64_t>(hp.n_embd), ff = static_cast<uint64_t>(hp.n_ff);
  using W = LayerWeights;
  return {{"ffn_norm", "weight", &W::ffn_norm, true, {d}},
          {"ffn_gate", "weight", &W::ffn_gate, true, {d, ff}},
          {"ffn_up", "weight", &W::ffn_up, true, {d, ff}},
          {"ffn_down", "weight", &W::ffn_down, true, {ff, d}}};
}

std::vector<TensorSlot> MoeRouterTensors(const ModelHParams& hp) {
  const uint64_t d = static_cast<uint64_t>(hp.n_embd), E = static_cast<uint64_t>(hp.n_expert);
  using W = LayerWeights;
  return {{"ffn_norm", "weight", &W::ffn_norm, true, {d}},
          {"ffn_gate_inp", "weight", &W::gate_inp, true, {d, E}},
          {"exp_probs_b", "bias", &W::exp_probs_b, false, {E}}};
}

std::vector<TensorSlot> MoeExpertTensors(const ModelHParams& hp) {
  const uint64_t d = static_cast<uint64_t>(hp.n_embd), E = static_cast<uint64_t>(hp.n_expert);
  const uint64_t ff = static_cast<uint64_t>(hp.n_ff_exp);
  using W = LayerWeights;
  return {{"ffn_gate_exps", "weight", &W::gate_exps, true, {d, ff, E}},
          {"ffn_up_exps", "weight", &W::up_exps, true, {d, ff, E}},
          {"ffn_down_exps", "weight", &W::down_exps, true, {ff, d, E}}};
}

std::vector<TensorSlot> MoeSharedTensors(const ModelHParams& hp) {
  // Width 0 (unknown from the metadata): taken from the tensors, which must then agree
  // (checked by Model::Create).
  const uint64_t d = static_cast<uint64_t>(hp.n_embd), sh = static_cast<uint64_t>(hp.n_ff_shexp);
  using W = LayerWeights;
  return {{"ffn_gate_shexp", "weight", &W::gate_shexp, false, {d, sh}},
          {"ffn_up_shexp", "weight", &W::up_shexp, false, {d, sh}},
          {"ffn_down_shexp", "weight", &W::down_shexp, false, {sh, d}},
          {"ffn_gate_inp_shexp", "weight", &W::gate_inp_shexp, false, {d}}};
}

std::vector<TensorSlot> NextnTensors(const ModelHParams& hp) {
  const uint64_t d = static_cast<uint64_t>(hp.n_embd);
  using W = LayerWeights;
  return {{"nextn.embed_tokens", "weight", &W::nextn_embd, false, {d, 0}},
          {"nextn.enorm", "weight", &W::enorm, true, {d}},
          {"nextn.hnorm", "weight", &W::hnorm, true, {d}},
          {"nextn.eh_proj", "weight", &W::eh_proj, true, {2 * d, d}},
          {"nextn.shared_head_norm", "weight", &W::nextn_head_norm, false, {d}},
          {"nextn.shared_head_head", "weight", &W::nextn_head, false, {d, 0}}};
}

Status ResolveSlots(const WeightSource& s, int il, const std::vector<TensorSlot>& slots,
                    LayerWeights* w) {
  for (const TensorSlot& slot : slots) {
    const std::string name = BlockTensor(il, slot.base, slot.suffix);
    ASSIGN_OR_RETURN(TensorId id, FindTensor(s, name, slot.shape));
    if (id == kNoTensor && slot.required) return NotFound("model has no tensor '" + name + "'");
    w->*slot.field = id;
  }
  return Status::Ok();
}

Expected<TensorId> RequireTensor(const WeightSource& s, const std::string& name,
                                 const std::vector<uint64_t>& ne) {
  ASSIGN_OR_RETURN(TensorId id, FindTensor(s, name, ne));
  if (id == kNoTensor) return NotFound("model has no tensor '" + name + "'");
  return id;
}

Expected<TensorId> OptionalTensor(const WeightSource& s, const std::string& name,
                                  const std::vector<uint64_t>& ne) {
  return FindTensor(s, name, ne);
}

}  // namespace substrate
