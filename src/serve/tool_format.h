// Tool calls in the formats real chat templates teach their models: which format a template
// uses, the grammar that makes a model write well-formed calls in it (tool_choice required or
// a named tool, and after a trigger in auto mode), and the parser that turns the model's text
// back into calls — also on partial text, for streaming.
//
// clang-format off
//   kHermes          <tool_call>{"name": .., "arguments": {..}}</tool_call>  (Hermes 2 Pro, Qwen 2.5/3)
//   kLlama3          {"name": .., "parameters": {..}}, or <|python_tag|>...  (Llama 3.1/3.2/3.3)
//   kMistral         [TOOL_CALLS][{"name": .., "arguments": {..}}]
//   kMistralArgs     [TOOL_CALLS]name[ARGS]{..}  (templates that teach [ARGS]; both are read)
//   kDeepSeekR1      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name
//                    ```json {..} ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   kDeepSeekV3      <｜tool▁call▁begin｜>name<｜tool▁sep｜>{..}<｜tool▁call▁end｜>  (V3.1)
//   kFunctionaryV32  >>>name\n{..}  (>>>all\ntext for text)
//   kFunctionaryV31  <function=name>{..}</function>
//   kCommandR7B      <|START_ACTION|>[{"tool_call_id": "0", "tool_name": .., "parameters": {..}}]<|END_ACTION|>
//   kCommandRPlus    Action:\n```json\n[{"tool_name": .., "parameters": {..}}]\n```
//   kFirefunction    functools[{"name": .., "arguments": {..}}]
//   kGeneric         templates without tool support: the tools are described in the system
//                    message and calls are written as kHermes; any bare {"name", "arguments"}
//                    object (or {"tool_calls": [...]}) is also read as a call.
// clang-format on
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace substrate::serve {

enum class ToolFormat {
  kGeneric,
  kHermes,
  kLlama3,
  kMistral,
  kMistralArgs,
  kDeepSeekR1,
  kDeepSeekV3,
  kFunctionaryV32,
  kFunctionaryV31,
  kCommandR7B,
  kCommandRPlus,
  kFirefunction,
};

const char* ToolFormatName(ToolFormat f);
// The format a chat template's source teaches (kGeneric when it renders no tool calls).
ToolFormat DetectToolFormat(std::string_view template_source);

struct ToolSpec {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();  // a JSON schema
};

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text of the arguments object, as the model wrote it
};

// The grammar of a tool-call section in format `f`: one call (or, with `parallel`, one or
// more) of the tools given, arguments valid against their schemas. `prefix` (grammar text, may
// be empty) comes first, e.g. a reasoning block. Fails naming a schema keyword outside the
// supported subset.
Expected<std::string> ToolCallGrammar(ToolFormat f, const std::vector<ToolSpec>& tools,
                                      bool parallel, const std::string& prefix = "");

// Texts that start a tool-call section in format `f` (auto mode constrains from there on).
std::vector<std::string> ToolCallTriggers(ToolFormat f);

struct ToolParse {
  std::string content;          // text outside the calls (markers removed)
  std::vector<ToolCall> calls;  // complete calls
  // Partial text only: the call being written, when its name is known; `arguments` is then a
  // prefix of what the complete call's arguments will be.
  bool has_partial = false;
  ToolCall partial;
  // Final text only: a call section that does not parse (what is wrong).
  std::string error;
};

// Parses model output. final == false: `text` may still grow, and everything returned is a
// prefix of what the parse of any longer text returns (content is held back where it could
// turn into a call).
ToolParse ParseToolCalls(ToolFormat f, std::string_view text, bool final);

}  // namespace substrate::serve
