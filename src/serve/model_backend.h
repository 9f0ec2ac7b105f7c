// The real InferenceBackend: a model opened by the runtime's Engine (weights resident, or
// streamed from a store inside a RAM budget), its tokenizer and chat template. This is what
// `substrate serve` runs.
//
// Slots share one Engine and hand their passes to one PassBatcher (continuous batching): the
// slots decoding at the same time advance together in one multi-sequence pass per token, and a
// new prompt joins that pass in chunks.
#pragma once

#include <atomic>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "core/memory_ledger.h"
#include "format/dtype.h"
#include "runtime/engine.h"
#include "runtime/pass_batcher.h"
#include "serve/backend.h"
#include "serve/prompt_cache.h"

namespace substrate {
class ChatTemplate;
class ModelFile;
}

namespace substrate::serve {

struct ConstraintVocab;

struct ModelBackendOptions {
  std::string path;               // GGUF file or HF folder
  int context = 0;                // tokens per slot; 0: min(model's training context, 4096)
  int threads = 0;                // 0: the default pool
  std::string model_id;           // empty: the file name without extension
  MemoryLedger* ledger = nullptr; // null: MemoryLedger::Global()
  DType kv_type = DType::kF32;    // each slot's KV cache rows (EngineOptions::kv_type)
  int draft_max = 0;              // prompt-lookup speculative decoding (GenerateOptions)
  std::string chat_template;      // Jinja source replacing the model's own; empty: the model's
  std::string prompt_cache_dir;   // non-empty: the prompt cache on disk (serve/prompt_cache.h)
  uint64_t prompt_cache_bytes = 8ull << 30;
  VerifyOptions verify;           // deferred verification (only checked tokens are streamed)
  int slots = 1;                  // sessions open at once: their KV caches share the budget
  PassBatcherOptions batching;    // continuous batching of the slots' passes
  // The RAM budget and out-of-core runtime (EngineOptions::max_ram, store, residency); the
  // fields above fill in the rest of the engine's options.
  EngineOptions engine;
};

class ModelBackend : public InferenceBackend {
 public:
  static Expected<std::unique_ptr<ModelBackend>> Load(const ModelBackendOptions& options);
  ~ModelBackend() override;

  std::string ModelId() const override { return model_id_; }
  int ContextLength() const override { return context_; }
  int VocabSize() const override;
  Expected<std::vector<int32_t>> EncodeText(const std::string& text) const override;
  Expected<ChatPrompt> EncodeChat(const nlohmann::json& messages,
                                  const nlohmann::ordered_json& tools) const override;
  Expected<std::unique_ptr<Session>> NewSession() override;
  nlohmann::json RuntimeStats() const override;
  std::vector<std::pair<std::string, double>> RuntimeCounters() const override;

  Engine& engine() { return *engine_; }
  // The vocabulary as constrained decoding sees it (built on first use).
  // Charged to the ledger's "grammar" account.
  Expected<std::shared_ptr<const ConstraintVocab>> constraint_vocab() const;

 private:
  friend class ModelSession;
  ModelBackend() = default;
  std::unique_ptr<Engine> engine_;
  std::string model_id_;
  std::unique_ptr<ChatTemplate> chat_template_;  // parsed once; renders concurrently
  Status template_status_;                       // why chat is unavailable, if it is
  ToolFormat tool_format_ = ToolFormat::kGeneric;
  bool template_renders_tools_ = false;          // the template reads `tools`
  std::string think_open_ = "<think>", think_close_ = "</think>";
  mutable std::mutex vocab_mu_;
  mutable std::shared_ptr<const ConstraintVocab> vocab_;
  mutable LedgerCharge vocab_charge_;
  int context_ = 0;
  // Every pass over the engine's model (the Engine's scratch is shared); RuntimeStats reads the
  // op tiers in an exclusive turn, since the adaptive runtime changes them at the end of a pass.
  std::unique_ptr<PassBatcher> batcher_;
  int draft_max_ = 0;
  std::unique_ptr<DiskPromptCache> prompt_cache_;
  // Constrained decoding, summed over finished generations.
  std::atomic<uint64_t> masks_{0};
  std::atomic<uint64_t> mask_ns_{0};
  VerifyOptions verify_;
};

}  // namespace substrate::serve
