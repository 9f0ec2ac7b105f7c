// Tool calls in every format the server reads: each real template (../shared/templates) renders
// an assistant turn with a tool call, and the text it renders — what the model was trained to
// write — parses back into that call; formats without a shared template are rendered by small
// templates written here from the format's description. The constrained grammar of each
// format produces only calls the parser reads, and parsing text as it streams (byte by byte)
// gives events that reassemble into the same calls.
#include "serve/tool_format.h"

#include <gtest/gtest.h>

#include "core/file_io.h"
#include "grammar_test_util.h"
#include "serve/output_parser.h"
#include "tokenizer/chat_template.h"

namespace substrate::serve {
namespace {

using ojson = nlohmann::ordered_json;

const std::string kTemplates = std::string(SUBSTRATE_SHARED_DIR) + "/templates/src/";

ojson Tools() {
  return ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Get the weather in a city", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "description": "City name"},
      "days": {"type": "integer", "description": "Days ahead"}}, "required": ["city"]}}}])");
}

// Renders [user, assistant(tool call)] and returns what the assistant turn adds after the
// generation prompt, cut at the end-of-turn marker: the text the model writes.
std::string AssistantText(const std::string& tmpl, bool args_as_string, const ojson& call_args) {
  ojson user = {{"role", "user"}, {"content", "Weather in Paris?"}};
  ojson call = {{"id", "call_1"},
                {"type", "function"},
                {"function",
                 {{"name", "get_weather"},
                  {"arguments", args_as_string ? ojson(call_args.dump()) : call_args}}}};
  ojson assistant = {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}};
  auto render = [&](ojson msgs, bool gen) {
    ojson ctx = {{"messages", msgs},   {"tools", Tools()},    {"add_generation_prompt", gen},
                 {"bos_token", "<s>"}, {"eos_token", "</s>"}, {"functions", ""},
                 {"datetime", ""}};
    auto out = RenderChatTemplate(tmpl, ctx);
    if (!out.ok()) {
      // Some templates fail on `tools` as Python does (llama-cpp-deepseek-r1): without them.
      ctx.erase("tools");
      out = RenderChatTemplate(tmpl, ctx);
    }
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? *out : std::string();
  };
  const std::string prompt = render({user}, true);
  const std::string full = render({user, assistant}, false);
  size_t common = 0;
  while (common < prompt.size() && common < full.size() && prompt[common] == full[common]) ++common;
  // Back to the end of the last marker or line both share ("<｜Assistant｜><" of "<think>" and
  // "<｜tool▁calls▁begin｜>" is not the answer's).
  while (common > 0 && full[common - 1] != '>' && full[common - 1] != '\n') --common;
  std::string out = full.substr(common);
  if (out.rfind("<|CHATBOT_TOKEN|>", 0) == 0) out = out.substr(17);  // Command R+
  for (const char* end : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>",
                          "<\xEF\xBD\x9C"
                          "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                          "<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|>", "</s>"}) {
    const size_t at = out.find(end);
    if (at != std::string::npos) out.resize(at);
  }
  return out;
}

struct Streamed {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  int arg_fragments = 0;  // kToolArgs events
};

// Feeds `text` byte by byte and reassembles the events, as a streaming client does.
Streamed Stream(const OutputOptions& o, const std::string& text, OutputParser* final_parser) {
  OutputParser p(o);
  Streamed s;
  auto take = [&](const std::vector<OutputEvent>& ev) {
    for (const OutputEvent& e : ev) {
      switch (e.kind) {
        case OutputEvent::kReasoning:
          s.reasoning += e.text;
          break;
        case OutputEvent::kContent:
          s.content += e.text;
          break;
        case OutputEvent::kToolStart:
          ASSERT_EQ(static_cast<size_t>(e.index), s.calls.size());
          s.calls.push_back({e.name, ""});
          break;
        case OutputEvent::kToolArgs:
          ASSERT_LT(static_cast<size_t>(e.index), s.calls.size());
          s.calls[e.index].arguments += e.text;
          ++s.arg_fragments;
          break;
      }
    }
  };
  for (char c : text) take(p.Push(std::string_view(&c, 1)));
  take(p.Finish());
  if (final_parser) *final_parser = p;
  return s;
}

// The call `text` holds parses (whole and streamed) as get_weather with `args`.
void ExpectCall(ToolFormat f, const std::string& text, const ojson& args) {
  SCOPED_TRACE(std::string(ToolFormatName(f)) + ": " + text);
  ToolParse tp = ParseToolCalls(f, text, true);
  EXPECT_TRUE(tp.error.empty()) << tp.error;
  ASSERT_EQ(tp.calls.size(), 1u);
  EXPECT_EQ(tp.calls[0].name, "get_weather");
  EXPECT_EQ(ojson::parse(tp.calls[0].arguments), args);
  OutputOptions o;
  o.parse_tools = true;
  o.format = f;
  o.tools_required = true;
  OutputParser whole(o);
  Streamed s = Stream(o, text, &whole);
  EXPECT_TRUE(whole.error().empty()) << whole.error();
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].name, "get_weather");
  EXPECT_EQ(s.calls[0].arguments, tp.calls[0].arguments);  // fragments reassemble exactly
  // Arguments stream as they are generated, not once the call is complete (what a server's
  // stream shows whenever it takes tokens one at a time). Llama 3's bare JSON call may name the
  // function after its parameters, so they are held until the object closes.
  if (f != ToolFormat::kLlama3) {
    EXPECT_GT(s.arg_fragments, 1);
  }
  EXPECT_EQ(s.content, whole.content());
}

TEST(ToolFormats, SharedTemplatesRenderCallsThatParseBack) {
  struct Case {
    const char* file;
    ToolFormat format;
    bool args_as_string;
  } cases[] = {
      {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", ToolFormat::kHermes, false},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", ToolFormat::kHermes, false},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolFormat::kLlama3, false},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", ToolFormat::kLlama3, false},
      {"meta-llama-Llama-3.3-70B-Instruct.jinja", ToolFormat::kLlama3, false},
      {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", ToolFormat::kDeepSeekR1, true},
      {"llama-cpp-deepseek-r1.jinja", ToolFormat::kDeepSeekR1, true},
      {"meetkai-functionary-medium-v3.1.jinja", ToolFormat::kFunctionaryV31, true},
      {"fireworks-ai-llama-3-firefunction-v2.jinja", ToolFormat::kFirefunction, true},
      {"CohereForAI-c4ai-command-r-plus-tool_use.jinja", ToolFormat::kCommandRPlus, false},
  };
  const ojson args = {{"city", "Paris"}, {"days", 2}};
  int n = 0;
  for (const Case& c : cases) {
    auto tmpl = ReadFileToString(kTemplates + c.file);
    if (!tmpl.ok()) GTEST_SKIP() << "shared templates absent: " << tmpl.status().ToString();
    SCOPED_TRACE(c.file);
    EXPECT_EQ(DetectToolFormat(*tmpl), c.format);
    const std::string text = AssistantText(*tmpl, c.args_as_string, args);
    ASSERT_FALSE(text.empty());
    ExpectCall(c.format, text, args);
    ++n;
  }
  EXPECT_EQ(n, 10);
  // A template without tool calls.
  auto gemma = ReadFileToString(kTemplates + "google-gemma-2-2b-it.jinja");
  if (gemma.ok()) {
    EXPECT_EQ(DetectToolFormat(*gemma), ToolFormat::kGeneric);
  }
}

// Formats without a shared template: minimal templates that write the assistant's calls the
// way each format's documentation shows.
TEST(ToolFormats, OtherFormatsRenderCallsThatParseBack) {
  struct Case {
    ToolFormat format;
    const char* tmpl;
  } cases[] = {
      {ToolFormat::kMistral,
       R"({%- for m in messages %}{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]{%- elif m.tool_calls %})"
       R"([TOOL_CALLS][{%- for c in m.tool_calls %}{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments|tojson }}, "id": "abcdef123"}{%- endfor %}]</s>)"
       R"({%- endif %}{%- endfor %})"},
      {ToolFormat::kMistralArgs,  // the newer [ARGS] form
       R"({%- for m in messages %}{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]{%- elif m.tool_calls %})"
       R"({%- for c in m.tool_calls %}[TOOL_CALLS]{{ c.function.name }}[ARGS]{{ c.function.arguments|tojson }}{%- endfor %}</s>)"
       R"({%- endif %}{%- endfor %})"},
      {ToolFormat::kDeepSeekV3,
       "{%- for m in messages %}{%- if m.role == 'user' %}<｜User｜>{{ m.content "
       "}}<｜Assistant｜>{%- elif m.tool_calls %}"
       "<｜tool▁calls▁begin｜>{%- for c in m.tool_calls %}<｜tool▁call▁begin｜>{{ c.function.name "
       "}}<｜tool▁sep｜>"
       "{{ c.function.arguments|tojson }}<｜tool▁call▁end｜>{%- endfor "
       "%}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
       "{%- endif %}{%- endfor %}"},
      {ToolFormat::kFunctionaryV32,
       R"({%- for m in messages %}{%- if m.role == 'user' %}<|start_header_id|>user<|end_header_id|>\n\n{{ m.content }}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n)"
       R"({%- elif m.tool_calls %}{%- for c in m.tool_calls %}>>>{{ c.function.name }}\n{{ c.function.arguments|tojson }}{%- endfor %}<|eot_id|>{%- endif %}{%- endfor %})"},
      {ToolFormat::kCommandR7B,
       R"({%- for m in messages %}{%- if m.role == 'user' %}<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{{ m.content }}<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>)"
       R"({%- elif m.tool_calls %}<|START_THINKING|>I will look it up.<|END_THINKING|><|START_ACTION|>[{%- for c in m.tool_calls %})"
       R"({"tool_call_id": "{{ loop.index0 }}", "tool_name": "{{ c.function.name }}", "parameters": {{ c.function.arguments|tojson }}}{%- endfor %}]<|END_ACTION|><|END_OF_TURN_TOKEN|>)"
       R"({%- endif %}{%- endfor %})"},
  };
  const ojson args = {{"city", "Paris"}, {"days", 2}};
  for (const Case& c : cases) {
    std::string tmpl = c.tmpl;
    std::string unescaped;  // "\\n" in the raw strings above is a newline
    for (size_t i = 0; i < tmpl.size(); ++i) {
      if (tmpl[i] == '\\' && i + 1 < tmpl.size() && tmpl[i + 1] == 'n') {
        unescaped += '\n';
        ++i;
      } else {
        unescaped += tmpl[i];
      }
    }
    tmpl = unescaped;
    SCOPED_TRACE(ToolFormatName(c.format));
    EXPECT_EQ(DetectToolFormat(tmpl), c.format);
    std::string text = AssistantText(tmpl, false, args);
    if (c.format == ToolFormat::kCommandR7B) {
      // The reasoning block precedes the action: the output parser takes it apart.
      OutputOptions o;
      o.parse_tools = true;
      o.format = c.format;
      o.think_open = "<|START_THINKING|>";
      o.think_close = "<|END_THINKING|>";
      OutputParser whole(o);
      Streamed s = Stream(o, text, &whole);
      EXPECT_EQ(s.reasoning, "I will look it up.");
      ASSERT_EQ(s.calls.size(), 1u);
      EXPECT_EQ(ojson::parse(s.calls[0].arguments), args);
      text = text.substr(text.find("<|START_ACTION|>"));
    }
    ExpectCall(c.format, text, args);
  }
}

TEST(ToolFormats, TextAroundCallsParallelCallsAndAutoMode) {
  // Hermes: text before, two calls.
  const std::string two =
      "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
      "<tool_call>\n{\"arguments\": {\"y\": [1, 2]}, \"name\": \"b\"}\n</tool_call>";
  ToolParse tp = ParseToolCalls(ToolFormat::kHermes, two, true);
  ASSERT_EQ(tp.calls.size(), 2u);
  EXPECT_EQ(tp.content, "Let me check.\n");
  EXPECT_EQ(tp.calls[1].name, "b");
  EXPECT_EQ(tp.calls[1].arguments, "{\"y\": [1, 2]}");
  OutputOptions o;
  o.parse_tools = true;
  o.format = ToolFormat::kHermes;
  OutputParser whole(o);
  Streamed s = Stream(o, two, &whole);
  ASSERT_EQ(s.calls.size(), 2u);
  EXPECT_EQ(s.calls[0].arguments, "{\"x\": 1}");
  EXPECT_EQ(s.calls[1].arguments, "{\"y\": [1, 2]}");
  EXPECT_EQ(s.content, "Let me check.\n");
  // Auto mode: a broken call is text; required mode: an error.
  const std::string broken =
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": }\n</tool_call>";
  OutputParser autop(o);
  autop.Push(broken);
  autop.Finish();
  EXPECT_TRUE(autop.error().empty());
  EXPECT_EQ(autop.content(), broken);
  o.tools_required = true;
  OutputParser req(o);
  req.Push("Sure, the weather is nice.");
  req.Finish();
  EXPECT_FALSE(req.error().empty());
  // Llama 3 with the python tag, built-in call form.
  ToolParse py = ParseToolCalls(ToolFormat::kLlama3,
                                "<|python_tag|>brave_search.call(query=\"weather Paris\")", true);
  ASSERT_EQ(py.calls.size(), 1u);
  EXPECT_EQ(py.calls[0].name, "brave_search");
  EXPECT_EQ(ojson::parse(py.calls[0].arguments)["query"], "weather Paris");
  // Functionary v3.2: text, then a call.
  ToolParse fv = ParseToolCalls(ToolFormat::kFunctionaryV32,
                                "all\nI'll check.>>>get_weather\n{\"city\": \"Paris\"}", true);
  EXPECT_EQ(fv.content, "I'll check.");
  ASSERT_EQ(fv.calls.size(), 1u);
  // Generic: a bare JSON answer from a model without a tool template.
  ToolParse gj = ParseToolCalls(ToolFormat::kGeneric,
                                "```json\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n```", true);
  ASSERT_EQ(gj.calls.size(), 1u);
  EXPECT_EQ(gj.calls[0].name, "f");
}

TEST(ToolFormats, GrammarOfEachFormatProducesCallsTheParserReads) {
  std::vector<ToolSpec> tools(2);
  tools[0].name = "get_weather";
  tools[0].parameters =
      ojson::parse(R"({"type":"object","properties":{"city":{"type":"string","maxLength":12},
      "unit":{"enum":["c","f"]}},"required":["city"],"additionalProperties":false})");
  tools[1].name = "add";
  tools[1].parameters = ojson::parse(R"({"type":"object","properties":{"a":{"type":"integer"},
      "b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false})");
  for (ToolFormat f :
       {ToolFormat::kGeneric, ToolFormat::kHermes, ToolFormat::kLlama3, ToolFormat::kMistral,
        ToolFormat::kMistralArgs, ToolFormat::kDeepSeekR1, ToolFormat::kDeepSeekV3,
        ToolFormat::kFunctionaryV32, ToolFormat::kFunctionaryV31, ToolFormat::kCommandR7B,
        ToolFormat::kCommandRPlus, ToolFormat::kFirefunction}) {
    SCOPED_TRACE(ToolFormatName(f));
    auto text = ToolCallGrammar(f, tools, /*parallel=*/true);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    auto g = testing::MustParse(*text);
    ASSERT_TRUE(g);
    for (uint64_t seed = 0; seed < 8; ++seed) {
      const std::string out = testing::RandomSentence(g, seed);
      ToolParse tp = ParseToolCalls(f, out, true);
      EXPECT_TRUE(tp.error.empty()) << tp.error << "\n" << out;
      ASSERT_FALSE(tp.calls.empty()) << out;
      for (const ToolCall& c : tp.calls) {
        ojson a = ojson::parse(c.arguments, nullptr, false);
        ASSERT_TRUE(a.is_object()) << out;
        if (c.name == "add") {
          EXPECT_TRUE(a["a"].is_number_integer() && a["b"].is_number_integer()) << out;
        } else {
          ASSERT_EQ(c.name, "get_weather") << out;
          EXPECT_TRUE(a["city"].is_string()) << out;
        }
      }
    }
  }
}

TEST(Reasoning, ThinkBlocksSplitWhenStreamed) {
  OutputOptions o;
  const std::string text = "<think>\nPlan: add.\n</think>\n\nThe answer is 4.";
  OutputParser whole(o);
  Streamed s = Stream(o, text, &whole);
  EXPECT_EQ(s.reasoning, "\nPlan: add.\n");
  EXPECT_EQ(s.content, "The answer is 4.");
  EXPECT_EQ(whole.reasoning(), s.reasoning);
  // The prompt opened the block (DeepSeek-R1's template ends with "<think>\n").
  o.thinking_open = true;
  Streamed open = Stream(o, "a < b </thin>k</think>Done", nullptr);
  EXPECT_EQ(open.reasoning, "a < b </thin>k");
  EXPECT_EQ(open.content, "Done");
  // --reasoning-format none: all of it is text.
  o.split_reasoning = false;
  EXPECT_EQ(Stream(o, text, nullptr).content, text);
}

}  // namespace
}  // namespace substrate::serve
