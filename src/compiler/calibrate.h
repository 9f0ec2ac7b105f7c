// Calibration: the measured half of a model profile. For each op (the experts of a MoE layer
// as one group) and each candidate type, the op's weight matrices are quantized to that type in
// memory (the rest of the model stays at the file's precision) and the mean KL divergence of the
// final logits against the unquantized model is measured on calibration text. The same
// machinery evaluates any per-tensor type assignment (a compiled plan, or the types of a
// reference GGUF quantized by our bit-compatible quantizer), so predicted and measured quality
// are compared on exactly the same tokens.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compiler/activation_stats.h"
#include "compiler/plan_bundle.h"
#include "compiler/profile.h"
#include "core/status.h"
#include "format/dtype.h"
#include "format/model_file.h"
#include "model/weight_source.h"

namespace substrate::compiler {

struct KlMeasurement {
  double mean_kld = 0, kld_err = 0;
  double same_top = 0;  // fraction of positions with the same most likely token
  double ppl = 0;
  int64_t n_scored = 0;
};

// A loaded model plus its tokenized text, kept across many measurements. Not thread-safe.
class CalibrationRunner {
 public:
  // n_ctx: chunk length (llama.cpp's perplexity convention); threads 0: the default pool.
  static Expected<std::unique_ptr<CalibrationRunner>> Open(const std::string& model_path,
                                                           const std::string& text_path,
                                                           int64_t n_ctx, int threads);
  ~CalibrationRunner();

  // KL of the model with `types` applied (tensor name -> type; others untouched; quantized with
  // `importance` when given) against the unquantized model, over chunks
  // [first_chunk, first_chunk + n_chunks) of the text.
  Expected<KlMeasurement> Measure(const std::map<std::string, DType>& types, int64_t first_chunk,
                                  int64_t n_chunks, const ImportanceSource* importance = nullptr);

  // Forward passes of the unquantized model over the chunks, recording every product's input.
  Expected<ActivationStats> CollectActivationStats(int64_t first_chunk, int64_t n_chunks);

  // A tensor of the unquantized model, resident for the runner's lifetime.
  struct BaseTensor {
    const TensorInfo* info = nullptr;
    WeightHandle handle;  // handle->data: the stored bytes (plain row layout)
  };
  Expected<BaseTensor> Base(const std::string& name) const;
  const ModelFile& file() const;
  ThreadPool& pool() const;

  int64_t n_chunks_available() const;
  // The profile's ops (no measurements yet): quantizable weight tensors of each op, each tensor
  // owned by the first op that uses it (a tied embedding belongs to token_embd), bytes per type.
  Expected<ModelProfile> SkeletonProfile(const std::vector<DType>& types) const;
  // Quantizable tensors of each op as SkeletonProfile assigns them (expert slices collapsed to
  // their 3-D tensor: the unit the runner can quantize).
  std::vector<std::pair<std::string, std::vector<std::string>>> OpTensors() const;

  struct Impl;

 private:
  explicit CalibrationRunner(std::unique_ptr<Impl> impl);
  Status CheckChunks(int64_t first_chunk, int64_t n_chunks) const;
  std::unique_ptr<Impl> impl_;
};

struct CalibrationOptions {
  std::string model_path;
  std::string text_path;
  std::vector<DType> types;  // empty: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_0
  int64_t n_ctx = 512;
  int64_t first_chunk = 0;
  int64_t n_chunks = 4;
  std::string partial_path;  // resumable results; "" = none
  int threads = 0;
  bool measure_hardware = true;
};

// Runs every (op group, type) measurement, resuming from partial_path when it holds results for
// the same settings, and returns the calibrated profile.
Expected<ModelProfile> Calibrate(const CalibrationOptions& options);

// The stored type of every tensor of a model file with at least two dimensions.
Expected<std::map<std::string, DType>> FileTensorTypes(const std::string& path);
// Additive estimate of a type assignment from a calibrated profile: the sum over ops of the loss
// at the type its tensors get (an op whose tensors disagree takes its first tensor's type), and
// the bytes of the profile's tensors under it.
struct Prediction {
  double loss = 0;
  uint64_t bytes = 0;
  int unmatched_ops = 0;  // ops whose type has no calibrated option
};
Prediction PredictAdditive(const ModelProfile& profile, const std::map<std::string, DType>& types);

}  // namespace substrate::compiler
