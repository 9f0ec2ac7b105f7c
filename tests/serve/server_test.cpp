// The HTTP layer end to end over loopback, against the deterministic FakeBackend: every
// endpoint, streaming and not, errors in each API's shape, API keys, limits, disconnects,
// the queue and the prompt cache.
#include <gtest/gtest.h>

#include <cmath>

#include <atomic>
#include <chrono>
#include <optional>
#include <random>
#include <thread>

#include "fake_backend.h"
#include "serve/server.h"
#include "sse_client.h"

namespace substrate::serve {
namespace {

using nlohmann::json;
using testing::FakeBackend;
using testing::FakeGreedy;
using testing::ParseSse;
using testing::PostStream;

class ServerTest : public ::testing::Test {
 protected:
  void StartServer(ServerOptions opt = {}) {
    opt.port = 0;
    if (opt.parallel < 1) opt.parallel = 2;
    auto s = HttpServer::Create(&backend_, opt);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    server_->Start();
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  httplib::Client Client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(30, 0);
    c.set_tcp_nodelay(true);
    return c;
  }
  httplib::Result Post(const std::string& path, const json& body, httplib::Headers h = {}) {
    auto c = Client();
    return c.Post(path.c_str(), h, body.dump(), "application/json");
  }
  // The prompt the fake sees for a one-message chat.
  static size_t ChatPromptLen(const std::string& content) {
    return std::string("<user>" + content + "\n<assistant>").size();
  }

  FakeBackend backend_{512};
  std::unique_ptr<HttpServer> server_;
};

TEST_F(ServerTest, HealthModelsAndMetrics) {
  StartServer();
  auto c = Client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");

  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  json mj = json::parse(m->body);
  EXPECT_EQ(mj["object"], "list");
  EXPECT_EQ(mj["data"][0]["id"], "fake-model");

  auto am = c.Get("/v1/models", httplib::Headers{{"anthropic-version", "2023-06-01"}});
  ASSERT_TRUE(am);
  EXPECT_EQ(json::parse(am->body)["data"][0]["type"], "model");

  ASSERT_TRUE(Post("/v1/completions", {{"prompt", "abc"}, {"max_tokens", 4}, {"temperature", 0}}));
  // The request counter is bumped after the response is sent: give it a moment.
  std::optional<httplib::Response> mt;
  for (int i = 0; i < 100; ++i) {
    auto got = c.Get("/metrics");
    ASSERT_TRUE(got);
    mt = *got;
    if (mt->body.find("completions\",status=\"200\"} 1") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(mt->status, 200);
  for (const char* name : {"substrate_tokens_per_second", "substrate_queue_depth 0",
                           "substrate_generated_tokens_total 4", "substrate_memory_ledger_bytes",
                           "substrate_requests_total{path=\"/v1/completions\",status=\"200\"} 1"})
    EXPECT_NE(mt->body.find(name), std::string::npos) << name << "\n" << mt->body;
}

TEST_F(ServerTest, ChatCompletionGreedy) {
  StartServer();
  json req = {{"model", "x"},
              {"messages", {{{"role", "user"}, {"content", "hello"}}}},
              {"max_tokens", 20},
              {"temperature", 0}};
  auto r = Post("/v1/chat/completions", req);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "fake-model");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  const size_t n = ChatPromptLen("hello");
  EXPECT_EQ(j["choices"][0]["message"]["content"], FakeGreedy(n, 20, false));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], n);
  EXPECT_EQ(j["usage"]["completion_tokens"], 20);
  EXPECT_EQ(j["usage"]["total_tokens"], n + 20);
}

TEST_F(ServerTest, ChatStreamMatchesNonStream) {
  StartServer();
  json req = {{"messages", {{{"role", "system"}, {"content", "be brief"}},
                            {{"role", "user"}, {"content", "hi [eos]"}}}},
              {"temperature", 0},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}}};
  auto s = PostStream(server_->port(), "/v1/chat/completions", req.dump());
  ASSERT_TRUE(s.transport_ok);
  ASSERT_EQ(s.status, 200) << s.body;
  auto events = ParseSse(s.body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back().data, "[DONE]");
  json first = json::parse(events[0].data);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text, finish;
  json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json e = json::parse(events[i].data);
    if (e.contains("usage") && !e["usage"].is_null()) usage = e["usage"];
    if (e["choices"].empty()) continue;
    auto& c = e["choices"][0];
    if (c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  req["stream"] = false;
  auto r = Post("/v1/chat/completions", req);
  ASSERT_TRUE(r);
  json j = json::parse(r->body);
  EXPECT_EQ(text, j["choices"][0]["message"]["content"]);
  EXPECT_EQ(finish, "stop");  // the fake's end-of-text
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(usage["completion_tokens"], j["usage"]["completion_tokens"]);
  EXPECT_EQ(text, testing::FakeScript(usage["prompt_tokens"].get<size_t>()));
}

TEST_F(ServerTest, CompletionsStreamAndNot) {
  StartServer();
  json req = {{"prompt", "def f():"}, {"max_tokens", 30}, {"temperature", 0}};
  auto r = Post("/v1/completions", req);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], FakeGreedy(8, 30, false));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 8);

  req["stream"] = true;
  auto s = PostStream(server_->port(), "/v1/completions", req.dump());
  ASSERT_EQ(s.status, 200);
  auto events = ParseSse(s.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().data, "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i)
    text += json::parse(events[i].data)["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, FakeGreedy(8, 30, false));

  // Token ids as the prompt.
  auto ids = Post("/v1/completions", {{"prompt", {100, 101, 102}}, {"max_tokens", 5}, {"temperature", 0}});
  ASSERT_TRUE(ids);
  EXPECT_EQ(json::parse(ids->body)["choices"][0]["text"], FakeGreedy(3, 5, false));
}

TEST_F(ServerTest, LogprobsInOpenAIShapes) {
  StartServer();
  // The fake reports each chosen byte at log(1/2) and the alternatives 'z', 'y', ... below it.
  json chat = {{"messages", {{{"role", "user"}, {"content", "hello"}}}},
               {"max_tokens", 12}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}};
  json j = json::parse(Post("/v1/chat/completions", chat)->body);
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 12u) << j.dump();
  std::string joined;
  for (const json& e : content) {
    joined += e["token"].get<std::string>();
    EXPECT_NEAR(e["logprob"].get<double>(), std::log(0.5), 1e-6);
    EXPECT_EQ(e["bytes"].size(), 1u);
    ASSERT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_EQ(e["top_logprobs"][0]["token"], "z");
    EXPECT_EQ(e["top_logprobs"][1]["token"], "y");
  }
  EXPECT_EQ(joined, j["choices"][0]["message"]["content"]);

  // Streamed: the chunks' entries together are the same list.
  chat["stream"] = true;
  auto s = PostStream(server_->port(), "/v1/chat/completions", chat.dump());
  ASSERT_EQ(s.status, 200);
  json streamed = json::array();
  for (const auto& e : ParseSse(s.body)) {
    if (e.data == "[DONE]") continue;
    json d = json::parse(e.data);
    if (d["choices"].empty() || d["choices"][0]["logprobs"].is_null()) continue;
    for (const json& x : d["choices"][0]["logprobs"]["content"]) streamed.push_back(x);
  }
  EXPECT_EQ(streamed, content);

  // Not asked for: null.
  chat.erase("logprobs");
  chat.erase("top_logprobs");
  chat["stream"] = false;
  EXPECT_TRUE(json::parse(Post("/v1/chat/completions", chat)->body)["choices"][0]["logprobs"].is_null());

  // Completions: parallel lists, text offsets in bytes.
  json c = json::parse(Post("/v1/completions", {{"prompt", "def f():"}, {"max_tokens", 5},
                                                 {"temperature", 0}, {"logprobs", 3}})->body);
  const json& lp = c["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u) << c.dump();
  std::string text;
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(lp["text_offset"][i], text.size());
    text += lp["tokens"][i].get<std::string>();
    EXPECT_EQ(lp["top_logprobs"][i].size(), 3u);
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), std::log(0.5), 1e-6);
  }
  EXPECT_EQ(text, c["choices"][0]["text"]);

  // Out of range, or top_logprobs without logprobs: 400 naming the field.
  auto bad = Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                           {"top_logprobs", 2}});
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "top_logprobs");
  bad = Post("/v1/completions", {{"prompt", "x"}, {"logprobs", 6}});
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "logprobs");
}

TEST_F(ServerTest, AnthropicMessagesStreamAndNot) {
  StartServer();
  json req = {{"model", "fake-model"},
              {"max_tokens", 64},
              {"temperature", 0},
              {"system", "sys"},
              {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hey [eos]"}}}}}}}};
  auto r = Post("/v1/messages", req);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  const size_t n = std::string("<system>sys\n<user>hey [eos]\n<assistant>").size();
  EXPECT_EQ(j["type"], "message");
  EXPECT_EQ(j["role"], "assistant");
  EXPECT_EQ(j["content"][0]["type"], "text");
  EXPECT_EQ(j["content"][0]["text"], testing::FakeScript(n));
  EXPECT_EQ(j["stop_reason"], "end_turn");
  EXPECT_EQ(j["usage"]["input_tokens"].get<int>() + j["usage"]["cache_read_input_tokens"].get<int>(),
            static_cast<int>(n));

  req["stream"] = true;
  auto s = PostStream(server_->port(), "/v1/messages", req.dump());
  ASSERT_EQ(s.status, 200);
  auto events = ParseSse(s.body);
  ASSERT_GE(events.size(), 6u);
  EXPECT_EQ(events[0].event, "message_start");
  EXPECT_EQ(events[1].event, "content_block_start");
  EXPECT_EQ(events[events.size() - 3].event, "content_block_stop");
  EXPECT_EQ(events[events.size() - 2].event, "message_delta");
  EXPECT_EQ(events.back().event, "message_stop");
  std::string text;
  for (auto& e : events) {
    json d = json::parse(e.data);
    EXPECT_EQ(d["type"], e.event);  // Anthropic repeats the event name in the data
    if (e.event == "content_block_delta") text += d["delta"]["text"].get<std::string>();
  }
  EXPECT_EQ(text, j["content"][0]["text"]);
  json md = json::parse(events[events.size() - 2].data);
  EXPECT_EQ(md["delta"]["stop_reason"], "end_turn");
  EXPECT_EQ(md["usage"]["output_tokens"], j["usage"]["output_tokens"]);
}

TEST_F(ServerTest, StopSequences) {
  StartServer();
  const std::string script = testing::FakeScript(3);  // "Answer 3: café quick brown fox. "
  json req = {{"prompt", "abc"}, {"max_tokens", 100}, {"temperature", 0}, {"stop", {"brown", "zzz"}}};
  auto r = Post("/v1/completions", req);
  ASSERT_TRUE(r);
  json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["text"], script.substr(0, script.find("brown")));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");

  req["stream"] = true;
  auto s = PostStream(server_->port(), "/v1/completions", req.dump());
  std::string text;
  auto events = ParseSse(s.body);
  for (size_t i = 0; i + 1 < events.size(); ++i)
    text += json::parse(events[i].data)["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, script.substr(0, script.find("brown")));

  json areq = {{"model", "m"},
               {"max_tokens", 100},
               {"temperature", 0},
               {"stop_sequences", {"quick"}},
               {"messages", {{{"role", "user"}, {"content", "x"}}}}};
  auto a = Post("/v1/messages", areq);
  json aj = json::parse(a->body);
  EXPECT_EQ(aj["stop_reason"], "stop_sequence");
  EXPECT_EQ(aj["stop_sequence"], "quick");
  EXPECT_EQ(aj["content"][0]["text"].get<std::string>().find("quick"), std::string::npos);
}

TEST_F(ServerTest, SeededSamplingIsReproducible) {
  StartServer();
  json req = {{"prompt", "abc"}, {"max_tokens", 12}, {"temperature", 0.8}, {"seed", 42}};
  auto a = Post("/v1/completions", req);
  auto b = Post("/v1/completions", req);
  req["seed"] = 43;
  auto c = Post("/v1/completions", req);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(json::parse(a->body)["choices"][0]["text"], json::parse(b->body)["choices"][0]["text"]);
  EXPECT_NE(json::parse(a->body)["choices"][0]["text"], json::parse(c->body)["choices"][0]["text"]);
}

TEST_F(ServerTest, PromptCacheReusesPrefix) {
  ServerOptions opt;
  opt.parallel = 3;
  StartServer(opt);
  json msgs = {{{"role", "user"}, {"content", "first question"}}};
  auto r1 = Post("/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(r1);
  json j1 = json::parse(r1->body);
  const int p1 = j1["usage"]["prompt_tokens"];
  msgs.push_back({{"role", "assistant"}, {"content", j1["choices"][0]["message"]["content"]}});
  msgs.push_back({{"role", "user"}, {"content", "second"}});
  auto r2 = Post("/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(r2);
  json j2 = json::parse(r2->body);
  // The whole first prompt and its answer are a prefix of the second prompt.
  EXPECT_GE(j2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), p1);
  EXPECT_LT(j2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
            j2["usage"]["prompt_tokens"].get<int>());
}

TEST_F(ServerTest, MalformedRequestsGet400InTheirApiShape) {
  StartServer();
  auto c = Client();
  struct Case {
    const char* path;
    std::string body;
    const char* needle;  // in the message
  };
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{not json", "not valid JSON"},
      {"/v1/chat/completions", "[1,2]", "JSON object"},
      {"/v1/chat/completions", "{}", "messages"},
      {"/v1/chat/completions", R"({"messages":"hi"})", "messages"},
      {"/v1/chat/completions", R"({"messages":[]})", "empty"},
      {"/v1/chat/completions", R"({"messages":[{"content":"x"}]})", "role"},
      {"/v1/chat/completions", R"({"messages":[{"role":"wizard","content":"x"}]})", "role"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":5}]})", "content"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":"9"})", "max_tokens"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-1})", "max_tokens"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1e30})", "max_tokens"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "temperature"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"temperature":7})", "temperature"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})", "stop"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})", "stream"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"n":17})", "'n'"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]})", "at most 4"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"x":1}})", "logit_bias"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"5":101}})", "logit_bias"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"99999":1}})", "vocabulary"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "no tools"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes","tools":[{"type":"function","function":{"name":"f"}}]})", "tool_choice"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function","function":{"name":"g"}},"tools":[{"type":"function","function":{"name":"f"}}]})", "'g'"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a b"}}]})", "name"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string","pattern":"x"}}}}}],"tool_choice":"required"})", "'pattern'"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object","patternProperties":{}}}}})", "'patternProperties'"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}})", "response_format"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"grammar":"root ::= undefined-rule"})", "undefined-rule"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"grammar":"root ::= \"a\"","response_format":{"type":"json_object"}})", "together"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},"tools":[{"type":"function","function":{"name":"f"}}]})", "auto"},
      {"/v1/chat/completions", R"({"messages":[{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"not json"}}]}]})", "arguments"},
      {"/v1/completions", R"({"max_tokens":3})", "prompt"},
      {"/v1/completions", R"({"prompt":{"a":1}})", "prompt"},
      {"/v1/completions", R"({"prompt":[99999]})", "vocabulary"},
      {"/v1/completions", R"({"prompt":""})", "empty"},
      {"/v1/completions", std::string(100, '[') + std::string(100, ']'), "nests"},
      {"/v1/messages", R"({"model":"m","messages":[{"role":"user","content":"x"}]})", "max_tokens"},
      {"/v1/messages", R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}]})", "model"},
      {"/v1/messages", R"({"model":"m","max_tokens":5,"messages":[{"role":"system","content":"x"}]})", "role"},
      {"/v1/messages", R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image"}]}]})", "image"},
      {"/v1/messages", R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f"}]})", "input_schema"},
      {"/v1/messages", R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"g"}})", "'g'"},
      {"/v1/messages", R"({"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"x"}]}]})", "tool_result"},
  };
  for (const auto& tc : cases) {
    auto r = c.Post(tc.path, tc.body, "application/json");
    ASSERT_TRUE(r) << tc.body;
    EXPECT_EQ(r->status, 400) << tc.path << " " << tc.body << " -> " << r->body;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r->body;
    std::string message;
    if (std::string(tc.path) == "/v1/messages") {
      EXPECT_EQ(j["type"], "error") << r->body;
      EXPECT_EQ(j["error"]["type"], "invalid_request_error");
      message = j["error"]["message"];
    } else {
      EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r->body;
      message = j["error"]["message"];
    }
    EXPECT_NE(message.find(tc.needle), std::string::npos) << tc.body << " -> " << message;
  }
  auto nf = c.Get("/v1/nothing");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_TRUE(json::parse(nf->body).contains("error"));
}

TEST_F(ServerTest, ContextAndBodyLimits) {
  ServerOptions opt;
  opt.max_body_bytes = 64 * 1024;
  opt.context = 128;
  StartServer(opt);
  // Over the context: 400 naming it.
  auto r = Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", std::string(200, 'x')}}}}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "context_length_exceeded");
  auto a = Post("/v1/messages", {{"model", "m"}, {"max_tokens", 10},
                                 {"messages", {{{"role", "user"}, {"content", std::string(200, 'x')}}}}});
  ASSERT_TRUE(a);
  EXPECT_EQ(a->status, 400);
  EXPECT_EQ(json::parse(a->body)["type"], "error");
  // max_tokens beyond the context: answered up to the context's end.
  auto m = Post("/v1/completions", {{"prompt", std::string(100, 'y')}, {"max_tokens", 1000}, {"temperature", 0}});
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200) << m->body;
  EXPECT_EQ(json::parse(m->body)["usage"]["completion_tokens"], 28);
  EXPECT_EQ(json::parse(m->body)["choices"][0]["finish_reason"], "length");
  // Over the body limit: 413 in each shape.
  const std::string big = json{{"prompt", std::string(100 * 1024, 'z')}}.dump();
  auto c = Client();
  auto b = c.Post("/v1/completions", big, "application/json");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->status, 413);
  EXPECT_TRUE(json::parse(b->body).contains("error"));
  auto ba = c.Post("/v1/messages", big, "application/json");
  ASSERT_TRUE(ba);
  EXPECT_EQ(ba->status, 413);
  EXPECT_EQ(json::parse(ba->body)["error"]["type"], "request_too_large");
  // Still serving.
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST_F(ServerTest, ApiKey) {
  ServerOptions opt;
  opt.api_key = "sekrit";
  StartServer(opt);
  json req = {{"prompt", "a"}, {"max_tokens", 2}};
  auto none = Post("/v1/completions", req);
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(json::parse(none->body)["error"]["code"], "invalid_api_key");
  auto wrong = Post("/v1/completions", req, {{"Authorization", "Bearer nope"}});
  EXPECT_EQ(wrong->status, 401);
  auto prefix = Post("/v1/completions", req, {{"Authorization", "Bearer sekri"}});
  EXPECT_EQ(prefix->status, 401);
  auto ok = Post("/v1/completions", req, {{"Authorization", "Bearer sekrit"}});
  EXPECT_EQ(ok->status, 200);
  auto anth_wrong = Post("/v1/messages", {{"model", "m"}}, {{"x-api-key", "nope"}});
  EXPECT_EQ(anth_wrong->status, 401);
  EXPECT_EQ(json::parse(anth_wrong->body)["error"]["type"], "authentication_error");
  auto anth_ok = Post("/v1/messages", {{"model", "m"}, {"max_tokens", 2},
                                       {"messages", {{{"role", "user"}, {"content", "x"}}}}},
                      {{"x-api-key", "sekrit"}});
  EXPECT_EQ(anth_ok->status, 200);
  auto c = Client();
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST_F(ServerTest, DisconnectMidStreamFreesTheSlot) {
  ServerOptions opt;
  opt.parallel = 1;
  StartServer(opt);
  backend_.token_delay_us = 2000;
  json req = {{"prompt", "abc"}, {"max_tokens", 5000}, {"temperature", 0}, {"stream", true}};
  int chunks = 0;
  auto s = PostStream(server_->port(), "/v1/completions", req.dump(), {},
                      [&](const std::string&) { return ++chunks < 5; });
  EXPECT_FALSE(s.transport_ok);  // we hung up
  // The slot is free well before the 5000 tokens (10 s) would have run.
  auto t0 = std::chrono::steady_clock::now();
  while (server_->scheduler().Stats().busy > 0 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(server_->scheduler().Stats().busy, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_EQ(server_->scheduler().Stats().cancelled, 1u);
  EXPECT_LT(backend_.tokens_generated.load(), 1000u);
  // And the next request is served.
  backend_.token_delay_us = 0;
  auto r = Post("/v1/completions", {{"prompt", "abc"}, {"max_tokens", 3}, {"temperature", 0}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(ServerTest, QueueRunsNAtOnceAndAnswersAll) {
  ServerOptions opt;
  opt.parallel = 2;
  StartServer(opt);
  backend_.token_delay_us = 500;
  std::vector<std::thread> threads;
  std::atomic<int> correct{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      std::string prompt(10 + i, 'p');
      json req = {{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}, {"stream", i % 2 == 0}};
      auto s = PostStream(server_->port(), "/v1/completions", req.dump());
      std::string text;
      if (i % 2 == 0) {
        auto ev = ParseSse(s.body);
        for (size_t k = 0; k + 1 < ev.size(); ++k)
          text += json::parse(ev[k].data)["choices"][0]["text"].get<std::string>();
      } else {
        text = json::parse(s.body)["choices"][0]["text"];
      }
      if (s.status == 200 && text == FakeGreedy(prompt.size(), 40, false)) ++correct;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(correct.load(), 8);
  EXPECT_EQ(backend_.max_running.load(), 2);
}

TEST_F(ServerTest, RandomGarbageNeverCrashes) {
  StartServer();
  const std::string valid =
      R"({"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hi"}],"stop":["x"],"temperature":0.5})";
  std::mt19937 rng(7);
  auto c = Client();
  for (int i = 0; i < 150; ++i) {
    std::string body = valid;
    int edits = 1 + rng() % 4;
    for (int e = 0; e < edits; ++e) {
      size_t at = rng() % body.size();
      switch (rng() % 3) {
        case 0: body[at] = static_cast<char>(rng() % 256); break;
        case 1: body.erase(at, 1 + rng() % 5); break;
        default: body.insert(at, 1, "{}[]\",:0e-\\"[rng() % 11]); break;
      }
    }
    const char* path = i % 3 == 0 ? "/v1/messages" : i % 3 == 1 ? "/v1/chat/completions" : "/v1/completions";
    auto r = c.Post(path, body, "application/json");
    ASSERT_TRUE(r) << body;
    EXPECT_LT(r->status, 500) << body << " -> " << r->body;
    EXPECT_FALSE(json::parse(r->body, nullptr, false).is_discarded()) << r->body;
  }
  EXPECT_EQ(c.Get("/health")->status, 200);
}

}  // namespace
}  // namespace substrate::serve

namespace substrate::serve {
namespace {

TEST_F(ServerTest, StopWhileStreamingReturnsPromptly) {
  StartServer();
  backend_.token_delay_us = 2000;
  std::thread client([&] {
    json req = {{"prompt", "abc"}, {"max_tokens", 5000}, {"stream", true}};
    (void)PostStream(server_->port(), "/v1/completions", req.dump());
  });
  while (backend_.running.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto t0 = std::chrono::steady_clock::now();
  server_->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  client.join();
  EXPECT_EQ(backend_.running.load(), 0);
  server_.reset();
}

}  // namespace
}  // namespace substrate::serve
