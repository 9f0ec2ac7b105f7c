// Internals of the HF folder reader shared by its .cpp files (not for other layers).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "format/model_file.h"

namespace substrate::hf {

// What differs between the architectures we map (see hf_tensor_map.cpp).
struct ArchSpec {
  std::string model_type;  // config.json "model_type"
  std::string gguf_arch;   // general.architecture
  bool permute_qk = false; // llama-family rope permutation of q/k
  // Order the converter emits a layer's merged expert tensors in ("gate", "up", "down").
  std::vector<std::string> expert_order;
  // llama.cpp (early 2025) requires output.weight for this arch even with tied embeddings, and
  // the reference GGUFs carry a copy of token_embd there.
  bool duplicate_tied_output = false;
};

// Spec for config.json's model_type / architectures, or Unimplemented naming what was found.
Expected<ArchSpec> FindArch(const nlohmann::json& config);

// The result of mapping one HF tensor name.
struct MappedName {
  bool skip = false;       // not part of the GGUF (rotary buffers, MTP layers)
  std::string name;        // GGUF name; for experts the merged 3-D tensor's name
  int64_t expert = -1;     // expert index for per-expert tensors
  int64_t block = -1;      // layer index, or -1
  std::string expert_kind; // "gate" / "up" / "down" for experts
  int64_t permute_heads = 0;  // > 0: apply the rope permutation with this many heads
};

Expected<MappedName> MapTensorName(const std::string& hf_name, const ArchSpec& arch,
                                   const nlohmann::json& config);

// Integer / float from config.json, accepting absent or null as nullopt.
std::optional<int64_t> ConfigInt(const nlohmann::json& config, const std::string& key);
std::optional<double> ConfigFloat(const nlohmann::json& config, const std::string& key);

// Fills the GGUF metadata the reference converter writes for this config (architecture keys,
// general.*), then the tokenizer keys from the folder's tokenizer files. `tensors` is the final
// catalog (for the size label); `file_type` is GGUF's general.file_type.
Status BuildMetadata(const std::string& dir, const nlohmann::json& config, const ArchSpec& arch,
                     const std::vector<TensorInfo>& tensors, uint32_t file_type, Metadata* md);

// tokenizer.ggml.* and tokenizer.chat_template from tokenizer.json, tokenizer_config.json and
// chat_template.jinja; nothing when the folder has no tokenizer.json.
Status AddTokenizerMetadata(const std::string& dir, const nlohmann::json& config, Metadata* md);

// "tiny-coder-moe" -> "Tiny Coder Moe", as the converter titles a folder name.
std::string TitleFromFolderName(const std::string& folder);
// "6.8M", "32x4.2M": the converter's size label for a catalog.
std::string SizeLabel(const std::vector<TensorInfo>& tensors);

}  // namespace substrate::hf
