// Quantization mixes: which type each tensor of a model gets for a target file type such as
// Q4_K_M. The rules are llama.cpp's (llama-quantize without an importance matrix), so our
// mixes match files made by that tool: norms, biases and routers stay as they are; the output
// (or the tied token embedding) gets Q6_K; attn_v / ffn_down are bumped on some layers in the
// _M mixes; rows whose length is not a multiple of the block size fall back to a 32-block type.
//
// ChooseTensorTypes is a pure function of the model's shape. An optional override map (tensor
// name -> type, e.g. from a compiler plan) replaces the rule for the tensors it names.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "format/dtype.h"

namespace substrate {

// A target file type (llama.cpp's LLAMA_FTYPE): the name the user types, the id stored in
// general.file_type, and the default tensor type the rules start from.
struct FileType {
  const char* name;  // "Q4_K_M"
  uint32_t id;       // general.file_type
  DType default_type;
};

// "q4_k_m", "Q4_K_M", "Q4_K" (= Q4_K_M) ... -> file type; nullopt when unknown.
std::optional<FileType> FileTypeFromName(std::string_view name);
// All names FileTypeFromName accepts, for help and errors.
std::vector<std::string> FileTypeNames();

// What the rules need to know about the model (from its GGUF metadata).
struct MixModelInfo {
  std::string arch;   // general.architecture
  int n_layer = 0;    // <arch>.block_count
  int n_head = 0;     // <arch>.attention.head_count
  int n_head_kv = 0;  // <arch>.attention.head_count_kv
  int n_expert = 0;   // <arch>.expert_count (0 for dense models)
};

struct MixTensor {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order
  DType type = DType::kF32;  // type in the source file
};

struct TensorChoice {
  DType type = DType::kF32;  // type to write
  bool quantize = false;     // false: the tensor is copied unchanged
  bool fallback = false;     // the rule's type did not fit the row length
};

// Chooses the type of every tensor (same order as `tensors`). Tensors are visited in
// llama.cpp's order (non-block tensors, then blocks by number, by name within a block), which
// matters for the per-layer counters. Fails on an override naming an unknown tensor or a type
// we cannot quantize to.
Expected<std::vector<TensorChoice>> ChooseTensorTypes(
    const MixModelInfo& model, const std::vector<MixTensor>& tensors, const FileType& ftype,
    const std::map<std::string, DType>* overrides = nullptr);

// Whether llama.cpp would quantize this tensor at all (>= 2 dims, a ".weight" that is not a
// norm, router or positional table).
bool TensorAllowsQuantization(const MixTensor& t);

}  // namespace substrate
