// The CPU attention kernels alone on llama3-8b's shape (32 query heads, 8 KV heads of 128; --heads
// Q,KV for other counts): a pass of --tokens tokens on top of a --context - tokens history, per
// kernel the best of three timings of --reps calls, as JSON. The K/V bytes a call must read
// against the bandwidth measured in the same run give each kernel's ratio to the memory limit (a
// long history does not fit in cache).
//
// The cache lies in buffers allocated as the engine's (2 MiB pages where the kernel allows);
// --small-pages reads it from plain heap memory instead (4 KiB pages: a TLB miss per key).
//
//   bench_attention_kernels [--tokens 1] [--context 512,2048,8192] [--threads 2] [--f16] [--reps
//   50] [--small-pages] [--heads 32,8]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/aligned_buffer.h"
#include "kernels/attention.h"
#include "kernels/attention_simd.h"
#include "kernels/cpu_features.h"
#include "kernels/membw.h"
#include "quant/quant.h"

using namespace substrate;

namespace {

std::vector<int64_t> ParseList(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(std::stoll(item));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n_tokens = 1;
  std::vector<int64_t> contexts = {512, 2048, 8192};
  int threads = 2, reps = 50;
  bool f16 = false, small_pages = false;
  std::vector<int64_t> heads = {32, 8};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_attention_kernels: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokens")
      n_tokens = std::stoll(next());
    else if (a == "--context")
      contexts = ParseList(next());
    else if (a == "--threads")
      threads = std::stoi(next());
    else if (a == "--reps")
      reps = std::stoi(next());
    else if (a == "--f16")
      f16 = true;
    else if (a == "--small-pages")
      small_pages = true;
    else if (a == "--heads")
      heads = ParseList(next());
    else {
      std::fprintf(stderr, "bench_attention_kernels: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (ActiveIsa() < Isa::kAvx2) {
    std::fprintf(stderr, "bench_attention_kernels: needs AVX2\n");
    return 1;
  }
  ThreadPool pool(threads);
  if (heads.size() != 2 || heads[1] <= 0 || heads[0] % heads[1] != 0) {
    std::fprintf(stderr, "bench_attention_kernels: --heads takes Q,KV with KV dividing Q\n");
    return 2;
  }
  const AttentionShape s{static_cast<int>(heads[0]), static_cast<int>(heads[1]), 128, 128,
                         1.0f / std::sqrt(128.0f)};
  auto measured = MeasureReadBandwidth(pool, uint64_t{1} << 30);
  if (!measured.ok()) {
    std::fprintf(stderr, "bench_attention_kernels: %s\n", measured.status().ToString().c_str());
    return 1;
  }
  const double bw = measured->bytes_per_second;
  std::printf(
      "{\n  \"isa\": \"%s\",\n  \"threads\": %d,\n  \"tokens\": %lld,\n  \"heads\": [%d, %d],\n"
      "  \"kv_type\": \"%s\",\n  \"mem_bw_bytes_per_s\": %.0f,\n  \"runs\": [\n",
      IsaName(ActiveIsa()), threads, static_cast<long long>(n_tokens), s.n_head, s.n_head_kv,
      f16 ? "f16" : "f32", bw);
  for (size_t ci = 0; ci < contexts.size(); ++ci) {
    const int64_t ctx = std::max(contexts[ci], n_tokens);
    const int64_t stride = int64_t{s.n_head_kv} * s.dk;
    std::mt19937 rng(7);
    std::normal_distribution<float> g;
    std::vector<float> k(ctx * stride), v(ctx * stride), q(n_tokens * s.n_head * s.dk);
    for (auto* b : {&k, &v, &q})
      for (float& x : *b) x = g(rng);
    std::vector<uint16_t> k16, v16;
    for (float x : k) k16.push_back(Fp32ToFp16(x));
    for (float x : v) v16.push_back(Fp32ToFp16(x));
    // The cache in buffers as the engine allocates it (2 MiB pages where the kernel allows),
    // or with --small-pages where it was generated, in plain heap memory (4 KiB pages).
    const void* kp = f16 ? static_cast<const void*>(k16.data()) : k.data();
    const void* vp = f16 ? static_cast<const void*>(v16.data()) : v.data();
    AlignedBuffer kb, vb;
    if (!small_pages) {
      const size_t bytes = static_cast<size_t>(ctx * stride) * (f16 ? 2 : 4);
      auto ka = AlignedBuffer::Allocate(bytes), va = AlignedBuffer::Allocate(bytes);
      if (!ka.ok() || !va.ok()) {
        std::fprintf(stderr, "bench_attention_kernels: out of memory\n");
        return 1;
      }
      kb = std::move(ka).value();
      vb = std::move(va).value();
      std::memcpy(kb.data(), kp, bytes);
      std::memcpy(vb.data(), vp, bytes);
      kp = kb.data();
      vp = vb.data();
    }
    const KvRows kv{f16 ? DType::kF16 : DType::kF32, kp, stride, vp, stride};
    std::vector<float> out(n_tokens * s.n_head * s.dv);
    const double kv_bytes = 2.0 * ctx * stride * (f16 ? 2 : 4);
    auto time = [&](auto&& call) {
      double best = 1e30;
      for (int round = 0; round < 3; ++round) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r) call();
        best = std::min(
            best,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
      }
      return best;
    };
    const int64_t pos0 = ctx - n_tokens;
    const double simd =
        time([&] { AttentionSimd(s, q.data(), n_tokens, pos0, kv, out.data(), pool); });
    double blocked = 0;
    if (ActiveIsa() >= Isa::kAvx512)
      blocked =
          time([&] { AttentionBlockedAvx512(s, q.data(), n_tokens, pos0, kv, out.data(), pool); });
    std::printf(
        "    {\"context\": %lld, \"kv_bytes\": %.0f, \"simd_s\": %.3e, "
        "\"blocked_s\": %.3e, \"simd_bw_ratio\": %.3f, \"blocked_bw_ratio\": %.3f, "
        "\"speedup\": %.2f}%s\n",
        static_cast<long long>(ctx), kv_bytes, simd, blocked, kv_bytes / simd / bw,
        blocked > 0 ? kv_bytes / blocked / bw : 0.0, blocked > 0 ? simd / blocked : 0.0,
        ci + 1 < contexts.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
  return 0;
}
