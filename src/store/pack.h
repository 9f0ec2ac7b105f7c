// The tiered store: a model split per op id into a skeleton file (tier 0) and residual files
// (tier k = the quantized error left by tiers 0..k-1), so a runtime can read a cheap skeleton
// and refine it only where it can afford to.
//
// Layout of STORE/:
//   manifest.json       schema version, tier types, per tensor unit (tensor, expert slice):
//                       op id, tier, file, offset, bytes, type, CRC32C
//   model.gguf          the model's metadata (tokenizer, hparams) and no tensors
//   <op_id>.t<k>.bin    data of op <op_id> at tier k, every range aligned to 4096 (O_DIRECT)
// A tensor unit is a whole tensor, or one expert slice of a 3-D expert tensor (stored in its
// expert's op). Only matrices (>= 2 dims, not the embedding table) get residual tiers; norms,
// biases and token_embd are stored as they are, at tier 0.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "format/dtype.h"

namespace substrate {

class ModelFile;

constexpr int kStoreSchemaVersion = 1;
constexpr uint64_t kStoreAlignment = 4096;

struct PackOptions {
  DType skeleton = DType::kQ4_K;
  // Residual tier types, in order (0, 1 or 2 of them).
  std::vector<DType> residuals = {DType::kQ8_0, DType::kF16};
};

struct PackStats {
  uint64_t tier_bytes[3] = {0, 0, 0};
  int n_units = 0;
  int n_files = 0;
};

// Writes the store for `model` into directory `out_dir` (created if needed). Every file is
// written through AtomicFileWriter; manifest.json last, so a store without one is incomplete.
Expected<PackStats> PackStore(const ModelFile& model, const std::string& out_dir,
                              const PackOptions& options);

}  // namespace substrate
