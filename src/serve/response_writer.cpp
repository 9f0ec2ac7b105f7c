#include "serve/response_writer.h"

#include "serve/stop_matcher.h"

namespace substrate::serve {

using nlohmann::json;

namespace {

const char* OpenAIFinish(Finish f, bool tool_calls) {
  if (f == Finish::kLength) return "length";
  return tool_calls ? "tool_calls" : "stop";
}

const char* AnthropicStop(Finish f, bool tool_calls) {
  if (tool_calls && f != Finish::kLength) return "tool_use";
  switch (f) {
    case Finish::kEndOfText:
      return "end_turn";
    case Finish::kStopSequence:
      return "stop_sequence";
    case Finish::kLength:
      return "max_tokens";
  }
  return "end_turn";
}

json OpenAIUsage(const CompletionInfo& i) {
  return {{"prompt_tokens", i.prompt_tokens},
          {"completion_tokens", i.completion_tokens},
          {"total_tokens", i.prompt_tokens + i.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", i.cached_tokens}}}};
}

// llama-server's `timings` (an extra field the SDKs ignore): prompt_n counts the prompt tokens
// actually evaluated, so a prompt-cache hit shows as a small prompt_n.
json Timings(const CompletionInfo& i) {
  return {{"prompt_n", i.prompt_tokens - i.cached_tokens},
          {"cache_n", i.cached_tokens},
          {"prompt_ms", i.prompt_seconds * 1e3},
          {"predicted_n", i.completion_tokens},
          {"predicted_ms", i.decode_seconds * 1e3}};
}

json AnthropicUsage(const CompletionInfo& i, int output_tokens) {
  return {{"input_tokens", i.prompt_tokens - i.cached_tokens},
          {"cache_read_input_tokens", i.cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"output_tokens", output_tokens}};
}

json OpenAIChunkBase(const CompletionInfo& i, const char* object) {
  return {{"id", i.id},
          {"object", object},
          {"created", i.created},
          {"model", i.model},
          {"system_fingerprint", "substrate"}};
}

// OpenAI's logprobs object for the tokens of one response or chunk: chat's "content" list, or
// completions' parallel lists (text_offset counts bytes of the completion from `offset`).
json LogprobsJson(Api api, const std::vector<StepLogprobs>* lps, size_t offset) {
  if (!lps) return nullptr;
  auto bytes = [](const std::string& b) {
    json a = json::array();
    for (unsigned char c : b) a.push_back(static_cast<int>(c));
    return a;
  };
  if (api == Api::kOpenAIChat) {
    json content = json::array();
    for (const StepLogprobs& s : *lps) {
      json top = json::array();
      for (const TokenLogprob& t : s.top)
        top.push_back(
            {{"token", SanitizeUtf8(t.bytes)}, {"logprob", t.logprob}, {"bytes", bytes(t.bytes)}});
      content.push_back({{"token", SanitizeUtf8(s.chosen.bytes)},
                         {"logprob", s.chosen.logprob},
                         {"bytes", bytes(s.chosen.bytes)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_lps = json::array(), tops = json::array(),
       offsets = json::array();
  for (const StepLogprobs& s : *lps) {
    tokens.push_back(SanitizeUtf8(s.chosen.bytes));
    token_lps.push_back(s.chosen.logprob);
    json top = json::object();
    for (const TokenLogprob& t : s.top) top[SanitizeUtf8(t.bytes)] = t.logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += s.chosen.bytes.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

std::string Data(const json& j) {
  return "data: " + j.dump() + "\n\n";
}
std::string Event(const char* name, const json& j) {
  return std::string("event: ") + name + "\ndata: " + j.dump() + "\n\n";
}

// The arguments as an object (Anthropic's tool_use input); {} when they do not parse.
json ArgumentsObject(const std::string& args) {
  json j = json::parse(args, nullptr, false);
  return j.is_object() ? j : json::object();
}

}  // namespace

std::string NewToolCallId(Api api) {
  std::string id = NewId(api);
  id = id.substr(id.find_first_of("-_") + 1);
  return (api == Api::kAnthropicMessages ? "toolu_" : "call_") + id;
}

std::string ChoicesBody(Api api, const CompletionInfo& i,
                        const std::vector<ChoiceResult>& choices) {
  switch (api) {
    case Api::kOpenAIChat:
    case Api::kOpenAICompletion: {
      const bool chat = api == Api::kOpenAIChat;
      json j = OpenAIChunkBase(i, chat ? "chat.completion" : "text_completion");
      json arr = json::array();
      for (size_t k = 0; k < choices.size(); ++k) {
        const ChoiceResult& c = choices[k];
        json choice = {{"index", k},
                       {"logprobs", LogprobsJson(api, c.has_logprobs ? &c.logprobs : nullptr, 0)},
                       {"finish_reason", OpenAIFinish(c.finish, !c.calls.empty())}};
        if (!chat) {
          choice["text"] = SanitizeUtf8(c.content);
        } else {
          json msg = {{"role", "assistant"}};
          msg["content"] =
              c.calls.empty() || !c.content.empty() ? json(SanitizeUtf8(c.content)) : json(nullptr);
          if (!c.reasoning.empty()) msg["reasoning_content"] = SanitizeUtf8(c.reasoning);
          if (!c.calls.empty()) {
            json calls = json::array();
            for (const ToolCall& t : c.calls)
              calls.push_back(
                  {{"id", NewToolCallId(api)},
                   {"type", "function"},
                   {"function", {{"name", t.name}, {"arguments", SanitizeUtf8(t.arguments)}}}});
            msg["tool_calls"] = calls;
          }
          choice["message"] = msg;
        }
        arr.push_back(choice);
      }
      j["choices"] = arr;
      j["usage"] = OpenAIUsage(i);
      j["timings"] = Timings(i);
      return j.dump();
    }
    case Api::kAnthropicMessages: {
      const ChoiceResult& c = choices.at(0);
      json content = json::array();
      if (!c.reasoning.empty())
        content.push_back(
            {{"type", "thinking"}, {"thinking", SanitizeUtf8(c.reasoning)}, {"signature", ""}});
      if (!c.content.empty() || c.calls.empty())
        content.push_back({{"type", "text"}, {"text", SanitizeUtf8(c.content)}});
      for (const ToolCall& t : c.calls)
        content.push_back({{"type", "tool_use"},
                           {"id", NewToolCallId(api)},
                           {"name", t.name},
                           {"input", ArgumentsObject(t.arguments)}});
      json j = {{"id", i.id},
                {"type", "message"},
                {"role", "assistant"},
                {"model", i.model},
                {"content", content},
                {"stop_reason", AnthropicStop(c.finish, !c.calls.empty())},
                {"stop_sequence",
                 c.finish == Finish::kStopSequence ? json(c.stop_sequence) : json(nullptr)},
                {"usage", AnthropicUsage(i, i.completion_tokens)},
                {"timings", Timings(i)}};
      return j.dump();
    }
  }
  return "{}";
}

StreamWriter::StreamWriter(Api api, CompletionInfo info, int n_choices)
    : api_(api), info_(std::move(info)), choices_(static_cast<size_t>(std::max(1, n_choices))) {}

std::string StreamWriter::OpenAIChunk(int choice, const json& delta, const json& logprobs) {
  const bool chat = api_ == Api::kOpenAIChat;
  json j = OpenAIChunkBase(info_, chat ? "chat.completion.chunk" : "text_completion");
  json c = {{"index", choice}, {"logprobs", logprobs}, {"finish_reason", nullptr}};
  if (chat)
    c["delta"] = delta;
  else
    c["text"] = delta.value("content", "");
  j["choices"] = json::array({c});
  return Data(j);
}

std::string StreamWriter::Start() {
  switch (api_) {
    case Api::kOpenAIChat: {
      std::string out;
      for (size_t k = 0; k < choices_.size(); ++k)
        out += OpenAIChunk(static_cast<int>(k), {{"role", "assistant"}, {"content", ""}}, nullptr);
      return out;
    }
    case Api::kOpenAICompletion:
      return "";
    case Api::kAnthropicMessages: {
      json msg = {{"id", info_.id},           {"type", "message"},
                  {"role", "assistant"},      {"model", info_.model},
                  {"content", json::array()}, {"stop_reason", nullptr},
                  {"stop_sequence", nullptr}, {"usage", AnthropicUsage(info_, 0)}};
      return Event("message_start", {{"type", "message_start"}, {"message", msg}});
    }
  }
  return "";
}

std::string StreamWriter::CloseBlock(Choice& c) {
  if (c.block < 0) return "";
  std::string out =
      Event("content_block_stop", {{"type", "content_block_stop"}, {"index", c.block}});
  c.block = -1;
  return out;
}

std::string StreamWriter::Events(int choice, const std::vector<OutputEvent>& events,
                                 const std::vector<StepLogprobs>* lps, size_t text_offset) {
  Choice& c = choices_.at(static_cast<size_t>(choice));
  std::string out;
  if (api_ != Api::kAnthropicMessages) {
    // Log-probabilities ride on the first chunk of these events (or on an empty one).
    json lp = LogprobsJson(api_, lps, text_offset);
    auto take_lp = [&] {
      json l = lp;
      lp = nullptr;
      return l;
    };
    for (const OutputEvent& e : events) {
      switch (e.kind) {
        case OutputEvent::kContent:
          out += OpenAIChunk(choice, {{"content", SanitizeUtf8(e.text)}}, take_lp());
          break;
        case OutputEvent::kReasoning:
          out += OpenAIChunk(choice, {{"reasoning_content", SanitizeUtf8(e.text)}}, take_lp());
          break;
        case OutputEvent::kToolStart: {
          if (c.ids.size() <= static_cast<size_t>(e.index))
            c.ids.resize(static_cast<size_t>(e.index) + 1);
          c.ids[e.index] = NewToolCallId(api_);
          json tc = {{"index", e.index},
                     {"id", c.ids[e.index]},
                     {"type", "function"},
                     {"function", {{"name", e.name}, {"arguments", ""}}}};
          out += OpenAIChunk(choice, {{"tool_calls", json::array({tc})}}, take_lp());
          break;
        }
        case OutputEvent::kToolArgs: {
          json tc = {{"index", e.index}, {"function", {{"arguments", SanitizeUtf8(e.text)}}}};
          out += OpenAIChunk(choice, {{"tool_calls", json::array({tc})}}, take_lp());
          break;
        }
      }
    }
    if (!lp.is_null()) out += OpenAIChunk(choice, {{"content", ""}}, lp);
    return out;
  }
  for (const OutputEvent& e : events) {
    const bool same = c.block >= 0 && c.kind == e.kind &&
                      (e.kind == OutputEvent::kContent || e.kind == OutputEvent::kReasoning ||
                       (e.kind == OutputEvent::kToolArgs && c.tool == e.index));
    if (!same && e.kind != OutputEvent::kToolArgs) {
      out += CloseBlock(c);
      c.block = next_block_++;
      c.kind = e.kind == OutputEvent::kToolStart ? OutputEvent::kToolArgs : e.kind;
      json block;
      if (e.kind == OutputEvent::kContent) {
        block = {{"type", "text"}, {"text", ""}};
      } else if (e.kind == OutputEvent::kReasoning) {
        block = {{"type", "thinking"}, {"thinking", ""}};
      } else {
        c.tool = e.index;
        block = {{"type", "tool_use"},
                 {"id", NewToolCallId(api_)},
                 {"name", e.name},
                 {"input", json::object()}};
      }
      out += Event("content_block_start",
                   {{"type", "content_block_start"}, {"index", c.block}, {"content_block", block}});
    } else if (!same) {
      continue;  // arguments of a call whose block is not open (cannot happen: starts come first)
    }
    json delta;
    if (e.kind == OutputEvent::kContent)
      delta = {{"type", "text_delta"}, {"text", SanitizeUtf8(e.text)}};
    else if (e.kind == OutputEvent::kReasoning)
      delta = {{"type", "thinking_delta"}, {"thinking", SanitizeUtf8(e.text)}};
    else if (e.kind == OutputEvent::kToolArgs)
      delta = {{"type", "input_json_delta"}, {"partial_json", SanitizeUtf8(e.text)}};
    else
      continue;  // a tool_use block opens with its name; arguments follow
    out += Event("content_block_delta",
                 {{"type", "content_block_delta"}, {"index", c.block}, {"delta", delta}});
  }
  return out;
}

std::string StreamWriter::EndChoice(int choice, Finish finish, const std::string& stop_sequence,
                                    bool tool_calls) {
  Choice& c = choices_.at(static_cast<size_t>(choice));
  if (api_ == Api::kAnthropicMessages) {
    std::string out;
    if (next_block_ == 0) {
      // No output at all: one empty text block, as clients expect a block.
      out += Event("content_block_start", {{"type", "content_block_start"},
                                           {"index", 0},
                                           {"content_block", {{"type", "text"}, {"text", ""}}}});
      c.block = next_block_++;
    }
    out += CloseBlock(c);
    stop_reason_ = AnthropicStop(finish, tool_calls);
    stop_sequence_ = finish == Finish::kStopSequence ? stop_sequence : "";
    anthropic_stopped_ = finish == Finish::kStopSequence;
    return out;
  }
  const bool chat = api_ == Api::kOpenAIChat;
  json j = OpenAIChunkBase(info_, chat ? "chat.completion.chunk" : "text_completion");
  json ch = {{"index", choice},
             {"logprobs", nullptr},
             {"finish_reason", OpenAIFinish(finish, tool_calls)}};
  if (chat)
    ch["delta"] = json::object();
  else
    ch["text"] = "";
  j["choices"] = json::array({ch});
  return Data(j);
}

std::string StreamWriter::Done(const CompletionInfo& info, bool include_usage) {
  if (api_ == Api::kAnthropicMessages) {
    json delta = {{"stop_reason", stop_reason_},
                  {"stop_sequence", anthropic_stopped_ ? json(stop_sequence_) : json(nullptr)}};
    return Event("message_delta", {{"type", "message_delta"},
                                   {"delta", delta},
                                   {"usage", {{"output_tokens", info.completion_tokens}}}}) +
           Event("message_stop", {{"type", "message_stop"}});
  }
  std::string out;
  if (include_usage) {
    json u = OpenAIChunkBase(
        info, api_ == Api::kOpenAIChat ? "chat.completion.chunk" : "text_completion");
    u["choices"] = json::array();
    u["usage"] = OpenAIUsage(info);
    u["timings"] = Timings(info);
    out += Data(u);
  }
  return out + "data: [DONE]\n\n";
}

}  // namespace substrate::serve
