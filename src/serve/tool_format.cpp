#include "serve/tool_format.h"

#include "serve/grammar.h"
#include "serve/json_schema.h"
#include "serve/tool_markers.h"

namespace substrate::serve {

using nlohmann::json;

const char* ToolFormatName(ToolFormat f) {
  switch (f) {
    case ToolFormat::kGeneric:
      return "generic";
    case ToolFormat::kHermes:
      return "hermes";
    case ToolFormat::kLlama3:
      return "llama3";
    case ToolFormat::kMistral:
      return "mistral";
    case ToolFormat::kMistralArgs:
      return "mistral-args";
    case ToolFormat::kDeepSeekR1:
      return "deepseek-r1";
    case ToolFormat::kDeepSeekV3:
      return "deepseek-v3";
    case ToolFormat::kFunctionaryV32:
      return "functionary-v3.2";
    case ToolFormat::kFunctionaryV31:
      return "functionary-v3.1";
    case ToolFormat::kCommandR7B:
      return "command-r7b";
    case ToolFormat::kCommandRPlus:
      return "command-r-plus";
    case ToolFormat::kFirefunction:
      return "firefunction";
  }
  return "generic";
}

ToolFormat DetectToolFormat(std::string_view src) {
  auto has = [&](std::string_view s) { return src.find(s) != std::string_view::npos; };
  if (has("<|START_ACTION|>")) return ToolFormat::kCommandR7B;
  if (has("[TOOL_CALLS]")) return has("[ARGS]") ? ToolFormat::kMistralArgs : ToolFormat::kMistral;
  if (has("tool▁call▁begin")) {
    return has("```json") ? ToolFormat::kDeepSeekR1 : ToolFormat::kDeepSeekV3;
  }
  if (has("<tool_call>")) return ToolFormat::kHermes;
  if (has(">>>")) return ToolFormat::kFunctionaryV32;
  if (has("<function=")) return ToolFormat::kFunctionaryV31;
  if (has("functools[")) return ToolFormat::kFirefunction;
  if (has("Action:") && has("tool_name")) return ToolFormat::kCommandRPlus;
  if (has("<|start_header_id|>") && (has("<|python_tag|>") || has("\"parameters\": ")))
    return ToolFormat::kLlama3;
  return ToolFormat::kGeneric;
}

std::vector<std::string> ToolCallTriggers(ToolFormat f) {
  switch (f) {
    case ToolFormat::kGeneric:
    case ToolFormat::kHermes:
      return {"<tool_call>"};
    case ToolFormat::kLlama3:
      return {"<|python_tag|>", "{\"name\""};
    case ToolFormat::kMistral:
    case ToolFormat::kMistralArgs:
      return {"[TOOL_CALLS]"};
    case ToolFormat::kDeepSeekR1:
    case ToolFormat::kDeepSeekV3:
      return {kDsCallsBegin, kDsCallBegin};
    case ToolFormat::kFunctionaryV32:
      return {">>>"};
    case ToolFormat::kFunctionaryV31:
      return {"<function="};
    case ToolFormat::kCommandR7B:
      return {"<|START_ACTION|>"};
    case ToolFormat::kCommandRPlus:
      return {"Action:"};
    case ToolFormat::kFirefunction:
      return {"functools["};
  }
  return {};
}

namespace {

std::string L(std::string_view s) {
  return GrammarLiteral(s);
}

}  // namespace

Expected<std::string> ToolCallGrammar(ToolFormat f, const std::vector<ToolSpec>& tools,
                                      bool parallel, const std::string& prefix) {
  if (tools.empty()) return InvalidArgument("tool calls need at least one tool");
  SchemaGrammar sg;
  // One alternative per tool: (name literal, arguments rule).
  std::vector<std::pair<std::string, std::string>> each;
  for (size_t i = 0; i < tools.size(); ++i) {
    nlohmann::ordered_json schema =
        tools[i].parameters.is_null() ? nlohmann::ordered_json::object() : tools[i].parameters;
    if (schema.is_object() && schema.empty()) schema = {{"type", "object"}};
    std::string prefix_name = "t";
    prefix_name += std::to_string(i);
    auto args = sg.Add(schema, prefix_name);
    if (!args.ok()) return args.status().WithContext("tool '" + tools[i].name + "'");
    each.push_back({tools[i].name, *args});
  }
  // item: one call of any tool, written by `one(name, args_rule)`.
  auto item = [&](auto one) {
    std::string body;
    for (const auto& [name, args] : each) body += (body.empty() ? "" : " | ") + one(name, args);
    return body;
  };
  auto quoted = [](const std::string& name) { return L(json(name).dump()); };
  std::string call, sep, open, close;
  switch (f) {
    case ToolFormat::kGeneric:
    case ToolFormat::kHermes:
      call = item([&](const std::string& n, const std::string& a) {
        return "( " + L("<tool_call>\n{\"name\": ") + " " + quoted(n) + " " +
               L(", \"arguments\": ") + " " + a + " " + L("}\n</tool_call>") + " )";
      });
      sep = L("\n");
      break;
    case ToolFormat::kLlama3:
      call = item([&](const std::string& n, const std::string& a) {
        return "( " + L("{\"name\": ") + " " + quoted(n) + " " + L(", \"parameters\": ") + " " + a +
               " " + L("}") + " )";
      });
      parallel = false;  // the templates take one call per turn
      break;
    case ToolFormat::kMistral:
      call = item([&](const std::string& n, const std::string& a) {
        return "( " + L("{\"name\": ") + " " + quoted(n) + " " + L(", \"arguments\": ") + " " + a +
               " " + L("}") + " )";
      });
      open = L("[TOOL_CALLS][");
      sep = L(", ");
      close = L("]");
      break;
    case ToolFormat::kMistralArgs:
      call = item([&](const std::string& n, const std::string& a) {
        return "( " + L("[TOOL_CALLS]" + n + "[ARGS]") + " " + a + " )";
      });
      break;
    case ToolFormat::kDeepSeekR1:
      call = item([&](const std::string& n, const std::string& a) {
        return "( " + L(kDsCallBegin + "function" + kDsSep + n + "\n```json\n") + " " + a + " " +
               L("\n```" + kDsCallEnd) + " )";
      });
      open = L(kDsCallsBegin) + "?";  // R1 distills sometimes start at the call's own marker
      sep = L("\n");
      close = L(kDsCallsEnd);
      break;
    case ToolFormat::kDeepSeekV3:
      call = item([&](const std::string& n, const std::string& a) {
        return "( " + L(kDsCallBegin + n + kDsSep) + " " + a + " " + L(kDsCallEnd) + " )";
      });
      open = L(kDsCallsBegin) + "?";
      close = L(kDsCallsEnd);
      break;
    case ToolFormat::kFunctionaryV32:
      call = item([&](const std::string& n, const std::string& a) {
        return "( " + L(n + "\n") + " " + a + " )";
      });
      open = L(">>>") + "?";
      sep = L(">>>");
      break;
    case ToolFormat::kFunctionaryV31:
      call = item([&](const std::string& n, const std::string& a) {
        return "( " + L("<function=" + n + ">") + " " + a + " " + L("</function>") + " )";
      });
      break;
    case ToolFormat::kCommandR7B:
      call = item([&](const std::string& n, const std::string& a) {
        return "( " + L("{\"tool_call_id\": \"") + " [0-9]{1,3} " + L("\", \"tool_name\": ") + " " +
               quoted(n) + " " + L(", \"parameters\": ") + " " + a + " " + L("}") + " )";
      });
      open = L("<|START_ACTION|>[");
      sep = L(", ");
      close = L("]<|END_ACTION|>");
      break;
    case ToolFormat::kCommandRPlus:
      call = item([&](const std::string& n, const std::string& a) {
        return "( " + L("{\"tool_name\": ") + " " + quoted(n) + " " + L(", \"parameters\": ") +
               " " + a + " " + L("}") + " )";
      });
      open = L("Action:\n```json\n[");
      sep = L(",\n");
      close = L("]\n```");
      break;
    case ToolFormat::kFirefunction:
      call = item([&](const std::string& n, const std::string& a) {
        return "( " + L("{\"name\": ") + " " + quoted(n) + " " + L(", \"arguments\": ") + " " + a +
               " " + L("}") + " )";
      });
      open = L(" functools[");
      sep = L(", ");
      close = L("]");
      break;
  }
  std::string calls = "tool-call";
  if (parallel) calls += " ( " + (sep.empty() ? std::string() : sep + " ") + "tool-call )*";
  std::string head = "root ::= " + (prefix.empty() ? "" : prefix + " ") + open + " " + calls + " " +
                     close + "\ntool-call ::= " + call;
  return sg.Text(head);
}

}  // namespace substrate::serve
