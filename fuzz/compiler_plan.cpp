// libFuzzer target: the plan readers on arbitrary JSON: the compiler's PlanBundle reader
// (PlanFromJson: fields, references, the invariants of a loadable plan) and the fields pack takes
// from a plan (ParsePackPlan). A plan that loads must round-trip through PlanToJson.
#include <cstddef>
#include <cstdint>
#include <string>

#include "compiler/plan_bundle.h"
#include "store/pack.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto plan = substrate::compiler::PlanFromJson(text);
  if (plan.ok()) {
    auto again = substrate::compiler::PlanFromJson(substrate::compiler::PlanToJson(*plan));
    if (!again.ok()) __builtin_trap();
  }
  (void)substrate::ParsePackPlan(text);
  return 0;
}
