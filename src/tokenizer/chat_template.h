// Chat templates: renders a model's `tokenizer.chat_template` (Jinja) exactly as Hugging Face
// `transformers` does with Python's jinja2 — trim_blocks, lstrip_blocks, loop controls, its own
// `tojson` (ensure_ascii=False), `raise_exception(msg)` and `strftime_now(fmt)` — so the prompt
// bytes (and hence the tokens) match the reference implementation.
//
// Errors: a template that refuses a conversation (raise_exception), or fails the way Python
// would ("'NoneType' object is not iterable", "'x' is undefined"), yields a Status whose
// message is exactly Python's message. Malformed templates give a syntax error naming the
// line. Hostile templates are bounded (steps, recursion depth, string sizes).
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/jinja/evaluator.h"

namespace substrate {

struct TemplateOptions {
  // The clock behind strftime_now(); unset means the local time at render.
  std::function<std::tm()> now;
  // As transformers: `tools` and `documents` are None and `add_generation_prompt` is false
  // when the context does not give them (templates tell "no tools" by `tools is none`).
  bool transformers_defaults = true;
  jinja::RenderLimits limits;
};

// A parsed template: parse once (e.g. at model load), render per request. Thread-safe to
// render concurrently.
class ChatTemplate {
 public:
  static Expected<ChatTemplate> Parse(const std::string& source);
  // context: a JSON object whose keys become template variables: messages, tools,
  // add_generation_prompt, bos_token, eos_token, ... Use ordered_json: dict order is printed.
  Expected<std::string> Render(const nlohmann::ordered_json& context, const TemplateOptions& opts = {}) const;

 private:
  std::shared_ptr<const jinja::Body> body_;
};

Expected<std::string> RenderChatTemplate(const std::string& tmpl, const nlohmann::ordered_json& context,
                                         const TemplateOptions& opts = {});

// "2026-11-29T12:00:00" (also with a space or without seconds) as a local broken-down time,
// for TemplateOptions::now.
Expected<std::tm> ParseDateTime(const std::string& text);

}  // namespace substrate
