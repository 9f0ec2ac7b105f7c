// substrate template: renders one chat template over one conversation, as transformers would.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/file_io.h"
#include "tokenizer/chat_template.h"

namespace substrate::cli {
namespace {

int RunTemplate(const std::vector<std::string>& args) {
  Flags flags(args, {"--template", "--context", "--now"});
  if (!flags.status().ok()) return PrintError("template", flags.status());
  std::string tmpl_path = flags.Get({"--template"});
  std::string ctx_path = flags.Get({"--context"});
  if (tmpl_path.empty() || ctx_path.empty() || flags.Has("--help")) {
    std::fprintf(stderr,
                 "usage: substrate template --template FILE.jinja --context CASE.json [--now YYYY-MM-DDTHH:MM:SS]\n"
                 "  CASE.json: {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": true,\n"
                 "              \"bos_token\": \"...\", \"eos_token\": \"...\", \"now\": \"2026-11-29T12:00:00\"}\n");
    return 2;
  }
  auto tmpl = ReadFileToString(tmpl_path, 16u << 20);
  if (!tmpl.ok()) return PrintError("template", tmpl.status());
  auto ctx_text = ReadFileToString(ctx_path, 256u << 20);
  if (!ctx_text.ok()) return PrintError("template", ctx_text.status());
  nlohmann::ordered_json ctx;
  try {
    ctx = nlohmann::ordered_json::parse(*ctx_text);
  } catch (const nlohmann::json::exception& e) {
    return PrintError("template", InvalidArgument(ctx_path + ": invalid JSON: " + e.what()));
  }
  if (!ctx.is_object()) return PrintError("template", InvalidArgument(ctx_path + ": expected a JSON object"));
  TemplateOptions opts;
  std::string now = flags.Get({"--now"}, ctx.value("now", std::string()));
  if (!now.empty()) {
    auto tm = ParseDateTime(now);
    if (!tm.ok()) return PrintError("template", tm.status());
    std::tm fixed = *tm;
    opts.now = [fixed] { return fixed; };
  }
  // Test-case bookkeeping keys are not template variables.
  for (const char* k : {"now", "template", "case", "status", "expected_file"}) ctx.erase(k);
  auto out = RenderChatTemplate(*tmpl, ctx, opts);
  if (!out.ok()) {
    // The template's own message, alone on stderr (as Python's exception text).
    std::fprintf(stderr, "%s\n", out.status().message().c_str());
    return 1;
  }
  std::fwrite(out->data(), 1, out->size(), stdout);
  return 0;
}

CommandRegistrar reg("template", "render a chat template over a conversation (as transformers would)", &RunTemplate);

}  // namespace
}  // namespace substrate::cli
