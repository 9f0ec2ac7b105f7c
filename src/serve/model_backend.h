// The real InferenceBackend: a model opened by the runtime's Engine (weights resident, or
// streamed from a store inside a RAM budget), its tokenizer and chat template. This is what
// `substrate serve` runs.
//
// Slots share one Engine, whose scratch allows one forward pass at a time: each slot takes the
// forward lock per step (its prefill, then one decode token), so parallel slots interleave
// token by token instead of waiting for whole answers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "core/memory_ledger.h"
#include "format/dtype.h"
#include "runtime/engine.h"
#include "serve/backend.h"

namespace substrate {
class ChatTemplate;
}

namespace substrate::serve {

struct ModelBackendOptions {
  std::string path;               // GGUF file or HF folder
  int context = 0;                // tokens per slot; 0: min(model's training context, 4096)
  int threads = 0;                // 0: the default pool
  std::string model_id;           // empty: the file name without extension
  MemoryLedger* ledger = nullptr; // null: MemoryLedger::Global()
  DType kv_type = DType::kF32;    // each slot's KV cache rows (EngineOptions::kv_type)
  int draft_max = 0;              // prompt-lookup speculative decoding (GenerateOptions)
  VerifyOptions verify;           // deferred verification (only checked tokens are streamed)
  int slots = 1;                  // sessions open at once: their KV caches share the budget
  // The RAM budget and out-of-core runtime (EngineOptions::max_ram, store, residency); the
  // fields above fill in the rest of the engine's options.
  EngineOptions engine;
};

// A mutex that hands the lock over in arrival order, so that slots take forward passes in
// turn (a plain mutex lets the slot that just released it take it again, starving the rest).
class FifoMutex {
 public:
  void lock();
  void unlock();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ticket_ = 0;
  uint64_t serving_ = 0;
};

class ModelBackend : public InferenceBackend {
 public:
  static Expected<std::unique_ptr<ModelBackend>> Load(const ModelBackendOptions& options);
  ~ModelBackend() override;

  std::string ModelId() const override { return model_id_; }
  int ContextLength() const override { return context_; }
  int VocabSize() const override;
  Expected<std::vector<int32_t>> EncodeText(const std::string& text) const override;
  Expected<std::vector<int32_t>> EncodeChat(const nlohmann::json& messages) const override;
  Expected<std::unique_ptr<Session>> NewSession() override;
  std::vector<std::pair<std::string, double>> RuntimeCounters() const override;

  Engine& engine() { return *engine_; }

 private:
  friend class ModelSession;
  ModelBackend() = default;
  std::unique_ptr<Engine> engine_;
  std::string model_id_;
  std::unique_ptr<ChatTemplate> chat_template_;  // parsed once; renders concurrently
  Status template_status_;                       // why chat is unavailable, if it is
  int context_ = 0;
  FifoMutex forward_mu_;  // one forward pass at a time (the Engine's scratch is shared)
  int draft_max_ = 0;
  VerifyOptions verify_;
};

}  // namespace substrate::serve
