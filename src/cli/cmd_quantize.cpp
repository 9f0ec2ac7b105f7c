// substrate quantize IN OUT TYPE [--threads N] [--plan plan.json]
//
// Converts a model (GGUF file or HF folder) to a quantized GGUF: a single type (Q8_0, Q4_0,
// F16, ...) or one of llama.cpp's mixes (Q2_K, Q3_K_S/M/L, Q4_K_S/M, Q5_K_S/M, Q6_K), with
// llama.cpp's per-tensor rules. --plan applies per-tensor types chosen by `substrate compile`.
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "cli/command.h"
#include "core/thread_pool.h"
#include "format/model_file.h"
#include "quant/mix.h"
#include "quant/quantize_model.h"
#include "quant/type_plan.h"

namespace substrate::cli {
namespace {

const char* kUsage =
    "usage: substrate quantize IN.gguf|HF_DIR OUT.gguf TYPE [--threads N] [--plan plan.json]\n"
    "  TYPE: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL IQ4_XS Q2_K Q2_K_S Q3_K_S Q3_K_M\n"
    "        Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K (Q3_K/Q4_K/Q5_K mean the _M mixes)\n"
    "  --plan: JSON {\"tensor_types\": {\"tensor name\": \"TYPE\", ...}} overriding the mix\n";

std::string Mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

int RunQuantize(const std::vector<std::string>& args) {
  Flags flags(args, {{"--threads", "-t", "--plan"}, {}, 3});
  if (!flags.status().ok()) return UsageError("quantize", flags.status(), kUsage);
  if (flags.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (flags.positional().size() != 3)
    return UsageError("quantize", InvalidArgument("need IN, OUT and TYPE"), kUsage);
  const std::string& in_path = flags.positional()[0];
  const std::string& out_path = flags.positional()[1];
  auto ftype = FileTypeFromName(flags.positional()[2]);
  if (!ftype) {
    std::string names;
    for (const auto& n : FileTypeNames()) names += " " + n;
    return PrintError("quantize", InvalidArgument("unknown type '" + flags.positional()[2] +
                                                  "'; known:" + names));
  }
  auto threads = ThreadsFlag(flags, {"--threads", "-t"});
  if (!threads.ok()) return PrintError("quantize", threads.status());
  if (in_path == out_path)
    return PrintError("quantize", InvalidArgument("input and output are the same file"));

  std::map<std::string, DType> plan;
  if (flags.Has("--plan")) {
    auto p = LoadTensorTypePlan(flags.Get({"--plan"}));
    if (!p.ok()) return PrintError("quantize", p.status());
    plan = std::move(*p);
  }
  auto in = ModelFile::Open(in_path);
  if (!in.ok()) return PrintError("quantize", in.status());

  std::unique_ptr<ThreadPool> own_pool;
  if (*threads > 0) own_pool = std::make_unique<ThreadPool>(static_cast<int>(*threads));
  QuantizeOptions opt;
  opt.ftype = *ftype;
  opt.overrides = flags.Has("--plan") ? &plan : nullptr;
  opt.pool = own_pool ? own_pool.get() : &ThreadPool::Default();
  GgufFileSink sink(out_path);
  auto report = QuantizeModel(**in, opt, sink);
  if (!report.ok()) return PrintError("quantize", report.status());

  std::map<std::string, int> per_type;
  for (const auto& t : report->tensors) {
    ++per_type[DTypeName(t.to)];
    if (t.fallback)
      std::fprintf(stderr, "note: %s: rows of %llu do not fit the mix's type, using %s\n",
                   t.name.c_str(), static_cast<unsigned long long>(t.cols), DTypeName(t.to));
  }
  std::printf("%s -> %s (%s): %zu tensors, %s -> %s in %.2f s\n", in_path.c_str(),
              out_path.c_str(), ftype->name, report->tensors.size(), Mib(report->bytes_in).c_str(),
              Mib(report->bytes_out).c_str(), report->seconds);
  for (const auto& [type, n] : per_type) std::printf("  %-7s %d tensors\n", type.c_str(), n);
  return 0;
}

CommandRegistrar reg("quantize", "quantize a model to a type or a llama.cpp mix (Q4_K_M, ...)",
                     &RunQuantize);

}  // namespace
}  // namespace substrate::cli
