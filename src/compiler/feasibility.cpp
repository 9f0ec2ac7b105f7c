// Feasibility: the four axes of a request and, when it fails, relax options. An option is only
// offered after the request with it applied has been checked again and found feasible.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "compiler/fill.h"
#include "compiler/planner.h"
#include "core/memory_ledger.h"

namespace substrate::compiler {
namespace {

std::string Num(double v, const char* fmt = "%.6g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// The shortest of %.6g / %.17g that reads back as exactly v.
std::string Exact(double v) {
  std::string s = Num(v, "%.6g");
  return std::strtod(s.c_str(), nullptr) == v ? s : Num(v, "%.17g");
}

FeasibilityReport Axes(const ModelProfile& profile, const Budget& b, const FillResult& f) {
  FeasibilityReport r;
  int streamed = 0;
  for (bool s : f.streamed) streamed += s;
  r.streamed_ops = streamed;
  r.quality_loss = f.quality_loss;
  r.tokens_per_second = f.tokens_per_second();
  r.default_peak_bytes = f.peak();

  AxisReport mem{"memory", f.memory_ok, static_cast<double>(f.curve.front().first),
                 static_cast<double>(b.max_ram_bytes), ""};
  mem.detail = "cheapest skeleton needs " + FormatBytes(f.curve.front().first) + " (overhead " +
               FormatBytes(profile.overhead_bytes) + ", " + std::to_string(streamed) +
               " ops streamed) of " + FormatBytes(b.max_ram_bytes);
  const double need_bw = f.ssd_bytes_per_token * b.target_tokens_per_second;
  AxisReport bw{"bandwidth", need_bw <= b.ssd_read_bw || need_bw == 0, need_bw, b.ssd_read_bw, ""};
  bw.detail = "streaming " + FormatBytes(static_cast<uint64_t>(f.ssd_bytes_per_token)) +
              "/token at " + Num(b.target_tokens_per_second) + " tokens/s needs " +
              FormatBytes(static_cast<uint64_t>(need_bw)) + "/s of SSD reads; measured " +
              FormatBytes(static_cast<uint64_t>(b.ssd_read_bw)) + "/s";
  AxisReport lat{"latency", b.target_tokens_per_second <= 0 || f.tokens_per_second() >= b.target_tokens_per_second,
                 b.target_tokens_per_second, f.tokens_per_second(), ""};
  lat.detail = "predicted " + Num(f.tokens_per_second(), "%.3f") + " tokens/s (measured bandwidths: memory " +
               FormatBytes(static_cast<uint64_t>(b.memory_read_bw)) + "/s, SSD " +
               FormatBytes(static_cast<uint64_t>(b.ssd_read_bw)) + "/s), target " +
               Num(b.target_tokens_per_second);
  AxisReport q{"quality", f.memory_ok && f.quality_loss <= b.quality_loss_cap, f.quality_loss,
               b.quality_loss_cap, ""};
  q.detail = "estimated loss " + Num(f.quality_loss) + " (" + profile.quality_metric +
             ", additive) against cap " + Num(b.quality_loss_cap);
  r.axes = {mem, bw, lat, q};
  r.feasible = true;
  for (const AxisReport& a : r.axes) {
    if (!a.ok && r.binding_axis.empty()) r.binding_axis = a.axis;
    r.feasible = r.feasible && a.ok;
  }
  return r;
}

// Rounds to 4 significant digits, up or down, so a printed option can be typed back as is.
double RoundSig(double v, bool up) {
  if (!(v > 0) || !std::isfinite(v)) return v;
  double scale = std::pow(10.0, std::floor(std::log10(v)) - 3);
  double r = (up ? std::ceil(v / scale) : std::floor(v / scale)) * scale;
  return up ? std::max(r, v) : std::min(r, v);
}

uint64_t AllBestBytes(const ModelProfile& p) {
  uint64_t total = p.overhead_bytes;
  for (const OpProfile& op : p.ops) total += op.options.back().bytes;
  return total;
}

}  // namespace

Expected<CompileRequest> ResolveRequest(const ModelProfile& profile, CompileRequest req) {
  Budget& b = req.budget;
  if (b.memory_read_bw <= 0) b.memory_read_bw = profile.hardware.memory_read_bw;
  if (b.ssd_read_bw <= 0) b.ssd_read_bw = profile.hardware.ssd_read_bw;
  for (double v : {b.memory_read_bw, b.ssd_read_bw, b.quality_loss_cap, b.target_tokens_per_second})
    if (!std::isfinite(v) || v < 0)
      return InvalidArgument("compile: budget values must be finite numbers >= 0");
  if (b.target_tokens_per_second > 0 && (b.memory_read_bw <= 0 || b.ssd_read_bw <= 0))
    return InvalidArgument("compile: a tokens/s target needs measured memory and SSD read bandwidth; "
                           "the profile has none (run 'substrate calibrate --measure-hardware' or "
                           "pass --mem-bw and --ssd-bw)");
  if (req.escalation.max_concurrent_escalations < 0)
    return InvalidArgument("compile: --max-concurrent must be >= 0");
  return req;
}

Expected<FeasibilityReport> EvaluateAxes(const ModelProfile& profile, const CompileRequest& request) {
  ASSIGN_OR_RETURN(CompileRequest req, ResolveRequest(profile, request));
  return Axes(profile, req.budget, RunFill(profile, req.budget));
}

CompileRequest ApplyRelax(CompileRequest req, const RelaxOption& o) {
  if (o.max_ram_bytes) req.budget.max_ram_bytes = *o.max_ram_bytes;
  if (o.quality_loss_cap) req.budget.quality_loss_cap = *o.quality_loss_cap;
  if (o.target_tokens_per_second) req.budget.target_tokens_per_second = *o.target_tokens_per_second;
  return req;
}

Expected<FeasibilityReport> CheckFeasibility(const ModelProfile& profile, const CompileRequest& request) {
  ASSIGN_OR_RETURN(CompileRequest req, ResolveRequest(profile, request));
  FeasibilityReport report = Axes(profile, req.budget, RunFill(profile, req.budget));
  if (report.feasible) return report;

  auto feasible = [&](const CompileRequest& r) {
    return Axes(profile, r.budget, RunFill(profile, r.budget)).feasible;
  };
  // What the fill reaches with the quality cap and/or tokens/s target lifted: the cap becomes
  // the loss reached, the target the tokens/s reached (a hair below, for the comparison).
  auto reach = [&](CompileRequest r, bool lift_cap, bool lift_tps) {
    if (lift_cap) r.budget.quality_loss_cap = 0;
    if (lift_tps) r.budget.target_tokens_per_second = 0;
    FillResult f = RunFill(profile, r.budget);
    RelaxOption o;
    if (lift_cap) o.quality_loss_cap = f.quality_loss;
    if (lift_tps && request.budget.target_tokens_per_second > 0)
      o.target_tokens_per_second = f.tokens_per_second() * (1 - 1e-9);
    return o;
  };
  std::vector<RelaxOption> candidates;
  const uint64_t ram_hi = std::max(AllBestBytes(profile), req.budget.max_ram_bytes);
  {  // More RAM alone: the least that works (binary search, then re-checked).
    CompileRequest r = req;
    r.budget.max_ram_bytes = ram_hi;
    if (feasible(r)) {
      uint64_t lo = req.budget.max_ram_bytes, hi = ram_hi;
      while (hi - lo > std::max<uint64_t>(1, hi / 2000)) {
        r.budget.max_ram_bytes = lo + (hi - lo) / 2;
        (feasible(r) ? hi : lo) = r.budget.max_ram_bytes;
      }
      RelaxOption o;
      o.max_ram_bytes = hi;
      candidates.push_back(o);
    }
  }
  candidates.push_back(reach(req, true, false));
  if (req.budget.target_tokens_per_second > 0) {
    candidates.push_back(reach(req, false, true));
    candidates.push_back(reach(req, true, true));
  }
  {  // RAM for everything at its best precision, with the cap and target that reaches.
    CompileRequest r = req;
    r.budget.max_ram_bytes = ram_hi;
    RelaxOption o = reach(r, true, false);
    o.max_ram_bytes = ram_hi;
    candidates.push_back(o);
    o = reach(r, true, true);
    o.max_ram_bytes = ram_hi;
    candidates.push_back(o);
  }
  for (RelaxOption& o : candidates) {
    RelaxOption exact = o;
    if (o.quality_loss_cap) o.quality_loss_cap = RoundSig(*o.quality_loss_cap, true);
    if (o.target_tokens_per_second) o.target_tokens_per_second = RoundSig(*o.target_tokens_per_second, false);
    if (o.max_ram_bytes && *o.max_ram_bytes > (64ull << 20))
      o.max_ram_bytes = (*o.max_ram_bytes + (1ull << 20) - 1) / (1ull << 20) * (1ull << 20);
    if (!feasible(ApplyRelax(req, o))) o = exact;
    if (!feasible(ApplyRelax(req, o))) continue;
    std::vector<std::string> parts;
    if (o.max_ram_bytes)
      parts.push_back("raise max-ram to " + FormatBytes(*o.max_ram_bytes) + " (" +
                      std::to_string(*o.max_ram_bytes) + " bytes)");
    if (o.quality_loss_cap) parts.push_back("accept quality loss " + Exact(*o.quality_loss_cap));
    if (o.target_tokens_per_second)
      parts.push_back("lower tokens/s to " + Exact(*o.target_tokens_per_second));
    if (parts.empty()) continue;
    o.description = parts[0];
    for (size_t i = 1; i < parts.size(); ++i) o.description += " and " + parts[i];
    bool dup = false;
    for (const RelaxOption& seen : report.relax_options) dup = dup || seen.description == o.description;
    if (!dup) report.relax_options.push_back(o);
  }
  return report;
}

std::string FeasibilityToJson(const FeasibilityReport& r) {
  using nlohmann::json;
  json axes = json::object();
  for (const AxisReport& a : r.axes)
    axes[a.axis] = {{"ok", a.ok}, {"required", a.required}, {"available", a.available}, {"detail", a.detail}};
  json relax = json::array();
  for (const RelaxOption& o : r.relax_options) {
    json jo = {{"description", o.description}};
    if (o.max_ram_bytes) jo["max_ram_bytes"] = *o.max_ram_bytes;
    if (o.quality_loss_cap) jo["quality_loss_cap"] = *o.quality_loss_cap;
    if (o.target_tokens_per_second) jo["target_tokens_per_second"] = *o.target_tokens_per_second;
    relax.push_back(std::move(jo));
  }
  json j = {{"status", r.feasible ? "feasible" : "infeasible"},
            {"binding_axis", r.binding_axis.empty() ? json(nullptr) : json(r.binding_axis)},
            {"axes", std::move(axes)},
            {"relax_options", std::move(relax)},
            {"quality_loss", r.quality_loss},
            {"tokens_per_second", r.tokens_per_second},
            {"default_peak_ram_bytes", r.default_peak_bytes},
            {"streamed_ops", r.streamed_ops}};
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace substrate::compiler
