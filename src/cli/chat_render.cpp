// RenderChat: the model's chat template (tokenizer.chat_template, Jinja) applied to a
// conversation, the way transformers renders it.
#include <string>

#include "cli/generation_flags.h"
#include "tokenizer/chat_template.h"

namespace substrate::cli {

Expected<std::string> RenderChat(const Engine& e, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) {
  const std::string tmpl = e.metadata().GetString("tokenizer.chat_template", "");
  if (tmpl.empty()) return InvalidArgument("model has no chat template (tokenizer.chat_template)");
  nlohmann::ordered_json ctx;
  ctx["messages"] = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages)
    ctx["messages"].push_back({{"role", m.role}, {"content", m.content}});
  ctx["add_generation_prompt"] = add_generation_prompt;
  if (const Tokenizer* tok = e.tokenizer()) {
    ctx["bos_token"] = tok->bos() >= 0 ? tok->Piece(tok->bos()) : "";
    ctx["eos_token"] = tok->eos() >= 0 ? tok->Piece(tok->eos()) : "";
  }
  auto out = RenderChatTemplate(tmpl, ctx);
  if (!out.ok()) return out.status().WithContext("chat template");
  return out;
}

}  // namespace substrate::cli
