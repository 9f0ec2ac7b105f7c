// A model's answer split the way the APIs return it: reasoning (<think>...</think>, or the
// template's equivalent), text, and tool calls. Fed the text as it is generated, it returns
// events that are safe to stream — each a suffix of what the complete answer will contain, so
// the streamed pieces concatenate to the non-streamed answer exactly.
//
//   OutputParser p(options);
//   for (each piece of text) write(p.Push(piece));
//   write(p.Finish());
//   if (!p.error().empty()) ...  // tool_choice required and no well-formed call
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "serve/tool_format.h"

namespace substrate::serve {

struct OutputOptions {
  bool parse_tools = false;  // tools were offered (tool_choice other than none)
  ToolFormat format = ToolFormat::kGeneric;
  bool tools_required = false;  // no call is an error (tool_choice required / named)
  bool split_reasoning = true;  // false: --reasoning-format none (reasoning stays inline)
  bool thinking_open = false;   // the prompt ended inside a reasoning block
  std::string think_open = "<think>";
  std::string think_close = "</think>";
};

struct OutputEvent {
  enum Kind { kReasoning, kContent, kToolStart, kToolArgs };
  Kind kind = kContent;
  int index = 0;     // tool calls: which call (0, 1, ...)
  std::string text;  // reasoning/content text, or an arguments fragment
  std::string name;  // kToolStart: the tool's name
};

class OutputParser {
 public:
  explicit OutputParser(OutputOptions options) : o_(std::move(options)) {}

  std::vector<OutputEvent> Push(std::string_view text);
  // The end of the answer: what was held back, and the final split.
  std::vector<OutputEvent> Finish();

  // The whole answer, valid after Finish.
  const std::string& reasoning() const { return reasoning_; }
  const std::string& content() const { return content_; }
  const std::vector<ToolCall>& calls() const { return calls_; }
  // Set by Finish when tools were required and the answer holds no well-formed call.
  const std::string& error() const { return error_; }

 private:
  struct Split {
    std::string reasoning;
    std::string content;
    std::vector<ToolCall> calls;
    bool has_partial = false;
    ToolCall partial;
    std::string error;
  };
  Split Parse(bool final) const;
  std::vector<OutputEvent> Diff(const Split& s);

  OutputOptions o_;
  std::string text_;
  // What has been emitted.
  std::string reasoning_, content_;
  std::vector<ToolCall> calls_;  // complete or being written (the last one may be partial)
  size_t complete_calls_ = 0;
  std::string error_;
};

}  // namespace substrate::serve
