// substrate bench: prompt-processing and generation speed of a model, in the manner of
// llama-bench, next to the physical limit: the memory bandwidth measured in the same run and
// the bytes of weights each generated token must read. Decode is bandwidth-bound, so
// achieved / limit says how much speed is left on the table. With --store the weights are the
// store's at its served tier (skeleton + residuals), counted by the same rule, and the disk read
// rate over decode is set against an O_DIRECT read of one store file in the same run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/generation_flags.h"
#include "cli/store_flags.h"
#include "core/file_io.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "kernels/membw.h"
#include "kernels/profile.h"
#include "model/hparams.h"
#include "model/op_id.h"
#include "runtime/engine.h"
#include "runtime/read_probe.h"
#include "tokenizer/tokenizer.h"

namespace substrate::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Weights {
  uint64_t total_bytes = 0;      // every tensor in the file
  uint64_t per_token_bytes = 0;  // what one decode step reads
  uint64_t n_params = 0;
};

// A weight tensor as a token's compute reads it: its bytes (for a store, every served tier's).
struct TensorBytes {
  const std::string* name;
  const std::vector<uint64_t>* ne;
  uint64_t bytes = 0;
};

// Bytes one generated token reads: every weight matrix once, except the token embedding (one
// row), in MoE layers only the routed experts' share of the expert tensors, and no next-n layer
// (a drafter's, not the token's). One rule for a model file and a store.
Weights CountWeights(const Metadata& md, const std::vector<TensorBytes>& tensors) {
  std::string arch = md.GetString("general.architecture", "");
  double n_expert = static_cast<double>(md.GetInt(arch + ".expert_count", 0));
  double n_used = static_cast<double>(md.GetInt(arch + ".expert_used_count", 0));
  const int nextn = FirstNextnLayer(md);
  Weights w;
  for (const TensorBytes& t : tensors) {
    uint64_t n_el = 1;
    for (uint64_t d : *t.ne) n_el *= d;
    w.total_bytes += t.bytes;
    w.n_params += n_el;
    if (IsNextnTensor(*t.name, nextn)) {
      continue;
    } else if (*t.name == "token_embd.weight") {
      w.per_token_bytes += t.ne->size() > 1 ? t.bytes / (*t.ne)[1] : t.bytes;
    } else if (t.name->find("_exps.") != std::string::npos && n_expert > 0) {
      w.per_token_bytes += static_cast<uint64_t>(static_cast<double>(t.bytes) * n_used / n_expert);
    } else {
      w.per_token_bytes += t.bytes;
    }
  }
  return w;
}

std::vector<TensorBytes> FileTensors(const ModelFile& file) {
  std::vector<TensorBytes> v;
  for (const auto& t : file.tensors()) v.push_back({&t.name, &t.ne, t.bytes});
  return v;
}

// A store's tensors at the served tier: the skeleton plus the residuals up to it, as the kernels
// apply them in one pass.
std::vector<TensorBytes> StoreTensors(const StoreIndex& index, int serve) {
  std::vector<TensorBytes> v;
  for (const StoreTensor& t : index.tensors()) {
    uint64_t bytes = 0;
    for (const StoreUnit& u : t.units)
      for (int k = 0; k <= serve && k < u.n_tiers; ++k) bytes += u.tier[k].bytes;
    v.push_back({&t.info.name, &t.info.ne, bytes});
  }
  return v;
}

struct Series {
  std::vector<double> tps;
  double Mean() const {
    double s = 0;
    for (double v : tps) s += v;
    return tps.empty() ? 0 : s / static_cast<double>(tps.size());
  }
  double Stdev() const {
    if (tps.size() < 2) return 0;
    double m = Mean(), s = 0;
    for (double v : tps) s += (v - m) * (v - m);
    return std::sqrt(s / static_cast<double>(tps.size() - 1));
  }
};

double Seconds(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

std::vector<int32_t> RandomTokens(int64_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(n_vocab));
  return t;
}

// Kernel timers of one timed phase: seconds per token and share of the phase, per entry, and
// the rest (norms, rope, routing, pool synchronisation) as "other".
nlohmann::json ProfileJson(const std::vector<KernelProfileEntry>& entries, double s_per_token,
                           int64_t n_tokens) {
  const double total = s_per_token * static_cast<double>(n_tokens);
  double kernel_s = 0;
  nlohmann::json parts = nlohmann::json::array();
  for (const auto& k : entries) {
    kernel_s += k.seconds;
    parts.push_back({{"name", k.name},
                     {"seconds_per_token", k.seconds / n_tokens},
                     {"share", k.seconds / total},
                     {"calls", k.calls},
                     {"bytes_per_s", k.seconds > 0 ? k.bytes / k.seconds : 0}});
  }
  parts.push_back({{"name", "other (norms, rope, routing, sync)"},
                   {"seconds_per_token", (total - kernel_s) / n_tokens},
                   {"share", (total - kernel_s) / total}});
  return parts;
}

constexpr const char* kUsage =
    "usage: substrate bench -m MODEL [-p 512] [-n 128] [-d 0] [-t N] [-r 2] [--json] [--profile]\n"
    "                       [--bw-bytes SIZE] [--bw-each-token SIZE] [--kv-type f32|f16]\n"
    "                       [--device cpu|cuda] [--gpu N]\n"
    "                       [--max-vram SIZE] [--store STORE/ --max-ram SIZE [--tier N] ...]\n"
    "                       [--cache-aware-routing DELTA] [--lookahead N]\n"
    "                       [--verify all|margin [--verify-window W] [--verify-tau T] ...]\n"
    "                       [--draft-model M | --draft-mtp] [--draft-max K] [--prompt-file F]\n"
    "Prompt processing (-p tokens in one batch) and generation (-n tokens one at a time)\n"
    "speed, bytes of weights read per generated token, the memory read bandwidth measured\n"
    "over a --bw-bytes buffer (16x the CPU's last-level cache, 512M-2G; a GPU's 2G; 128M\n"
    "under a budget) before and after the runs and around each decode run (the\n"
    "highest is the limit; under a RAM budget on the CPU once, before the model opens, so the\n"
    "run has the whole budget), and the ratio achieved/limit; each decode run also against\n"
    "the probes either side of it (tg.per_run, bw_ratio_run_median). --bw-each-token SIZE\n"
    "(plain resident decode on the CPU) reads a SIZE buffer before each token and after the\n"
    "last, and adds each token's ratio against the readings either side of it (tg.per_token:\n"
    "p10, median, p90): the limit at the moment the token ran; the probe's time is not timed.\n"
    "-p 0 or -n 0 skips a test.\n"
    "-d N (depth): each test starts after an untimed prefill of N tokens, so it reads a KV\n"
    "cache of N positions and more (as llama-bench -d); bytes per generated token then count\n"
    "the cache's rows it reads (their mean over the test) beside the weights.\n"
    "--profile adds where decode time goes (kernel timers per weight type).\n"
    "With --store: weights per token are the served tier's; disk bytes per token and the\n"
    "read rate over decode, against an O_DIRECT read of the store's largest file in the same\n"
    "run (--probe-bytes, default 256M; 0 skips it).\n"
    "With --verify: generation runs through deferred verification (greedy, from an 8-token\n"
    "random prompt after the -p test); the JSON adds its counters.\n"
    "With --draft-model M, --draft-mtp and/or --draft-max K: speculative decoding (greedy;\n"
    "drafts from M, loaded resident inside --max-ram, or from the model's own next-n layer, else\n"
    "prompt lookup): each repetition generates -n\n"
    "tokens with drafts and without, in turn, from the text of --prompt-file (default: 8\n"
    "random tokens); the JSON's \"speculative\" has the acceptance rate (accepted / drafted),\n"
    "tokens/s with and without drafts, target passes, whether the tokens were the same, and\n"
    "out of core the expert reads and bytes read from disk per generated token of each.\n"
    "With --adaptive [--verifier ...] (see substrate run --help): generation runs the adaptive\n"
    "runtime; the JSON adds the tier controller's counters.\n"
    "With --sequences B: generation decodes B sequences at once, each with its own KV cache,\n"
    "in one multi-sequence pass per step (continuous batching, as serve's slots run); t/s is\n"
    "all sequences together, and the limit counts the weights read once per step.\n"
    "--print-plan prints the plan the session chose (see substrate run --help) on stderr.\n";

int RunBench(const std::vector<std::string>& args) {
  Flags f(args, {StoreFlagsWithValue({"-m", "--model", "-p", "-n", "-d", "--depth", "-t",
                                      "--threads", "-r", "--repetitions", "--bw-bytes",
                                      "--probe-bytes", "--kv-type", "--cache-type", "--verify",
                                      "--verify-window", "--verify-tau", "--verify-tier",
                                      "--draft-tier", "--sequences", "--draft-model",
                                      "--draft-max", "--prompt-file", "--bw-each-token"}),
                 StoreSwitches({"--json", "--profile", "--draft-mtp"})});
  if (!f.status().ok()) return UsageError("bench", f.status(), kUsage);
  if (f.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  std::string path = f.Get({"-m", "--model"});
  if (path.empty() && !f.Has("--store"))
    return PrintError("bench", InvalidArgument("-m MODEL (or --store STORE/) is required"));
  auto p = f.GetInt({"-p"}, 512), n = f.GetInt({"-n"}, 128),
       r = f.GetInt({"-r", "--repetitions"}, 2), seqs = f.GetInt({"--sequences"}, 1),
       depth = f.GetInt({"-d", "--depth"}, 0);
  for (auto* e : {&p, &n, &r, &seqs, &depth})
    if (!e->ok()) return PrintError("bench", e->status());
  auto t = ThreadsFlag(f);
  if (!t.ok()) return PrintError("bench", t.status());
  if (*p < 0 || *n < 0 || *depth < 0 || *r < 1)
    return PrintError("bench", InvalidArgument("-p/-n/-d must be >= 0, -r >= 1"));
  if (*seqs < 1 || *seqs > 256)
    return PrintError("bench", InvalidArgument("--sequences must be 1..256"));
  // Under a budget (a store, or a GGUF that may run in place) the probe buffer is inside it.
  // Else a GPU's is 2 GiB, the host's large enough that no cache holds it (and no larger: it
  // counts in the bench's peak memory, which side-by-side runs compare).
  const bool under_budget = f.Has("--store") || f.Has("--max-ram") || f.Has("--max-vram");
  Expected<uint64_t> bw_bytes = under_budget                          ? 128ull << 20
                                : f.Get({"--device"}, "cpu") != "cpu" ? 2ull << 30
                                                                      : DefaultProbeBytes();
  if (f.Has("--bw-bytes")) bw_bytes = ParseBytes(f.Get({"--bw-bytes"}, ""));
  if (!bw_bytes.ok()) return PrintError("bench", bw_bytes.status());
  auto token_probe_bytes = ParseBytes(f.Get({"--bw-each-token"}, "0"));
  if (!token_probe_bytes.ok()) return PrintError("bench", token_probe_bytes.status());
  auto probe_bytes = ParseBytes(f.Get({"--probe-bytes"}, "256M"));
  if (!probe_bytes.ok()) return PrintError("bench", probe_bytes.status());
  const bool json = f.Has("--json"), profile = f.Has("--profile");

  auto kv_type = ParseKvType(f);
  if (!kv_type.ok()) return PrintError("bench", kv_type.status());
  EngineOptions eo;
  eo.n_threads = static_cast<int>(*t);
  eo.require_tokenizer = false;
  eo.kv_type = *kv_type;
  // Positions the cache must hold: the depth, then a test (p + n covers either).
  const int64_t bench_ctx = *p + *n + *depth + 8;
  eo.n_ctx = bench_ctx;
  if (Status st = ApplyStoreFlags(f, &eo); !st.ok()) return PrintError("bench", st);
  // Under a RAM budget on the host the bandwidth buffer is read before the model opens, so that
  // the budget is the run's alone, as `run` and `serve` have it (the expert cache gets what the
  // buffer would take); the disk probes' buffers after the runs are the only reserve beside it.
  // Elsewhere the buffer is read before and after the runs, the higher kept.
  std::unique_ptr<ThreadPool> own_pool;
  if (eo.n_threads > 0) own_pool = std::make_unique<ThreadPool>(eo.n_threads);
  eo.pool = own_pool ? own_pool.get() : &ThreadPool::Default();
  const bool host_budget = eo.device == "cpu" && (f.Has("--store") || f.Has("--max-ram"));
  const uint64_t probe_room = std::min<uint64_t>(32ull << 20, *bw_bytes);
  std::optional<BandwidthMeasurement> bw_unloaded;
  if (host_budget) {
    auto m = MeasureReadBandwidth(*eo.pool, *bw_bytes, 3);
    if (!m.ok()) return PrintError("bench", m.status());
    bw_unloaded = *m;
  }
  eo.extra_reserve = host_budget ? probe_room : *bw_bytes;
  auto verify = ParseVerifyFlags(f);
  if (!verify.ok()) return PrintError("bench", verify.status());
  const bool verifying = verify->mode != VerifyOptions::Mode::kOff;
  if (verifying && *seqs > 1)
    return PrintError("bench", InvalidArgument("--sequences and --verify do not go together"));
  KeepDraftTierResident(*verify, &eo);
  int draft_max = 0;
  if (Status st = ParseDraftFlags(f, &draft_max, &eo.draft_model, &eo.draft_mtp); !st.ok())
    return PrintError("bench", st);
  const bool drafting = draft_max > 0;
  if (*token_probe_bytes > 0 &&
      (host_budget || eo.device != "cpu" || drafting || verifying || *seqs > 1 || *n == 0))
    return PrintError("bench", InvalidArgument("--bw-each-token goes with plain resident decode "
                                               "on the CPU only (-n > 0, no budget, no drafts, "
                                               "--verify or --sequences)"));
  std::string prompt_text;
  if (f.Has("--prompt-file")) {
    if (!drafting)
      return PrintError("bench", InvalidArgument("--prompt-file is the prompt of --draft-model / "
                                                 "--draft-max runs: give one of them"));
    auto text = ReadFileToString(f.Get({"--prompt-file"}), 1 << 20);
    if (!text.ok()) return PrintError("bench", text.status().WithContext("--prompt-file"));
    prompt_text = std::move(*text);
    // The context must hold the prompt: count its tokens with the file's tokenizer, before the
    // engine sizes its budget's reserve by the context.
    auto file = ModelFile::Open(path.empty() ? eo.store + "/model.gguf" : path);
    if (!file.ok()) return PrintError("bench", file.status());
    auto tok = Tokenizer::FromMetadata((*file)->metadata());
    if (!tok.ok()) return PrintError("bench", tok.status().WithContext("--prompt-file needs a tokenizer"));
    auto ids = (*tok)->Encode(prompt_text, {.add_special = true, .parse_special = false});
    if (!ids.ok()) return PrintError("bench", ids.status());
    eo.n_ctx += static_cast<int64_t>(ids->size());
  }
  if (*depth > 0 && (drafting || verifying || *seqs > 1))
    return PrintError("bench", InvalidArgument("-d goes with neither --verify, --sequences nor "
                                               "--draft-model / --draft-max"));
  if (drafting && (verifying || *seqs > 1))
    return PrintError("bench", InvalidArgument("--draft-model / --draft-max go with neither "
                                               "--verify nor --sequences"));
  auto t_load = Clock::now();
  auto engine = Engine::Load(path, eo);
  if (!engine.ok()) return PrintError("bench", engine.status());
  double load_s = Seconds(t_load);
  Engine& e = **engine;
  PrintPlanIfAsked(f, e);
  Model& model = e.model();
  const int64_t n_vocab = model.hparams().n_vocab;
  ResidencyManager* rm = e.runtime();
  Weights w = CountWeights(
      e.metadata(), rm ? StoreTensors(rm->index(), rm->serve_tier()) : FileTensors(e.file()));

  // The limit: the memory the weights are read from (the device's for a GPU backend, else the
  // host's with the same threads), measured right before the runs and again right after them.
  // A shared machine's bandwidth moves with its neighbours; the limit is the higher reading,
  // so a neighbour's quiet spell counts against us, never for us.
  bool device_bw = false;  // the limit is a device's memory
  auto measure_bw = [&]() -> Expected<BandwidthMeasurement> {
    if (bw_unloaded) return *bw_unloaded;
    if (const std::optional<double> device = e.backend().MeasureReadBandwidth(*bw_bytes)) {
      device_bw = true;
      BandwidthMeasurement m;
      m.bytes_per_second = *device;
      m.buffer_bytes = *bw_bytes;
      return m;
    }
    return MeasureReadBandwidth(e.pool(), *bw_bytes, 3);
  };
  Expected<BandwidthMeasurement> bw = measure_bw();
  if (!bw.ok()) return PrintError("bench", bw.status());

  // Speculative decoding: the prompt, and per run kind (0 plain, 1 drafted) the sums.
  std::vector<int32_t> spec_prompt;
  if (drafting) {
    if (prompt_text.empty()) {
      spec_prompt = RandomTokens(8, n_vocab, 7);
    } else {
      auto ids = EncodePlain(e, prompt_text);
      if (!ids.ok()) return PrintError("bench", ids.status().WithContext("--prompt-file"));
      spec_prompt = std::move(*ids);
    }
  }
  struct SpecSums {
    GenerateStats st;
    double seconds = 0;
    uint64_t disk_bytes = 0, expert_reads = 0;
  } spec[2];
  bool spec_equal = true;
  auto spec_run = [&](int kind, std::vector<int32_t>* tokens) -> Status {
    ASSIGN_OR_RETURN(auto session, e.NewSession(eo.n_ctx));
    GenerateOptions go;
    go.max_tokens = static_cast<int>(*n);
    go.stop_at_eog = false;
    go.draft_max = kind == 1 ? draft_max : 0;
    const ResidencyStats r0 = rm ? rm->stats() : ResidencyStats{};
    ASSIGN_OR_RETURN(GenerateStats st,
                     e.Generate(*session, spec_prompt, go, [&](int32_t tok, const std::string&) {
                       if (tok >= 0) tokens->push_back(tok);
                       return true;
                     }));
    SpecSums& s = spec[kind];
    if (rm) {
      const ResidencyStats r1 = rm->stats();
      s.disk_bytes += r1.stream_bytes_read - r0.stream_bytes_read;
      s.expert_reads += (r1.expert_misses + r1.expert_hinted) - (r0.expert_misses + r0.expert_hinted);
    }
    s.seconds += st.decode_seconds;
    s.st.n_generated += st.n_generated;
    s.st.n_forwards += st.n_forwards;
    s.st.n_drafted += st.n_drafted;
    s.st.n_accepted += st.n_accepted;
    s.st.n_draft_passes += st.n_draft_passes;
    s.st.draft_seconds += st.draft_seconds;
    return Status::Ok();
  };

  auto cache = KvCache::Create(model.hparams(), bench_ctx, model.backend(), *kv_type);
  if (!cache.ok()) return PrintError("bench", cache.status());
  // Weights are read once per step, for all --sequences; each token reads its own sequence's
  // KV rows, of every layer, at all the positions before it: depth + (n + 1) / 2 on average.
  const double kv_bytes_per_token =
      static_cast<double>(cache->k_row_bytes() + cache->v_row_bytes()) *
      static_cast<double>(model.hparams().n_layer) *
      (static_cast<double>(*depth) + static_cast<double>(*n + 1) / 2);
  const double step_bytes_per_token =
      static_cast<double>(w.per_token_bytes) / static_cast<double>(*seqs) + kv_bytes_per_token;
  std::vector<float> logits;
  // --sequences: one cache per sequence, and each one's last logits.
  std::vector<KvCache> seq_caches;
  for (int64_t b = 0; *seqs > 1 && b < *seqs; ++b) {
    auto c = KvCache::Create(model.hparams(), *n + 8, model.backend(), *kv_type);
    if (!c.ok()) return PrintError("bench", c.status());
    seq_caches.push_back(std::move(*c));
  }
  std::vector<float> seq_logits(static_cast<size_t>(seq_caches.size() * n_vocab));
  std::vector<Model::SequencePass> seq_passes(seq_caches.size());
  Series pp, tg;
  // Each decode repetition's own limit: the bandwidth read right before and right after it, the
  // higher. A neighbour's load moves the machine's bandwidth between repetitions by more than
  // our own scatter, so a limit read minutes away says little about one repetition.
  std::vector<double> tg_rep_limit;
  double last_probe = 0;       // the last decode run's closing probe
  // --bw-each-token: a probe read between decode steps, and each step's ratio against the
  // readings either side of it: the limit at the moment the step ran, on a machine whose
  // neighbours move its bandwidth within a run.
  std::vector<double> token_ratios, token_probes;
  uint64_t tg_disk_bytes = 0;  // --store: bytes read from the store during timed decode
  uint64_t tg_link_bytes = 0;  // weights a GPU read from host memory in timed decode (--max-vram)
  uint64_t tg_host_bytes = 0;  // of the weights off the GPU, those its host CPU computed (hybrid)
  GenerateStats verified;      // --verify: summed over the repetitions
  nlohmann::json prefill_profile;
  // Untimed tokens warm caches, page tables and the pool. A GPU backend also loads its
  // libraries' kernels on first use (an untimed prompt, as llama-bench's warm-up run) and
  // captures the decode step's graph on its second token.
  {
    if (device_bw && *p > 0) {
      auto warm = RandomTokens(*p, n_vocab, 98);
      Status st = model.Forward(warm.data(), *p, *cache, false, &logits);
      if (!st.ok()) return PrintError("bench", st);
      cache->Clear();
    }
    auto warm = RandomTokens(device_bw ? 3 : 1, n_vocab, 99);
    for (int32_t& tok : warm) {
      Status st = model.Forward(&tok, 1, *cache, false, &logits);
      if (!st.ok()) return PrintError("bench", st);
    }
    cache->Clear();
  }
  // -d: an empty cache, then an untimed prefill of `depth` tokens, in passes of at most 512.
  auto start_at_depth = [&](uint32_t seed) -> Status {
    cache->Clear();
    const auto fill = RandomTokens(*depth, n_vocab, seed);
    for (int64_t i = 0; i < *depth; i += 512) {
      const int64_t m = std::min<int64_t>(512, *depth - i);
      if (Status st = model.Forward(fill.data() + i, m, *cache, false, &logits); !st.ok())
        return st;
    }
    return Status::Ok();
  };
  for (int64_t rep = 0; rep < *r; ++rep) {
    if (*p > 0) {
      auto tokens = RandomTokens(*p, n_vocab, static_cast<uint32_t>(rep + 1));
      if (Status st = start_at_depth(static_cast<uint32_t>(500 + rep)); !st.ok())
        return PrintError("bench", st);
      if (profile && rep == *r - 1) {
        ResetKernelProfile();
        SetKernelProfiling(true);
      }
      auto start = Clock::now();
      Status st = model.Forward(tokens.data(), *p, *cache, false, &logits);
      if (!st.ok()) return PrintError("bench", st);
      pp.tps.push_back(static_cast<double>(*p) / Seconds(start));
      SetKernelProfiling(false);
      if (profile && rep == *r - 1)
        prefill_profile = ProfileJson(KernelProfile(), 1.0 / pp.tps.back(), *p);
    }
    if (*n > 0) {
      auto tokens = RandomTokens(*n, n_vocab, static_cast<uint32_t>(1000 + rep));
      if (Status st = start_at_depth(static_cast<uint32_t>(600 + rep)); !st.ok())
        return PrintError("bench", st);
      const uint64_t read0 = rm ? rm->stats().stream_bytes_read : 0;
      const uint64_t link0 = e.backend().host_link_bytes();
      const uint64_t host0 = e.backend().host_compute_bytes();
      const uint64_t drafted_disk0 = spec[1].disk_bytes;
      Expected<BandwidthMeasurement> rep_bw_before = measure_bw();
      if (!rep_bw_before.ok()) return PrintError("bench", rep_bw_before.status());
      // --bw-each-token's buffer lives for the run only, never beside the bracketing probes'.
      std::optional<MemoryReadProbe> token_probe;
      if (*token_probe_bytes > 0) {
        auto probe = MemoryReadProbe::Create(e.pool(), *token_probe_bytes);
        if (!probe.ok()) return PrintError("bench", probe.status().WithContext("--bw-each-token"));
        token_probe.emplace(std::move(*probe));
      }
      if (profile && rep == *r - 1) {
        ResetKernelProfile();
        SetKernelProfiling(true);
      }
      auto start = Clock::now();
      if (drafting) {
        // Plain and drafted in turn, so neither always finds the caches the other warmed.
        std::vector<int32_t> tokens[2];
        const double drafted_before = spec[1].seconds;
        for (int i = 0; i < 2; ++i) {
          const int kind = (rep + i) % 2;
          if (Status st = spec_run(kind, &tokens[kind]); !st.ok()) return PrintError("bench", st);
        }
        spec_equal = spec_equal && tokens[0] == tokens[1];
        // tg is the drafted run's decode.
        start = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(spec[1].seconds - drafted_before));
      } else if (verifying) {
        auto session = e.NewSession(*p + *n + 8);
        if (!session.ok()) return PrintError("bench", session.status());
        GenerateOptions go;
        go.max_tokens = static_cast<int>(*n);
        go.stop_at_eog = false;
        go.verify = *verify;
        auto st = e.Generate(**session, RandomTokens(8, n_vocab, static_cast<uint32_t>(rep + 7)),
                             go, [](int32_t, const std::string&) { return true; });
        if (!st.ok()) return PrintError("bench", st.status());
        start = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(st->decode_seconds));
        verified.Add(*st);
      } else if (!seq_caches.empty()) {
        // Each step one token of every sequence, rows exact as serve's batched steps run.
        const auto seq_tokens =
            RandomTokens(*n * *seqs, n_vocab, static_cast<uint32_t>(2000 + rep));
        for (KvCache& c : seq_caches) c.Clear();
        start = Clock::now();
        ExactTokenRows exact;
        for (int64_t i = 0; i < *n; ++i) {
          for (size_t b = 0; b < seq_caches.size(); ++b)
            seq_passes[b] = {&seq_tokens[i * *seqs + static_cast<int64_t>(b)], 1, &seq_caches[b],
                             false, seq_logits.data() + b * n_vocab};
          Status st =
              model.ForwardSequences(seq_passes.data(), static_cast<int>(seq_passes.size()));
          if (!st.ok()) return PrintError("bench", st);
          e.AfterToken();
        }
      } else {
        // --bw-each-token: a probe read before each token and after the last, left out of the
        // run's time (`start` moves past each read).
        auto probe_read = [&] {
          const auto p0 = Clock::now();
          token_probes.push_back(token_probe->Read());
          start += Clock::now() - p0;
          return token_probes.back();
        };
        double probe_before = token_probe ? probe_read() : 0;
        for (int64_t i = 0; i < *n; ++i) {
          const auto t0 = Clock::now();
          Status st = model.Forward(&tokens[i], 1, *cache, false, &logits);
          if (!st.ok()) return PrintError("bench", st);
          e.AfterToken();  // the adaptive runtime's verifier and controller, when on
          if (!token_probe) continue;
          const double seconds = Seconds(t0);
          const double probe_after = probe_read();
          token_ratios.push_back(step_bytes_per_token / seconds /
                                 std::max(probe_before, probe_after));
          probe_before = probe_after;
        }
      }
      tg.tps.push_back(static_cast<double>(*n * *seqs) / Seconds(start));
      // Drafting: the drafted runs' reads (spec[1]), not the plain ones'.
      if (rm) tg_disk_bytes += drafting ? spec[1].disk_bytes - drafted_disk0
                                        : rm->stats().stream_bytes_read - read0;
      tg_link_bytes += e.backend().host_link_bytes() - link0;
      tg_host_bytes += e.backend().host_compute_bytes() - host0;
      SetKernelProfiling(false);
      token_probe.reset();
      Expected<BandwidthMeasurement> rep_bw_after = measure_bw();
      if (!rep_bw_after.ok()) return PrintError("bench", rep_bw_after.status());
      last_probe = rep_bw_after->bytes_per_second;
      tg_rep_limit.push_back(std::max(rep_bw_before->bytes_per_second, last_probe));
    }
  }

  const double bw_before = bw->bytes_per_second;
  // With decode runs the last one's closing probe is the reading after the runs.
  double bw_after = last_probe;
  if (tg_rep_limit.empty()) {
    Expected<BandwidthMeasurement> m = measure_bw();
    if (!m.ok()) return PrintError("bench", m.status());
    bw_after = m->bytes_per_second;
  }
  double limit = std::max(bw_before, bw_after);
  for (double l : tg_rep_limit) limit = std::max(limit, l);
  const double achieved = tg.Mean() * step_bytes_per_token;
  nlohmann::json j;
  j["model"] = path;
  j["architecture"] = e.metadata().GetString("general.architecture", "");
  j["model_bytes"] = w.total_bytes;
  j["n_params"] = w.n_params;
  j["threads"] = e.pool().size();
  j["isa"] = IsaName(ActiveIsa());
  j["device"] = e.backend().name();
  if (const MemoryLedger* dl = e.backend().device_ledger()) {
    // Each account's peak too: what a --max-vram reserve is held against.
    j["device_ledger"] = nlohmann::json::parse(dl->ToJson());
    j["device_ledger"]["peak_bytes"] = dl->peak();
  }
  j["repetitions"] = *r;
  j["load_seconds"] = load_s;
  if (*p > 0)
    j["pp"] = {
        {"n_tokens", *p}, {"tokens_per_s", pp.Mean()}, {"stdev", pp.Stdev()}, {"runs", pp.tps}};
  if (*n > 0)
    j["tg"] = {
        {"n_tokens", *n}, {"tokens_per_s", tg.Mean()}, {"stdev", tg.Stdev()}, {"runs", tg.tps}};
  j["weight_bytes_per_token"] = w.per_token_bytes;
  j["kv_bytes_per_token"] = kv_bytes_per_token;
  j["depth"] = *depth;
  j["sequences"] = *seqs;
  if (drafting) {
    auto per_token = [&](double v, const SpecSums& s) {
      return s.st.n_generated > 0 ? v / static_cast<double>(s.st.n_generated) : 0.0;
    };
    auto tps = [](const SpecSums& s) {
      return s.seconds > 0 ? static_cast<double>(s.st.n_generated) / s.seconds : 0.0;
    };
    const SpecSums& plain = spec[0];
    const SpecSums& drafted = spec[1];
    nlohmann::json sj = {
        {"drafter", eo.draft_mtp                ? std::string("next-n layer")
                    : eo.draft_model.empty() ? std::string("prompt lookup")
                                             : eo.draft_model},
        {"draft_max", draft_max},
        {"prompt_tokens", spec_prompt.size()},
        {"prompt", prompt_text.empty() ? "8 random tokens" : f.Get({"--prompt-file"})},
        {"generated", drafted.st.n_generated},
        {"drafted", drafted.st.n_drafted},
        {"accepted", drafted.st.n_accepted},
        {"acceptance_rate", drafted.st.n_drafted > 0 ? static_cast<double>(drafted.st.n_accepted) /
                                                           static_cast<double>(drafted.st.n_drafted)
                                                     : 0.0},
        {"target_passes", drafted.st.n_forwards},
        {"target_passes_plain", plain.st.n_forwards},
        {"draft_model_passes", drafted.st.n_draft_passes},
        {"draft_model_seconds", drafted.st.draft_seconds},
        {"tokens_per_s", tps(drafted)},
        {"tokens_per_s_plain", tps(plain)},
        {"speedup", tps(plain) > 0 ? tps(drafted) / tps(plain) : 0.0},
        {"greedy_equal", spec_equal}};
    if (rm) {
      sj["disk_bytes_per_token"] = per_token(static_cast<double>(drafted.disk_bytes), drafted);
      sj["disk_bytes_per_token_plain"] = per_token(static_cast<double>(plain.disk_bytes), plain);
      sj["expert_reads_per_token"] = per_token(static_cast<double>(drafted.expert_reads), drafted);
      sj["expert_reads_per_token_plain"] = per_token(static_cast<double>(plain.expert_reads), plain);
    }
    j["speculative"] = sj;
  }
  if (verifying) {
    j["verify"] = {{"mode", verify->mode == VerifyOptions::Mode::kAll ? "all" : "margin"},
                   {"window", verify->window},
                   {"tau", verify->tau},
                   {"generated", verified.n_generated},
                   {"drafted", verified.n_drafted},
                   {"verified", verified.n_verified},
                   {"verify_passes", verified.n_verify_passes},
                   {"rollbacks", verified.n_rollbacks},
                   {"rollback_lost", verified.n_rollback_lost},
                   {"verify_bytes_read", verified.verify_bytes},
                   {"verify_seconds", verified.verify_seconds},
                   {"decode_seconds", verified.decode_seconds}};
  }
  j["ledger"] = {{"cap_bytes", e.ledger().cap()}, {"peak_bytes", e.ledger().peak()}};
  if (e.tier_controller()) j["adaptive"] = AdaptiveStatsJson(e);
  if (rm) {
    j["store"] = nlohmann::json::parse(StoreStatsJson(e));
    double tg_s = 0;
    for (double v : tg.tps) tg_s += static_cast<double>(*n) / v;
    double disk_rate = 0;
    if (*n > 0 && tg_s > 0) {
      disk_rate = static_cast<double>(tg_disk_bytes) / tg_s;
      j["disk_bytes_per_token"] = static_cast<double>(tg_disk_bytes) / static_cast<double>(*n * *r);
      j["disk_read_bytes_per_s"] = disk_rate;
    }
    // After the timed runs, so the probe does not compete with them; its chunk fits in the
    // reserve the bandwidth buffer held.
    if (*probe_bytes > 0) {
      auto probe =
          ProbeStoreRead(rm->index(), *probe_bytes, std::min<uint64_t>(16ull << 20, probe_room),
                         rm->options().io_mode, &e.ledger());
      if (!probe.ok()) return PrintError("bench", probe.status().WithContext("disk read probe"));
      j["disk_probe"] = {
          {"file", probe->file},
          {"bytes", probe->bytes},
          {"seconds", probe->seconds},
          {"bytes_per_s", probe->bytes_per_s},
          {"direct", probe->direct},
          {"uring", probe->uring},
          {"method", "one store file from its start, O_DIRECT, the runtime's reader"}};
      if (disk_rate > 0 && probe->bytes_per_s > 0) j["disk_ratio"] = disk_rate / probe->bytes_per_s;
      // Routed experts read whole, in no order, by as many readers as the runtime has: the rate
      // the expert cache's misses get, and the decode's disk bound from it.
      const ResidencyStats rs = rm->stats();
      if (rs.expert_slots < rs.n_ops_expert) {
        std::vector<int> experts;
        const ModelHParams& hp = model.hparams();
        for (int l = 0; l < hp.n_layer; ++l)
          for (int x = 0; x < hp.n_expert; ++x)
            if (const int o = rm->index().FindOp(OpIdMoeExpert(l, x)); o >= 0) experts.push_back(o);
        std::shuffle(experts.begin(), experts.end(), std::mt19937(17));
        const int readers = rm->options().io_threads;
        auto ep = ProbeConcurrentOpReads(
            rm->index(), experts, readers, 0.2, *probe_bytes / static_cast<uint64_t>(readers), 0.3,
            2 * *probe_bytes / static_cast<uint64_t>(readers),
            std::min<uint64_t>(16ull << 20, probe_room / static_cast<uint64_t>(readers)),
            rm->options().io_mode, &e.ledger());
        if (!ep.ok()) return PrintError("bench", ep.status().WithContext("expert read probe"));
        j["expert_read_probe"] = {
            {"readers", readers},
            {"bytes", ep->bytes},
            {"seconds", ep->seconds},
            {"bytes_per_s", ep->bytes_per_s},
            {"method",
             "routed experts whole, in no order, each reader checking what it read, "
             "as the runtime's reading threads do"}};
        if (ep->bytes_per_s > 0 && j.contains("disk_bytes_per_token")) {
          const double per_token = j["disk_bytes_per_token"].get<double>();
          if (per_token > 0) j["disk_bound_tokens_per_s"] = ep->bytes_per_s / per_token;
          if (disk_rate > 0) j["expert_disk_ratio"] = disk_rate / ep->bytes_per_s;
        }
      }
    }
  }
  if (device_bw) {
    j["mem_bw"] = {
        {"bytes_per_s", limit},
        {"before_runs", bw_before},
        {"after_runs", bw_after},
        {"buffer_bytes", bw->buffer_bytes},
        {"method",
         "device memory: one streaming read of 16-byte loads over the buffer, best of 5, "
         "before and after the runs and around each decode run, the highest"}};
  } else {
    j["mem_bw"] = {
        {"bytes_per_s", limit},
        {"before_runs", bw_before},
        {"after_runs", bw_after},
        {"buffer_bytes", bw->buffer_bytes},
        {"threads", bw->threads},
        {"method",
         bw_unloaded
             ? "streaming read, widest vector loads, without and with each prefetch, best pass of "
               "3 repeats, before the model opened (under a RAM budget the buffer would take "
               "the run's room)"
             : "streaming read, widest vector loads, without and with each prefetch, best pass of "
               "3 repeats, before and after the runs and around each decode run, the highest"}};
  }
  if (*n > 0) {
    j["tg_bytes_per_s"] = achieved;
    j["tg_limit_tokens_per_s"] = limit / step_bytes_per_token;
    j["bw_ratio"] = achieved / limit;
    // Each repetition against the probes on either side of it (under a RAM budget on the host
    // there is one probe, before the model opened, and these equal the run-wide ratio's terms).
    nlohmann::json reps = nlohmann::json::array();
    std::vector<double> ratios;
    for (size_t i = 0; i < tg.tps.size() && i < tg_rep_limit.size(); ++i) {
      const double ratio = tg.tps[i] * step_bytes_per_token / tg_rep_limit[i];
      ratios.push_back(ratio);
      reps.push_back({{"tokens_per_s", tg.tps[i]},
                      {"limit_bytes_per_s", tg_rep_limit[i]},
                      {"bw_ratio", ratio}});
    }
    j["tg"]["per_run"] = reps;
    if (!token_ratios.empty()) {
      std::sort(token_ratios.begin(), token_ratios.end());
      std::sort(token_probes.begin(), token_probes.end());
      auto at = [&](double q) {
        return token_ratios[static_cast<size_t>(q * static_cast<double>(token_ratios.size() - 1))];
      };
      j["tg"]["per_token"] = {{"probe_bytes", *token_probe_bytes},
                              {"tokens", token_ratios.size()},
                              {"bw_ratio_p10", at(0.1)},
                              {"bw_ratio_median", at(0.5)},
                              {"bw_ratio_p90", at(0.9)},
                              {"probe_median_bytes_per_s", token_probes[token_probes.size() / 2]},
                              {"probe_max_bytes_per_s", token_probes.back()}};
      j["bw_ratio_token_median"] = at(0.5);
    }
    if (!ratios.empty()) {
      std::sort(ratios.begin(), ratios.end());
      const size_t m = ratios.size();
      j["bw_ratio_run_median"] = m % 2 ? ratios[m / 2] : (ratios[m / 2 - 1] + ratios[m / 2]) / 2;
    }
  }
  if (tg_link_bytes > 0 || tg_host_bytes > 0) {
    // Out of VRAM: the weights the GPU does not hold cross the link every token, or (the
    // hybrid) the host's CPU computes its share of them where they lie, both at once. The limit
    // is the slower of the link over its bytes and the host's memory over both sides' bytes
    // (the link's copies read host memory too).
    const double tokens = static_cast<double>(*r * *n * *seqs);
    const double per_token = static_cast<double>(tg_link_bytes) / tokens;
    const double host_per_token = static_cast<double>(tg_host_bytes) / tokens;
    const double h2d = e.backend().MeasureUploadBandwidth(256u << 20).value_or(0);
    double host_bw = 0;
    if (tg_host_bytes > 0) {
      // Host memory over a buffer no cache holds: --max-vram's default probe (128 MiB, sized for
      // a RAM budget there is none of here) fits a server's L3 and reads 2-3x DRAM's rate.
      auto m =
          MeasureReadBandwidth(e.pool(), f.Has("--bw-bytes") ? *bw_bytes : DefaultProbeBytes(), 3);
      if (!m.ok()) return PrintError("bench", m.status());
      host_bw = m->bytes_per_second;
    }
    double seconds = h2d > 0 ? per_token / h2d : 0;
    if (host_bw > 0) seconds = std::max(seconds, (per_token + host_per_token) / host_bw);
    const double link_limit = seconds > 0 ? 1 / seconds : 0;
    j["host_link"] = {{"bytes_per_token", per_token},
                      {"host_to_device_bytes_per_s", h2d},
                      {"limit_tokens_per_s", link_limit},
                      {"ratio", link_limit > 0 ? tg.Mean() / link_limit : 0},
                      {"method",
                       "weight bytes the device read from host memory during timed decode "
                       "(copied to it, or read in place by its kernels); the link: a copy of up "
                       "to 256 MiB from pinned host memory, best of 5, after the runs"}};
    if (tg_host_bytes > 0)
      j["host_link"]["hybrid"] = {
          {"cpu_bytes_per_token", host_per_token},
          {"cpu_share", host_per_token / (host_per_token + per_token)},
          {"host_read_bytes_per_s", host_bw},
          {"method",
           "weight bytes the host's CPU computed in place of the device during timed decode; "
           "the limit is max(link bytes / link bandwidth, (link + CPU bytes) / host read "
           "bandwidth over 2 GiB with the run's threads) a token"}};
  }
  if (profile && *n > 0)
    j["decode_profile"] = ProfileJson(KernelProfile(), 1.0 / tg.tps.back(), *n * *seqs);
  if (profile && *p > 0) j["prefill_profile"] = prefill_profile;
  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("| model | size | params | threads | test | t/s |\n|---|---|---|---|---|---|\n");
  auto row = [&](const char* test, const Series& s) {
    std::printf("| %s | %s | %.2f B | %d | %s | %.2f ± %.2f |\n", path.c_str(),
                FormatBytes(w.total_bytes).c_str(), static_cast<double>(w.n_params) / 1e9,
                e.pool().size(), test, s.Mean(), s.Stdev());
  };
  const std::string at = *depth > 0 ? " @ d" + std::to_string(*depth) : "";
  if (*p > 0) row(("pp" + std::to_string(*p) + at).c_str(), pp);
  if (*n > 0) row(("tg" + std::to_string(*n) + at).c_str(), tg);
  if (device_bw) {
    std::printf("%s memory read bandwidth: %.2f GB/s; weights per token: %s\n", e.backend().name(),
                limit / 1e9, FormatBytes(w.per_token_bytes).c_str());
  } else {
    std::printf("memory read bandwidth: %.2f GB/s (%d threads); weights per token: %s\n",
                limit / 1e9, bw->threads, FormatBytes(w.per_token_bytes).c_str());
  }
  if (*n > 0 && *depth > 0)
    std::printf("at depth %lld: KV cache rows read per token %s\n", static_cast<long long>(*depth),
                FormatBytes(static_cast<uint64_t>(kv_bytes_per_token)).c_str());
  if (*n > 0) {
    std::printf("generation reads %.2f GB/s = %.1f%% of the limit (limit %.2f tokens/s)\n",
                achieved / 1e9, 100 * achieved / limit, limit / step_bytes_per_token);
    std::printf("each run against the probes either side of it:");
    for (const auto& run : j["tg"]["per_run"])
      std::printf(" %.1f%%", 100 * run["bw_ratio"].get<double>());
    std::printf("\n");
    if (j["tg"].contains("per_token"))
      std::printf(
          "each token against the probes either side of it: median %.1f%% (p10 %.1f%%, "
          "p90 %.1f%%)\n",
          100 * j["tg"]["per_token"]["bw_ratio_median"].get<double>(),
          100 * j["tg"]["per_token"]["bw_ratio_p10"].get<double>(),
          100 * j["tg"]["per_token"]["bw_ratio_p90"].get<double>());
  }
  if (j.contains("host_link")) {
    const auto& l = j["host_link"];
    std::printf("host link: %.1f MB per token over %.2f GB/s (limit %.2f tokens/s, %.1f%%)\n",
                l["bytes_per_token"].get<double>() / 1e6,
                l["host_to_device_bytes_per_s"].get<double>() / 1e9,
                l["limit_tokens_per_s"].get<double>(), 100 * l["ratio"].get<double>());
    if (l.contains("hybrid"))
      std::printf("hybrid: the CPU computed %.1f MB per token (%.0f%% of the bytes off the "
                  "device), host memory %.2f GB/s\n",
                  l["hybrid"]["cpu_bytes_per_token"].get<double>() / 1e6,
                  100 * l["hybrid"]["cpu_share"].get<double>(),
                  l["hybrid"]["host_read_bytes_per_s"].get<double>() / 1e9);
  }
  if (j.contains("disk_read_bytes_per_s"))
    std::printf("disk: %.1f MB per token, %.3f GB/s over decode",
                j["disk_bytes_per_token"].get<double>() / 1e6,
                j["disk_read_bytes_per_s"].get<double>() / 1e9);
  if (j.contains("disk_probe"))
    std::printf("; O_DIRECT read of %s: %.3f GB/s",
                j["disk_probe"]["file"].get<std::string>().c_str(),
                j["disk_probe"]["bytes_per_s"].get<double>() / 1e9);
  if (j.contains("disk_ratio")) std::printf(" (ratio %.2f)", j["disk_ratio"].get<double>());
  if (j.contains("expert_read_probe"))
    std::printf("; experts read whole by %d readers: %.3f GB/s",
                j["expert_read_probe"]["readers"].get<int>(),
                j["expert_read_probe"]["bytes_per_s"].get<double>() / 1e9);
  if (j.contains("disk_bound_tokens_per_s"))
    std::printf(" (disk bound %.2f tokens/s, ratio %.2f)",
                j["disk_bound_tokens_per_s"].get<double>(), j["expert_disk_ratio"].get<double>());
  if (j.contains("disk_read_bytes_per_s") || j.contains("disk_probe")) std::printf("\n");
  if (j.contains("decode_profile")) std::printf("%s\n", j["decode_profile"].dump(2).c_str());
  return 0;
}

CommandRegistrar reg("bench", "prompt/generation speed against the memory-bandwidth limit",
                     &RunBench);

}  // namespace
}  // namespace substrate::cli
