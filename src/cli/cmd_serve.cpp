// substrate serve: the HTTP server (OpenAI and Anthropic APIs) over a loaded model.
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>

#include "cli/command.h"
#include "cli/generation_flags.h"
#include "cli/store_flags.h"
#include "core/file_io.h"
#include "core/log.h"
#include "serve/model_backend.h"
#include "serve/server.h"

namespace substrate::cli {
namespace {

const char* kUsage =
    "usage: substrate serve -m MODEL [--host 127.0.0.1] [--port 8080] [--api-key KEY]\n"
    "                       [-c CTX] [--parallel N] [-t THREADS] [--max-queue N]\n"
    "                       [--batch-size N] [--ubatch-size N] [--batch-invariant]\n"
    "                       [--max-body BYTES] [--alias NAME] [--kv-type f32|f16]\n"
    "                       [--draft-max K] [--draft-model M | --draft-mtp] [--device cpu|cuda] [--gpu N]\n"
    "                       [--max-vram SIZE]\n"
    "                       [--chat-template-file F] [--reasoning-format auto|none]\n"
    "                       [--slot-save-path DIR] [--prompt-cache-dir DIR] [--prompt-cache-size SIZE]\n"
    "                       [--store STORE/ --max-ram SIZE [--plan P] [--tier N] [--trace T]\n"
    "                        [--prefetch-depth N] [--io auto|uring|pread] [--io-threads N]\n"
    "                        [--cache-aware-routing DELTA] [--lookahead N]]\n"
    "                       [--verify off|all|margin [--verify-window W] [--verify-tau T]\n"
    "                        [--verify-tier N] [--draft-tier N]]  (as for substrate run)\n"
    "  endpoints: GET / (web page), GET /health, GET /metrics, GET /v1/models,\n"
    "             POST /v1/chat/completions, POST /v1/completions (OpenAI), POST /v1/messages,\n"
    "             POST /v1/messages/count_tokens (Anthropic), GET /v1/runtime/events (SSE),\n"
    "             POST /slots/{id}?action=save|restore\n"
    "  --api-key     required as 'Authorization: Bearer KEY' or 'x-api-key: KEY' on /v1/*\n"
    "                (default: $SUBSTRATE_API_KEY, else none)\n"
    "  -c CTX        tokens per request, prompt and answer (default: min(model's, 4096))\n"
    "  --parallel N  requests generated at once, each with its own KV cache (default 1)\n"
    "  --max-queue N requests waiting for a slot before 503/529 (default 64)\n"
    "  --batch-size N  continuous batching: the slots decoding at once share one model pass\n"
    "                per token; a pass holds at most N tokens of all slots (default 512)\n"
    "  --ubatch-size N a new prompt joins the running pass N tokens at a time, so the others\n"
    "                wait at most one such chunk for their next token (default 512)\n"
    "  --batch-invariant  prompts evaluated with exact rows too, so a greedy answer does not\n"
    "                depend on what shared its batch or on a cached prefix; only CPUs with AMX\n"
    "                differ without it (their prefill GEMM, which this gives up); CPU only\n"
    "  --kv-type T   KV cache rows: f32 (default, exact) or f16 (half the memory per slot)\n"
    "  --draft-max K speculative decoding: up to K tokens drafted from the context (prompt\n"
    "                lookup) and verified per model pass; same output (default 0: off)\n"
    "  --draft-model M speculative decoding with a draft model (see substrate run --help):\n"
    "                M drafts K tokens (--draft-max, default 4) for each slot from its own KV\n"
    "                cache; the drafts' passes run one at a time, the slots' verify passes\n"
    "                are batched as ever\n"
    "  --draft-mtp   drafts from the model's own next-n (MTP) layer instead (see substrate run\n"
    "                --help)\n"
    "  --chat-template-file F  a Jinja chat template used instead of the model's\n"
    "  --reasoning-format R    auto (default): <think>...</think> returned apart as\n"
    "                reasoning_content / thinking blocks; none: left in the text\n"
    "  --slot-save-path DIR    folder for slot files (POST /slots/{id}?action=save|restore,\n"
    "                body {\"filename\": \"name\"}); off without it\n"
    "  --prompt-cache-dir DIR  keep evaluated prompts' KV caches on disk and reuse them for\n"
    "                prompts that start the same way, across restarts\n"
    "  --prompt-cache-size S   the most the prompt cache keeps (default 8G; oldest go first)\n"
    "  --max-ram SIZE  the RAM budget (weights, every slot's KV cache, scratch)\n"
    "  --store STORE/  run out of core: weights streamed from a packed store (substrate pack)\n"
    "                inside --max-ram; /metrics adds the runtime's counters\n"
    "  --print-plan  print the plan the session chose (see substrate run --help) on stderr\n";

int RunServe(const std::vector<std::string>& args) {
  Flags f(args, {StoreFlagsWithValue({"-m", "--model", "--host", "--port", "--api-key", "-c",
                                      "--ctx-size", "--parallel", "-np", "-t", "--threads",
                                      "--max-queue", "--max-body", "--alias", "--kv-type",
                                      "--cache-type", "--draft-max", "--draft-model", "--verify",
                                      "--verify-window", "--verify-tau", "--verify-tier",
                                      "--draft-tier", "--chat-template-file",
                                      "--reasoning-format", "--slot-save-path",
                                      "--prompt-cache-dir", "--prompt-cache-size",
                                      "--batch-size", "-b", "--ubatch-size", "-ub"}),
                 StoreSwitches({"--batch-invariant", "--draft-mtp"})});
  if (!f.status().ok()) return UsageError("serve", f.status(), kUsage);
  if (f.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::string model = f.Get({"-m", "--model"});
  if (model.empty() && !f.Has("--store"))
    return UsageError("serve", InvalidArgument("-m MODEL (or --store STORE/) is required"), kUsage);
  auto port = f.GetInt({"--port"}, 8080);
  auto ctx = f.GetInt({"-c", "--ctx-size"}, 0);
  auto parallel = f.GetInt({"--parallel", "-np"}, 1);
  auto threads = ThreadsFlag(f);
  auto max_queue = f.GetInt({"--max-queue"}, 64);
  auto batch_size = f.GetInt({"--batch-size", "-b"}, Model::kMaxBatch);
  auto ubatch_size = f.GetInt({"--ubatch-size", "-ub"}, Model::kMaxBatch);
  for (const auto* v : {&port, &ctx, &parallel, &max_queue, &batch_size, &ubatch_size})
    if (!v->ok()) return PrintError("serve", v->status());
  if (!threads.ok()) return PrintError("serve", threads.status());
  if (*port < 0 || *port > 65535)
    return PrintError("serve", InvalidArgument("--port must be 0..65535"));
  if (*parallel < 1 || *parallel > 256)
    return PrintError("serve", InvalidArgument("--parallel must be 1..256"));
  if (*batch_size < 1 || *batch_size > Model::kMaxBatch || *ubatch_size < 1 ||
      *ubatch_size > Model::kMaxBatch)
    return PrintError("serve", InvalidArgument("--batch-size and --ubatch-size must be 1.." +
                                               std::to_string(Model::kMaxBatch)));
  if (*max_queue < 0 || *max_queue > 4096)
    return PrintError("serve", InvalidArgument("--max-queue must be 0..4096"));
  if (*ctx < 0 || *ctx > (1 << 22)) return PrintError("serve", InvalidArgument("-c out of range"));
  auto kv_type = ParseKvType(f);
  if (!kv_type.ok()) return PrintError("serve", kv_type.status());
  const std::string reasoning = f.Get({"--reasoning-format"}, "auto");
  if (reasoning != "auto" && reasoning != "none" && reasoning != "deepseek")
    return PrintError("serve", InvalidArgument("--reasoning-format must be auto or none, got '" +
                                               reasoning + "'"));
  std::string chat_template;
  if (f.Has("--chat-template-file")) {
    auto t = ReadFileToString(f.Get({"--chat-template-file"}), 16ull << 20);
    if (!t.ok()) return PrintError("serve", t.status().WithContext("--chat-template-file"));
    chat_template = std::move(*t);
  }
  uint64_t prompt_cache_bytes = 8ull << 30;
  if (f.Has("--prompt-cache-size")) {
    auto b = ParseBytes(f.Get({"--prompt-cache-size"}));
    if (!b.ok()) return PrintError("serve", b.status().WithContext("--prompt-cache-size"));
    prompt_cache_bytes = *b;
  }
  const std::string slot_dir = f.Get({"--slot-save-path"});
  if (!slot_dir.empty()) {
    struct stat st {};
    if (::stat(slot_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return PrintError("serve", InvalidArgument("--slot-save-path '" + slot_dir +
                                                 "' is not a folder (create it first)"));
  }
  uint64_t max_body = 4ull << 20;
  if (f.Has("--max-body")) {
    auto b = ParseBytes(f.Get({"--max-body"}));
    if (!b.ok()) return PrintError("serve", b.status());
    max_body = *b;
  }

  // SIGINT/SIGTERM are taken by sigwait below; block them before any thread starts so that
  // every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  serve::ModelBackendOptions mo;
  mo.path = model;
  mo.context = static_cast<int>(*ctx);
  mo.threads = static_cast<int>(*threads);
  mo.model_id = f.Get({"--alias"});
  mo.kv_type = *kv_type;
  if (Status st = ParseDraftFlags(f, &mo.draft_max, &mo.engine.draft_model, &mo.engine.draft_mtp); !st.ok())
    return PrintError("serve", st);
  mo.chat_template = std::move(chat_template);
  mo.prompt_cache_dir = f.Get({"--prompt-cache-dir"});
  mo.prompt_cache_bytes = prompt_cache_bytes;
  auto verify = ParseVerifyFlags(f);
  if (!verify.ok()) return PrintError("serve", verify.status());
  mo.verify = *verify;
  mo.slots = static_cast<int>(*parallel);
  mo.batching.batch_size = *batch_size;
  mo.batching.ubatch_size = *ubatch_size;
  mo.batching.batch_invariant = f.Has("--batch-invariant");
  if (Status st = ApplyStoreFlags(f, &mo.engine); !st.ok()) return PrintError("serve", st);
  KeepDraftTierResident(mo.verify, &mo.engine);
  std::fprintf(stderr, "substrate serve: loading %s\n",
               model.empty() ? mo.engine.store.c_str() : model.c_str());
  auto backend = serve::ModelBackend::Load(mo);
  if (!backend.ok()) return PrintError("serve", backend.status());
  PrintPlanIfAsked(f, (*backend)->engine());

  serve::ServerOptions so;
  so.host = f.Get({"--host"}, "127.0.0.1");
  so.port = static_cast<int>(*port);
  const char* env_key = std::getenv("SUBSTRATE_API_KEY");
  so.api_key = f.Get({"--api-key"}, env_key ? env_key : "");
  so.parallel = static_cast<int>(*parallel);
  so.max_queue = static_cast<int>(*max_queue);
  so.context = (*backend)->ContextLength();
  so.max_body_bytes = max_body;
  so.reasoning_format = reasoning == "none" ? "none" : "auto";
  so.slot_save_path = slot_dir;
  auto server = serve::HttpServer::Create(backend->get(), so);
  if (!server.ok()) return PrintError("serve", server.status());
  const bool loopback = so.host == "127.0.0.1" || so.host == "localhost" || so.host == "::1";
  if (!loopback && so.api_key.empty())
    std::fprintf(stderr, "substrate serve: warning: listening on %s without --api-key\n",
                 so.host.c_str());
  (*server)->Start();
  std::fprintf(stderr,
               "substrate serve: model '%s', context %d, %d slot(s); listening on http://%s:%d\n",
               (*backend)->ModelId().c_str(), (*backend)->ContextLength(), so.parallel,
               so.host.c_str(), (*server)->port());
  std::fflush(stderr);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "substrate serve: signal %d, stopping\n", sig);
  (*server)->Stop();
  return 0;
}

CommandRegistrar reg("serve", "HTTP server: OpenAI and Anthropic APIs with streaming", &RunServe);

}  // namespace
}  // namespace substrate::cli
