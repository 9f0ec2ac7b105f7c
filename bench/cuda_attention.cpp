// The CUDA decode attention alone: one token's launch over an F16 KV cache of several lengths,
// with the GQA shapes of llama3-8b (32 query heads, 8 KV heads) and qwen3-30b-a3b (32, 4), the
// splits the backend chooses. Launches are replayed from a CUDA graph, each after the one
// before as in a decode step; the same graph of one-row quantizations gives the floor a small
// dependent launch costs on this device, so the attention's own time is the difference.
//   bench_cuda_attention [MAX_SPLITS]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#if SUBSTRATE_HAVE_CUDA
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_ops.h"
#include "cuda_timing.h"

namespace {

using namespace substrate::cuda;

#define CHECK CUDA_BENCH_CHECK

constexpr int kLaunches = 64;

}  // namespace

int main(int argc, char** argv) {
  // An optional argument caps the splits (to compare with the backend's choice).
  const int max_splits = argc > 1 ? std::atoi(argv[1]) : kAttentionMaxSplits;
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double hbm = MeasureReadBandwidth(2ull << 30, 5, s);
  std::printf("streaming read %.0f GB/s; %d multiprocessors\n", hbm / 1e9, sms);

  constexpr int kDim = 128, kMaxCtx = 16384, kHeads = 32;
  float *q = nullptr, *out = nullptr, *partial = nullptr, *xq_in = nullptr;
  __half *k = nullptr, *v = nullptr;
  int64_t* pos0 = nullptr;
  uint32_t* counters = nullptr;
  int8_t* xq = nullptr;
  float2* xs = nullptr;
  const size_t kv_elems = static_cast<size_t>(kMaxCtx) * 8 * kDim;
  CHECK(cudaMalloc(reinterpret_cast<void**>(&q), kHeads * kDim * 4));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&out), kHeads * kDim * 4));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&partial), 32u << 20));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&k), kv_elems * 2));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&v), kv_elems * 2));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&pos0), 8));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&counters), 4096 * 4));
  CHECK(cudaMemset(counters, 0, 4096 * 4));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&xq_in), 4096 * 4));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&xq), 4096));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&xs), 4096 / 32 * 8));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  {
    std::vector<__half> h(kv_elems);
    for (auto& e : h) e = __float2half(nd(rng));
    CHECK(cudaMemcpy(k, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(v, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    std::vector<float> f(kHeads * kDim);
    for (float& e : f) e = nd(rng);
    CHECK(cudaMemcpy(q, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(xq_in, f.data(), 4096 * 4, cudaMemcpyHostToDevice));
  }

  QuantizeQ8Params qp{xq_in, 1, 4096, xq, xs};
  const double floor_us =
      MicrosecondsPerLaunch(s, kLaunches, [&](int) { LaunchQuantizeQ8(&qp, s); });
  std::printf("floor: a one-row quantization %.2f us a launch\n", floor_us);

  struct Shape {
    const char* name;
    int n_head_kv;
  };
  // What every launch below shares: the cache, the heads, the scale, the position.
  auto base_params = [&](const Shape& sh, const float* qs, float* os, int n_tok) {
    AttentionParams p;
    p.q = qs;
    p.out = os;
    p.k = k;
    p.v = v;
    p.k_stride = p.v_stride = static_cast<int64_t>(sh.n_head_kv) * kDim;
    p.f16 = 1;
    p.n_tok = n_tok;
    p.n_head = kHeads;
    p.n_head_kv = sh.n_head_kv;
    p.dk = p.dv = kDim;
    p.scale = 0.0884f;
    p.pos0 = pos0;
    p.vec = 1;
    return p;
  };
  for (const Shape& sh : {Shape{"llama3-8b", 8}, Shape{"qwen3-30b-a3b", 4}}) {
    // As CudaBackend::Attention chooses for one token.
    const int group = kHeads / sh.n_head_kv;
    const int hb = std::max(1, std::min(group, 128 * kAttentionMaxAcc / kDim));
    const int cells = sh.n_head_kv * ((group + hb - 1) / hb);

    const int smem = AttentionSmemBytes(hb, kDim, kDim);
    if (smem > 48 * 1024) AllowAttentionSmem(smem);
    for (int ctx : {32, 128, 512, 2048, 8192, 16384}) {
      const int splits =
          std::min(DecodeAttentionSplits(cells, sms, (ctx + kAttentionTile - 1) / kAttentionTile),
                   std::max(1, max_splits));
      const int64_t p0 = ctx - 1;
      CHECK(cudaMemcpy(pos0, &p0, 8, cudaMemcpyHostToDevice));
      AttentionParams p = base_params(sh, q, out, 1);
      p.heads_per_block = hb;
      p.q_per_block = 1;
      p.splits = splits;
      p.partial = partial;
      p.counters = counters;
      p.smem_bytes = smem;
      const double us = MicrosecondsPerLaunch(s, kLaunches, [&](int) { LaunchAttention(&p, s); });
      const double bytes = 2.0 * ctx * sh.n_head_kv * kDim * 2;  // K and V, F16
      std::printf(
          "%-14s ctx %6d  splits %2d  %8.2f us a launch (%.2f over the floor)  %6.0f GB/s "
          "of cache\n",
          sh.name, ctx, std::min(splits, (ctx + kAttentionTile - 1) / kAttentionTile), us,
          us - floor_us, bytes / us / 1e3);
      std::fflush(stdout);
    }
  }

  // Prefill: the query rows of up to 512 tokens.
  constexpr int kTok = 512;
  float* q_pre = nullptr;
  float* out_pre = nullptr;
  CHECK(cudaMalloc(reinterpret_cast<void**>(&q_pre), size_t{kTok} * kHeads * kDim * 4));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&out_pre), size_t{kTok} * kHeads * kDim * 4));
  {
    std::vector<float> f(size_t{kTok} * kHeads * kDim);
    for (float& e : f) e = nd(rng);
    CHECK(cudaMemcpy(q_pre, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
  }
  AllowAttentionMmaSmem();
  for (const Shape& sh : {Shape{"llama3-8b", 8}, Shape{"qwen3-30b-a3b", 4}}) {
    const int group = kHeads / sh.n_head_kv;
    // As CudaBackend::Attention chooses for prefill.
    const int hb = std::max(1, std::min(group, 128 * kAttentionMaxAcc / kDim));
    const int qb = std::max(1, std::min(8, 128 * kAttentionMaxAcc / kDim / hb));
    const int smem = AttentionSmemBytes(qb * hb, kDim, kDim);
    if (smem > 48 * 1024) AllowAttentionSmem(smem);
    for (int n_tok : {16, 64, kTok})
      for (int depth : {0, 1024, 4096, 8192}) {
        const int64_t p0 = depth;
        CHECK(cudaMemcpy(pos0, &p0, 8, cudaMemcpyHostToDevice));
        double us[2] = {0, 0};
        int mma_splits = 1;
        for (int mma = 0; mma < 2; ++mma) {
          AttentionParams p = base_params(sh, q_pre, out_pre, n_tok);
          p.heads_per_block = mma ? group : hb;
          p.q_per_block = mma ? kAttentionMmaRows / group : qb;
          p.smem_bytes = smem;
          p.mma = mma;
          if (mma) {  // as CudaBackend::Attention splits a short prompt's positions
            const int64_t cells = (n_tok + p.q_per_block - 1) / p.q_per_block * sh.n_head_kv;
            mma_splits = p.splits = AttentionMmaSplits(cells, sms, depth + n_tok);
            p.partial = partial;
            p.counters = counters;
          }
          us[mma] = MicrosecondsPerLaunch(s, 8, [&](int) { LaunchAttention(&p, s); });
        }
        const double ops = 4.0 * n_tok * kHeads * (depth + (n_tok + 1) / 2.0) * kDim;
        std::printf(
            "%-14s prefill %3d after %5d  float %9.1f us (%5.1f TOPS)  tensor cores %9.1f us "
            "(%5.1f TOPS, %2d splits)  %.2fx\n",
            sh.name, n_tok, depth, us[0], ops / us[0] / 1e6, us[1], ops / us[1] / 1e6, mma_splits,
            us[0] / us[1]);
        std::fflush(stdout);
      }
  }
  return 0;
}

#else
int main() {
  std::printf("bench_cuda_attention: built without CUDA (-DSUBSTRATE_CUDA=ON)\n");
  return 0;
}
#endif
