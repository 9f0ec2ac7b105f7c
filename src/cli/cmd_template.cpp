// substrate template: renders one chat template over one conversation, as transformers would.
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/file_io.h"
#include "tokenizer/chat_template.h"

namespace substrate::cli {
namespace {

constexpr const char* kUsage =
    "usage: substrate template --template FILE.jinja --context CASE.json [--now "
    "YYYY-MM-DDTHH:MM:SS]\n"
    "                         [--bench N]  (render N more times, print timing JSON on stderr)\n"
    "  CASE.json: {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": true,\n"
    "              \"bos_token\": \"...\", \"eos_token\": \"...\", \"now\": "
    "\"2026-11-29T12:00:00\"}\n";

int RunTemplate(const std::vector<std::string>& args) {
  Flags flags(args, {{"--template", "--context", "--now", "--bench"}});
  if (!flags.status().ok()) return UsageError("template", flags.status(), kUsage);
  if (flags.help()) return std::fputs(kUsage, stdout), 0;
  std::string tmpl_path = flags.Get({"--template"});
  std::string ctx_path = flags.Get({"--context"});
  if (tmpl_path.empty() || ctx_path.empty())
    return UsageError("template", InvalidArgument("need --template and --context"), kUsage);
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
  auto bench = flags.GetInt({"--bench"}, 0);
  if (!bench.ok()) return PrintError("template", bench.status());
  auto out = RenderChatTemplate(*tmpl, ctx, opts);
  if (out.ok() && *bench > 0) {
    // Parse once, render N times: what a server pays per request.
    auto parsed = ChatTemplate::Parse(*tmpl);
    auto t0 = std::chrono::steady_clock::now();
    for (long long i = 0; i < *bench && parsed.ok(); ++i) {
      auto r = parsed->Render(ctx, opts);
      if (!r.ok()) return PrintError("template", r.status());
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    auto p0 = std::chrono::steady_clock::now();
    for (long long i = 0; i < *bench; ++i) (void)ChatTemplate::Parse(*tmpl);
    double parse_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - p0).count();
    std::fprintf(stderr, "{\"renders\": %lld, \"render_us\": %.2f, \"parse_us\": %.2f, \"output_bytes\": %zu}\n",
                 *bench, us / static_cast<double>(*bench), parse_us / static_cast<double>(*bench), out->size());
  }
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
