// The rate-distortion picture of `substrate quantize --report F.svg`: KL divergence (log scale)
// against file bytes. The predicted curve the file-size planner walked, plans (predicted and,
// when measured, measured KLD) and llama.cpp's fixed mixes as points. Hand-written SVG.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace substrate::compiler {

struct RdPoint {
  std::string label;
  uint64_t bytes = 0;
  double predicted = -1;  // < 0: none
  double measured = -1;   // < 0: not measured
};

struct RdChart {
  std::string title;
  std::vector<std::pair<uint64_t, double>> predicted_curve;  // (file bytes, KLD)
  std::vector<RdPoint> plans;  // file-size plans (the file just written among them)
  std::vector<RdPoint> mixes;  // llama.cpp's fixed mixes of the same model
};

std::string RateDistortionSvg(const RdChart& chart);

}  // namespace substrate::compiler
