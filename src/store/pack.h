// The tiered store: a model split per op id into a skeleton file (tier 0) and residual files
// (tier k = the quantized error left by tiers 0..k-1), so a runtime can read a cheap skeleton
// and refine it only where it can afford to.
//
// Layout of STORE/:
//   manifest.json       schema version, tier names, model.gguf's size and CRC32C, per tensor
//                       unit (tensor, expert slice): op id, tier, file, offset, bytes, type,
//                       CRC32C, and the layout where it is not plain rows ("q4_0_x16", ...)
//   model.gguf          the model's metadata (tokenizer, hparams) and no tensors
//   <op_id>.t<k>.bin    data of op <op_id> at tier k, every range aligned to 4096 (O_DIRECT)
// A tensor unit is a whole tensor, or one expert slice of a 3-D expert tensor (stored in its
// expert's op). Only matrices (>= 2 dims, not the embedding table) get residual tiers; vectors
// (norms, biases) are always stored as they are, at tier 0.
//
// Tier-0 types: one type for every matrix (PackOptions::skeleton), each tensor's own type in the
// source file (keep_skeleton: its bytes copied unchanged), or a plan's choice per tensor and op
// (PackPlan, from the compiler's plan JSON). Each entry of the manifest names its own type, so
// a store may mix them; "tiers" in the manifest lists one name per tier ("keep" / "plan" where
// the type varies).
//
// Memory: a unit is read and written in chunks of rows, so packing holds a few MiB per thread
// whatever the model's size (a whole unit only for HF files that need a layout transform).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "format/dtype.h"

namespace substrate {

class ModelFile;
struct TensorInfo;

// 2: the manifest carries model.gguf's size and CRC32C (1, without them, still opens).
constexpr int kStoreSchemaVersion = 2;
constexpr uint64_t kStoreAlignment = 4096;

// What pack takes from a plan (compiler/plan_bundle.h's JSON): "tensor_types" (tier-0 type per
// GGUF tensor) and, per op bundle, the precision of each tier (tier 0 for tensors the table does
// not name; tiers 1.. are the residual ladder of the op's matrices).
struct PackPlan {
  std::map<std::string, DType> tensor_types;
  std::map<std::string, std::vector<DType>> op_tiers;  // op id -> tier types, [0] = tier 0
};

// Reads those fields of a plan document; errors name the field or op.
// Whether a tensor is stored (and streamed) one expert slice at a time: a 3-D `*_exps.*` tensor.
bool IsExpertTensor(const TensorInfo& t);

Expected<PackPlan> ParsePackPlan(const std::string& json_text);

struct PackOptions {
  DType skeleton = DType::kQ4_K;
  // Tier 0 = each tensor's own bytes in the source file (no requantization).
  bool keep_skeleton = false;
  // Residual tier types, in order (0, 1 or 2 of them).
  std::vector<DType> residuals = {DType::kQ8_0, DType::kF16};
  // When set, tier-0 types and residual ladders come from the plan (skeleton, keep_skeleton and
  // residuals are ignored); a model op with matrices that the plan does not name is an error.
  const PackPlan* plan = nullptr;
  // Each expert's tier 0 in the layout the CPU kernels read on AVX-512 (kernels/interleaved.h)
  // where its type and shape take one, so that an expert read into the cache needs no
  // rearranging before its products. Only the CPU backend reads such a store.
  bool cpu_layout = false;
  // Quantization runs over this pool (nullptr: ThreadPool::Default()).
  ThreadPool* pool = nullptr;
  // A progress bar on stderr (shown only when stderr is a terminal).
  bool progress = false;
  // Writes the store's files; nullptr: Env::Default().
  Env* env = nullptr;
};

struct PackStats {
  uint64_t tier_bytes[3] = {0, 0, 0};
  int n_units = 0;
  int n_files = 0;
  uint64_t copied_units = 0;  // units whose tier 0 is the source bytes, unchanged
};

// Writes the store for `model` into directory `out_dir` (created if needed). Every file is
// written through AtomicFileWriter; manifest.json last, so a store without one is incomplete.
Expected<PackStats> PackStore(const ModelFile& model, const std::string& out_dir,
                              const PackOptions& options);

}  // namespace substrate
