// A short version of the load test (bench/serve_load.cpp runs the minute-long one): 16
// streaming clients with hang-ups mixed in, against the deterministic backend.
#include <gtest/gtest.h>

#include <thread>

#include "fake_backend.h"
#include "serve/load_client.h"
#include "serve/server.h"

namespace substrate::serve {
namespace {

using nlohmann::json;

// What the fake sees for a one-message chat (appends, not operator+: GCC 12 at -O3 warns
// falsely (-Wrestrict) on "literal" + std::string chains).
size_t ChatLen(const std::string& text) {
  std::string s("<user>");
  s.append(text);
  s.append("\n<assistant>");
  return s.size();
}

TEST(LoadTest, SixteenStreamingClientsWithDisconnects) {
  testing::FakeBackend backend(512);
  backend.token_delay_us = 300;
  ServerOptions so;
  so.port = 0;
  so.parallel = 4;
  auto server = HttpServer::Create(&backend, so);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  (*server)->Start();

  std::vector<LoadPrompt> prompts;
  for (int i = 0; i < 6; ++i) {
    LoadPrompt p;
    std::string text("prompt number ");
    text.append(std::to_string(i));
    if (i % 3 == 0) {
      p.api = Api::kOpenAIChat;
      p.body = {{"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", 30}, {"temperature", 0}};
      p.expected = testing::FakeGreedy(ChatLen(text), 30, false);
    } else if (i % 3 == 1) {
      p.api = Api::kOpenAICompletion;
      p.body = {{"prompt", text}, {"max_tokens", 30}, {"temperature", 0}};
      p.expected = testing::FakeGreedy(text.size(), 30, false);
    } else {
      p.api = Api::kAnthropicMessages;
      p.body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", 30}, {"temperature", 0}};
      p.expected = testing::FakeGreedy(ChatLen(text), 30, false);
    }
    prompts.push_back(p);
  }
  LoadOptions lo;
  lo.port = (*server)->port();
  lo.clients = 16;
  lo.seconds = 2;
  lo.disconnect_every = 4;
  LoadReport r = RunLoad(lo, prompts);
  std::printf("%s\n", r.ToJson().dump().c_str());
  EXPECT_EQ(r.errors, 0u) << r.ToJson().dump(1);
  EXPECT_EQ(r.mismatches, 0u) << r.ToJson().dump(1);
  EXPECT_GT(r.completed, 16u);
  EXPECT_GT(r.disconnected, 0u);
  EXPECT_EQ(r.tokens, r.completed * 30);
  // 30 tokens streamed one by one: time to the first, and gaps between the rest.
  EXPECT_GT(r.ttft_p50_ms, 0.0);
  EXPECT_GT(r.itl_p50_ms, 0.0);
  EXPECT_GE(r.itl_p99_ms, r.itl_p50_ms);
  // Every slot is free again once the clients are gone.
  for (int i = 0; i < 200 && (*server)->scheduler().Stats().busy > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  SchedulerStats st = (*server)->scheduler().Stats();
  EXPECT_EQ(st.busy, 0);
  EXPECT_EQ(st.queued, 0);
  EXPECT_EQ(backend.running.load(), 0);
  (*server)->Stop();
}

}  // namespace
}  // namespace substrate::serve
