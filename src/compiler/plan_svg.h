// An SVG picture of a plan, written by hand: the rate-distortion curve the greedy fill walked
// (RAM of the default path vs estimated quality loss) and every op's tier ladder (risk per tier,
// skeleton residency).
#pragma once

#include <string>

#include "compiler/plan_bundle.h"

namespace substrate::compiler {

std::string PlanToSvg(const PlanBundle& plan);

}  // namespace substrate::compiler
