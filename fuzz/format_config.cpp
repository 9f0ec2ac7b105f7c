// libFuzzer target: config.json handling for HF folders — architecture detection, tensor-name
// mapping and metadata synthesis — on arbitrary JSON text.
#include <cstddef>
#include <cstdint>
#include <string>

#include "format/hf_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(reinterpret_cast<const char*>(data),
                                   reinterpret_cast<const char*>(data) + size);
  } catch (const std::exception&) {
    return 0;  // HfModelFile reports invalid JSON as Corruption before this point
  }
  if (!config.is_object()) return 0;
  auto arch = substrate::hf::FindArch(config);
  if (!arch.ok()) return 0;
  for (const char* name :
       {"model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.bias", "model.layers.3.mlp.experts.7.gate_proj.weight",
        "model.layers.2.block_sparse_moe.experts.1.w2.weight",
        "model.layers.0.mlp.gate.e_score_correction_bias", "model.layers.99999999999.mlp.up_proj.weight",
        "model.layers.x.mlp.up_proj.weight", "model.layers.0.unknown.weight"}) {
    (void)substrate::hf::MapTensorName(name, *arch, config);
  }
  substrate::Metadata md;
  (void)substrate::hf::BuildMetadata("/nonexistent-fuzz-dir", config, *arch, {}, 0, &md);
  return 0;
}
