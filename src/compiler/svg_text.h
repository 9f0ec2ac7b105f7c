// Small SVG text helpers shared by the compiler's charts (plan_svg, rd_svg).
#pragma once

#include <cstdio>
#include <string>

namespace substrate::compiler::svg {

// A coordinate, one decimal.
inline std::string F(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

// s with the characters XML reserves in text and attributes escaped.
inline std::string Escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

// A sans-serif <text> element at (x, y); extra: more attributes.
inline std::string Text(double x, double y, const std::string& s, const char* extra = "",
                        int size = 12) {
  return "<text x=\"" + F(x) + "\" y=\"" + F(y) + "\" font-family=\"sans-serif\" font-size=\"" +
         std::to_string(size) + "\" " + extra + ">" + Escape(s) + "</text>\n";
}

}  // namespace substrate::compiler::svg
