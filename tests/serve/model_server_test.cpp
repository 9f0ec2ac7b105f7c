// The server over the real engine (ModelBackend) and the bundled tiny-coder: every endpoint,
// streaming and not, gives the greedy text `substrate run` gives for the same prompt.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "serve/model_backend.h"
#include "serve/server.h"
#include "core/file_io.h"
#include "sse_client.h"

namespace substrate::serve {
namespace {

using nlohmann::json;
using testing::ParseSse;
using testing::PostStream;

std::string FindTinyCoder() {
  for (std::string p : {std::string(SUBSTRATE_SOURCE_DIR) + "/models/tiny-coder-Q8_0.gguf",
                        std::string(SUBSTRATE_SHARED_DIR) + "/gguf/tiny-coder-Q8_0.gguf"})
    if (FileExists(p)) return p;
  return "";
}

// `substrate run ... --json`'s text, or an error string starting with "ERROR".
std::string RunCli(const std::string& args) {
  std::string cmd = std::string(SUBSTRATE_BINARY) + " run " + args + " --json 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return "ERROR: popen";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  int rc = pclose(f);
  json j = json::parse(out, nullptr, false);
  if (rc != 0 || j.is_discarded() || !j.contains("text")) return "ERROR: " + out;
  return j["text"];
}

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

class ModelServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = FindTinyCoder();
    if (path_.empty()) return;
    ModelBackendOptions mo;
    mo.path = path_;
    mo.context = 512;
    // A loaded test machine can be slow to wake a slot: let a step wait for both.
    mo.batching.gather_wait = std::chrono::milliseconds(50);
    auto b = ModelBackend::Load(mo);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = std::move(*b).release();
    ServerOptions so;
    so.port = 0;
    so.parallel = 2;
    auto s = HttpServer::Create(backend_, so);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s).release();
    server_->Start();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete backend_;
    server_ = nullptr;
    backend_ = nullptr;
  }
  void SetUp() override {
    if (path_.empty()) GTEST_SKIP() << "tiny-coder-Q8_0.gguf not in models/ or ../shared/gguf";
  }
  json Post(const std::string& path, const json& body) {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(120, 0);
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return json{{"transport_error", true}};
    json j = json::parse(r->body, nullptr, false);
    j["_status"] = r->status;
    return j;
  }
  std::string StreamText(const std::string& path, json body) {
    body["stream"] = true;
    auto s = PostStream(server_->port(), path, body.dump());
    std::string text;
    for (const auto& e : ParseSse(s.body)) {
      if (e.data == "[DONE]") continue;
      json d = json::parse(e.data);
      if (path == "/v1/messages") {
        if (e.event == "content_block_delta") text += d["delta"]["text"].get<std::string>();
      } else if (!d["choices"].empty()) {
        const json& c = d["choices"][0];
        if (c.contains("text")) text += c["text"].get<std::string>();
        if (c.contains("delta") && c["delta"].contains("content"))
          text += c["delta"]["content"].get<std::string>();
      }
    }
    return text;
  }

  static std::string path_;
  static ModelBackend* backend_;
  static HttpServer* server_;
};
std::string ModelServerTest::path_;
ModelBackend* ModelServerTest::backend_ = nullptr;
HttpServer* ModelServerTest::server_ = nullptr;

TEST_F(ModelServerTest, CompletionsEqualSubstrateRun) {
  const std::string prompt = "def fibonacci(n):";
  const std::string want = RunCli("-m " + Quote(path_) + " -p " + Quote(prompt) + " -n 40 --temp 0 -c 512");
  ASSERT_EQ(want.rfind("ERROR", 0), std::string::npos) << want;
  ASSERT_FALSE(want.empty());
  json body = {{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}};
  json r = Post("/v1/completions", body);
  ASSERT_EQ(r["_status"], 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], want);
  EXPECT_EQ(r["usage"]["completion_tokens"], 40);
  EXPECT_EQ(StreamText("/v1/completions", body), want);
}

TEST_F(ModelServerTest, ChatAndMessagesEqualSubstrateRunChat) {
  const std::string q = "Write a Python function that returns the square of x.";
  const std::string want =
      RunCli("-m " + Quote(path_) + " --chat -p " + Quote(q) + " -n 24 --temp 0 -c 512");
  ASSERT_EQ(want.rfind("ERROR", 0), std::string::npos) << want;
  json chat = {{"messages", {{{"role", "user"}, {"content", q}}}}, {"max_tokens", 24}, {"temperature", 0}};
  json r = Post("/v1/chat/completions", chat);
  ASSERT_EQ(r["_status"], 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["content"], want);
  EXPECT_EQ(StreamText("/v1/chat/completions", chat), want);

  json msg = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", q}}}},
              {"max_tokens", 24}, {"temperature", 0}};
  json a = Post("/v1/messages", msg);
  ASSERT_EQ(a["_status"], 200) << a.dump();
  EXPECT_EQ(a["content"][0]["text"], want);
  EXPECT_EQ(StreamText("/v1/messages", msg), want);
}

TEST_F(ModelServerTest, PromptCacheAndStops) {
  // A prompt that extends the previous one reuses its KV entries and gives the same text as
  // a cold evaluation (substrate run).
  const std::string p1 = "import os\n\ndef list_files(path):";
  json r1 = Post("/v1/completions", {{"prompt", p1}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_EQ(r1["_status"], 200);
  const std::string p2 = p1 + r1["choices"][0]["text"].get<std::string>() + "\n";
  json r2 = Post("/v1/completions", {{"prompt", p2}, {"max_tokens", 16}, {"temperature", 0}});
  ASSERT_EQ(r2["_status"], 200);
  EXPECT_GT(r2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 5);
  const std::string cold = RunCli("-m " + Quote(path_) + " -p " + Quote(p2) + " -n 16 --temp 0 -c 512");
  EXPECT_EQ(r2["choices"][0]["text"], cold);

  // A stop string cuts the text before it.
  json full = Post("/v1/completions", {{"prompt", "def fibonacci(n):"}, {"max_tokens", 40}, {"temperature", 0}});
  const std::string text = full["choices"][0]["text"];
  const size_t at = text.find("\"\"\"");
  ASSERT_NE(at, std::string::npos) << text;
  json cut = Post("/v1/completions", {{"prompt", "def fibonacci(n):"}, {"max_tokens", 40},
                                      {"temperature", 0}, {"stop", "\"\"\""}});
  EXPECT_EQ(cut["choices"][0]["text"], text.substr(0, at));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
}

TEST_F(ModelServerTest, LogprobsAreTheModelsLogSoftmax) {
  const std::string prompt = "def fibonacci(n):";
  json r = Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0},
                                    {"logprobs", 5}});
  ASSERT_EQ(r["_status"], 200) << r.dump();
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 6u);
  std::string joined;
  for (size_t i = 0; i < 6; ++i) {
    joined += lp["tokens"][i].get<std::string>();
    // Greedy: the chosen token is the most likely one, so it heads the alternatives.
    const json& top = lp["top_logprobs"][i];
    ASSERT_EQ(top.size(), 5u) << top.dump();
    double best = -1e30;
    for (auto& [tok, v] : top.items()) best = std::max(best, v.get<double>());
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), best, 1e-6);
    EXPECT_LE(best, 0.0);
  }
  EXPECT_EQ(joined, r["choices"][0]["text"]);

  // The first token's log-probability, computed from the engine's own logits.
  EngineOptions eo;
  eo.require_tokenizer = true;
  auto engine = Engine::Load(path_, eo);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto ids = backend_->EncodeText(prompt);
  ASSERT_TRUE(ids.ok());
  auto session = (*engine)->NewSession(512);
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE((*engine)->Prefill(**session, *ids).ok());
  const std::vector<float>& logits = (*session)->logits;
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(double{l} - max);
  const double want = 0.0 - std::log(sum);  // the argmax's log-softmax
  EXPECT_NEAR(lp["token_logprobs"][0].get<double>(), want, 1e-4);
}

TEST_F(ModelServerTest, SpeculativeSlotsGiveTheSameText) {
  ModelBackendOptions mo;
  mo.path = path_;
  mo.context = 512;
  mo.draft_max = 4;
  auto spec = ModelBackend::Load(mo);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const std::string prompt =
      "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):";
  auto generate = [&](ModelBackend& b, std::vector<StepLogprobs>* lps) {
    auto ids = b.EncodeText(prompt);
    EXPECT_TRUE(ids.ok());
    auto session = b.NewSession();
    EXPECT_TRUE(session.ok());
    SamplingParams p;
    p.max_tokens = 48;
    p.temperature = 0;
    p.logprobs = 2;
    std::string text;
    auto r = (*session)->Generate(*ids, p, [&](int32_t, std::string_view t, const StepLogprobs* lp) {
      text += t;
      if (lp) lps->push_back(*lp);
      return true;
    });
    EXPECT_TRUE(r.ok());
    EXPECT_EQ(r->generated_tokens, 48);
    return text;
  };
  std::vector<StepLogprobs> want_lp, got_lp;
  const std::string want = generate(*backend_, &want_lp);
  EXPECT_EQ(generate(**spec, &got_lp), want);
  ASSERT_EQ(got_lp.size(), want_lp.size());
  for (size_t i = 0; i < want_lp.size(); ++i) {
    EXPECT_EQ(got_lp[i].chosen.token, want_lp[i].chosen.token);
    // The verifying pass evaluates several tokens at once: the same values up to float order.
    EXPECT_NEAR(got_lp[i].chosen.logprob, want_lp[i].chosen.logprob, 1e-3);
  }
}

// Continuous batching: requests running at once on both slots share model passes, and each
// greedy answer is the one the request gets alone.
TEST_F(ModelServerTest, ConcurrentRequestsShareStepsAndGetTheirOwnAnswers) {
  // Short prompts: under the AMX GEMM's smallest batch, so on any CPU their rows are exact
  // whether a cached prefix is reused or not.
  const std::vector<std::string> prompts = {"def f(n):",        "import os",     "class Queue:",
                                            "def is_prime(n):", "# read a file", "for i in x:"};
  auto body = [](const std::string& p) {
    return json{{"prompt", p}, {"max_tokens", 24}, {"temperature", 0}};
  };
  const uint64_t steps_before = backend_->RuntimeStats()["batching"]["steps"];
  std::vector<std::string> alone;
  for (const auto& p : prompts) {
    json r = Post("/v1/completions", body(p));
    ASSERT_EQ(r["_status"], 200) << r.dump();
    alone.push_back(r["choices"][0]["text"]);
  }
  const uint64_t steps0 = backend_->RuntimeStats()["batching"]["steps"];
  std::vector<std::string> together(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] {
      json r = Post("/v1/completions", body(prompts[i]));
      if (r["_status"] == 200) together[i] = r["choices"][0]["text"];
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(together[i], alone[i]) << prompts[i];
  const json b = backend_->RuntimeStats()["batching"];
  EXPECT_EQ(b["max_sequences"], 2) << b.dump();
  // Two slots decoding together: fewer steps than the requests take one by one (about half
  // where both slots stay busy; each slot's gap between its requests, whose length the machine's
  // load decides, runs the other alone, so the bound leaves room: 108 of 150 seen under load).
  const uint64_t one_by_one = steps0 - steps_before;
  EXPECT_LT((b["steps"].get<uint64_t>() - steps0) * 8, one_by_one * 7) << b.dump();
  httplib::Client c("127.0.0.1", server_->port());
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("substrate_batch_max_sequences 2"), std::string::npos) << m->body;
}

TEST_F(ModelServerTest, ContextOverflowIs400) {
  std::string longp;
  for (int i = 0; i < 400; ++i) longp += "x = " + std::to_string(i) + "\n";
  json r = Post("/v1/completions", {{"prompt", longp}, {"max_tokens", 4}});
  EXPECT_EQ(r["_status"], 400) << r.dump();
  EXPECT_EQ(r["error"]["code"], "context_length_exceeded");
}

}  // namespace
}  // namespace substrate::serve
