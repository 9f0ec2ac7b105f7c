// substrate chat: an interactive conversation in the terminal through the model's chat template.
// The session's KV cache is kept between turns, so each turn only evaluates its new tokens.
// With --session F the conversation survives the process: its messages in F.messages.json and
// its KV cache in F (runtime/kv_session: checksummed, written atomically), restored next time.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/generation_flags.h"
#include "cli/store_flags.h"
#include "core/file_io.h"

namespace substrate::cli {
namespace {

constexpr const char* kUsage =
    "usage: substrate chat -m MODEL [-c CTX] [-n N] [--temp T] [--seed S] [--system TEXT]\n"
    "                      [--kv-type f32|f16] [--draft-max K] [--draft-model M | --draft-mtp] [--session F]\n"
    "                      [--device cpu|cuda] [--gpu N] [--max-vram SIZE]\n"
    "                      [--store STORE/ --max-ram SIZE [--plan P] [--tier N] ...]\n"
    "                      [--cache-aware-routing DELTA] [--lookahead N]\n"
    "                      [--verify off|all|margin ...]\n"
    "                      (as for substrate run)\n"
    "  --session F  keep the conversation in F (its KV cache) and F.messages.json, and go on\n"
    "               with it in a later run\n"
    "  type a message and press enter; /reset starts over, /exit (or end of input) quits\n"
    "  --print-plan  print the plan the session chose (see substrate run --help) on stderr\n";

int RunChat(const std::vector<std::string>& args) {
  Flags f(args, {StoreFlagsWithValue(GenerationFlagsWithValue({"--system", "--session"})),
                 StoreSwitches({"--draft-mtp"})});
  if (!f.status().ok()) return UsageError("chat", f.status(), kUsage);
  if (f.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  auto gf = ParseGenerationFlags(f);
  if (!gf.ok()) return PrintError("chat", gf.status());
  if (!f.Has("-n") && !f.Has("--n-predict")) gf->generate.max_tokens = 512;
  if (!f.Has("--temp") && !f.Has("--temperature")) gf->generate.sampling.temperature = 0.7f;
  const std::string session_file = f.Get({"--session"});
  if (!session_file.empty()) gf->prompt_cache = session_file;  // the KV cache, restored and saved
  EngineOptions eo;
  eo.n_ctx = gf->n_ctx;
  if (Status st = ApplyStoreFlags(f, &eo); !st.ok()) return PrintError("chat", st);
  KeepDraftTierResident(gf->generate.verify, &eo);
  auto loaded = LoadForGeneration(*gf, eo);
  if (!loaded.ok()) return PrintError("chat", loaded.status());
  auto& [engine, session] = *loaded;
  PrintPlanIfAsked(f, *engine);

  std::vector<ChatMessage> messages;
  if (f.Has("--system")) messages.push_back({"system", f.Get({"--system"})});
  const size_t n_fixed = messages.size();
  const std::string messages_file = session_file + ".messages.json";
  if (!session_file.empty() && FileExists(messages_file)) {
    auto text = ReadFileToString(messages_file);
    if (!text.ok()) return PrintError("chat", text.status());
    nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
    if (!j.is_array()) return PrintError("chat", Corruption("'" + messages_file + "' is not a message list"));
    messages.clear();
    for (const auto& m : j) {
      if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m["role"].is_string() ||
          !m["content"].is_string())
        return PrintError("chat", Corruption("'" + messages_file + "' holds a malformed message"));
      messages.push_back({m["role"], m["content"]});
    }
    std::fprintf(stderr, "(session %s: %zu earlier messages)\n", session_file.c_str(), messages.size());
  }
  auto save_session = [&]() -> Status {
    if (session_file.empty()) return Status::Ok();
    nlohmann::json j = nlohmann::json::array();
    for (const ChatMessage& m : messages) j.push_back({{"role", m.role}, {"content", m.content}});
    RETURN_IF_ERROR(WriteFileAtomic(messages_file, j.dump(1)));
    return SavePromptCache(*gf, *engine, *session);
  };
  std::string line;
  while (true) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages.resize(n_fixed);
      if (Status saved = save_session(); !saved.ok()) return PrintError("chat", saved);
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({"user", line});
    auto ids = EncodeChat(*engine, messages, true);
    if (!ids.ok()) return PrintError("chat", ids.status());
    std::string reply;
    auto st = engine->Generate(*session, *ids, gf->generate, [&](int32_t, const std::string& t) {
      reply += t;
      std::fwrite(t.data(), 1, t.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::fputs("\n", stdout);
    if (!st.ok()) {
      PrintError("chat", st.status());
      messages.pop_back();
      continue;  // e.g. the context is full: the user can /reset
    }
    messages.push_back({"assistant", reply});
    if (Status saved = save_session(); !saved.ok()) return PrintError("chat", saved);
  }
  return 0;
}

CommandRegistrar reg("chat", "interactive chat with a model (-m MODEL)", &RunChat);

}  // namespace
}  // namespace substrate::cli
