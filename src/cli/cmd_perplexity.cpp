// substrate perplexity: PPL of a text file (llama.cpp's chunked convention), and KL divergence
// against the log-probabilities of a reference run.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/generation_flags.h"
#include "cli/store_flags.h"
#include "core/file_io.h"
#include "model/perplexity.h"

namespace substrate::cli {
namespace {

constexpr const char* kUsage =
    "usage: substrate perplexity -m MODEL -f FILE [-c 512] [--chunks N] [-t THREADS]\n"
    "                            [--kl-divergence-base OUT | --kl-divergence BASE] [--kv-type T]\n"
    "                            [--device cpu|cuda] [--gpu N] [--max-vram SIZE]\n"
    "                            [--store STORE/ --max-ram SIZE [--plan P] [--tier N] ...]\n"
    "                            [--cache-aware-routing DELTA]\n"
    "                            [--adaptive [--verifier residual|linear] ...]\n"
    "  each chunk of c tokens is evaluated from scratch and scores its second half\n"
    "  --kl-divergence-base OUT   save this run's log-probabilities to OUT\n"
    "  --kl-divergence BASE       compare with a saved run: mean KLD, same top token %\n"
    "  --kv-type f32|f16          KV cache rows (default f32)\n"
    "  --adaptive                 the adaptive runtime (see substrate run --help): each chunk is\n"
    "                             evaluated one token at a time, so the verifier escalates and\n"
    "                             decays ops between tokens as in generation; prints the\n"
    "                             controller's counters\n"
    "  --cache-aware-routing D    out of core: as in generation (see substrate run --help), each\n"
    "                             chunk one token at a time, so experts are chosen against the\n"
    "                             cache a decode step would find; prints the runtime's counters\n";

int RunPerplexity(const std::vector<std::string>& args) {
  Flags f(args, {StoreFlagsWithValue({"-m", "--model", "-f", "--file", "-c", "--ctx-size",
                                      "--chunks", "-t", "--threads", "--kl-divergence-base",
                                      "--kl-divergence", "--kv-type", "--cache-type"}),
                 StoreSwitches()});
  if (!f.status().ok()) return UsageError("perplexity", f.status(), kUsage);
  if (f.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  std::string model_path = f.Get({"-m", "--model"});
  const std::string text_path = f.Get({"-f", "--file"});
  if ((model_path.empty() && !f.Has("--store")) || text_path.empty())
    return UsageError("perplexity", InvalidArgument("need -m MODEL and -f FILE"), kUsage);
  auto n_ctx = f.GetInt({"-c", "--ctx-size"}, 512);
  auto chunks = f.GetInt({"--chunks"}, -1);
  auto threads = ThreadsFlag(f);
  if (!n_ctx.ok() || !chunks.ok() || !threads.ok())
    return PrintError("perplexity", !n_ctx.ok()    ? n_ctx.status()
                                    : !chunks.ok() ? chunks.status()
                                                   : threads.status());
  if (*n_ctx < 4 || *n_ctx > (1 << 20))
    return PrintError("perplexity",
                      InvalidArgument("-c " + std::to_string(*n_ctx) + " out of range"));

  auto text = ReadFileToString(text_path);
  if (!text.ok()) return PrintError("perplexity", text.status());
  auto kv_type = ParseKvType(f);
  if (!kv_type.ok()) return PrintError("perplexity", kv_type.status());
  EngineOptions eo;
  eo.n_threads = static_cast<int>(*threads);
  eo.kv_type = *kv_type;
  eo.n_ctx = *n_ctx;
  if (Status st = ApplyStoreFlags(f, &eo); !st.ok()) return PrintError("perplexity", st);
  // A quality measure: tiers follow the verifier alone, not this machine's timing (the monitor
  // would also see the pauses where each chunk is scored as slow tokens).
  eo.adaptive.monitor = false;
  auto engine = Engine::Load(model_path, eo);
  if (!engine.ok()) return PrintError("perplexity", engine.status());
  Engine& e = **engine;
  PrintPlanIfAsked(f, e);
  auto ids = EncodePlain(e, *text);
  if (!ids.ok()) return PrintError("perplexity", ids.status());
  const Tokenizer& tok = *e.tokenizer();

  PerplexityOptions opt;
  opt.n_ctx = *n_ctx;
  opt.max_chunks = *chunks;
  opt.kv_type = *kv_type;
  // As llama.cpp: the text was encoded with the model's BOS rule, and then each chunk starts
  // with BOS when the model adds one.
  opt.bos = tok.vocab().add_bos ? tok.bos() : -1;
  opt.save_base = f.Get({"--kl-divergence-base"});
  opt.kld_base = f.Get({"--kl-divergence"});
  std::fprintf(stderr, "perplexity: %zu tokens, %lld per chunk\n", ids->size(),
               static_cast<long long>(opt.n_ctx));
  if (e.tier_controller() || (e.runtime() && f.Has("--cache-aware-routing")))
    opt.after_token = [&e] { e.AfterToken(); };
  opt.progress = [](int64_t c, double ppl) {
    std::fprintf(stderr, "[%lld]%.4f,", static_cast<long long>(c + 1), ppl);
    std::fflush(stderr);
  };
  auto r = ComputePerplexity(e.model(), *ids, &e.ledger(), opt);
  std::fprintf(stderr, "\n");
  if (!r.ok()) return PrintError("perplexity", r.status());
  std::printf("chunks = %lld, scored tokens = %lld\n", static_cast<long long>(r->n_chunks),
              static_cast<long long>(r->n_scored));
  std::printf("PPL = %.4f +/- %.4f\n", r->ppl, r->ppl_err);
  if (r->has_kld) {
    std::printf("mean KLD = %.6f +/- %.6f\n", r->mean_kld, r->kld_err);
    std::printf("same top token = %.2f %%\n", 100.0 * r->same_top);
  }
  if (e.tier_controller()) std::printf("adaptive = %s\n", AdaptiveStatsJson(e).dump().c_str());
  if (e.runtime()) std::printf("runtime = %s\n", e.runtime()->StatsJson().c_str());
  return 0;
}

CommandRegistrar reg("perplexity", "perplexity / KL divergence of a model on a text file",
                     &RunPerplexity);

}  // namespace
}  // namespace substrate::cli
