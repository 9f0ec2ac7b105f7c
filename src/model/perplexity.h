// Perplexity and KL divergence over a token stream, llama.cpp's convention: the stream is cut
// into chunks of n_ctx tokens; each chunk is evaluated from an empty cache (its first token
// replaced by BOS when the model adds one) and scores its second half: the logits at positions
// n_ctx/2 .. n_ctx-2 against the next token.
//
// KL divergence: a run with save_base writes the scored log-probabilities (fp16) to a file; a
// run with kld_base compares its own against them: mean KL(base || this) and the share of
// positions whose most likely token is the same.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"

namespace substrate {

struct PerplexityOptions {
  int64_t n_ctx = 512;
  DType kv_type = DType::kF32;  // KV cache rows (KvCache)
  int64_t max_chunks = -1;      // < 0: every full chunk
  int32_t bos = -1;             // >= 0: the first token of each chunk becomes this
  std::string save_base;        // write log-probs here (--kl-divergence-base)
  std::string kld_base;         // compare with this file (--kl-divergence)
  std::function<void(int64_t chunk, double ppl_so_far)> progress;
  // Set: each chunk is evaluated one token at a time, calling this after each (the adaptive
  // runtime switches ops' tiers between tokens, as it does in generation).
  std::function<void()> after_token;
};

struct PerplexityResult {
  int64_t n_chunks = 0;
  int64_t n_scored = 0;
  double ppl = 0, ppl_err = 0;  // err: one standard error, propagated from the NLL's
  bool has_kld = false;
  double mean_kld = 0, kld_err = 0;
  double same_top = 0;  // fraction in [0, 1]
};

Expected<PerplexityResult> ComputePerplexity(Model& model, const std::vector<int32_t>& tokens,
                                             MemoryLedger* ledger, const PerplexityOptions& opt);

}  // namespace substrate
