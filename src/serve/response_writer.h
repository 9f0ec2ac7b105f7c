// Answers in each API's own shape: the non-streaming body (one or n choices, with reasoning
// and tool calls), and the server-sent events of a streamed answer built from OutputParser's
// events — OpenAI chunks (content, reasoning_content, tool_calls deltas with argument
// fragments), Anthropic content blocks (text, thinking, tool_use with input_json_delta).
#pragma once

#include <string>
#include <vector>

#include "serve/output_parser.h"
#include "serve/protocol.h"

namespace substrate::serve {

struct ChoiceResult {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> calls;
  Finish finish = Finish::kLength;
  std::string stop_sequence;
  bool has_logprobs = false;
  std::vector<StepLogprobs> logprobs;
};

// A fresh tool-call id in the API's style ("call_..", "toolu_..").
std::string NewToolCallId(Api api);

// The non-streaming body.
std::string ChoicesBody(Api api, const CompletionInfo& info,
                        const std::vector<ChoiceResult>& choices);

// One streamed response (n choices for OpenAI, one for Anthropic). Each method returns complete
// SSE events, ready to write.
class StreamWriter {
 public:
  StreamWriter(Api api, CompletionInfo info, int n_choices);

  std::string Start();
  // `lps`: log-probabilities of the tokens behind these events (nullptr when not asked for);
  // text_offset: bytes of completion text before them (completions' text_offset).
  std::string Events(int choice, const std::vector<OutputEvent>& events,
                     const std::vector<StepLogprobs>* lps = nullptr, size_t text_offset = 0);
  // The end of one choice.
  std::string EndChoice(int choice, Finish finish, const std::string& stop_sequence,
                        bool tool_calls);
  // The end of the response (after every choice ended); `info` carries the final usage.
  std::string Done(const CompletionInfo& info, bool include_usage);

 private:
  struct Choice {
    int block = -1;  // Anthropic: the open content block's index (-1: none)
    OutputEvent::Kind kind = OutputEvent::kContent;
    int tool = -1;                 // the tool call the open block holds
    std::vector<std::string> ids;  // tool-call ids by call index
  };
  std::string OpenAIChunk(int choice, const nlohmann::json& delta, const nlohmann::json& logprobs);
  std::string CloseBlock(Choice& c);

  Api api_;
  CompletionInfo info_;
  std::vector<Choice> choices_;
  int next_block_ = 0;
  bool anthropic_stopped_ = false;
  std::string stop_reason_;
  std::string stop_sequence_;
};

}  // namespace substrate::serve
