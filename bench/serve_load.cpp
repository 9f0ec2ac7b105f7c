// Loopback load test of `substrate serve`'s stack: starts the server in this process on a free
// port over a real model, then runs N concurrent streaming clients (OpenAI chat, completions
// and Anthropic messages, greedy) for a fixed time with hang-ups mixed in. Every completed
// answer must equal the answer the same request got alone; memory (RSS and the ledger) is
// read after warm-up and after the run. Prints one JSON object.
//
//   bench_serve_load -m models/tiny-coder-Q8_0.gguf [--clients 16] [--seconds 60]
//                    [--parallel 4] [--max-tokens 48] [--disconnect-every 5] [-c 1024]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "serve/load_client.h"
#include "serve/model_backend.h"
#include "serve/server.h"

using namespace substrate;
using namespace substrate::serve;
using nlohmann::json;

namespace {

std::string Arg(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return fallback;
}

bool HasFlag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i)
    if (argv[i] == name) return true;
  return false;
}

// Completions, and chat requests in both APIs when the model has a chat template (a synthetic
// file may not).
std::vector<LoadPrompt> MakePrompts(int max_tokens, bool chat) {
  const char* code[] = {"def fibonacci(n):", "import os\n\ndef list_files(path):",
                        "class Stack:\n    def __init__(self):", "def is_prime(n):\n"};
  const char* questions[] = {"Write a function that reverses a string.",
                             "def add(a, b):", "Sort a list of numbers in Python."};
  std::vector<LoadPrompt> out;
  for (const char* c : code) {
    LoadPrompt p;
    p.api = Api::kOpenAICompletion;
    p.body = {{"prompt", c}, {"max_tokens", max_tokens}, {"temperature", 0}};
    out.push_back(p);
  }
  for (const char* q : chat ? questions : std::span<const char* const>{}) {
    LoadPrompt p;
    p.api = Api::kOpenAIChat;
    p.body = {{"messages", {{{"role", "user"}, {"content", q}}}}, {"max_tokens", max_tokens},
              {"temperature", 0}};
    out.push_back(p);
    p.api = Api::kAnthropicMessages;
    p.body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", q}}}},
              {"max_tokens", max_tokens}, {"temperature", 0}};
    out.push_back(p);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string model = Arg(argc, argv, "-m", "");
  if (model.empty()) {
    std::fprintf(stderr,
                 "usage: bench_serve_load -m MODEL [--clients 16] [--seconds 60] [--parallel 4]\n"
                 "                        [--max-tokens 48] [--disconnect-every 5] [-c 1024]\n"
                 "                        [--batch-invariant] [--device cpu|cuda]\n");
    return 2;
  }
  const int clients = std::atoi(Arg(argc, argv, "--clients", "16").c_str());
  const double seconds = std::atof(Arg(argc, argv, "--seconds", "60").c_str());
  const int parallel = std::atoi(Arg(argc, argv, "--parallel", "4").c_str());
  const int max_tokens = std::atoi(Arg(argc, argv, "--max-tokens", "48").c_str());
  const int disconnect_every = std::atoi(Arg(argc, argv, "--disconnect-every", "5").c_str());
  const int ctx = std::atoi(Arg(argc, argv, "-c", "1024").c_str());

  ModelBackendOptions mo;
  mo.path = model;
  mo.context = ctx;
  // Answers are compared with each request's answer alone: on AMX machines that needs prompts
  // evaluated exactly (PassBatcherOptions::batch_invariant).
  mo.batching.batch_invariant = HasFlag(argc, argv, "--batch-invariant");
  mo.engine.device = Arg(argc, argv, "--device", "cpu");
  auto backend = ModelBackend::Load(mo);
  if (!backend.ok()) {
    std::fprintf(stderr, "bench_serve_load: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  ServerOptions so;
  so.port = 0;
  so.parallel = parallel;
  so.max_queue = clients + 8;
  auto server = HttpServer::Create(backend->get(), so);
  if (!server.ok()) {
    std::fprintf(stderr, "bench_serve_load: %s\n", server.status().ToString().c_str());
    return 1;
  }
  (*server)->Start();

  LoadOptions lo;
  lo.port = (*server)->port();
  lo.clients = clients;
  lo.seconds = seconds;
  lo.disconnect_every = disconnect_every;

  // Expected answers: each request alone. This also warms every slot.
  const nlohmann::json probe = nlohmann::json::array({{{"role", "user"}, {"content", "hi"}}});
  const bool chat = (*backend)->EncodeChat(probe, nlohmann::ordered_json()).ok();
  std::vector<LoadPrompt> prompts = MakePrompts(max_tokens, chat);
  for (auto& p : prompts) {
    auto a = FetchAnswer(lo, p);
    if (!a.ok()) {
      std::fprintf(stderr, "bench_serve_load: %s\n", a.status().ToString().c_str());
      return 1;
    }
    p.expected = *a;
  }
  // A short warm-up under load, so that thread stacks and allocator arenas exist before the
  // baseline is read.
  LoadOptions warm = lo;
  warm.seconds = std::min(5.0, seconds / 10 + 1);
  (void)RunLoad(warm, prompts);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const uint64_t rss_before = ResidentBytes();
  const auto ledger_before = MemoryLedger::Global().Accounts();
  const json batching_before = (*backend)->RuntimeStats()["batching"];

  LoadReport r = RunLoad(lo, prompts);
  const json batching_after = (*backend)->RuntimeStats()["batching"];

  for (int i = 0; i < 500 && (*server)->scheduler().Stats().busy > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const uint64_t rss_after = ResidentBytes();
  const auto ledger_after = MemoryLedger::Global().Accounts();
  SchedulerStats st = (*server)->scheduler().Stats();
  const bool health = st.busy == 0 && st.queued == 0;

  json out = r.ToJson();
  out["model"] = (*backend)->ModelId();
  out["parallel"] = parallel;
  out["max_tokens"] = max_tokens;
  out["server_cancelled_generations"] = st.cancelled;
  out["server_idle_after"] = health;
  // Continuous batching over the measured run: model passes, and sequences per pass.
  {
    auto diff = [&](const char* k) {
      return batching_after[k].get<double>() - batching_before[k].get<double>();
    };
    const double steps = diff("steps");
    out["batching"] = {{"steps", steps},
                       {"token_steps", diff("token_steps")},
                       {"mean_sequences", steps > 0 ? diff("sequences") / steps : 0.0},
                       {"max_sequences", batching_after["max_sequences"]},
                       {"prompt_chunks_with_decode", diff("prompt_chunks_with_decode")},
                       {"gather_seconds", diff("gather_seconds")},
                       {"compute_seconds", diff("compute_seconds")}};
  }
  out["rss_mb_after_warmup"] = rss_before / 1048576.0;
  out["rss_mb_after_run"] = rss_after / 1048576.0;
  out["rss_growth_mb"] = (static_cast<double>(rss_after) - static_cast<double>(rss_before)) / 1048576.0;
  // Weights and KV caches must not move; scratch may grow to its bound (the largest prefill
  // batch seen), which is not a leak.
  bool ledger_flat = true;
  for (const auto& [account, a] : ledger_after) {
    auto it = ledger_before.find(account);
    const uint64_t before = it == ledger_before.end() ? 0 : it->second.current;
    out["ledger_bytes"][account] = {{"after_warmup", before}, {"after_run", a.current}};
    if (account != "scratch" && a.current != before) ledger_flat = false;
  }
  out["ledger_flat"] = ledger_flat;
  const bool ok = r.errors == 0 && r.mismatches == 0 && r.completed > 0 && health && ledger_flat;
  out["ok"] = ok;
  std::printf("%s\n", out.dump(1).c_str());
  (*server)->Stop();
  return ok ? 0 : 1;
}
