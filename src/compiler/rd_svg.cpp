#include "compiler/rd_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "compiler/svg_text.h"

namespace substrate::compiler {
namespace {

using svg::Escape;
using svg::F;
using svg::Text;

std::string G(double v, const char* fmt = "%.4g") {
  char b[32];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

}  // namespace

std::string RateDistortionSvg(const RdChart& c) {
  const double W = 900, H = 560, L = 80, R = 200, T = 40, B = 50;
  const double w = W - L - R, h = H - T - B;
  // Axis ranges over everything drawn.
  double x0 = 1e300, x1 = 0, y0 = 1e300, y1 = 0;
  auto take = [&](uint64_t bytes, double kld) {
    if (!(kld > 0)) return;
    x0 = std::min(x0, static_cast<double>(bytes));
    x1 = std::max(x1, static_cast<double>(bytes));
    y0 = std::min(y0, kld);
    y1 = std::max(y1, kld);
  };
  for (const auto& [b, k] : c.predicted_curve) take(b, k);
  for (const auto* set : {&c.plans, &c.mixes})
    for (const RdPoint& p : *set) take(p.bytes, p.predicted), take(p.bytes, p.measured);
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"560\" "
                  "viewBox=\"0 0 900 560\">\n<rect width=\"900\" height=\"560\" fill=\"white\"/>\n";
  s += Text(8, 16, c.title, "font-weight=\"bold\"");
  s += "<rect x=\"" + F(L) + "\" y=\"" + F(T) + "\" width=\"" + F(w) + "\" height=\"" + F(h) +
       "\" fill=\"none\" stroke=\"#888\"/>\n";
  if (x1 <= 0) return s + Text(L + 10, T + 20, "nothing to draw") + "</svg>\n";
  if (x1 <= x0) x1 = x0 + 1;
  const double pad = (x1 - x0) * 0.04;
  x0 -= pad, x1 += pad;
  double ly0 = std::floor(std::log10(y0)), ly1 = std::ceil(std::log10(y1));
  if (ly1 <= ly0) ly1 = ly0 + 1;
  auto X = [&](double v) { return L + (v - x0) / (x1 - x0) * w; };
  auto Y = [&](double v) { return T + h - (std::log10(v) - ly0) / (ly1 - ly0) * h; };
  // Grid: decades and their 2x, 5x on y; five byte ticks on x.
  for (double e = ly0; e <= ly1; e += 1) {
    for (double m : {1.0, 2.0, 5.0}) {
      const double v = m * std::pow(10.0, e);
      if (std::log10(v) > ly1 + 1e-9) break;
      const double y = Y(v);
      s += "<line x1=\"" + F(L) + "\" x2=\"" + F(L + w) + "\" y1=\"" + F(y) + "\" y2=\"" + F(y) +
           "\" stroke=\"" + (m == 1.0 ? "#ccc" : "#eee") + "\"/>\n";
      s += Text(L - 56, y + 4, G(v, "%.3g"));
    }
  }
  for (int i = 0; i <= 4; ++i) {
    const double v = x0 + (x1 - x0) * i / 4;
    s += Text(X(v) - 30, T + h + 18, G(v / 1e6, "%.3f") + " MB");
  }
  s += Text(L + w / 2 - 60, H - 8, "file size (bytes)");
  s += Text(8, T - 10, "mean KLD against the unquantized model (log scale)", "", 11);

  if (!c.predicted_curve.empty()) {
    std::string pts;
    for (const auto& [b, k] : c.predicted_curve)
      if (k > 0) pts += F(X(static_cast<double>(b))) + "," + F(Y(k)) + " ";
    s += "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"" + pts + "\"/>\n";
  }
  auto marker = [&](double x, double y, const char* color, bool filled, bool square, const std::string& tip) {
    const std::string fill = filled ? color : "white";
    std::string m = square ? "<rect x=\"" + F(x - 5) + "\" y=\"" + F(y - 5) + "\" width=\"10\" height=\"10\""
                           : "<circle cx=\"" + F(x) + "\" cy=\"" + F(y) + "\" r=\"5\"";
    return m + " fill=\"" + fill + "\" stroke=\"" + color + "\" stroke-width=\"2\"><title>" +
           Escape(tip) + "</title></" + (square ? "rect" : "circle") + ">\n";
  };
  auto points = [&](const std::vector<RdPoint>& set, const char* color, bool square) {
    for (const RdPoint& p : set) {
      const double x = X(static_cast<double>(p.bytes));
      if (p.predicted > 0 && p.measured > 0)
        s += "<line x1=\"" + F(x) + "\" x2=\"" + F(x) + "\" y1=\"" + F(Y(p.predicted)) + "\" y2=\"" +
             F(Y(p.measured)) + "\" stroke=\"" + color + "\" stroke-dasharray=\"2,2\"/>\n";
      if (p.predicted > 0)
        s += marker(x, Y(p.predicted), color, false, square,
                    p.label + ": predicted " + G(p.predicted) + ", " + std::to_string(p.bytes) + " bytes");
      if (p.measured > 0)
        s += marker(x, Y(p.measured), color, true, square,
                    p.label + ": measured " + G(p.measured) + ", " + std::to_string(p.bytes) + " bytes");
      const double ly = p.measured > 0 ? Y(p.measured) : Y(p.predicted);
      if (p.measured > 0 || p.predicted > 0) s += Text(x + 8, ly - 6, p.label, "", 10);
    }
  };
  points(c.mixes, "#d62728", true);
  points(c.plans, "#1f77b4", false);

  // Legend.
  const double lx = L + w + 16;
  s += "<line x1=\"" + F(lx) + "\" x2=\"" + F(lx + 24) + "\" y1=\"" + F(T + 10) + "\" y2=\"" + F(T + 10) +
       "\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n";
  s += Text(lx + 30, T + 14, "predicted (plans)");
  s += marker(lx + 12, T + 34, "#1f77b4", false, false, "") + Text(lx + 30, T + 38, "plan, predicted");
  s += marker(lx + 12, T + 58, "#1f77b4", true, false, "") + Text(lx + 30, T + 62, "plan, measured");
  s += marker(lx + 12, T + 82, "#d62728", false, true, "") + Text(lx + 30, T + 86, "llama.cpp mix, predicted");
  s += marker(lx + 12, T + 106, "#d62728", true, true, "") + Text(lx + 30, T + 110, "llama.cpp mix, measured");
  s += "</svg>\n";
  return s;
}

}  // namespace substrate::compiler
