// substrate trace-report TRACE.jsonl [--json] [--top N]: summarizes a runtime trace
// (runtime/trace_writer.h): per op kind the count, bytes, hit rate and stall time; the reads'
// bytes and bandwidth (over read time and over the trace's span); misses; the longest stalls;
// and, for an adaptive run, its tier switches by kind and by op, the escalation pool's
// occupancy over the run (in tenths of its tokens), the runtime monitor's transitions and the
// residuals skipped by the fallback.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/memory_ledger.h"

namespace substrate::cli {
namespace {

using nlohmann::json;

// "block_3.moe.expert_7" -> "moe.expert"; "block_3.attn" -> "attn"; "output" -> "output".
std::string OpKind(const std::string& op) {
  std::string k = op;
  if (k.rfind("block_", 0) == 0) {
    const size_t dot = k.find('.');
    k = dot == std::string::npos ? k : k.substr(dot + 1);
  }
  const size_t us = k.rfind("expert_");
  if (us != std::string::npos) k = k.substr(0, us + 6);
  return k;
}

struct KindStats {
  uint64_t count = 0, bytes = 0, hits = 0, misses = 0;
  int64_t stall_us = 0;
};

// The adaptive runtime's events.
struct Adaptive {
  std::map<std::string, uint64_t> switches;  // by why
  std::map<std::string, uint64_t> escalations_by_op;
  std::vector<std::pair<uint64_t, uint64_t>> pool;  // per token: used, bytes
  std::vector<std::string> monitor;                 // "t s: state (ratios)"
  uint64_t skipped = 0;
  bool any() const { return !switches.empty() || !pool.empty() || !monitor.empty() || skipped; }
  nlohmann::json Json() const;
};

nlohmann::json Adaptive::Json() const {
  nlohmann::json j;
  j["switches"] = switches;
  std::vector<std::pair<uint64_t, std::string>> by_op;
  for (const auto& [op, n] : escalations_by_op) by_op.push_back({n, op});
  std::sort(by_op.rbegin(), by_op.rend());
  j["most_escalated"] = nlohmann::json::array();
  for (size_t i = 0; i < by_op.size() && i < 10; ++i)
    j["most_escalated"].push_back({{"op", by_op[i].second}, {"escalations", by_op[i].first}});
  uint64_t peak = 0, cap = 0;
  double sum = 0;
  for (const auto& [used, bytes] : pool) {
    peak = std::max(peak, used);
    cap = std::max(cap, bytes);
    sum += static_cast<double>(used);
  }
  const size_t n = pool.size();
  j["pool"] = {{"tokens", n},
               {"bytes", cap},
               {"peak_used", peak},
               {"mean_used", n ? sum / static_cast<double>(n) : 0.0}};
  j["pool"]["mean_used_by_tenth"] = nlohmann::json::array();
  for (size_t d = 0; d < 10 && n >= 10; ++d) {
    double s = 0;
    const size_t a = n * d / 10, b = n * (d + 1) / 10;
    for (size_t i = a; i < b; ++i) s += static_cast<double>(pool[i].first);
    j["pool"]["mean_used_by_tenth"].push_back(s / static_cast<double>(b - a));
  }
  j["monitor"] = monitor;
  j["residuals_skipped"] = skipped;
  return j;
}

struct Stall {
  std::string op;
  int64_t start_us = 0, stall_us = 0;
};

int RunTraceReport(const std::vector<std::string>& args) {
  constexpr const char* kUsage = "usage: substrate trace-report TRACE.jsonl [--json] [--top N]\n";
  Flags f(args, {{"--top"}, {"--json"}, 1});
  if (!f.status().ok()) return UsageError("trace-report", f.status(), kUsage);
  if (f.help()) return std::fputs(kUsage, stdout), 0;
  if (f.positional().size() != 1)
    return UsageError("trace-report", InvalidArgument("one TRACE.jsonl expected"), kUsage);
  auto top = f.GetInt({"--top"}, 10);
  if (!top.ok() || *top < 0) return PrintError("trace-report", InvalidArgument("--top N: N >= 0"));
  const std::string path = f.positional()[0];
  std::ifstream in(path);
  if (!in) return PrintError("trace-report", NotFound("cannot open trace '" + path + "'"));

  std::map<std::string, KindStats> kinds;
  std::vector<Stall> stalls;
  Adaptive adaptive;
  uint64_t n_reads = 0, read_bytes = 0, n_direct = 0, n_uring = 0;
  int64_t read_us = 0, first_us = INT64_MAX, last_us = 0;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    const std::string where = "trace '" + path + "' line " + std::to_string(line_no) + ": ";
    try {
      json e = json::parse(line);
      if (!e.is_object())
        return PrintError("trace-report", Corruption(where + "not a JSON object"));
      const std::string ev = e.at("ev").get<std::string>();
      const int64_t start = e.at("start_us").get<int64_t>(), end = e.at("end_us").get<int64_t>();
      if (end < start)
        return PrintError("trace-report", Corruption(where + "end_us before start_us"));
      first_us = std::min(first_us, start);
      last_us = std::max(last_us, end);
      if (ev == "op") {
        KindStats& k = kinds[OpKind(e.at("op").get<std::string>())];
        ++k.count;
        k.bytes += e.at("bytes").get<uint64_t>();
        const bool hit = e.at("hit").get<bool>();
        hit ? ++k.hits : ++k.misses;
        const int64_t stall = e.at("stall_us").get<int64_t>();
        k.stall_us += stall;
        if (stall > 0) stalls.push_back({e.at("op").get<std::string>(), start, stall});
        adaptive.skipped += e.value("skip", false);
      } else if (ev == "read") {
        ++n_reads;
        read_bytes += e.at("bytes").get<uint64_t>();
        read_us += end - start;
        n_direct += e.at("direct").get<bool>();
        n_uring += e.at("uring").get<bool>();
      } else if (ev == "tier") {
        const std::string why = e.at("why").get<std::string>();
        ++adaptive.switches[why];
        if (why == "escalate") ++adaptive.escalations_by_op[e.at("op").get<std::string>()];
      } else if (ev == "token") {
        adaptive.pool.push_back(
            {e.at("pool_used").get<uint64_t>(), e.at("pool_bytes").get<uint64_t>()});
      } else if (ev == "monitor") {
        char buf[160];
        std::snprintf(buf, sizeof buf, "%.3f s: %s (latency x%.2f, disk x%.2f)", start / 1e6,
                      e.at("state").get<std::string>().c_str(), e.at("latency_ratio").get<double>(),
                      e.at("bw_ratio").get<double>());
        adaptive.monitor.push_back(buf);
      } else {
        return PrintError("trace-report", Corruption(where + "unknown event '" + ev + "'"));
      }
    } catch (const json::exception& ex) {
      return PrintError("trace-report", Corruption(where + "malformed event: " + ex.what()));
    }
  }
  std::sort(stalls.begin(), stalls.end(),
            [](const Stall& a, const Stall& b) { return a.stall_us > b.stall_us; });
  if (stalls.size() > static_cast<size_t>(*top)) stalls.resize(static_cast<size_t>(*top));
  const double span_s = last_us > first_us ? (last_us - first_us) / 1e6 : 0;

  json j;
  uint64_t misses = 0;
  int64_t stall_total = 0;
  for (const auto& [name, k] : kinds) {
    j["ops"][name] = {{"count", k.count},
                      {"bytes", k.bytes},
                      {"hits", k.hits},
                      {"misses", k.misses},
                      {"hit_rate", k.count ? static_cast<double>(k.hits) / k.count : 0.0},
                      {"stall_us", k.stall_us}};
    misses += k.misses;
    stall_total += k.stall_us;
  }
  j["reads"] = {{"count", n_reads},
                {"bytes", read_bytes},
                {"read_seconds", read_us / 1e6},
                {"bytes_per_s_while_reading", read_us ? read_bytes / (read_us / 1e6) : 0.0},
                {"bytes_per_s_over_span", span_s > 0 ? read_bytes / span_s : 0.0},
                {"direct", n_direct},
                {"uring", n_uring}};
  j["misses"] = misses;
  j["stall_us"] = stall_total;
  j["span_seconds"] = span_s;
  j["top_stalls"] = json::array();
  for (const Stall& s : stalls)
    j["top_stalls"].push_back({{"op", s.op}, {"start_us", s.start_us}, {"stall_us", s.stall_us}});
  if (adaptive.any()) j["adaptive"] = adaptive.Json();
  if (f.Has("--json")) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%-14s %8s %12s %9s %12s\n", "op kind", "count", "bytes", "hit rate", "stall ms");
  for (const auto& [name, k] : kinds)
    std::printf("%-14s %8llu %12s %8.1f%% %12.1f\n", name.c_str(),
                static_cast<unsigned long long>(k.count), FormatBytes(k.bytes).c_str(),
                k.count ? 100.0 * k.hits / k.count : 0.0, k.stall_us / 1e3);
  std::printf(
      "reads: %llu (%s), %.2f GB/s while reading, %.2f GB/s over the %.2f s trace; "
      "%llu direct, %llu io_uring\n",
      static_cast<unsigned long long>(n_reads), FormatBytes(read_bytes).c_str(),
      read_us ? read_bytes / (read_us / 1e6) / 1e9 : 0.0,
      span_s > 0 ? read_bytes / span_s / 1e9 : 0.0, span_s,
      static_cast<unsigned long long>(n_direct), static_cast<unsigned long long>(n_uring));
  std::printf("misses: %llu, stall %.1f ms\n", static_cast<unsigned long long>(misses),
              stall_total / 1e3);
  for (const Stall& s : stalls)
    std::printf("  stall %8.2f ms  %s at %.3f s\n", s.stall_us / 1e3, s.op.c_str(),
                s.start_us / 1e6);
  if (adaptive.any()) {
    const nlohmann::json a = j["adaptive"];
    std::printf("adaptive: switches %s; residuals skipped %llu\n", a["switches"].dump().c_str(),
                static_cast<unsigned long long>(adaptive.skipped));
    std::printf("  pool %s of %s at peak, %s on average; by tenth of the run:",
                FormatBytes(a["pool"]["peak_used"].get<uint64_t>()).c_str(),
                FormatBytes(a["pool"]["bytes"].get<uint64_t>()).c_str(),
                FormatBytes(static_cast<uint64_t>(a["pool"]["mean_used"].get<double>())).c_str());
    for (const auto& v : a["pool"]["mean_used_by_tenth"])
      std::printf(" %s", FormatBytes(static_cast<uint64_t>(v.get<double>())).c_str());
    std::printf("\n");
    for (const auto& o : a["most_escalated"])
      std::printf("  escalated %4llu x  %s\n",
                  static_cast<unsigned long long>(o["escalations"].get<uint64_t>()),
                  o["op"].get<std::string>().c_str());
    for (const std::string& m : adaptive.monitor) std::printf("  monitor %s\n", m.c_str());
  }
  return 0;
}

CommandRegistrar reg("trace-report", "summarize a runtime trace (substrate run --trace T.jsonl)",
                     &RunTraceReport);

}  // namespace
}  // namespace substrate::cli
