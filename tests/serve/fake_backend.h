// A deterministic InferenceBackend for the server tests (tests only — the product serves the
// real model through serve/model_backend.h). Tokens are bytes (0..255) plus end-of-text (256).
//
// Greedy output is a fixed script chosen by the prompt length, so a test can predict every
// answer; it contains a two-byte character split across two tokens, to exercise UTF-8
// reassembly. A prompt containing "[eos]" ends after one copy of the script with end-of-text.
// temperature > 0 gives letters from a PRNG seeded with `seed`. A prompt containing
// "[[say:TEXT:yas]]" answers TEXT (then end-of-text): scripted tool calls and reasoning.
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <thread>

#include "serve/backend.h"
#include "serve/stop_matcher.h"

namespace substrate::serve::testing {

inline std::string FakeScript(size_t prompt_tokens) {
  return "Answer " + std::to_string(prompt_tokens) + ": caf\xC3\xA9 quick brown fox. ";
}

// What the fake generates for a prompt of n tokens, greedy, up to max_tokens bytes.
inline std::string FakeGreedy(size_t prompt_tokens, int max_tokens, bool eos) {
  std::string script = FakeScript(prompt_tokens), out;
  while (static_cast<int>(out.size()) < max_tokens) {
    if (eos && out.size() == script.size()) break;
    out += script[out.size() % script.size()];
  }
  return out;
}

class FakeBackend : public InferenceBackend {
 public:
  explicit FakeBackend(int context = 512) : context_(context) {}

  std::atomic<int> token_delay_us{0};
  std::atomic<int> running{0};
  std::atomic<int> max_running{0};
  std::atomic<uint64_t> tokens_generated{0};

  std::string ModelId() const override { return "fake-model"; }
  int ContextLength() const override { return context_; }
  int VocabSize() const override { return 257; }
  Expected<std::vector<int32_t>> EncodeText(const std::string& text) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  ToolFormat tool_format = ToolFormat::kHermes;
  Expected<ChatPrompt> EncodeChat(const nlohmann::json& messages,
                                  const nlohmann::ordered_json& tools) const override {
    std::string out;
    for (const auto& m : messages) {
      out.push_back('<');
      out.append(m["role"].get<std::string>());
      out.push_back('>');
      if (m["content"].is_string()) out.append(m["content"].get<std::string>());
      if (m.contains("tool_calls")) out.append(m["tool_calls"].dump());
      out.push_back('\n');
    }
    if (!tools.is_null()) out.append("<tools>" + tools.dump() + "\n");
    out.append("<assistant>");
    ChatPrompt cp;
    cp.tokens = *EncodeText(out);
    cp.tool_format = tool_format;
    cp.thinking_open = out.find("[think-open]") != std::string::npos;
    return cp;
  }

  class FakeSession : public Session {
   public:
    explicit FakeSession(FakeBackend* b) : b_(b) {}
    Expected<GenerateResult> Generate(const std::vector<int32_t>& prompt,
                                      const SamplingParams& params,
                                      const TokenCallback& on_token) override {
      GenerateResult r;
      r.prompt_tokens = static_cast<int>(prompt.size());
      for (int32_t t : prompt)
        if (t < 0 || t >= 257) return InvalidArgument("fake: token id out of range");
      size_t lcp = 0;
      while (lcp < cached_.size() && lcp < prompt.size() && cached_[lcp] == prompt[lcp]) ++lcp;
      if (lcp == prompt.size()) --lcp;  // the last prompt token is always evaluated
      r.cached_tokens = static_cast<int>(lcp);
      cached_ = prompt;
      int now = ++b_->running;
      int prev = b_->max_running.load();
      while (now > prev && !b_->max_running.compare_exchange_weak(prev, now)) {
      }
      std::string text(prompt.begin(), prompt.end());
      bool eos = text.find("[eos]") != std::string::npos;
      std::string script = FakeScript(prompt.size());
      const bool scripted = text.find("[[say:") != std::string::npos;
      if (size_t say = text.find("[[say:"); say != std::string::npos) {
        const size_t end = text.find(":yas]]", say);
        script = text.substr(say + 6, end - say - 6);
        eos = true;
      }
      std::mt19937_64 rng(params.seed);
      Utf8Assembler utf8;
      r.finish = BackendFinish::kLength;
      for (int i = 0; i < params.max_tokens; ++i) {
        if (int d = b_->token_delay_us.load()) std::this_thread::sleep_for(std::chrono::microseconds(d));
        if (eos && static_cast<size_t>(i) == script.size()) {
          r.finish = BackendFinish::kEndOfText;
          break;
        }
        int32_t tok = params.temperature > 0 && !scripted ? static_cast<int32_t>('a' + rng() % 26)
                                             : static_cast<unsigned char>(script[i % script.size()]);
        if (i > 0) cached_.push_back(last_);
        last_ = tok;
        ++r.generated_tokens;
        ++b_->tokens_generated;
        char c = static_cast<char>(tok);
        StepLogprobs lp;  // a fixed distribution: the chosen byte at log(1/2), then 'z', 'y', ...
        lp.chosen = {tok, std::string(1, c), std::log(0.5f)};
        for (int k = 0; k < params.logprobs; ++k)
          lp.top.push_back({'z' - k, std::string(1, static_cast<char>('z' - k)), std::log(0.25f) - k});
        if (!on_token(tok, utf8.Push(std::string_view(&c, 1)), params.logprobs >= 0 ? &lp : nullptr)) {
          r.finish = BackendFinish::kCallerStopped;
          break;
        }
      }
      --b_->running;
      return r;
    }
    std::vector<int32_t> CachedTokens() const override { return cached_; }

   private:
    FakeBackend* b_;
    std::vector<int32_t> cached_;
    int32_t last_ = 0;
  };

  Expected<std::unique_ptr<Session>> NewSession() override {
    return std::unique_ptr<Session>(new FakeSession(this));
  }

 private:
  int context_;
};

}  // namespace substrate::serve::testing
