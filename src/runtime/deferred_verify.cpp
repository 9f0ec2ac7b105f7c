// Deferred verification (Engine::GenerateDeferred). The session's cache is the draft tier's: it
// holds every drafted token but the last. The verify cache holds only settled tokens, and lags
// the last one, so each verify pass feeds history[v_pos, end - 1) and its row r predicts token
// v_pos + r + 1: every unsettled token's check in one pass. At the first disagreement both
// caches are cut to the tokens before it, the verify tier's token replaces it, and drafting
// resumes from there.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "kernels/matmul.h"
#include "runtime/engine.h"
#include "runtime/token_emitter.h"

namespace substrate {
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Top-1 minus top-2 log-probability: the difference of the two largest logits.
float Margin(const float* logits, int64_t n) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (logits[i] > a) {
      b = a;
      a = logits[i];
    } else if (logits[i] > b) {
      b = logits[i];
    }
  }
  return a - b;
}

}  // namespace

Expected<GenerateStats> Engine::GenerateDeferred(Session& s, const std::vector<int32_t>& prompt,
                                                 const GenerateOptions& opt,
                                                 const TokenCallback& on_token) {
  const VerifyOptions& vo = opt.verify;
  const int top = vo.verify_tier < 0 ? weights_->DefaultTier() : vo.verify_tier;
  if (controller_)
    return InvalidArgument("deferred verification and the adaptive runtime both set the ops' "
                           "tiers: pick one");
  if (opt.draft_max > 0)
    return InvalidArgument("deferred verification and speculative drafting (--draft-max, "
                           "--draft-model) are two ways of drafting: pick one");
  if (vo.draft_tier < 0 || vo.draft_tier >= top)
    return InvalidArgument("deferred verification drafts at tier " +
                           std::to_string(vo.draft_tier) + " and verifies at tier " +
                           std::to_string(top) + ": the draft tier must be below (a store with "
                           "residual tiers gives the ladder)");
  if (vo.window < 1 || vo.window > 256)
    return InvalidArgument("--verify-window must be 1..256");
  std::vector<uint8_t>& tiers = model_->op_tiers();
  auto use_tier = [&](int t) { std::fill(tiers.begin(), tiers.end(), static_cast<uint8_t>(t)); };
  // Every pass runs all ops at one tier: with the model to itself (no other session's pass
  // in its batch), the tiers put back afterwards for the passes of other sessions.
  PassRunner& passes = PassesOf(opt.passes);
  std::vector<uint8_t> saved_tiers = tiers;
  auto pass_at = [&](int tier, const std::function<Status()>& pass) {
    return passes.Exclusive([&] {
      saved_tiers = tiers;
      use_tier(tier);
      const Status st = pass();
      tiers = saved_tiers;
      return st;
    });
  };

  GenerateStats st;
  st.n_prompt = static_cast<int64_t>(prompt.size());
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(pass_at(vo.draft_tier, [&]() -> Status {
    ASSIGN_OR_RETURN(st.n_reused, Prefill(s, prompt));
    return Status::Ok();
  }));
  if (!s.verify_cache) {
    ASSIGN_OR_RETURN(KvCache vc, KvCache::Create(model_->hparams(), s.cache.n_ctx(), *backend_,
                                                 s.cache.type()));
    s.verify_cache = std::make_unique<KvCache>(std::move(vc));
  }
  KvCache& verify = *s.verify_cache;
  {
    // Keep the verified prefix this prompt shares, short of its last token (whose logits a
    // pass must produce).
    const auto& have = verify.tokens();
    size_t common = 0;
    while (common < have.size() && common + 1 < prompt.size() && have[common] == prompt[common])
      ++common;
    verify.Truncate(static_cast<int64_t>(common));
  }
  st.prompt_seconds = Since(start);

  const auto t0 = std::chrono::steady_clock::now();
  const int64_t V = model_->hparams().n_vocab;
  const size_t n_ctx = static_cast<size_t>(s.cache.n_ctx());
  Sampler sampler(opt.sampling);
  std::vector<int32_t> history = prompt;  // settled tokens, then drafted ones
  std::vector<int32_t> shown = prompt;    // what the emitter has shown
  std::vector<int32_t> prefix;            // history up to a checked token (the sampler's view)
  std::vector<float> rows;
  TokenEmitter emitter(tokenizer_.get(), opt, on_token, &shown, &st);
  size_t settled = prompt.size();  // history[0, settled) is shown or being shown
  int64_t window_start = -1;       // the first drafted token that needs checking, -1: none
  bool more = opt.max_tokens > 0;
  // Shows history[settled, end): token i with the logits at logits + (i - settled) * stride.
  auto settle = [&](size_t end, const float* logits, int64_t stride) {
    for (; more && settled < end; ++settled, logits += stride) {
      if (st.n_generated == 0) st.first_token_seconds = Since(start);
      more = emitter.Emit(history[settled], logits);
    }
  };

  while (more) {
    const size_t drafted = history.size() - prompt.size();
    const bool eog = history.size() > settled && tokenizer_ && opt.stop_at_eog &&
                     tokenizer_->IsEog(history.back());
    const bool full = history.size() + 1 >= n_ctx;
    const bool draft_done = eog || full || static_cast<int64_t>(drafted) >= opt.max_tokens;
    if (!draft_done) {
      if (s.cache.n_past() < static_cast<int64_t>(history.size())) {
        RETURN_IF_ERROR(pass_at(vo.draft_tier, [&] {
          return model_->Forward(&history.back(), 1, s.cache, false, &s.logits);
        }));
        ++st.n_forwards;
      }
      int32_t tok = sampler.Sample(s.logits.data(), V, history);
      if (vo.edit_draft) tok = vo.edit_draft(st.n_drafted, tok);
      const bool check = vo.mode == VerifyOptions::Mode::kAll || Margin(s.logits.data(), V) < vo.tau;
      history.push_back(tok);
      ++st.n_drafted;
      if (check && window_start < 0) window_start = static_cast<int64_t>(history.size()) - 1;
      if (window_start < 0) {
        // Nothing pending needs checking: the token is settled as drafted.
        settle(history.size(), s.logits.data(), 0);
        continue;
      }
      if (static_cast<int64_t>(history.size()) - window_start < vo.window) continue;
    } else if (window_start < 0) {
      if (full && settled == history.size()) st.stop_reason = "context";
      break;
    }

    // Check every unsettled token in one pass of the verify tier.
    const int64_t v_pos = verify.n_past(), end = static_cast<int64_t>(history.size());
    const auto pass_start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(pass_at(top, [&] {
      const uint64_t read0 = runtime_ ? runtime_->stats().stream_bytes_read : 0;
      ExactTokenRows exact;  // each row as a one-token pass computes it (kernels/matmul.h)
      RETURN_IF_ERROR(
          model_->Forward(history.data() + v_pos, end - 1 - v_pos, verify, true, &rows));
      if (runtime_) st.verify_bytes += runtime_->stats().stream_bytes_read - read0;
      return Status::Ok();
    }));
    ++st.n_verify_passes;
    st.verify_seconds += Since(pass_start);
    size_t agreed = static_cast<size_t>(end);
    int32_t replacement = -1;
    for (size_t j = settled; j < static_cast<size_t>(end); ++j) {
      const float* row = rows.data() + (static_cast<int64_t>(j) - 1 - v_pos) * V;
      prefix.assign(history.begin(), history.begin() + static_cast<int64_t>(j));
      const int32_t want = sampler.Verify(row, V, prefix, history[j]);
      ++st.n_verified;
      if (want != history[j]) {
        agreed = j;
        replacement = want;
        break;
      }
    }
    const float* first_row = rows.data() + (static_cast<int64_t>(settled) - 1 - v_pos) * V;
    if (replacement >= 0) {
      ++st.n_rollbacks;
      st.n_rollback_lost += end - static_cast<int64_t>(agreed);
      history.resize(agreed);
      history.push_back(replacement);
      s.cache.Truncate(static_cast<int64_t>(agreed));
      verify.Truncate(std::min<int64_t>(verify.n_past(), static_cast<int64_t>(agreed)));
      settle(agreed + 1, first_row, V);
    } else {
      settle(static_cast<size_t>(end), first_row, V);
    }
    window_start = -1;
  }
  emitter.Finish();
  st.decode_seconds = Since(t0);
  return st;
}

}  // namespace substrate
