// Shared by the store and runtime tests: tiny-coder-moe's bf16 weights packed once per test
// process into a temp store (the default ladder Q4_K + Q8_0 + F16, which reproduces bf16 at the
// top tier), damaged copies of it, and a greedy continuation through any WeightSource.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "core/memory_ledger.h"
#include "core/thread_pool.h"
#include "format/model_file.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/sampler.h"
#include "store/pack.h"

namespace substrate::testing {

// A path in the temp folder, unique to this process.
inline std::string StoreTestPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("substrate_test_" + std::to_string(getpid()) + "_" + name))
      .string();
}

// ../shared/gguf/<model>.gguf packed into a temp store (by default with the default ladder,
// Q4_K + Q8_0 + F16); "" when the fixture is absent.
inline std::string PackOnce(const std::string& model, const std::string& name,
                            const PackOptions& options = {}) {
  const std::string path = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/" + model + ".gguf";
  if (!std::filesystem::exists(path)) return std::string();
  const std::string out = StoreTestPath(name);
  auto file = ModelFile::Open(path);
  if (!file.ok()) return std::string();
  auto st = PackStore(**file, out, options);
  if (!st.ok()) {
    ADD_FAILURE() << st.status().ToString();
    return std::string();
  }
  return out;
}

struct RemoveAtExit {
  const std::string& dir;
  ~RemoveAtExit() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};

// tiny-coder-moe (the default fixture of the store and runtime tests).
inline const std::string& PackedTinyMoeStore() {
  static const std::string dir = PackOnce("tiny-coder-moe-bf16", "packed");
  static const RemoveAtExit cleanup{dir};
  return dir;
}

// tiny-coder (dense).
inline const std::string& PackedTinyCoderStore() {
  static const std::string dir = PackOnce("tiny-coder-bf16", "packed_dense");
  static const RemoveAtExit cleanup{dir};
  return dir;
}

// A fresh copy of the packed store that a test may damage (and should remove).
inline std::string CopyPackedStore(const std::string& name) {
  const std::string dst = StoreTestPath(name);
  std::filesystem::remove_all(dst);
  std::filesystem::copy(PackedTinyMoeStore(), dst, std::filesystem::copy_options::recursive);
  return dst;
}

inline ThreadPool& StoreTestPool() {
  static ThreadPool pool(2);
  return pool;
}

// Evaluates `prompt` through `src`, then n greedy tokens, and returns them; the logits after
// the prompt go to *prompt_logits when given (empty results and *err on failure).
inline std::vector<int32_t> GreedyThrough(WeightSource* src, const Metadata& md,
                                          MemoryLedger* ledger,
                                          const std::vector<int32_t>& prompt, size_t n,
                                          Status* err,
                                          std::vector<float>* prompt_logits = nullptr) {
  auto model = Model::Create(md, src, &StoreTestPool(), ledger);
  if (!model.ok()) {
    *err = model.status();
    return {};
  }
  auto cache = KvCache::Create((*model)->hparams(), 256, (*model)->backend());
  if (!cache.ok()) {
    *err = cache.status();
    return {};
  }
  const int64_t V = (*model)->hparams().n_vocab;
  std::vector<float> logits;
  *err = (*model)->Forward(prompt.data(), static_cast<int64_t>(prompt.size()), *cache, false,
                           &logits);
  if (prompt_logits && err->ok()) *prompt_logits = logits;
  std::vector<int32_t> got;
  for (size_t i = 0; i < n && err->ok(); ++i) {
    int32_t tok = Argmax(logits.data(), V);
    got.push_back(tok);
    *err = (*model)->Forward(&tok, 1, *cache, false, &logits);
  }
  return got;
}

// Logits of the last prompt position through `src` (an empty vector and *err on failure).
inline std::vector<float> LogitsThrough(WeightSource* src, const Metadata& md, MemoryLedger* ledger,
                                        const std::vector<int32_t>& prompt, Status* err) {
  std::vector<float> logits;
  GreedyThrough(src, md, ledger, prompt, 0, err, &logits);
  return logits;
}

}  // namespace substrate::testing
