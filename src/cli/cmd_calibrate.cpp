// substrate calibrate: measure a model's per-op quality loss at each candidate type (a
// calibrated profile for `substrate compile`), or evaluate a plan / a reference file's types on
// held-out chunks of the same text.
//
//   substrate calibrate -m tiny-coder-bf16.gguf -f heldout.txt --chunks 4 -o profile.json
//   substrate calibrate -m tiny-coder-bf16.gguf -f heldout.txt --evaluate plan.json
//       --from-chunk 8 --chunks 20 [--profile profile.json]
//   substrate calibrate -m tiny-coder-bf16.gguf -f heldout.txt --evaluate tiny-coder-Q4_K_M.gguf ...
#include <cstdio>

#include "cli/command.h"
#include "compiler/calibrate.h"
#include "compiler/hardware.h"
#include "core/file_io.h"
#include "core/memory_ledger.h"

namespace substrate::cli {
namespace {

constexpr const char* kUsage =
    "usage: substrate calibrate -m MODEL -f TEXT [--types Q2_K,Q3_K,...] [-c 512]\n"
    "         [--from-chunk 0] [--chunks 4] [-t THREADS] -o profile.json\n"
    "       substrate calibrate -m MODEL -f TEXT --evaluate PLAN.json|FILE.gguf\n"
    "         [--from-chunk N] [--chunks M] [--profile profile.json]\n"
    "       substrate calibrate --measure-hardware PROFILE [--ssd-file FILE]\n"
    "Calibration resumes from OUT.partial when it exists. Evaluation prints JSON: the mean KL\n"
    "divergence of the final logits against MODEL, and the additive prediction from --profile.\n";

int MeasureHardware(const Flags& f) {
  const std::string path = f.Get({"--measure-hardware"});
  auto profile = compiler::LoadProfile(path);
  if (!profile.ok()) return PrintError("calibrate", profile.status());
  auto mem = compiler::MeasureMemoryReadBandwidth();
  if (!mem.ok()) return PrintError("calibrate", mem.status());
  std::string ssd_file = f.Get({"--ssd-file"});
  auto ssd = ssd_file.empty() ? compiler::MeasureScratchReadBandwidth(
                                    path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/')))
                              : compiler::MeasureFileReadBandwidth(ssd_file);
  if (!ssd.ok()) return PrintError("calibrate", ssd.status());
  profile->hardware.memory_read_bw = *mem;
  profile->hardware.ssd_read_bw = ssd->bytes_per_second;
  profile->hardware.measured_by = std::string("substrate calibrate --measure-hardware") +
                                  (ssd->direct_io ? " (direct I/O)" : " (buffered reads)");
  Status st = compiler::SaveProfile(*profile, path);
  if (!st.ok()) return PrintError("calibrate", st);
  std::printf("memory read %s/s, SSD read %s/s (%s)\n", FormatBytes(static_cast<uint64_t>(*mem)).c_str(),
              FormatBytes(static_cast<uint64_t>(ssd->bytes_per_second)).c_str(),
              ssd->direct_io ? "direct I/O" : "buffered");
  return 0;
}

int Evaluate(const Flags& f, const std::string& model, const std::string& text, int64_t n_ctx,
             int64_t from, int64_t chunks, int threads) {
  const std::string what = f.Get({"--evaluate"});
  std::map<std::string, DType> types;
  std::string note;
  if (what.size() > 5 && what.substr(what.size() - 5) == ".json") {
    auto plan = compiler::LoadPlan(what);
    if (!plan.ok()) return PrintError("calibrate", plan.status());
    auto t = compiler::PlanTensorTypes(*plan, &note);
    if (!t.ok()) return PrintError("calibrate", t.status());
    types = *t;
  } else {
    auto t = compiler::FileTensorTypes(what);
    if (!t.ok()) return PrintError("calibrate", t.status());
    types = *t;
  }
  auto runner = compiler::CalibrationRunner::Open(model, text, n_ctx, threads);
  if (!runner.ok()) return PrintError("calibrate", runner.status());
  auto m = (*runner)->Measure(types, from, chunks);
  if (!m.ok()) return PrintError("calibrate", m.status());
  std::printf("{\"evaluated\": \"%s\", \"chunks\": [%lld, %lld], \"mean_kld\": %.6f, \"kld_err\": %.6f, "
              "\"same_top\": %.4f, \"ppl\": %.4f, \"scored\": %lld",
              what.c_str(), static_cast<long long>(from), static_cast<long long>(from + chunks),
              m->mean_kld, m->kld_err, m->same_top, m->ppl, static_cast<long long>(m->n_scored));
  std::string prof = f.Get({"--profile"});
  if (!prof.empty()) {
    auto p = compiler::LoadProfile(prof);
    if (!p.ok()) return PrintError("calibrate", p.status());
    compiler::Prediction pr = compiler::PredictAdditive(*p, types);
    std::printf(", \"predicted_kld\": %.6f, \"planned_bytes\": %llu, \"unmatched_ops\": %d", pr.loss,
                static_cast<unsigned long long>(pr.bytes), pr.unmatched_ops);
  }
  std::printf("}\n");
  if (!note.empty()) std::fprintf(stderr, "%s", note.c_str());
  return 0;
}

int RunCalibrate(const std::vector<std::string>& args) {
  Flags f(args, {{"-m", "--model", "-f", "--file", "--types", "-c", "--ctx-size", "--from-chunk",
                  "--chunks", "-t", "--threads", "-o", "--out", "--evaluate", "--profile",
                  "--measure-hardware", "--ssd-file"}});
  if (!f.status().ok()) return UsageError("calibrate", f.status(), kUsage);
  if (f.help()) return std::fputs(kUsage, stdout), 0;
  if (!f.Get({"--measure-hardware"}).empty()) return MeasureHardware(f);
  const std::string model = f.Get({"-m", "--model"}), text = f.Get({"-f", "--file"});
  if (model.empty() || text.empty())
    return UsageError("calibrate", InvalidArgument("need -m MODEL and -f TEXT"), kUsage);
  auto n_ctx = f.GetInt({"-c", "--ctx-size"}, 512), from = f.GetInt({"--from-chunk"}, 0),
       chunks = f.GetInt({"--chunks"}, 4);
  auto threads = ThreadsFlag(f);
  for (auto* e : {&n_ctx, &from, &chunks})
    if (!e->ok()) return PrintError("calibrate", e->status());
  if (!threads.ok()) return PrintError("calibrate", threads.status());
  if (*from < 0 || *chunks <= 0 || *chunks > 100000)
    return PrintError("calibrate", InvalidArgument("--from-chunk >= 0, --chunks >= 1, --threads >= 0"));
  if (!f.Get({"--evaluate"}).empty())
    return Evaluate(f, model, text, *n_ctx, *from, *chunks, static_cast<int>(*threads));

  compiler::CalibrationOptions o;
  o.model_path = model;
  o.text_path = text;
  o.n_ctx = *n_ctx;
  o.first_chunk = *from;
  o.n_chunks = *chunks;
  o.threads = static_cast<int>(*threads);
  std::string types = f.Get({"--types"});
  for (size_t pos = 0; !types.empty() && pos <= types.size();) {
    size_t comma = types.find(',', pos);
    std::string name = types.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    auto t = DTypeFromName(name);
    if (!t) return PrintError("calibrate", InvalidArgument("--types: unknown type '" + name + "'"));
    o.types.push_back(*t);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  const std::string out = f.Get({"-o", "--out"});
  if (out.empty()) return PrintError("calibrate", InvalidArgument("-o profile.json is required"));
  o.partial_path = out + ".partial";
  auto profile = compiler::Calibrate(o);
  if (!profile.ok()) return PrintError("calibrate", profile.status());
  Status st = compiler::SaveProfile(*profile, out);
  if (!st.ok()) return PrintError("calibrate", st);
  std::printf("wrote %s: %zu ops calibrated on chunks %lld..%lld of %s\n", out.c_str(),
              profile->ops.size(), static_cast<long long>(*from),
              static_cast<long long>(*from + *chunks), text.c_str());
  return 0;
}

CommandRegistrar reg("calibrate", "measure per-op quality loss per type (a calibrated profile)",
                     &RunCalibrate);

}  // namespace
}  // namespace substrate::cli
