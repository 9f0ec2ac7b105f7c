// bench_moe_decode MODEL.gguf [threads=2] [tokens=256] [block=8]
// MoE decode with the routed experts run together (one ParallelFor per phase over all selected
// experts) against expert by expert, interleaved in blocks of `block` tokens in one process, so
// a busy machine's drift hits both alike. Prints JSON: median seconds per token of each mode.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/memory_ledger.h"
#include "core/thread_pool.h"
#include "format/model_file.h"
#include "model/expert_batch.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/resident_weight_source.h"

using namespace substrate;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_moe_decode MODEL.gguf [threads] [tokens] [block]\n");
    return 2;
  }
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const int tokens = argc > 3 ? std::atoi(argv[3]) : 256;
  const int block = argc > 4 ? std::max(1, std::atoi(argv[4])) : 8;
  MemoryLedger ledger;
  ThreadPool pool(threads);
  auto file = ModelFile::Open(argv[1]);
  if (!file.ok()) return std::fprintf(stderr, "%s\n", file.status().ToString().c_str()), 1;
  auto src = ResidentWeightSource::Load(**file, &ledger);
  if (!src.ok()) return std::fprintf(stderr, "%s\n", src.status().ToString().c_str()), 1;
  auto model = Model::Create((*file)->metadata(), src->get(), &pool, &ledger);
  if (!model.ok()) return std::fprintf(stderr, "%s\n", model.status().ToString().c_str()), 1;
  auto cache = KvCache::Create((*model)->hparams(), tokens + 8, (*model)->backend());
  if (!cache.ok()) return std::fprintf(stderr, "%s\n", cache.status().ToString().c_str()), 1;
  std::vector<float> logits;
  std::vector<double> t_batched, t_single;
  int32_t tok = 1;
  for (int i = 0; i < tokens; ++i) {
    const bool batched = (i / block) % 2 == 0;
    SetBatchedExpertMaxTokens(batched ? 4 : 0);
    auto t0 = std::chrono::steady_clock::now();
    Status st = (*model)->Forward(&tok, 1, *cache, false, &logits);
    auto t1 = std::chrono::steady_clock::now();
    if (!st.ok()) return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;
    if (i >= 2) (batched ? t_batched : t_single).push_back(std::chrono::duration<double>(t1 - t0).count());
    tok = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const double mb = median(t_batched), ms = median(t_single);
  std::printf("{\"model\": \"%s\", \"threads\": %d, \"tokens\": %d, \"block\": %d, "
              "\"batched_s_per_token\": %.6f, \"one_by_one_s_per_token\": %.6f, "
              "\"batched_tokens_per_s\": %.3f, \"one_by_one_tokens_per_s\": %.3f, "
              "\"speedup\": %.4f}\n",
              argv[1], threads, tokens, block, mb, ms, 1 / mb, 1 / ms, ms / mb);
  return 0;
}
