// substrate synth-moe: the seed's synthetic MoE profile (no model needed), for planning
// experiments and the compile benchmark. Bandwidths are measured unless given.
#include <cstdio>

#include "cli/command.h"
#include "compiler/hardware.h"
#include "compiler/profile.h"
#include "core/memory_ledger.h"

namespace substrate::cli {
namespace {

constexpr const char* kUsage =
    "usage: substrate synth-moe [--layers 27] [--experts 64] [--top-k 8] [--shared 2]\n"
    "         [--d-model 2048] [--ffn 1536] [--vocab 102400] [--seed 1] [--model-id NAME]\n"
    "         [--mem-bw BYTES/S --ssd-bw BYTES/S] --out profile.json\n"
    "Without --mem-bw/--ssd-bw the bandwidths are measured on this machine.\n";

int RunSynthMoe(const std::vector<std::string>& args) {
  Flags f(args, {{"--layers", "--experts", "--top-k", "--shared", "--d-model", "--ffn", "--vocab",
                  "--seed", "--model-id", "--mem-bw", "--ssd-bw", "--out", "-o"}});
  if (!f.status().ok()) return UsageError("synth-moe", f.status(), kUsage);
  if (f.help()) return std::fputs(kUsage, stdout), 0;
  compiler::SynthMoeOptions o;
  auto geti = [&](const char* name, long long def) { return f.GetInt({name}, def); };
  auto layers = geti("--layers", o.layers), experts = geti("--experts", o.experts),
       top_k = geti("--top-k", o.top_k), shared = geti("--shared", o.shared_experts),
       d = geti("--d-model", static_cast<long long>(o.d_model)),
       ffn = geti("--ffn", static_cast<long long>(o.expert_ffn)),
       vocab = geti("--vocab", static_cast<long long>(o.vocab)), seed = geti("--seed", 1);
  for (auto* e : {&layers, &experts, &top_k, &shared, &d, &ffn, &vocab, &seed})
    if (!e->ok()) return PrintError("synth-moe", e->status());
  if (*d <= 0 || *ffn <= 0 || *vocab <= 0 || *seed < 0)
    return PrintError("synth-moe", InvalidArgument("--d-model, --ffn, --vocab must be positive"));
  o.layers = static_cast<int>(*layers);
  o.experts = static_cast<int>(*experts);
  o.top_k = static_cast<int>(*top_k);
  o.shared_experts = static_cast<int>(*shared);
  o.d_model = static_cast<uint64_t>(*d);
  o.expert_ffn = static_cast<uint64_t>(*ffn);
  o.vocab = static_cast<uint64_t>(*vocab);
  o.seed = static_cast<uint64_t>(*seed);
  o.model_id = f.Get({"--model-id"}, "synthetic-moe");
  std::string out = f.Get({"--out", "-o"});
  if (out.empty()) return PrintError("synth-moe", InvalidArgument("--out FILE is required"));
  auto profile = compiler::SynthesizeMoeProfile(o);
  if (!profile.ok()) return PrintError("synth-moe", profile.status());

  auto mem = f.GetDouble({"--mem-bw"}, 0), ssd = f.GetDouble({"--ssd-bw"}, 0);
  if (!mem.ok()) return PrintError("synth-moe", mem.status());
  if (!ssd.ok()) return PrintError("synth-moe", ssd.status());
  profile->hardware.memory_read_bw = *mem;
  profile->hardware.ssd_read_bw = *ssd;
  profile->hardware.measured_by = "given on the command line";
  if (*mem <= 0 || *ssd <= 0) {
    std::string dir = out.find('/') == std::string::npos ? "." : out.substr(0, out.rfind('/'));
    if (*mem <= 0) {
      auto m = compiler::MeasureMemoryReadBandwidth();
      if (!m.ok()) return PrintError("synth-moe", m.status());
      profile->hardware.memory_read_bw = *m;
    }
    if (*ssd <= 0) {
      auto s = compiler::MeasureScratchReadBandwidth(dir);
      if (!s.ok()) return PrintError("synth-moe", s.status());
      profile->hardware.ssd_read_bw = s->bytes_per_second;
    }
    profile->hardware.measured_by = "substrate synth-moe (measured on this machine)";
  }
  Status st = compiler::SaveProfile(*profile, out);
  if (!st.ok()) return PrintError("synth-moe", st);
  uint64_t bf16 = profile->overhead_bytes;
  for (const auto& op : profile->ops) bf16 += op.options.back().bytes;
  std::printf("wrote %s: %zu ops, %s at the top precision; memory %s/s, SSD %s/s\n", out.c_str(),
              profile->ops.size(), FormatBytes(bf16).c_str(),
              FormatBytes(static_cast<uint64_t>(profile->hardware.memory_read_bw)).c_str(),
              FormatBytes(static_cast<uint64_t>(profile->hardware.ssd_read_bw)).c_str());
  return 0;
}

CommandRegistrar reg("synth-moe", "write a synthetic MoE model profile (the seed's demo)", &RunSynthMoe);

}  // namespace
}  // namespace substrate::cli
