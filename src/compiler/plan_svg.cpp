#include "compiler/plan_svg.h"

#include <algorithm>
#include <cstdio>
#include <unordered_set>

#include "compiler/svg_text.h"
#include "core/memory_ledger.h"

namespace substrate::compiler {

using svg::Escape;
using svg::F;
using svg::Text;

std::string PlanToSvg(const PlanBundle& plan) {
  const double W = 960, L = 70, R = 20;
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"960\" height=\"720\" "
                  "viewBox=\"0 0 960 720\">\n<rect width=\"960\" height=\"720\" fill=\"white\"/>\n";
  s += Text(L, 20, "plan for " + plan.model_id + ": max RAM " + FormatBytes(plan.budget.max_ram_bytes) +
                       ", pool " + FormatBytes(plan.escalation_ram_pool_bytes) + ", K=" +
                       std::to_string(plan.escalation_policy.max_concurrent_escalations),
            "font-weight=\"bold\"");

  // Panel 1: rate-distortion curve, y = quality loss, x = default path bytes.
  const double top1 = 40, h1 = 280, w = W - L - R;
  s += "<rect x=\"" + F(L) + "\" y=\"" + F(top1) + "\" width=\"" + F(w) + "\" height=\"" + F(h1) +
       "\" fill=\"none\" stroke=\"#888\"/>\n";
  const auto& c = plan.predicted.rd_curve;
  if (c.size() >= 1) {
    double x0 = static_cast<double>(c.front().first), x1 = static_cast<double>(plan.budget.max_ram_bytes);
    for (auto& p : c) x1 = std::max(x1, static_cast<double>(p.first));
    double y1 = 0;
    for (auto& p : c) y1 = std::max(y1, p.second);
    y1 = std::max({y1, plan.budget.quality_loss_cap, 1e-12});
    if (x1 <= x0) x1 = x0 + 1;
    auto X = [&](double v) { return L + (v - x0) / (x1 - x0) * w; };
    auto Y = [&](double v) { return top1 + h1 - v / y1 * h1; };
    std::string pts;
    for (auto& p : c) pts += F(X(static_cast<double>(p.first))) + "," + F(Y(p.second)) + " ";
    s += "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"" + pts + "\"/>\n";
    double yc = Y(plan.budget.quality_loss_cap);
    s += "<line x1=\"" + F(L) + "\" x2=\"" + F(L + w) + "\" y1=\"" + F(yc) + "\" y2=\"" + F(yc) +
         "\" stroke=\"#d62728\" stroke-dasharray=\"6,4\"/>\n";
    s += Text(L + w - 160, yc - 4, "quality cap " + std::to_string(plan.budget.quality_loss_cap), "fill=\"#d62728\"");
    double xr = X(static_cast<double>(plan.budget.max_ram_bytes));
    s += "<line x1=\"" + F(xr) + "\" x2=\"" + F(xr) + "\" y1=\"" + F(top1) + "\" y2=\"" + F(top1 + h1) +
         "\" stroke=\"#2ca02c\" stroke-dasharray=\"6,4\"/>\n";
    s += Text(L, top1 + h1 + 16, FormatBytes(c.front().first));
    s += Text(L + w - 80, top1 + h1 + 16, FormatBytes(static_cast<uint64_t>(x1)));
    s += Text(L + w / 2 - 120, top1 + h1 + 16, "default path RAM (greedy fill steps)");
    s += Text(4, top1 + 12, std::to_string(y1).substr(0, 8));
    s += Text(4, top1 + h1, "0");
  }

  // Panel 2: tier ladders, one column per op: bar heights = risk of tier 0 / 1 / 2.
  const double top2 = 380, h2 = 300;
  s += "<rect x=\"" + F(L) + "\" y=\"" + F(top2) + "\" width=\"" + F(w) + "\" height=\"" + F(h2) +
       "\" fill=\"none\" stroke=\"#888\"/>\n";
  s += Text(L, top2 - 8, "tier ladders: estimated quality risk per op (tier 0 red, 1 orange, 2 green; "
                         "grey base = skeleton streamed)");
  const size_t n = plan.op_bundles.size();
  double rmax = 1e-12;
  for (const OpBundle& ob : plan.op_bundles) rmax = std::max(rmax, ob.tiers[0].estimated_quality_risk);
  const double cw = w / static_cast<double>(std::max<size_t>(n, 1));
  const char* colors[3] = {"#d62728", "#ff7f0e", "#2ca02c"};
  std::unordered_set<std::string> streamed_ops;
  for (const CatalogTensor& t : plan.tensor_catalog)
    if (t.tier == 0 && t.residency == Residency::kStreamed) streamed_ops.insert(t.op_id);
  for (size_t i = 0; i < n; ++i) {
    const OpBundle& ob = plan.op_bundles[i];
    const double x = L + cw * static_cast<double>(i);
    const bool streamed = streamed_ops.count(ob.op_id) != 0;
    if (streamed)
      s += "<rect x=\"" + F(x) + "\" y=\"" + F(top2 + h2 - 4) + "\" width=\"" + F(std::max(cw, 0.5)) +
           "\" height=\"4\" fill=\"#999\"/>\n";
    for (size_t t = 0; t < ob.tiers.size(); ++t) {
      double hh = ob.tiers[t].estimated_quality_risk / rmax * (h2 - 8);
      double bw = std::max(cw * (1.0 - 0.3 * static_cast<double>(t)), 0.3);
      s += "<rect x=\"" + F(x) + "\" y=\"" + F(top2 + h2 - 4 - hh) + "\" width=\"" + F(bw) +
           "\" height=\"" + F(hh) + "\" fill=\"" + colors[t] + "\"><title>" + Escape(ob.op_id) +
           " tier " + std::to_string(t) + " " + Escape(ob.tiers[t].precision) + "</title></rect>\n";
    }
  }
  s += Text(L, top2 + h2 + 16, "ops in topological order (" + std::to_string(n) + ")");
  s += "</svg>\n";
  return s;
}

}  // namespace substrate::compiler
