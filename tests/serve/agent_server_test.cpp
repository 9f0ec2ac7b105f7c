// The agent features of the HTTP layer over loopback, against the FakeBackend scripted to
// answer given text ("[[say:...:yas]]", one byte per token, so streaming splits everything):
// tool calls parsed and streamed in both APIs, reasoning split, tool_choice required failing
// visibly, n > 1, count_tokens, the web page, the runtime event stream, slot-file checks.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <thread>

#include "fake_backend.h"
#include "serve/server.h"
#include "sse_client.h"

namespace substrate::serve {
namespace {

using nlohmann::json;
using testing::FakeBackend;
using testing::ParseSse;
using testing::PostStream;

const char* kCallAnswer =
    "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": "
    "[1, 2]}}"
    "\n</tool_call>";

json Tools() {
  return json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"},
      "days": {"type": "array", "items": {"type": "integer"}}}}}}])");
}

json Say(const std::string& text) {
  return {{"role", "user"}, {"content", "[[say:" + text + ":yas]]"}};
}

class AgentServerTest : public ::testing::Test {
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
  json Post(const std::string& path, const json& body, int* status = nullptr,
            httplib::Headers* headers = nullptr) {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(30, 0);
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return json();
    if (status) *status = r->status;
    if (headers) *headers = r->headers;
    return json::parse(r->body, nullptr, false);
  }
  std::vector<testing::SseEvent> Stream(const std::string& path, json body) {
    body["stream"] = true;
    auto s = PostStream(server_->port(), path, body.dump());
    EXPECT_EQ(s.status, 200) << s.body;
    return ParseSse(s.body);
  }

  FakeBackend backend_{2048};
  std::unique_ptr<HttpServer> server_;
};

TEST_F(AgentServerTest, OpenAIToolCallsWholeAndStreamed) {
  StartServer();
  json body = {{"messages", {Say(kCallAnswer)}}, {"tools", Tools()}, {"max_tokens", 400}};
  json r = Post("/v1/chat/completions", body);
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.dump();
  EXPECT_EQ(choice["message"]["content"], "Sure.");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << r.dump();
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(call["function"]["arguments"], "{\"city\": \"Paris\", \"days\": [1, 2]}");
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);

  // Streamed: the role chunk, content, a tool_calls start with id and name, argument fragments
  // (tokens come slowly enough for the answer to be taken in pieces).
  backend_.token_delay_us = 1500;
  std::string content, args, name, id;
  int fragments = 0;
  std::string finish;
  for (const auto& e : Stream("/v1/chat/completions", body)) {
    if (e.data == "[DONE]") continue;
    json d = json::parse(e.data);
    for (const json& c : d["choices"]) {
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
      const json& delta = c["delta"];
      if (delta.contains("content")) content += delta["content"].get<std::string>();
      if (delta.contains("tool_calls"))
        for (const json& tc : delta["tool_calls"]) {
          EXPECT_EQ(tc["index"], 0);
          if (tc.contains("id")) id = tc["id"];
          if (tc["function"].contains("name")) name += tc["function"]["name"].get<std::string>();
          if (tc["function"].contains("arguments") &&
              !tc["function"]["arguments"].get<std::string>().empty()) {
            args += tc["function"]["arguments"].get<std::string>();
            ++fragments;
          }
        }
    }
  }
  EXPECT_EQ(content, "Sure.");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(args, call["function"]["arguments"]);
  EXPECT_GT(fragments, 5);  // one byte per token: the arguments arrive piece by piece
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(finish, "tool_calls");
  backend_.token_delay_us = 0;

  // The tools reached the prompt (the fake renders them), and a tool message goes back in.
  json back = {{"messages",
                {Say("ok"),
                 choice["message"],
                 {{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "18 C"}}}},
               {"tools", Tools()},
               {"max_tokens", 10}};
  int status = 0;
  json r2 = Post("/v1/chat/completions", back, &status);
  EXPECT_EQ(status, 200) << r2.dump();
  EXPECT_GT(r2["usage"]["prompt_tokens"].get<int>(), r["usage"]["prompt_tokens"].get<int>());
}

TEST_F(AgentServerTest, AnthropicToolUseWholeAndStreamed) {
  StartServer();
  json body = {
      {"model", "m"},
      {"max_tokens", 400},
      {"messages", {Say(kCallAnswer)}},
      {"tools",
       {{{"name", "get_weather"}, {"input_schema", Tools()[0]["function"]["parameters"]}}}}};
  json r = Post("/v1/messages", body);
  EXPECT_EQ(r["stop_reason"], "tool_use") << r.dump();
  ASSERT_EQ(r["content"].size(), 2u) << r.dump();
  EXPECT_EQ(r["content"][0]["text"], "Sure.");
  const json& use = r["content"][1];
  EXPECT_EQ(use["type"], "tool_use");
  EXPECT_EQ(use["name"], "get_weather");
  EXPECT_EQ(use["input"], json::parse(R"({"city": "Paris", "days": [1, 2]})"));
  EXPECT_EQ(use["id"].get<std::string>().rfind("toolu_", 0), 0u);

  std::string text, partial;
  int text_block = -1, tool_block = -1, stops = 0;
  std::string stop_reason;
  for (const auto& e : Stream("/v1/messages", body)) {
    json d = json::parse(e.data);
    if (e.event == "content_block_start") {
      if (d["content_block"]["type"] == "text") text_block = d["index"];
      if (d["content_block"]["type"] == "tool_use") {
        tool_block = d["index"];
        EXPECT_EQ(d["content_block"]["name"], "get_weather");
        EXPECT_EQ(d["content_block"]["input"], json::object());
      }
    } else if (e.event == "content_block_delta") {
      if (d["delta"]["type"] == "text_delta") {
        EXPECT_EQ(d["index"], text_block);
        text += d["delta"]["text"].get<std::string>();
      } else {
        EXPECT_EQ(d["delta"]["type"], "input_json_delta");
        EXPECT_EQ(d["index"], tool_block);
        partial += d["delta"]["partial_json"].get<std::string>();
      }
    } else if (e.event == "content_block_stop") {
      ++stops;
    } else if (e.event == "message_delta") {
      stop_reason = d["delta"]["stop_reason"];
    }
  }
  EXPECT_EQ(text_block, 0);
  EXPECT_EQ(tool_block, 1);
  EXPECT_EQ(stops, 2);
  EXPECT_EQ(text, "Sure.");
  EXPECT_EQ(json::parse(partial), use["input"]);
  EXPECT_EQ(stop_reason, "tool_use");

  // tool_use / tool_result blocks in the history reach the template as a call and a tool turn.
  json back = {
      {"model", "m"},
      {"max_tokens", 10},
      {"tools", body["tools"]},
      {"messages",
       {Say("ok"),
        {{"role", "assistant"}, {"content", r["content"]}},
        {{"role", "user"},
         {"content",
          {{{"type", "tool_result"}, {"tool_use_id", use["id"]}, {"content", "18 C"}}}}}}}};
  int status = 0;
  json r2 = Post("/v1/messages", back, &status);
  EXPECT_EQ(status, 200) << r2.dump();
  // count_tokens: the prompt of the same body.
  json count = Post("/v1/messages/count_tokens", back, &status);
  EXPECT_EQ(status, 200) << count.dump();
  EXPECT_EQ(count["input_tokens"], r2["usage"]["input_tokens"].get<int>() +
                                       r2["usage"]["cache_read_input_tokens"].get<int>());
}

TEST_F(AgentServerTest, RequiredToolWithoutACallIsAnErrorTheClientSees) {
  StartServer();
  json body = {{"messages", {Say("The weather is nice.")}},
               {"tools", Tools()},
               {"tool_choice", "required"},
               {"max_tokens", 100}};
  int status = 0;
  httplib::Headers headers;
  json r = Post("/v1/chat/completions", body, &status, &headers);
  EXPECT_EQ(status, 500) << r.dump();
  EXPECT_EQ(r["error"]["code"], "tool_call_parse_error");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("tool call"), std::string::npos);
  auto retry = headers.find("x-should-retry");
  ASSERT_NE(retry, headers.end());
  EXPECT_EQ(retry->second, "false");
  // Streamed: the error comes as the last event, after no tool call.
  auto events = Stream("/v1/chat/completions", body);
  ASSERT_FALSE(events.empty());
  json last = json::parse(events.back().data);
  EXPECT_EQ(last["error"]["code"], "tool_call_parse_error") << events.back().data;
  // Anthropic: an error event.
  json a = {{"model", "m"},
            {"max_tokens", 100},
            {"messages", {Say("No tools today.")}},
            {"tools", {{{"name", "f"}, {"input_schema", {{"type", "object"}}}}}},
            {"tool_choice", {{"type", "any"}}}};
  auto ae = Stream("/v1/messages", a);
  ASSERT_FALSE(ae.empty());
  EXPECT_EQ(ae.back().event, "error");
  // With tool_choice auto the same answer is plain text.
  body["tool_choice"] = "auto";
  json ok = Post("/v1/chat/completions", body, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(ok["choices"][0]["message"]["content"], "The weather is nice.");
  EXPECT_EQ(ok["choices"][0]["finish_reason"], "stop");
}

TEST_F(AgentServerTest, ReasoningIsSplitUnlessTurnedOff) {
  StartServer();
  json body = {{"messages", {Say("<think>I add 2 and 2.</think>\n\nIt is 4.")}},
               {"max_tokens", 100}};
  json r = Post("/v1/chat/completions", body);
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], "I add 2 and 2.") << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["content"], "It is 4.");
  std::string reasoning, content;
  for (const auto& e : Stream("/v1/chat/completions", body)) {
    if (e.data == "[DONE]") continue;
    json d = json::parse(e.data);
    for (const json& c : d["choices"]) {
      if (c["delta"].contains("reasoning_content"))
        reasoning += c["delta"]["reasoning_content"].get<std::string>();
      if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
    }
  }
  EXPECT_EQ(reasoning, "I add 2 and 2.");
  EXPECT_EQ(content, "It is 4.");

  json a = {{"model", "m"}, {"max_tokens", 100}, {"messages", body["messages"]}};
  json m = Post("/v1/messages", a);
  ASSERT_EQ(m["content"].size(), 2u) << m.dump();
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][0]["thinking"], "I add 2 and 2.");
  EXPECT_EQ(m["content"][1]["text"], "It is 4.");
  std::string thinking;
  for (const auto& e : Stream("/v1/messages", a)) {
    json d = json::parse(e.data);
    if (e.event == "content_block_delta" && d["delta"]["type"] == "thinking_delta")
      thinking += d["delta"]["thinking"].get<std::string>();
  }
  EXPECT_EQ(thinking, "I add 2 and 2.");

  server_->Stop();
  ServerOptions off;
  off.reasoning_format = "none";
  StartServer(off);
  json inline_r = Post("/v1/chat/completions", body);
  EXPECT_EQ(inline_r["choices"][0]["message"]["content"],
            "<think>I add 2 and 2.</think>\n\nIt is 4.");
  EXPECT_FALSE(inline_r["choices"][0]["message"].contains("reasoning_content"));
}

TEST_F(AgentServerTest, SeveralChoices) {
  StartServer();
  json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
               {"max_tokens", 6},
               {"n", 3},
               {"temperature", 1.0},
               {"seed", 11}};
  json r = Post("/v1/chat/completions", body);
  ASSERT_EQ(r["choices"].size(), 3u) << r.dump();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r["choices"][i]["index"], i);
  // Seeds seed, seed+1, seed+2: distinct answers, the same on a repeat.
  EXPECT_NE(r["choices"][0]["message"]["content"], r["choices"][1]["message"]["content"]);
  EXPECT_EQ(r["usage"]["completion_tokens"], 18);
  json again = Post("/v1/chat/completions", body);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(again["choices"][i]["message"]["content"], r["choices"][i]["message"]["content"]);
  // Streamed: each choice's chunks carry its index and each ends with a finish_reason.
  std::map<int, std::string> text;
  std::map<int, int> finished;
  for (const auto& e : Stream("/v1/chat/completions", body)) {
    if (e.data == "[DONE]") continue;
    json d = json::parse(e.data);
    for (const json& c : d["choices"]) {
      const int i = c["index"];
      if (c["delta"].contains("content")) text[i] += c["delta"]["content"].get<std::string>();
      if (!c["finish_reason"].is_null()) ++finished[i];
    }
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(text[i], r["choices"][i]["message"]["content"]) << i;
    EXPECT_EQ(finished[i], 1) << i;
  }
}

TEST_F(AgentServerTest, WebPageAndRuntimeEvents) {
  StartServer();
  httplib::Client c("127.0.0.1", server_->port());
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->get_header_value("Content-Type").find("text/html"), std::string::npos);
  for (const char* id : {"id=\"plot-tps\"", "id=\"plot-memory\"", "id=\"plot-disk\"",
                         "/v1/runtime/events", "/v1/chat/completions"})
    EXPECT_NE(page->body.find(id), std::string::npos) << id;
  EXPECT_EQ(page->body.find("http://"), std::string::npos);  // nothing from elsewhere
  EXPECT_EQ(page->body.find("https://"), std::string::npos);

  // Two events from the stream, then hang up.
  std::string got;
  int events = 0;
  c.set_read_timeout(10, 0);
  auto r = c.Get("/v1/runtime/events?interval_ms=100", [&](const char* data, size_t n) {
    got.append(data, n);
    events = 0;
    for (size_t at = 0; (at = got.find("event: stats", at)) != std::string::npos; ++at) ++events;
    return events < 2;
  });
  ASSERT_GE(events, 2) << got;
  auto parsed = ParseSse(got);
  json st = json::parse(parsed[0].data);
  EXPECT_EQ(st["model"], "fake-model");
  EXPECT_EQ(st["slots"], 1);
  EXPECT_TRUE(st["memory"].contains("accounts"));
  EXPECT_TRUE(st["tokens"].contains("generated"));
  EXPECT_TRUE(st.contains("runtime"));

  // Slot files: off without --slot-save-path.
  auto slot = c.Post("/slots/0?action=save", R"({"filename":"a.bin"})", "application/json");
  ASSERT_TRUE(slot);
  EXPECT_EQ(slot->status, 501);
}

TEST_F(AgentServerTest, SlotFileNamesCannotLeaveTheFolder) {
  ServerOptions opt;
  opt.slot_save_path = ::testing::TempDir();
  StartServer(opt);
  httplib::Client c("127.0.0.1", server_->port());
  for (const char* name : {"../x", "/etc/passwd", ".hidden", "a/b", "", "..", "a b"}) {
    auto r = c.Post("/slots/0?action=save", json{{"filename", name}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << name << " " << r->body;
  }
  auto r = c.Post("/slots/0?action=wipe", R"({"filename":"a"})", "application/json");
  EXPECT_EQ(r->status, 400);
  r = c.Post("/slots/9?action=save", R"({"filename":"a"})", "application/json");
  EXPECT_EQ(r->status, 400) << r->body;  // no slot 9
  r = c.Post("/slots/0?action=save", R"({"filename":"ok.bin"})", "application/json");
  EXPECT_EQ(r->status, 500) << r->body;  // the fake cannot save
}

}  // namespace
}  // namespace substrate::serve
