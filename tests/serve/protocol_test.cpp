// Unit tests of the pieces under the server: stop strings over streamed text, UTF-8
// reassembly, request parsing defaults.
#include <gtest/gtest.h>

#include "serve/protocol.h"
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
  EXPECT_EQ(SanitizeUtf8("ok\xC3(\xED\xA0\x80"), "ok\xEF\xBF\xBD(\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Protocol, DefaultsAndFields) {
  GenerationRequest r;
  ApiError e;
  ASSERT_TRUE(ParseRequest(Api::kOpenAICompletion, R"({"prompt":"x"})", &r, &e)) << e.message;
  EXPECT_EQ(r.sampling.max_tokens, 16);
  EXPECT_EQ(r.prompt_text, "x");
  ASSERT_TRUE(ParseRequest(Api::kOpenAIChat,
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
  ASSERT_TRUE(ParseRequest(Api::kOpenAIChat, R"({"messages":[{"role":"user","content":"x"}]})", &r, &e));
  EXPECT_FALSE(r.max_tokens_given);
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
