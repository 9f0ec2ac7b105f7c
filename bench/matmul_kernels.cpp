// Kernel microbenchmark: MatMul per weight type and ISA tier, as decode (GEMV, 1 token) and
// prefill (GEMM, many tokens), on an llama3-8b-sized FFN matrix. Prints JSON: time per call,
// weight bytes per second (decode; compare with the machine's read bandwidth, measured here
// too) and integer/float operations per second (prefill). Times are the best of repeated calls;
// a matrix small enough for L2 (--rows 256) shows the kernels' compute speed without memory.
//
//   bench_matmul_kernels [--threads N] [--rows 14336] [--cols 4096] [--tokens 64] [--matrices N]
//     [--batch B]
//     [--prefetch L1:L2,...]
//     [--isa best|all|scalar|avx2|avx512|prefill (avx512 dot kernels vs the amx GEMM)]
//     [--types Q4_K,Q6_K,Q8_0,Q4_0] [--seconds S] [--layout rows|decode]
// --layout decode lays out the weights as the CPU backend does at load (interleaved Q8_0,
// Q4_0 and Q4_K on AVX-512). --matrices N (decode, default 1) cycles the GEMV through N
// distinct copies of the matrix, as a model's decode meets them: each one cold in every cache
// once N copies exceed the last level, so the figure is DRAM's and not a cache's (the time is
// then the mean call's). --prefetch L1:L2,L1:L2,... compares the decode kernels' prefetch
// distances (cpu_features.h) on those cold matrices, alternating per call so that every setting
// meets the same neighbours on a shared machine: "prefetch" has each one's weight bytes/s.
// --batch B (decode) makes each call one MatMulBatch over B of those copies, as a MoE layer's
// selected experts run in decode (its weight bytes are then B matrices').
// "vnni_peak_gops_per_core": one core issuing nothing but independent 512-bit dpbusd
// (64 multiply-adds each, 2 operations per multiply-add), the ceiling of any int8 kernel here.
// GCC 12's 512-bit reduce intrinsics pass an "undefined" vector that its own -Wuninitialized
// then flags; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/aligned_buffer.h"
#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/interleaved.h"
#include "kernels/matmul.h"
#include "kernels/membw.h"
#include "quant/quant.h"

using namespace substrate;

namespace {

// The fastest of repeated calls: on a shared machine the minimum is the run nobody preempted.
// The best call's time, or with `mean` the mean of every call's (cold matrices: each call is as
// cold as the next, and the best of them would be the one a neighbour left the most room).
double TimeIt(const std::function<void()>& fn, double min_seconds, bool mean = false) {
  fn();  // warm
  auto start = std::chrono::steady_clock::now();
  double best = 1e30, el = 0;
  int64_t calls = 0;
  do {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    el = std::chrono::duration<double>(t1 - start).count();
    ++calls;
  } while (el < min_seconds);
  return mean ? el / static_cast<double>(calls) : best;
}

// Integer operations per second of one core's dpbusd stream: 12 independent accumulators, named
// one by one so that each stays in a register (an array of them went through the stack between
// dpbusd, and the store-to-load latency of each chain halved the figure this reported until
// 2026-12-05: 466-506 on Zen 5, whose two 512-bit dpbusd a cycle give 950).
__attribute__((target("avx512f,avx512bw,avx512vnni"))) double VnniPeakGops(double min_seconds) {
  const int64_t kIters = 1 << 15;  // ~0.4 M dpbusd: short enough to run unpreempted
  double best = 0;
  auto start = std::chrono::steady_clock::now();
  do {
    __m512i c0 = _mm512_set1_epi32(0), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0,
            c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
    const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-5);
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t it = 0; it < kIters; ++it) {
      __asm__ volatile(
          "vpdpbusd %13, %12, %0\n\tvpdpbusd %13, %12, %1\n\tvpdpbusd %13, %12, %2\n\t"
          "vpdpbusd %13, %12, %3\n\tvpdpbusd %13, %12, %4\n\tvpdpbusd %13, %12, %5\n\t"
          "vpdpbusd %13, %12, %6\n\tvpdpbusd %13, %12, %7\n\tvpdpbusd %13, %12, %8\n\t"
          "vpdpbusd %13, %12, %9\n\tvpdpbusd %13, %12, %10\n\tvpdpbusd %13, %12, %11"
          : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6), "+v"(c7),
            "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11)
          : "v"(a), "v"(b));
    }
    auto t1 = std::chrono::steady_clock::now();
    const __m512i all = _mm512_add_epi32(
        _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                         _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7))),
        _mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(c10, c11)));
    const int32_t sink = _mm512_reduce_add_epi32(all);
    __asm__ volatile("" : : "r"(sink));
    const double sec = std::chrono::duration<double>(t1 - t0).count();
    best = std::max(best, 2.0 * 64 * 12 * static_cast<double>(kIters) / sec / 1e9);
  } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
           min_seconds);
  return best;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  double seconds = 0.5;
  int64_t rows = 14336, cols = 4096, tokens = 64;
  std::string types = "Q4_K,Q6_K,Q8_0,Q4_0,Q5_K,Q3_K,Q2_K,IQ4_XS,F16,BF16", isa_arg = "best";
  std::string layout = "rows";
  int64_t matrices = 1, batch = 1;
  std::vector<PrefetchDistances> prefetch;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--threads") threads = std::stoi(v);
    else if (a == "--rows") rows = std::stoll(v);
    else if (a == "--cols") cols = std::stoll(v);
    else if (a == "--tokens") tokens = std::stoll(v);
    else if (a == "--types") types = v;
    else if (a == "--isa") isa_arg = v;
    else if (a == "--seconds") seconds = std::stod(v);
    else if (a == "--layout") layout = v;
    else if (a == "--matrices") matrices = std::max<int64_t>(1, std::stoll(v));
    else if (a == "--batch") batch = std::max<int64_t>(1, std::stoll(v));
    else if (a == "--prefetch")
      for (const auto& d : Split(v)) {
        const size_t colon = d.find(':');
        prefetch.push_back({std::stoi(d.substr(0, colon)),
                            colon == std::string::npos ? 0 : std::stoi(d.substr(colon + 1))});
      }
  }
  ThreadPool pool(threads);
  std::vector<Isa> tiers;
  if (isa_arg == "all") tiers = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx};
  else if (isa_arg == "scalar") tiers = {Isa::kScalar};
  else if (isa_arg == "avx2") tiers = {Isa::kAvx2};
  else if (isa_arg == "avx512") tiers = {Isa::kAvx512};
  else if (isa_arg == "prefill") tiers = {Isa::kAvx512, Isa::kAmx};  // dot kernels vs AMX GEMM
  else tiers = {DetectedIsa()};

  nlohmann::json out;
  auto bw = MeasureReadBandwidth(pool, 1ull << 30, 5);
  out["threads"] = threads;
  out["shape"] = {rows, cols};
  out["mem_bw_bytes_per_s"] = bw.ok() ? bw->bytes_per_second : 0.0;
  if (DetectedIsa() >= Isa::kAvx512) out["vnni_peak_gops_per_core"] = VnniPeakGops(seconds);
  out["results"] = nlohmann::json::array();

  std::mt19937 rng(1);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> x(static_cast<size_t>(cols * tokens)), y(static_cast<size_t>(rows * tokens));
  for (auto& v : x) v = g(rng);
  for (const auto& tn : Split(types)) {
    auto type = DTypeFromName(tn);
    if (!type || !CanQuantize(*type)) continue;
    size_t rb = *RowBytes(*type, static_cast<uint64_t>(cols));
    std::vector<uint8_t> w(rb * rows);
    std::vector<float> row(static_cast<size_t>(cols));
    // A few distinct quantized rows, repeated: realistic blocks without a long setup.
    for (int64_t r = 0; r < rows; ++r) {
      if (r < 16) {
        for (auto& v : row) v = 0.02f * g(rng);
        QuantizeRow(*type, row.data(), w.data() + r * rb, cols);
      } else {
        std::memcpy(w.data() + r * rb, w.data() + (r % 16) * rb, rb);
      }
    }
    WeightView view;
    // The layout the CPU backend gives the matrix at load (interleaved.h).
    if (layout == "decode" &&
        InterleavedKernelFor(DecodeLayoutFor(*type, rows, cols), DetectedIsa()))
      view.layout = InterleaveForDecode(*type, rows, cols, w.data(), &pool);
    view.type = *type;
    view.data = w.data();
    view.bytes = w.size();
    view.rows = rows;
    view.cols = cols;
    // Copies 1..N-1 (copy 0 is w), on huge pages as the engine's resident weights are.
    std::vector<AlignedBuffer> copies;
    for (int64_t m = 1; m < matrices; ++m) {
      auto b = AlignedBuffer::Allocate(w.size());
      if (!b.ok()) {
        std::fprintf(stderr, "%s\n", b.status().ToString().c_str());
        return 1;
      }
      std::memcpy(b->data(), w.data(), w.size());
      copies.push_back(std::move(b).value());
    }
    size_t next = 0;
    std::vector<WeightView> views(static_cast<size_t>(batch), view);
    std::vector<MatMulJob> jobs(static_cast<size_t>(batch));
    std::vector<float> ys(static_cast<size_t>(rows * batch));
    auto gemv_one = [&] {
      for (int64_t b = 0; b < batch; ++b) {
        WeightView& v = views[static_cast<size_t>(b)];
        v.data = next > 0 ? copies[next - 1].data() : w.data();
        next = (next + 1) % static_cast<size_t>(matrices);
        jobs[static_cast<size_t>(b)] = {&v, x.data(), 1, ys.data() + b * rows};
      }
      MatMulBatch(jobs.data(), static_cast<int>(batch), pool);
    };
    const double call_bytes = static_cast<double>(w.size()) * static_cast<double>(batch);
    for (Isa isa : tiers) {
      if (isa > DetectedIsa()) continue;
      Isa prev = SetIsaForTesting(isa);
      double gemv = TimeIt(gemv_one, seconds, matrices > 1);
      double gemm = TimeIt([&] { MatMul(view, x.data(), tokens, y.data(), pool); }, seconds);
      nlohmann::json by_distance = nlohmann::json::array();
      if (!prefetch.empty()) {
        const PrefetchDistances before = DecodePrefetch();
        std::vector<double> secs(prefetch.size(), 0);
        int64_t rounds = 0;  // each setting once per round, for `seconds` each in all
        for (double all = 0; all < seconds * static_cast<double>(prefetch.size()); ++rounds)
          for (size_t k = 0; k < prefetch.size(); ++k) {
            SetDecodePrefetchForTesting(prefetch[k]);
            const auto t0 = std::chrono::steady_clock::now();
            gemv_one();
            const double dt =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            secs[k] += dt;
            all += dt;
          }
        SetDecodePrefetchForTesting(before);
        for (size_t k = 0; k < prefetch.size(); ++k)
          by_distance.push_back({{"l1", prefetch[k].l1}, {"l2", prefetch[k].l2},
                                 {"gemv_weight_bytes_per_s",
                                  call_bytes * static_cast<double>(rounds) / secs[k]}});
      }
      SetIsaForTesting(prev);
      double ops = 2.0 * static_cast<double>(rows) * static_cast<double>(cols);
      out["results"].push_back({{"type", tn}, {"isa", IsaName(isa)},
                                {"layout", view.layout == WeightLayout::kRows ? "rows" : "interleaved"},
                                {"gemv_ms", gemv * 1e3},
                                {"gemv_weight_bytes_per_s", call_bytes / gemv},
                                {"gemv_bw_ratio", bw.ok() ? call_bytes / gemv /
                                                                bw->bytes_per_second
                                                          : 0.0},
                                {"gemm_tokens", tokens},
                                {"gemm_ms", gemm * 1e3},
                                {"gemm_gops", ops * static_cast<double>(tokens) / gemm / 1e9},
                                {"prefetch", by_distance}});
    }
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
