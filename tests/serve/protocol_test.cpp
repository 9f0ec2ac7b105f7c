// Unit tests of the pieces under the server: stop strings over streamed text, UTF-8
// reassembly, request parsing defaults.
#include "serve/protocol.h"

#include <gtest/gtest.h>

#include "serve/stop_matcher.h"

namespace substrate::serve {
namespace {

std::string Feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += m.Push(p);
  return out + m.Flush();
}

TEST(StopMatcher, HoldsBackPartialMatchesAndCutsAtTheStop) {
  StopMatcher m({"</end>"});
  EXPECT_EQ(m.Push("hello <"), "hello ");
  EXPECT_EQ(m.Push("/en"), "");
  EXPECT_EQ(m.Push("d> tail"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "</end>");
  EXPECT_EQ(m.Flush(), "");

  StopMatcher n({"</end>"});
  EXPECT_EQ(Feed(n, {"a <", "/e", "x>"}), "a </ex>");
  EXPECT_FALSE(n.stopped());

  StopMatcher e({"b", "abc"});  // the earliest match wins, as in a one-pass scan
  EXPECT_EQ(Feed(e, {"xa", "bc"}), "x");
  EXPECT_EQ(e.matched(), "abc");

  StopMatcher none({});
  EXPECT_EQ(Feed(none, {"abc", "def"}), "abcdef");
}

TEST(Utf8, ReassemblesSplitCharactersAndReplacesBadBytes) {
  Utf8Assembler a;
  EXPECT_EQ(a.Push("caf\xC3"), "caf");
  EXPECT_EQ(a.Push("\xA9!"), "\xC3\xA9!");
  EXPECT_EQ(a.Push("\xE2\x82"), "");
  EXPECT_EQ(a.Push("\xAC"), "\xE2\x82\xAC");
  EXPECT_EQ(a.Push("\xFF"), "\xEF\xBF\xBD");
  EXPECT_EQ(a.Push("\xC3"), "");
  EXPECT_EQ(a.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(SanitizeUtf8("ok\xC3(\xED\xA0\x80"),
            "ok\xEF\xBF\xBD(\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Protocol, DefaultsAndFields) {
  GenerationRequest r;
  ApiError e;
  ASSERT_TRUE(ParseRequest(Api::kOpenAICompletion, R"({"prompt":"x"})", &r, &e)) << e.message;
  EXPECT_EQ(r.sampling.max_tokens, 16);
  EXPECT_EQ(r.prompt_text, "x");
  ASSERT_TRUE(ParseRequest(
      Api::kOpenAIChat,
      R"({"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
                               "max_completion_tokens":7,"top_p":0.5,"seed":-3,"stop":"q"})",
      &r, &e))
      << e.message;
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[0]["content"], "ab");
  EXPECT_EQ(r.sampling.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_TRUE(r.sampling.has_seed);
  EXPECT_EQ(r.stop, std::vector<std::string>{"q"});
  EXPECT_FALSE(r.max_tokens_given == false);
  ASSERT_TRUE(
      ParseRequest(Api::kOpenAIChat, R"({"messages":[{"role":"user","content":"x"}]})", &r, &e));
  EXPECT_FALSE(r.max_tokens_given);
}

TEST(Protocol, ToolMessagesBecomeTheTemplatesShape) {
  GenerationRequest r;
  ApiError e;
  // OpenAI: arguments arrive as a JSON string and reach the template as an object; a tool
  // message learns its tool's name from the call it answers.
  ASSERT_TRUE(ParseRequest(Api::kOpenAIChat, R"({"messages":[
      {"role":"user","content":"hi"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"18 C"}],
      "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
        "properties":{"z":{"type":"string"},"a":{"type":"integer"}}}}}],
      "tool_choice":{"type":"function","function":{"name":"get_weather"}},
      "parallel_tool_calls":false})",
                           &r, &e))
      << e.message;
  EXPECT_TRUE(r.messages[1]["content"].is_null());
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["function"]["arguments"]["city"], "Paris");
  EXPECT_EQ(r.messages[2]["role"], "tool");
  EXPECT_EQ(r.messages[2]["name"], "get_weather");
  EXPECT_EQ(r.tool_choice, ToolChoice::kNamed);
  EXPECT_FALSE(r.parallel_tool_calls);
  ASSERT_EQ(r.tools.size(), 1u);
  // The schema keeps its key order (properties are generated in that order).
  EXPECT_EQ(r.tools[0].parameters["properties"].begin().key(), "z");

  // Anthropic: tool_use and tool_result blocks, thinking dropped, system first.
  ASSERT_TRUE(ParseRequest(Api::kAnthropicMessages,
                           R"({"model":"m","max_tokens":9,"system":"Be brief.",
      "messages":[{"role":"user","content":"hi"},
      {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"x"},
        {"type":"text","text":"Let me look."},
        {"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Paris"}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"18 C"}]},
        {"type":"text","text":"And tomorrow?"}]}],
      "tools":[{"name":"get_weather","input_schema":{"type":"object"}}],
      "tool_choice":{"type":"any","disable_parallel_tool_use":true}})",
                           &r, &e))
      << e.message;
  ASSERT_EQ(r.messages.size(), 5u) << r.messages.dump();
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[2]["content"], "Let me look.");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"]["city"], "Paris");
  EXPECT_EQ(r.messages[3]["role"], "tool");
  EXPECT_EQ(r.messages[3]["tool_call_id"], "t1");
  EXPECT_EQ(r.messages[3]["name"], "get_weather");
  EXPECT_EQ(r.messages[3]["content"], "18 C");
  EXPECT_EQ(r.messages[4]["content"], "And tomorrow?");
  EXPECT_EQ(r.tool_choice, ToolChoice::kRequired);
  EXPECT_FALSE(r.parallel_tool_calls);
}

TEST(Protocol, ErrorShapes) {
  ApiError e = BadRequest("bad \xFF thing", "messages");
  auto o = nlohmann::json::parse(ErrorBody(Api::kOpenAIChat, e));
  EXPECT_EQ(o["error"]["param"], "messages");
  EXPECT_TRUE(o["error"]["code"].is_null());
  auto a = nlohmann::json::parse(ErrorBody(Api::kAnthropicMessages, e));
  EXPECT_EQ(a["type"], "error");
  EXPECT_EQ(a["error"]["type"], "invalid_request_error");
}

}  // namespace
}  // namespace substrate::serve
