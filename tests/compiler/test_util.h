// Shared helpers for the compiler tests: random and small hand-made profiles.
#pragma once

#include <random>
#include <string>

#include "compiler/profile.h"

namespace substrate::compiler::testing {

inline ModelProfile SmallProfile() {
  ModelProfile p;
  p.model_id = "small";
  p.overhead_bytes = 1000;
  p.hardware = {1e10, 1e9, "test"};
  const DType types[4] = {DType::kQ2_K, DType::kQ4_K, DType::kQ6_K, DType::kQ8_0};
  const double loss[4] = {0.1, 0.02, 0.005, 0.001};
  for (int i = 0; i < 6; ++i) {
    OpProfile op;
    op.id = "block_" + std::to_string(i / 3) + (i % 3 == 0 ? ".attn" : ".moe.expert_" + std::to_string(i % 3));
    op.kind = i % 3 == 0 ? "attn" : "expert";
    op.layer = i / 3;
    op.activation_prob = i % 3 == 0 ? 1.0 : 0.5;
    for (int t = 0; t < 4; ++t)
      op.options.push_back({types[t], static_cast<uint64_t>((10000 + 1000 * t) * (i % 3 + 1)), loss[t] * (i + 1)});
    p.ops.push_back(op);
  }
  (void)p.Normalize();
  return p;
}

inline ModelProfile RandomProfile(std::mt19937_64& rng) {
  auto uni = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); };
  auto pick = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };
  ModelProfile p;
  p.model_id = "random";
  p.hardware.memory_read_bw = uni(1e9, 1e11);
  p.hardware.ssd_read_bw = uni(1e8, 1e10);
  p.hardware.measured_by = "test";
  const DType all[7] = {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K,
                        DType::kQ6_K, DType::kQ8_0, DType::kBF16};
  const int n = pick(1, 40);
  for (int i = 0; i < n; ++i) {
    OpProfile op;
    op.id = "op_" + std::to_string(i);
    op.kind = "test";
    op.layer = i;
    op.activation_prob = pick(0, 2) == 0 ? uni(0.02, 0.5) : 1.0;
    op.sensitivity = pick(0, 3) == 0 ? uni(0, 1) : 0.0;
    double bytes = uni(1e3, 1e7);
    double loss = uni(1e-4, 0.2);
    int first = pick(0, 5), count = pick(1, 7 - first);
    for (int t = first; t < first + count; ++t) {
      op.options.push_back({all[t], static_cast<uint64_t>(bytes), loss});
      bytes *= uni(1.1, 2.0);
      loss *= uni(0.1, 0.9);
    }
    p.ops.push_back(op);
  }
  p.overhead_bytes = static_cast<uint64_t>(uni(0, 1e6));
  (void)p.Normalize();
  return p;
}

}  // namespace substrate::compiler::testing
