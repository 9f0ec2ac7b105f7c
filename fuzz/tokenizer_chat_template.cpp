// libFuzzer target: the chat-template engine (a Jinja subset) on arbitrary template sources,
// rendered over a conversation with a system prompt, tools, a tool call and its result. An input
// with a NUL byte is split there: the template, then a JSON context replacing the default one.
// Any crash, hang, UB or unbounded allocation is a bug; errors are expected.
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/chat_template.h"

namespace {

const nlohmann::ordered_json& DefaultContext() {
  static const nlohmann::ordered_json c = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "What is 2+2? <|im_end|> {{ x }}"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "c1",
        "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "4"},
      {"role": "assistant", "content": "4."}],
    "tools": [{"type": "function", "function": {"name": "add", "description": "adds",
      "parameters": {"type": "object", "properties": {"a": {"type": "number"},
      "b": {"type": "number"}}, "required": ["a", "b"]}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string source = input.substr(0, nul);
  nlohmann::ordered_json context = DefaultContext();
  if (nul != std::string::npos) {
    context =
        nlohmann::ordered_json::parse(input.substr(nul + 1), nullptr, /*allow_exceptions=*/false);
    if (context.is_discarded() || !context.is_object()) return 0;
  }
  auto tmpl = substrate::ChatTemplate::Parse(source);
  if (!tmpl.ok()) return 0;
  substrate::TemplateOptions opts;
  // Tight bounds, so that each input is quick: a template that loops forever or doubles a
  // string must stop at them with an error, never run away.
  opts.limits.max_steps = 200000;
  opts.limits.max_string_bytes = 1u << 20;
  opts.now = [] {
    std::tm t{};
    t.tm_year = 126;
    t.tm_mon = 10;
    t.tm_mday = 29;
    return t;
  };
  (void)tmpl->Render(context, opts);
  return 0;
}
