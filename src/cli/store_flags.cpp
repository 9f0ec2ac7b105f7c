#include "cli/store_flags.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <nlohmann/json.hpp>

#include "core/file_io.h"

namespace substrate::cli {

std::vector<std::string> StoreFlagsWithValue(std::vector<std::string> extra) {
  for (const char* f : {"--store", "--max-ram", "--plan", "--trace", "--prefetch-depth", "--io",
                        "--io-threads", "--tier", "--verifier", "--probes", "--verifier-script",
                        "--escalation-threshold", "--escalation-persistence", "--escalation-max",
                        "--escalation-pool", "--device", "--gpu", "--cache-aware-routing",
                        "--lookahead", "--max-vram"})
    extra.push_back(f);
  return extra;
}

std::vector<std::string> StoreSwitches(std::vector<std::string> extra) {
  extra.push_back("--adaptive");
  extra.push_back("--print-plan");
  return extra;
}

void PrintPlanIfAsked(const Flags& f, const Engine& e) {
  if (!f.Has("--print-plan")) return;
  std::fputs(e.PlanText().c_str(), stderr);
  std::fflush(stderr);
}

Status ApplyStoreFlags(const Flags& f, EngineOptions* opt) {
  opt->device = f.Get({"--device"}, "cpu");
  if (opt->device != "cpu" && opt->device != "cuda")
    return InvalidArgument("--device " + opt->device + ": expected cpu or cuda");
  ASSIGN_OR_RETURN(long long gpu, f.GetInt({"--gpu"}, 0));
  if (gpu < 0 || gpu > 1024)
    return InvalidArgument("--gpu " + std::to_string(gpu) + ": not a device index");
  if (f.Has("--gpu") && opt->device != "cuda") return InvalidArgument("--gpu needs --device cuda");
  opt->gpu = static_cast<int>(gpu);
  if (f.Has("--max-vram")) {
    if (opt->device != "cuda") return InvalidArgument("--max-vram needs --device cuda");
    ASSIGN_OR_RETURN(opt->max_vram, ParseBytes(f.Get({"--max-vram"})));
    if (opt->max_vram == 0) return InvalidArgument("--max-vram must be more than 0");
  }
  opt->store = f.Get({"--store"});
  if (f.Has("--max-ram")) {
    ASSIGN_OR_RETURN(opt->max_ram, ParseBytes(f.Get({"--max-ram"})));
    if (opt->max_ram == 0) return InvalidArgument("--max-ram must be more than 0");
  }
  RETURN_IF_ERROR(ApplyAdaptiveFlags(f, &opt->adaptive));
  ASSIGN_OR_RETURN(double bonus, f.GetDouble({"--cache-aware-routing"}, 0));
  if (!(bonus >= 0 && bonus <= 1))
    return InvalidArgument("--cache-aware-routing is a probability bonus from 0 to 1");
  opt->cache_aware_routing = static_cast<float>(bonus);
  if (opt->store.empty()) {
    // Without a store, a GGUF under --max-ram may run out of core read in place (Engine): the
    // runtime's flags apply to it; tiers and escalations need a store's residuals.
    for (const char* flag : {"--tier", "--adaptive"})
      if (f.Has(flag)) return InvalidArgument(std::string(flag) + " needs --store STORE/");
    if (!f.Has("--max-ram")) {
      for (const char* flag : {"--plan", "--trace", "--prefetch-depth", "--io", "--io-threads",
                               "--cache-aware-routing", "--lookahead"})
        if (f.Has(flag))
          return InvalidArgument(std::string(flag) +
                                 " needs --max-ram SIZE (and a GGUF or --store STORE/)");
      return Status::Ok();
    }
  }
  if (!f.Has("--max-ram")) return InvalidArgument("--store needs --max-ram SIZE (the RAM budget)");
  ResidencyOptions& ro = opt->residency;
  ro.plan_path = f.Get({"--plan"});
  ro.trace_path = f.Get({"--trace"});
  ASSIGN_OR_RETURN(long long depth, f.GetInt({"--prefetch-depth"}, 2));
  if (depth < 1 || depth > 64) return InvalidArgument("--prefetch-depth must be 1 to 64");
  ro.prefetch_depth = static_cast<int>(depth);
  ASSIGN_OR_RETURN(ro.io_mode, ParseIoMode(f.Get({"--io"}, "auto")));
  ASSIGN_OR_RETURN(long long io_threads, f.GetInt({"--io-threads"}, ro.io_threads));
  if (io_threads < 1 || io_threads > 16) return InvalidArgument("--io-threads must be 1 to 16");
  ro.io_threads = static_cast<int>(io_threads);
  ASSIGN_OR_RETURN(long long lookahead, f.GetInt({"--lookahead"}, ro.lookahead_layers));
  if (f.Has("--lookahead") && (lookahead < 0 || lookahead > 4))
    return InvalidArgument("--lookahead must be 0 to 4");
  ro.lookahead_layers = static_cast<int>(lookahead);
  // The expert cache's policy, for A/B runs (unset: chosen from the cache's size).
  if (const char* p = std::getenv("SUBSTRATE_EXPERT_CACHE"); p && *p) {
    const std::string v = p;
    if (v != "lru" && v != "decayed")
      return InvalidArgument("SUBSTRATE_EXPERT_CACHE='" + v + "': expected lru or decayed");
    ro.expert_policy = v == "lru" ? ExpertCache::Policy::kLru : ExpertCache::Policy::kDecayed;
  }
  // The token embedding read by rows out of core (ResidencyOptions::embedding_rows), for A/B runs.
  if (const char* p = std::getenv("SUBSTRATE_EMBED_ROWS"); p && *p) {
    const std::string v = p;
    if (v != "0" && v != "1")
      return InvalidArgument("SUBSTRATE_EMBED_ROWS='" + v + "': expected 0 or 1");
    ro.embedding_rows = v == "1";
  }
  // Past the store's ladder is the manager's error at load (it names the ladder it found).
  ASSIGN_OR_RETURN(long long tier, f.GetInt({"--tier"}, -1));
  if (f.Has("--tier") && (tier < 0 || tier > 1000000))
    return InvalidArgument("--tier " + std::to_string(tier) + ": not a tier (0 = skeleton only)");
  ro.serve_tier = static_cast<int>(tier);
  return Status::Ok();
}

Status ApplyAdaptiveFlags(const Flags& f, AdaptiveOptions* a) {
  a->on = f.Has("--adaptive");
  const bool any = f.Has("--verifier") || f.Has("--probes") || f.Has("--verifier-script") ||
                   f.Has("--escalation-threshold") || f.Has("--escalation-persistence") ||
                   f.Has("--escalation-max") || f.Has("--escalation-pool");
  if (!a->on) {
    if (any) return InvalidArgument("the verifier and escalation flags need --adaptive");
    return Status::Ok();
  }
  const std::string v = f.Get({"--verifier"}, f.Has("--probes") ? "linear" : "residual");
  if (v == "residual") {
    a->verifier = AdaptiveOptions::Verifier::kResidual;
  } else if (v == "linear") {
    a->verifier = AdaptiveOptions::Verifier::kLinear;
    a->probes = f.Get({"--probes"});
    if (a->probes.empty())
      return InvalidArgument("--verifier linear needs --probes FILE (substrate train-probe)");
  } else if (v == "scripted") {
    a->verifier = AdaptiveOptions::Verifier::kScripted;
    const std::string path = f.Get({"--verifier-script"});
    if (path.empty()) return InvalidArgument("--verifier scripted needs --verifier-script FILE");
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
    try {
      const nlohmann::json j = nlohmann::json::parse(text);
      for (auto it = j.begin(); it != j.end(); ++it)
        a->script[it.key()] = it.value().get<std::vector<float>>();
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgument(
          path + ": a verifier script is {\"op id\": [disagreement per token]}: " + e.what());
    }
  } else {
    return InvalidArgument("--verifier " + v + ": residual, linear or scripted");
  }
  TierControllerOptions& c = a->controller;
  ASSIGN_OR_RETURN(double th, f.GetDouble({"--escalation-threshold"}, c.threshold));
  ASSIGN_OR_RETURN(long long pers, f.GetInt({"--escalation-persistence"}, c.persistence));
  ASSIGN_OR_RETURN(long long k, f.GetInt({"--escalation-max"}, c.max_concurrent));
  if (!(th >= 0) || pers < 1 || pers > 100000 || k < 1 || k > 100000)
    return InvalidArgument(
        "--escalation-threshold >= 0, --escalation-persistence and "
        "--escalation-max >= 1");
  c.threshold = static_cast<float>(th);
  c.persistence = static_cast<int>(pers);
  c.max_concurrent = static_cast<int>(k);
  if (f.Has("--escalation-pool")) {
    ASSIGN_OR_RETURN(c.pool_bytes, ParseBytes(f.Get({"--escalation-pool"})));
  }
  return Status::Ok();
}

nlohmann::json AdaptiveStatsJson(Engine& e) {
  TierController* c = e.tier_controller();
  if (!c) return nullptr;
  const TierControllerStats& s = c->stats();
  nlohmann::json j = {{"escalations", s.escalations},     {"decays", s.decays},
                      {"evictions", s.evictions},         {"refused", s.refused},
                      {"force_demotes", s.force_demotes}, {"pool_bytes", c->options().pool_bytes},
                      {"pool_peak", s.pool_peak},         {"escalated_peak", s.escalated_peak},
                      {"escalated_now", s.escalated}};
  if (e.runtime()) {
    j["residuals_skipped"] = e.runtime()->stats().skipped;
    j["residuals_kept"] = e.runtime()->stats().residuals_kept;
  }
  if (const RuntimeMonitor* m = e.runtime_monitor()) {
    j["monitor"] = {{"state", RuntimeStateName(m->state())},
                    {"transitions", m->stats().transitions},
                    {"critical_tokens", m->stats().critical_tokens},
                    {"latency_ratio", m->latency_ratio()},
                    {"bw_ratio", m->bw_ratio()}};
  }
  return j;
}

std::string StoreStatsJson(const Engine& e) {
  return e.runtime() ? e.runtime()->StatsJson() : "null";
}

}  // namespace substrate::cli
