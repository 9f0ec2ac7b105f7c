// ModelProfile: what the compiler knows about a model before planning it.
//
// One record per op (ids from the model layer's scheme: "block_5.attn", "block_5.moe.expert_17",
// "output"), in topological order, with the bytes the op's weights take at each candidate
// precision and the quality loss (mean KL divergence of the final logits, from calibration)
// when that op alone is stored at that precision. Plus the machine's measured memory and SSD
// read bandwidth, which the planner turns into a predicted tokens/s.
//
// Bytes come from RowBytes(type, ne[0]) * rows for every tensor of the op, so they match what
// the quantizer writes; a type whose block size does not divide a row is not a candidate.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "format/dtype.h"

namespace substrate::compiler {

inline constexpr int kProfileSchemaVersion = 1;

// One weight tensor of an op (or one expert slice of a 3-D expert tensor).
struct ProfileTensor {
  std::string name;          // GGUF canonical name, "blk.5.attn_q.weight"
  int slice = -1;            // >= 0: one index of the outermost dimension (an expert)
  std::vector<uint64_t> ne;  // ggml order, of the slice when slice >= 0
};

struct PrecisionOption {
  DType type = DType::kBF16;
  uint64_t bytes = 0;         // all tensors of the op at this type
  double quality_loss = 0.0;  // calibrated loss when only this op is at this type
  double act_error = 0.0;     // estimated profiles: the activation-weighted error behind the loss
};

struct OpProfile {
  std::string id;
  std::string kind;              // "attn", "ffn", "expert", "shared_expert", "router", "embed", "output"
  int layer = -1;                // -1 for ops outside the blocks
  double activation_prob = 1.0;  // fraction of tokens that run this op (experts: top_k / n)
  double sensitivity = 0.0;      // prior weight, multiplies the greedy ratio by (1 + s)
  std::vector<ProfileTensor> tensors;
  // Sorted by bytes, ascending; after Normalize() dominated options (more bytes, no less loss)
  // are gone, so quality_loss strictly decreases along the list.
  std::vector<PrecisionOption> options;
};

// One GGUF tensor that a file-size plan gives a type (per-tensor calibration; the unit of
// `compile --target-file-bytes` and `quantize --size`). A 3-D expert tensor is one unit: a GGUF
// tensor has one type.
struct TensorProfile {
  std::string name;          // "blk.5.attn_q.weight"
  std::string kind;          // the name without "blk.N." and ".weight": "attn_q", "ffn_down_exps"
  int layer = -1;            // -1 outside the blocks
  std::vector<uint64_t> ne;  // ggml order
  // As OpProfile::options after Normalize(): ascending bytes (of this tensor, unpadded),
  // strictly falling loss.
  std::vector<PrecisionOption> options;
};

// What a quantized GGUF of this model holds besides the planned tensors, so that a plan's file
// size is known to the byte (quant/quantize_model.h's layout).
struct FileLayout {
  uint64_t alignment = 0;     // 0: unknown (a profile made without the model file at hand)
  uint64_t header_bytes = 0;  // serialized header without the plan summary key
  uint64_t fixed_bytes = 0;   // the other tensors, each padded to the alignment
  uint64_t n_parameters = 0;  // elements of every tensor (bits per weight = 8 * bytes / this)
};

struct HardwareProfile {
  double memory_read_bw = 0;  // bytes/s, measured by a streaming read of a large buffer
  double ssd_read_bw = 0;     // bytes/s, measured by direct-I/O reads of a file
  std::string measured_by;    // "substrate calibrate --measure-hardware", "assumed", ...
};

struct ModelProfile {
  std::string model_id;
  std::string quality_metric = "mean_kld";
  uint64_t overhead_bytes = 0;  // always resident and not planned: KV cache, scratch, norms
  HardwareProfile hardware;
  std::vector<OpProfile> ops;  // topological order
  std::vector<TensorProfile> tensors;  // per-tensor calibration (may be empty)
  FileLayout file;
  std::string estimate;        // how losses were obtained: "measured" (per op), "activation_weighted"
  // Whole-model KL of a plan against the sum of its tensors' losses, fitted on measured plans:
  // KL = scale * sum^power (the sum understates it: losses compound).
  struct KldFit {
    double scale = 1, power = 1;
  } kld_fit;
  double FittedKld(double additive) const;

  // Sorts options, drops dominated and unsized ones, checks ids are unique and every op has an
  // option. The error names the op.
  Status Normalize();
  const OpProfile* Find(const std::string& id) const;
};

// A tensor's kind and layer from its GGUF name ("blk.5.attn_q.weight" -> "attn_q", 5).
std::pair<std::string, int> TensorKindAndLayer(const std::string& name);

// Bytes of `tensors` at `type`; nullopt when a row length is not a multiple of the block size.
std::optional<uint64_t> TensorBytesAt(const std::vector<ProfileTensor>& tensors, DType type);

Expected<ModelProfile> ProfileFromJson(const std::string& text);
std::string ProfileToJson(const ModelProfile& profile);
Expected<ModelProfile> LoadProfile(const std::string& path);
Status SaveProfile(const ModelProfile& profile, const std::string& path);

// The seed's synthetic MoE profile: per-op losses spread from the whole-model reference KLDs of
// each type, heavier on the sensitive layers, with seeded jitter.
struct SynthMoeOptions {
  std::string model_id = "synthetic-moe";
  int layers = 27;
  int experts = 64;
  int top_k = 8;
  int shared_experts = 2;
  uint64_t d_model = 2048;
  uint64_t expert_ffn = 1536;  // a multiple of 256, so every K-quant fits a row
  uint64_t vocab = 102400;
  std::vector<int> sensitive_layers;  // empty: the first two and the last two
  uint64_t seed = 1;
  std::vector<DType> types;  // empty: Q2_K..Q8_0 and BF16
};
Expected<ModelProfile> SynthesizeMoeProfile(const SynthMoeOptions& options);

}  // namespace substrate::compiler
