#include "model/perplexity.h"

#include <cmath>
#include <cstring>
#include <memory>

#include "core/file_io.h"
#include "quant/quant.h"

namespace substrate {
namespace {

constexpr char kMagic[8] = {'S', 'U', 'B', 'K', 'L', 'D', '1', '\0'};

struct BaseHeader {
  char magic[8];
  uint32_t n_ctx, n_vocab, n_chunks, first;
};

// log-softmax of one row, in double.
void LogSoftmax(const float* logits, int64_t n, std::vector<double>* out) {
  out->resize(static_cast<size_t>(n));
  double mx = logits[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(logits[i] - mx);
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < n; ++i) (*out)[i] = logits[i] - lse;
}

}  // namespace

Expected<PerplexityResult> ComputePerplexity(Model& model, const std::vector<int32_t>& tokens,
                                             MemoryLedger* ledger, const PerplexityOptions& opt) {
  const int64_t n_ctx = opt.n_ctx;
  if (n_ctx < 4)
    return InvalidArgument("perplexity context " + std::to_string(n_ctx) + " too small");
  int64_t n_chunks = static_cast<int64_t>(tokens.size()) / n_ctx;
  if (opt.max_chunks >= 0) n_chunks = std::min(n_chunks, opt.max_chunks);
  if (n_chunks == 0) {
    return InvalidArgument("text has " + std::to_string(tokens.size()) +
                           " tokens, fewer than one chunk of " + std::to_string(n_ctx));
  }
  const int64_t V = model.hparams().n_vocab;
  const int64_t first = n_ctx / 2;
  const int64_t per_chunk = n_ctx - 1 - first;

  std::unique_ptr<AtomicFileWriter> save;
  if (!opt.save_base.empty()) {
    ASSIGN_OR_RETURN(save, AtomicFileWriter::Create(opt.save_base));
    BaseHeader h{};
    std::memcpy(h.magic, kMagic, 8);
    h.n_ctx = static_cast<uint32_t>(n_ctx);
    h.n_vocab = static_cast<uint32_t>(V);
    h.n_chunks = static_cast<uint32_t>(n_chunks);
    h.first = static_cast<uint32_t>(first);
    RETURN_IF_ERROR(save->Append(&h, sizeof h));
    RETURN_IF_ERROR(save->Append(tokens.data(), static_cast<uint64_t>(n_chunks * n_ctx) * 4));
  }
  std::unique_ptr<RandomAccessFile> base;
  uint64_t base_off = 0;
  if (!opt.kld_base.empty()) {
    ASSIGN_OR_RETURN(base, RandomAccessFile::Open(opt.kld_base));
    BaseHeader h{};
    if (base->size() < sizeof h)
      return Corruption(opt.kld_base + ": too short for a KLD base file");
    RETURN_IF_ERROR(base->Read(0, sizeof h, &h));
    if (std::memcmp(h.magic, kMagic, 8) != 0)
      return Corruption(opt.kld_base + ": not a KLD base file");
    if (h.n_ctx != n_ctx || h.n_vocab != V || h.first != first) {
      return InvalidArgument(opt.kld_base + ": made with -c " + std::to_string(h.n_ctx) +
                             " and vocabulary " + std::to_string(h.n_vocab) + ", this run has -c " +
                             std::to_string(n_ctx) + " and " + std::to_string(V));
    }
    if (h.n_chunks < n_chunks) n_chunks = h.n_chunks;
    const uint64_t need = sizeof h + static_cast<uint64_t>(h.n_chunks) * n_ctx * 4 +
                          static_cast<uint64_t>(h.n_chunks) * per_chunk * V * 2;
    if (base->size() < need) return Corruption(opt.kld_base + ": truncated");
    std::vector<int32_t> base_tokens(static_cast<size_t>(n_chunks * n_ctx));
    RETURN_IF_ERROR(base->Read(sizeof h, base_tokens.size() * 4, base_tokens.data()));
    if (!std::equal(base_tokens.begin(), base_tokens.end(), tokens.begin()))
      return InvalidArgument(opt.kld_base +
                             ": made from different tokens (another text or tokenizer)");
    base_off = sizeof h + static_cast<uint64_t>(h.n_chunks) * n_ctx * 4;
  }

  ASSIGN_OR_RETURN(KvCache cache,
                   KvCache::Create(model.hparams(), n_ctx, model.backend(), opt.kv_type));
  PerplexityResult r;
  double nll = 0, nll2 = 0, kld = 0, kld2 = 0;
  int64_t same = 0;
  std::vector<int32_t> chunk(static_cast<size_t>(n_ctx));
  std::vector<float> logits, token_logits;
  std::vector<double> lp, blp(static_cast<size_t>(V));
  std::vector<uint16_t> half(static_cast<size_t>(V));
  for (int64_t c = 0; c < n_chunks; ++c) {
    std::copy(tokens.begin() + c * n_ctx, tokens.begin() + (c + 1) * n_ctx, chunk.begin());
    if (opt.bos >= 0) chunk[0] = opt.bos;
    cache.Clear();
    if (opt.after_token) {
      logits.resize(static_cast<size_t>(n_ctx * V));
      for (int64_t i = 0; i < n_ctx; ++i) {
        RETURN_IF_ERROR(model.Forward(&chunk[i], 1, cache, false, &token_logits));
        std::copy(token_logits.begin(), token_logits.end(), logits.begin() + i * V);
        opt.after_token();
      }
    } else {
      RETURN_IF_ERROR(model.Forward(chunk.data(), n_ctx, cache, true, &logits));
    }
    for (int64_t i = first; i < n_ctx - 1; ++i) {
      const float* row = logits.data() + i * V;
      LogSoftmax(row, V, &lp);
      const double v = -lp[chunk[i + 1]];
      nll += v;
      nll2 += v * v;
      if (save) {
        for (int64_t k = 0; k < V; ++k)
          half[k] = Fp32ToFp16(static_cast<float>(std::max(lp[k], -65000.0)));
        RETURN_IF_ERROR(save->Append(half.data(), static_cast<uint64_t>(V) * 2));
      }
      if (base) {
        RETURN_IF_ERROR(base->Read(base_off, static_cast<uint64_t>(V) * 2, half.data()));
        base_off += static_cast<uint64_t>(V) * 2;
        // Renormalize the stored base log-probs (fp16 rounding) before comparing.
        double mx = -1e300, sum = 0;
        for (int64_t k = 0; k < V; ++k) mx = std::max(mx, blp[k] = Fp16ToFp32(half[k]));
        for (int64_t k = 0; k < V; ++k) sum += std::exp(blp[k] - mx);
        const double lse = mx + std::log(sum);
        double d = 0;
        int64_t top_b = 0, top_c = 0;
        for (int64_t k = 0; k < V; ++k) {
          blp[k] -= lse;
          d += std::exp(blp[k]) * (blp[k] - lp[k]);
          if (blp[k] > blp[top_b]) top_b = k;
          if (lp[k] > lp[top_c]) top_c = k;
        }
        kld += d;
        kld2 += d * d;
        same += top_b == top_c;
      }
    }
    r.n_chunks = c + 1;
    r.n_scored += per_chunk;
    if (opt.progress) opt.progress(c, std::exp(nll / static_cast<double>(r.n_scored)));
  }
  if (save) RETURN_IF_ERROR(save->Commit());
  const double n = static_cast<double>(r.n_scored);
  const double mean = nll / n;
  r.ppl = std::exp(mean);
  const double var = std::max(0.0, nll2 / n - mean * mean);
  r.ppl_err = r.ppl * std::sqrt(var / std::max(1.0, n - 1));
  if (base) {
    r.has_kld = true;
    r.mean_kld = kld / n;
    r.kld_err = std::sqrt(std::max(0.0, kld2 / n - r.mean_kld * r.mean_kld) / std::max(1.0, n - 1));
    r.same_top = static_cast<double>(same) / n;
  }
  return r;
}

}  // namespace substrate
