// substrate run: generate a continuation of a prompt (optionally through the chat template).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/generation_flags.h"
#include "cli/store_flags.h"
#include "runtime/engine.h"

namespace substrate::cli {
namespace {

constexpr const char* kUsage =
    "usage: substrate run -m MODEL -p PROMPT [-n N] [--temp T] [--seed S] [-c CTX] [-t THREADS]\n"
    "                     [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R]\n"
    "                     [--stop TEXT]... [--chat] [--system TEXT] [--json] [--device cpu|cuda]\n"
    "                     [--gpu N] [--max-vram SIZE]\n"
    "                     [--store STORE/ --max-ram SIZE [--plan P] [--trace T]\n"
    "                      [--prefetch-depth N] [--cache-aware-routing DELTA] [--lookahead N]\n"
    "                      [--tier N]] [--kv-type f32|f16] [--draft-max K] [--draft-model M | --draft-mtp]\n"
    "                     [--prompt-cache F]\n"
    "                     [--verify off|all|margin [--verify-window W] [--verify-tau T]\n"
    "                      [--verify-tier N] [--draft-tier N]]\n"
    "                     [--adaptive [--verifier residual|linear|scripted] [--probes P]\n"
    "                      [--verifier-script F] [--escalation-threshold X]\n"
    "                      [--escalation-persistence N] [--escalation-max K] [--escalation-pool "
    "SIZE]]\n"
    "  -n N      tokens to generate (default 128)\n"
    "  --temp T  sampling temperature; 0 (the default) is greedy decoding\n"
    "  -c CTX    context size in tokens (default: min(model's, 4096))\n"
    "  --chat    wrap the prompt as a user message in the model's chat template\n"
    "  --json    print one JSON object: text, token counts, tokens/s, memory ledger peak\n"
    "  --tier N  with --store: serve tier N of the store's ladder (0 = skeleton only; default "
    "top)\n"
    "  --kv-type T      KV cache rows: f32 (default, exact) or f16 (half the memory)\n"
    "  --draft-max K    speculative decoding: up to K tokens drafted from the context (prompt\n"
    "                   lookup), verified per model pass; same output (default 0: off)\n"
    "  --draft-model M  speculative decoding with a draft model: M (a smaller model with the\n"
    "                   same vocabulary, loaded resident inside --max-ram before the target)\n"
    "                   drafts K tokens greedily (--draft-max, default 4), the model verifies\n"
    "                   them in one pass; output as without it (greedy: the same tokens)\n"
    "  --draft-mtp      speculative decoding drafted by the model's own next-n (multi-token\n"
    "                   prediction) layer, where its file has one (DeepSeek-V3, GLM-4.5 GGUFs\n"
    "                   with nextn tensors), resident, read in place or from a store (not with\n"
    "                   --max-vram); same output\n"
    "  --prompt-cache F restore the session saved in F (same model), save it there after\n"
    "  --verify M       deferred verification with a store: tier --draft-tier (default 0, kept\n"
    "                   resident) writes tokens, the top tier (or --verify-tier) checks them W at\n"
    "                   a time (--verify-window, default 8), reading only the residuals, and "
    "rolls\n"
    "                   back where it disagrees. all: every token is checked (greedy output is "
    "the\n"
    "                   top tier's); margin: only tokens whose top-1 minus top-2 log-probability "
    "is\n"
    "                   below --verify-tau (default 2) are. Only checked tokens are shown\n"
    "  --adaptive       with a store: ops run at the skeleton (kept resident); a verifier\n"
    "                   (residual: a sample of each op's residual rows, the default; linear:\n"
    "                   probes from substrate train-probe) escalates the ops it finds drifting\n"
    "                   for --escalation-persistence tokens (default 4) above\n"
    "                   --escalation-threshold, at most --escalation-max at once (default 4)\n"
    "                   within --escalation-pool bytes (default: 4 times the largest residual)\n"
    "  --cache-aware-routing DELTA  out of core (MoE): an expert already in memory gets DELTA\n"
    "                   added to its routing probability when experts are chosen (not to its\n"
    "                   weight), so near-ties are read less; 0 (default) routes exactly\n"
    "  --lookahead N    out of core (MoE): guess the experts of the next N layers from each\n"
    "                   layer's hidden state and read them ahead (default 1, or 0 where the\n"
    "                   expert cache holds fewer than four tokens' experts; 0 turns it off)\n"
    "  --print-plan     print the plan the session chose on stderr before generating: what\n"
    "                   stays resident by kind and bytes, what streams through how many slabs\n"
    "                   read how far ahead, the expert cache's slots and the predicted bytes\n"
    "                   read from disk per token (one line when every weight is resident).\n"
    "                   Without -p/-f it prints the plan on stdout and exits, reading no\n"
    "                   weight: `substrate run -m MODEL.gguf --max-ram 8G --print-plan`\n";

int RunRun(const std::vector<std::string>& args) {
  Flags f(args, {StoreFlagsWithValue(
                     GenerationFlagsWithValue({"-p", "--prompt", "-f", "--file", "--system"})),
                 StoreSwitches({"--chat", "--json", "--draft-mtp"})});
  if (!f.status().ok()) return UsageError("run", f.status(), kUsage);
  if (f.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  auto gf = ParseGenerationFlags(f);
  if (!gf.ok()) return PrintError("run", gf.status());
  std::string prompt = f.Get({"-p", "--prompt"});
  if (f.Has("-f") || f.Has("--file")) {
    auto text = ReadFileToString(f.Get({"-f", "--file"}));
    if (!text.ok()) return PrintError("run", text.status());
    prompt = *text;
  }
  const bool plan_only = f.Has("--print-plan") && !f.Has("-p") && !f.Has("--prompt") &&
                         !f.Has("-f") && !f.Has("--file");
  if (prompt.empty() && !plan_only)
    return UsageError("run", InvalidArgument("no prompt (-p)"), kUsage);

  EngineOptions eo;
  eo.kv_type = gf->kv_type;
  eo.n_ctx = gf->n_ctx;
  if (Status st = ApplyStoreFlags(f, &eo); !st.ok()) return PrintError("run", st);
  eo.draft_model = gf->draft_model;
  eo.draft_mtp = gf->draft_mtp;
  KeepDraftTierResident(gf->generate.verify, &eo);
  if (plan_only) {
    eo.n_threads = gf->threads;
    auto plan = Engine::Plan(gf->model, eo);
    if (!plan.ok()) return PrintError("run", plan.status());
    std::fputs(plan->c_str(), stdout);
    return 0;
  }
  auto loaded = LoadForGeneration(*gf, eo);
  if (!loaded.ok()) return PrintError("run", loaded.status());
  auto& [engine, session] = *loaded;
  PrintPlanIfAsked(f, *engine);

  std::vector<ChatMessage> messages;
  if (f.Has("--system")) messages.push_back({"system", f.Get({"--system"})});
  messages.push_back({"user", prompt});
  auto ids = f.Has("--chat") ? EncodeChat(*engine, messages, /*add_generation_prompt=*/true)
                             : EncodePlain(*engine, prompt);
  if (!ids.ok()) return PrintError("run", ids.status());

  const bool json = f.Has("--json");
  std::string text;
  GenerateOptions opt = gf->generate;
  auto stats = engine->Generate(*session, *ids, opt, [&](int32_t, const std::string& piece) {
    if (json) {
      text += piece;
    } else {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  });
  if (!stats.ok()) return PrintError("run", stats.status());
  if (Status saved = SavePromptCache(*gf, *engine, *session); !saved.ok())
    return PrintError("run", saved);
  if (json) {
    nlohmann::json j = StatsJson(*engine, *stats);
    j["text"] = text;
    if (engine->runtime()) j["store"] = nlohmann::json::parse(StoreStatsJson(*engine));
    if (engine->tier_controller()) j["adaptive"] = AdaptiveStatsJson(*engine);
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("\n");
  }
  return 0;
}

CommandRegistrar reg("run", "generate text from a prompt (-m MODEL -p PROMPT)", &RunRun);

}  // namespace
}  // namespace substrate::cli
