// Throughput of the reference quantizers and dequantizers, single thread, per type:
// {"type": "Q4_K", "quantize_melem_s": ..., "dequantize_melem_s": ..., "rel_rms": ...}.
// The physical limit it compares with is memory bandwidth for dequantize (bytes read+written
// per second); quantize is compute-bound by design (scale searches).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "format/dtype.h"
#include "quant/quant.h"

using namespace substrate;

int main() {
  const int64_t n = 1 << 20;
  std::vector<float> x(n), y(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.f, 0.02f);
  for (auto& v : x) v = g(rng);
  std::printf("[\n");
  const DType types[] = {DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                         DType::kQ5_0, DType::kQ5_1, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K,
                         DType::kQ5_K, DType::kQ6_K, DType::kIQ4_NL, DType::kIQ4_XS};
  bool first = true;
  for (DType t : types) {
    std::vector<uint8_t> q(*RowBytes(t, n));
    auto t0 = std::chrono::steady_clock::now();
    QuantizeRow(t, x.data(), q.data(), n);
    auto t1 = std::chrono::steady_clock::now();
    DequantizeRow(t, q.data(), y.data(), n);
    auto t2 = std::chrono::steady_clock::now();
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; ++i) {
      e += (x[i] - y[i]) * static_cast<double>(x[i] - y[i]);
      s += x[i] * static_cast<double>(x[i]);
    }
    const double qs = std::chrono::duration<double>(t1 - t0).count();
    const double ds = std::chrono::duration<double>(t2 - t1).count();
    std::printf("%s  {\"type\": \"%s\", \"quantize_melem_s\": %.1f, \"dequantize_melem_s\": %.1f, "
                "\"dequantize_gb_s\": %.2f, \"rel_rms\": %.5f}",
                first ? "" : ",\n", DTypeName(t), n / qs / 1e6, n / ds / 1e6,
                (q.size() + 4.0 * n) / ds / 1e9, std::sqrt(e / s));
    first = false;
  }
  std::printf("\n]\n");
  return 0;
}
