// substrate quantize: a model (GGUF file or HF folder) to a quantized GGUF.
//
//   quantize IN OUT TYPE [--plan P] [--imatrix F]   a type or one of llama.cpp's mixes
//   quantize IN OUT --plan P [--imatrix F]          per-tensor types from a plan
//   quantize IN OUT --size BYTES|--bpw BITS -f TEXT  the best file that fits (see kUsage)
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "cli/command.h"
#include "cli/quantize_size.h"
#include "compiler/activation_stats.h"
#include "compiler/size_plan.h"
#include "core/file_io.h"
#include "core/thread_pool.h"
#include "format/model_file.h"
#include "quant/mix.h"
#include "quant/quantize_model.h"
#include "quant/type_plan.h"

namespace substrate::cli {
namespace {

const char* kUsage =
    "usage: substrate quantize IN.gguf|HF_DIR OUT.gguf TYPE [--plan plan.json] [--imatrix F]\n"
    "       substrate quantize IN OUT.gguf --plan plan.json [--imatrix F]\n"
    "       substrate quantize IN OUT.gguf (--size BYTES | --bpw BITS) -f CALIBRATION_TEXT\n"
    "           [--profile P.json] [--types Q2_K,Q3_K,IQ4_XS,Q4_K,Q5_K,Q6_K,Q8_0] [--no-importance]\n"
    "           [--stats-chunks N] [--measure-chunks N] [--groups N] [-c CTX]\n"
    "           [--report F.svg [--report-text EVAL.txt] [--report-chunks 20]]\n"
    "  common: [--threads N]\n"
    "  TYPE: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL IQ4_XS Q2_K Q2_K_S Q3_K_S Q3_K_M\n"
    "        Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K (Q3_K/Q4_K/Q5_K mean the _M mixes)\n"
    "  --plan: per-tensor types ({\"tensor_types\": {...}}: a compiled plan or file plan) that\n"
    "        override TYPE's rules; without TYPE, tensors the plan does not name are copied\n"
    "  --imatrix: activation statistics (from --size's cache, or `substrate calibrate\n"
    "        --imatrix`) that weight every K-quant and IQ4 tensor's quantization error\n"
    "  --size/--bpw: calibrates on TEXT (statistics, per-tensor error estimates and a few\n"
    "        measured KLs; cached and resumed in P.partial.json and P.imatrix.gguf, P defaulting\n"
    "        to OUT.gguf.profile.json), plans the file within 0.1 % below BYTES (or BITS per\n"
    "        weight of the whole model) to the byte, quantizes with importance and prints the mix.\n"
    "        --report draws predicted (and with --report-text, measured) KLD against file size,\n"
    "        llama.cpp's fixed mixes as points. Defaults by model size: under 200M parameters\n"
    "        -c 512, 64 statistics chunks, each tensor's KL measured alone on 4 chunks; above,\n"
    "        -c 256, 4 chunks, 24 groups of tensors (kind x layer range) measured on 1 chunk.\n";

std::string Mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// `quantize IN OUT [TYPE] [--plan P]`: the mix's rules, or a plan's types, or both.
int QuantizeTypeOrPlan(const Flags& flags, const ModelFile& in, const std::string& out_path,
                       ThreadPool& pool) {
  const bool have_type = flags.positional().size() == 3;
  QuantizeOptions opt;
  if (have_type) {
    auto ftype = FileTypeFromName(flags.positional()[2]);
    if (!ftype) {
      std::string names;
      for (const auto& n : FileTypeNames()) names += " " + n;
      return PrintError("quantize", InvalidArgument("unknown type '" + flags.positional()[2] +
                                                    "'; known:" + names));
    }
    opt.ftype = *ftype;
  }
  std::map<std::string, DType> plan;
  std::string summary;
  if (flags.Has("--plan")) {
    const std::string path = flags.Get({"--plan"});
    auto p = LoadTensorTypePlan(path);
    if (!p.ok()) return PrintError("quantize", p.status());
    plan = std::move(*p);
    opt.overrides = &plan;
    // A file plan carries its summary (and the size it predicted); a runtime plan only types.
    auto text = ReadFileToString(path, 256ull << 20);
    auto fp = text.ok() ? compiler::FilePlanFromJson(*text) : Expected<compiler::FilePlan>(text.status());
    if (fp.ok()) summary = fp->summary;
  }
  if (!have_type) opt.copy_unlisted = true;
  std::unique_ptr<compiler::ActivationStats> stats;
  if (flags.Has("--imatrix")) {
    auto s = compiler::LoadActivationStats(flags.Get({"--imatrix"}));
    if (!s.ok()) return PrintError("quantize", s.status());
    stats = std::make_unique<compiler::ActivationStats>(std::move(*s));
    opt.importance = stats.get();
  }
  opt.pool = &pool;
  if (flags.Has("--plan")) {
    // What the file is: the nearest llama.cpp file type, and the plan in our own key.
    auto layout = LayoutQuantizedFile(in, opt);
    if (!layout.ok()) return PrintError("quantize", layout.status());
    auto nearest = NearestFileType(in, layout->file_bytes);
    if (!nearest.ok()) return PrintError("quantize", nearest.status());
    if (!have_type) opt.ftype = *nearest;
    opt.file_type_id = nearest->id;
    if (summary.empty()) {
      std::vector<std::pair<std::string, DType>> ordered;
      for (const TensorInfo& t : layout->tensors)
        if (plan.count(t.name)) ordered.emplace_back(t.name, t.type);
      summary = compiler::MixSummary(ordered, -1);
    }
    opt.extra_metadata.emplace_back(kQuantizePlanKey, MetaValue::Str(summary));
  }
  auto layout = LayoutQuantizedFile(in, opt);
  if (!layout.ok()) return PrintError("quantize", layout.status());
  GgufFileSink sink(out_path);
  auto report = QuantizeModel(in, opt, sink);
  if (!report.ok()) return PrintError("quantize", report.status());

  std::map<std::string, int> per_type;
  for (const auto& t : report->tensors) {
    ++per_type[DTypeName(t.to)];
    if (t.fallback)
      std::fprintf(stderr, "note: %s: rows of %llu do not fit the mix's type, using %s\n",
                   t.name.c_str(), static_cast<unsigned long long>(t.cols), DTypeName(t.to));
  }
  auto nearest = NearestFileType(in, layout->file_bytes);
  std::printf("%s -> %s (%s%s%s): %zu tensors, %s -> %s in %.2f s, file %llu bytes\n", in.path().c_str(),
              out_path.c_str(), have_type ? opt.ftype.name : "plan",
              flags.Has("--plan") ? ", file type " : "", flags.Has("--plan") && nearest.ok() ? nearest->name : "",
              report->tensors.size(), Mib(report->bytes_in).c_str(), Mib(report->bytes_out).c_str(),
              report->seconds, static_cast<unsigned long long>(layout->file_bytes));
  for (const auto& [type, n] : per_type) std::printf("  %-7s %d tensors\n", type.c_str(), n);
  if (stats) std::printf("  importance from %s (%lld tokens)\n", flags.Get({"--imatrix"}).c_str(),
                         static_cast<long long>(stats->tokens));
  return 0;
}

int RunQuantize(const std::vector<std::string>& args) {
  Flags flags(args, {{"--threads", "-t", "--plan", "--imatrix", "--size", "--bpw", "-f", "--file",
                      "--profile", "--types", "--stats-chunks", "--measure-chunks", "--groups", "-c",
                      "--ctx-size", "--report", "--report-text", "--report-chunks"},
                     {"--no-importance"},
                     3});
  if (!flags.status().ok()) return UsageError("quantize", flags.status(), kUsage);
  if (flags.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const bool by_size = flags.Has("--size") || flags.Has("--bpw");
  const size_t n_pos = flags.positional().size();
  if (n_pos < 2)
    return UsageError("quantize", InvalidArgument("need IN and OUT"), kUsage);
  if (by_size && n_pos != 2)
    return UsageError("quantize", InvalidArgument("--size/--bpw take no TYPE"), kUsage);
  if (!by_size && n_pos == 2 && !flags.Has("--plan"))
    return UsageError("quantize", InvalidArgument("need TYPE, --plan, --size or --bpw"), kUsage);
  const std::string& in_path = flags.positional()[0];
  const std::string& out_path = flags.positional()[1];
  auto threads = ThreadsFlag(flags, {"--threads", "-t"});
  if (!threads.ok()) return PrintError("quantize", threads.status());
  if (in_path == out_path)
    return PrintError("quantize", InvalidArgument("input and output are the same file"));
  auto in = ModelFile::Open(in_path);
  if (!in.ok()) return PrintError("quantize", in.status());
  std::unique_ptr<ThreadPool> own_pool;
  if (*threads > 0) own_pool = std::make_unique<ThreadPool>(static_cast<int>(*threads));
  ThreadPool& pool = own_pool ? *own_pool : ThreadPool::Default();
  if (by_size) return QuantizeToSize(flags, **in, out_path, pool, static_cast<int>(*threads));
  return QuantizeTypeOrPlan(flags, **in, out_path, pool);
}

CommandRegistrar reg("quantize",
                     "quantize a model to a type, a llama.cpp mix (Q4_K_M, ...), a plan, or a size",
                     &RunQuantize);

}  // namespace
}  // namespace substrate::cli
