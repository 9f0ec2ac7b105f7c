// Chat request parsing beyond plain text: messages with tool calls and tool results (OpenAI)
// or content blocks (Anthropic), tools and tool_choice, response_format and grammar, all
// normalized into GenerationRequest (messages in the shape chat templates take).
#include <cstdlib>
#include <map>

#include "serve/protocol_reader.h"

namespace substrate::serve {

namespace {

// Content as a plain string: a string, or an array of text parts ({"type":"text","text":..}).
bool ContentText(Reader& r, const json& content, const std::string& where, std::string* out) {
  if (content.is_null()) return true;
  if (content.is_string()) {
    *out = content.get<std::string>();
    return true;
  }
  if (!content.is_array())
    return r.WrongType(where, "a string or an array of text blocks", content);
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    std::string at = where + "[" + std::to_string(i) + "]";
    if (!part.is_object()) return r.WrongType(at, "an object", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string())
      return r.Fail("missing required field '" + at + ".type'", at + ".type");
    if (*type != "text")
      return r.Fail("unsupported content type '" + type->get<std::string>() + "' in " + at +
                        " (only text is supported)",
                    at + ".type");
    auto text = part.find("text");
    if (text == part.end() || !text->is_string())
      return r.Fail("'" + at + ".text' must be a string", at + ".text");
    out->append(text->get<std::string>());
  }
  return true;
}

bool ValidToolName(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-' || c == '.'))
      return false;
  return true;
}

// A tool call's arguments for the template: the object (templates print it with tojson);
// OpenAI sends it as a JSON string.
bool Arguments(Reader& r, const json& v, const std::string& at, json* out) {
  if (v.is_object()) {
    *out = v;
    return true;
  }
  if (v.is_string()) {
    json parsed = json::parse(v.get<std::string>(), nullptr, false);
    if (parsed.is_object()) {
      *out = std::move(parsed);
      return true;
    }
    if (v.get<std::string>().empty()) {
      *out = json::object();
      return true;
    }
  }
  return r.Fail("'" + at + "' must be a JSON object (or a string holding one)", at);
}

// Anthropic tool_result content: a string or text blocks.
bool ResultText(Reader& r, const json& c, const std::string& at, std::string* out) {
  return ContentText(r, c, at, out);
}

bool OpenAIMessage(Reader& r, const json& m, const std::string& at, json* out,
                   std::map<std::string, std::string>* names) {
  auto role = m.find("role");
  if (role == m.end() || role->is_null())
    return r.Fail("missing required field '" + at + ".role'", at + ".role");
  if (!role->is_string()) return r.WrongType(at + ".role", "a string", *role);
  const std::string rs = role->get<std::string>();
  if (rs != "system" && rs != "developer" && rs != "user" && rs != "assistant" && rs != "tool")
    return r.Fail("unknown role '" + rs + "' in " + at + ".role", at + ".role");
  auto content = m.find("content");
  const bool has_calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
  if ((content == m.end() || content->is_null()) && rs != "assistant")
    return r.Fail("missing required field '" + at + ".content'", at + ".content");
  std::string text;
  if (content != m.end() && !ContentText(r, *content, at + ".content", &text)) return false;
  // Chat templates know "system"; OpenAI's newer "developer" role means the same.
  json msg = {{"role", rs == "developer" ? "system" : rs}, {"content", text}};
  if (rs == "assistant" && has_calls) {
    const json& calls = m["tool_calls"];
    if (!calls.is_array()) return r.WrongType(at + ".tool_calls", "an array", calls);
    json out_calls = json::array();
    for (size_t k = 0; k < calls.size(); ++k) {
      const std::string ct = at + ".tool_calls[" + std::to_string(k) + "]";
      const json& c = calls[k];
      if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
        return r.Fail("'" + ct + "' must be {\"id\", \"type\": \"function\", \"function\": {...}}",
                      ct);
      const json& f = c["function"];
      if (!f.contains("name") || !f["name"].is_string())
        return r.Fail("missing required field '" + ct + ".function.name'", ct + ".function.name");
      json args = json::object();
      if (f.contains("arguments") &&
          !Arguments(r, f["arguments"], ct + ".function.arguments", &args))
        return false;
      const std::string id = c.value("id", "call_" + std::to_string(k));
      (*names)[id] = f["name"].get<std::string>();
      out_calls.push_back({{"id", id},
                           {"type", "function"},
                           {"function", {{"name", f["name"]}, {"arguments", args}}}});
    }
    msg["tool_calls"] = out_calls;
    if (text.empty()) msg["content"] = nullptr;
  }
  if (rs == "tool") {
    std::string id;
    if (m.contains("tool_call_id") && m["tool_call_id"].is_string()) id = m["tool_call_id"];
    msg["tool_call_id"] = id;
    auto n = names->find(id);
    if (n != names->end())
      msg["name"] = n->second;
    else if (m.contains("name") && m["name"].is_string())
      msg["name"] = m["name"];
  }
  out->push_back(std::move(msg));
  return true;
}

bool AnthropicMessage(Reader& r, const json& m, const std::string& at, json* out,
                      std::map<std::string, std::string>* names) {
  auto role = m.find("role");
  if (role == m.end() || role->is_null())
    return r.Fail("missing required field '" + at + ".role'", at + ".role");
  if (!role->is_string()) return r.WrongType(at + ".role", "a string", *role);
  const std::string rs = role->get<std::string>();
  if (rs != "user" && rs != "assistant")
    return r.Fail("unknown role '" + rs + "' in " + at + ".role", at + ".role");
  auto content = m.find("content");
  if (content == m.end() || content->is_null())
    return r.Fail("missing required field '" + at + ".content'", at + ".content");
  if (content->is_string()) {
    out->push_back({{"role", rs}, {"content", content->get<std::string>()}});
    return true;
  }
  if (!content->is_array())
    return r.WrongType(at + ".content", "a string or an array of blocks", *content);
  std::string text;
  json calls = json::array();
  for (size_t i = 0; i < content->size(); ++i) {
    const json& b = (*content)[i];
    const std::string bt = at + ".content[" + std::to_string(i) + "]";
    if (!b.is_object()) return r.WrongType(bt, "an object", b);
    if (!b.contains("type") || !b["type"].is_string())
      return r.Fail("missing required field '" + bt + ".type'", bt + ".type");
    const std::string type = b["type"];
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string())
        return r.Fail("'" + bt + ".text' must be a string", bt + ".text");
      text += b["text"].get<std::string>();
    } else if (type == "tool_use" && rs == "assistant") {
      if (!b.contains("name") || !b["name"].is_string())
        return r.Fail("missing required field '" + bt + ".name'", bt + ".name");
      json input = json::object();
      if (b.contains("input") && !Arguments(r, b["input"], bt + ".input", &input)) return false;
      const std::string id = b.value("id", "toolu_" + std::to_string(i));
      (*names)[id] = b["name"].get<std::string>();
      calls.push_back({{"id", id},
                       {"type", "function"},
                       {"function", {{"name", b["name"]}, {"arguments", input}}}});
    } else if (type == "tool_result" && rs == "user") {
      std::string result;
      if (b.contains("content") && !ResultText(r, b["content"], bt + ".content", &result))
        return false;
      if (b.value("is_error", false)) result = "Error: " + result;
      const std::string id = b.value("tool_use_id", "");
      json msg = {{"role", "tool"}, {"tool_call_id", id}, {"content", result}};
      if (auto n = names->find(id); n != names->end()) msg["name"] = n->second;
      out->push_back(std::move(msg));
    } else if ((type == "thinking" || type == "redacted_thinking") && rs == "assistant") {
      // Earlier reasoning is not shown to the model again (as the templates of thinking models
      // drop it from history).
    } else {
      return r.Fail("unsupported content block type '" + type + "' in " + bt +
                        (rs == "user" ? " (supported: text, tool_result)"
                                      : " (supported: text, tool_use, thinking)"),
                    bt + ".type");
    }
  }
  if (rs == "assistant") {
    json msg = {{"role", "assistant"}, {"content", text}};
    if (!calls.empty()) {
      msg["tool_calls"] = calls;
      if (text.empty()) msg["content"] = nullptr;
    }
    out->push_back(std::move(msg));
  } else if (!text.empty() || out->empty() || out->back()["role"] != "tool") {
    out->push_back({{"role", "user"}, {"content", text}});
  }
  return true;
}

bool ParseTools(Reader& r, const nlohmann::ordered_json& ordered, bool anthropic,
                GenerationRequest* out) {
  const json* tools = r.Find("tools");
  if (!tools) return true;
  if (!tools->is_array()) return r.WrongType("tools", "an array", *tools);
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return r.WrongType(at, "an object", t);
    ToolSpec spec;
    const json* f = &t;
    if (!anthropic) {
      if (t.value("type", "function") != "function")
        return r.Fail("unsupported tool type in " + at + " (only \"function\")", at + ".type");
      if (!t.contains("function") || !t["function"].is_object())
        return r.Fail("missing required field '" + at + ".function'", at + ".function");
      f = &t["function"];
    } else if (t.contains("type") && t["type"].is_string() && t["type"] != "custom") {
      return r.Fail("unsupported tool type '" + t["type"].get<std::string>() + "' in " + at +
                        " (only client tools with an input_schema)",
                    at + ".type");
    }
    if (!f->contains("name") || !(*f)["name"].is_string() ||
        !ValidToolName((*f)["name"].get<std::string>()))
      return r.Fail("'" + at + ".name' must be 1-64 letters, digits, '_', '-' or '.'",
                    at + ".name");
    spec.name = (*f)["name"];
    if (f->contains("description") && (*f)["description"].is_string())
      spec.description = (*f)["description"];
    const char* schema_key = anthropic ? "input_schema" : "parameters";
    if (f->contains(schema_key) && !(*f)[schema_key].is_null()) {
      if (!(*f)[schema_key].is_object())
        return r.WrongType(at + "." + schema_key, "a JSON schema object", (*f)[schema_key]);
      // The schema as written (key order kept), from the ordered parse of the same body.
      const auto& ot = ordered["tools"][i];
      spec.parameters = anthropic ? ot[schema_key] : ot["function"][schema_key];
    } else if (anthropic) {
      return r.Fail("missing required field '" + at + ".input_schema'", at + ".input_schema");
    }
    for (const ToolSpec& other : out->tools)
      if (other.name == spec.name)
        return r.Fail("two tools named '" + spec.name + "'", at + ".name");
    out->tools.push_back(std::move(spec));
  }
  return true;
}

bool HasTool(const GenerationRequest& g, const std::string& name) {
  for (const ToolSpec& t : g.tools)
    if (t.name == name) return true;
  return false;
}

bool ParseToolChoice(Reader& r, bool anthropic, GenerationRequest* out) {
  const json* c = r.Find("tool_choice");
  if (!c) return true;
  std::string type, name;
  if (c->is_string()) {
    type = c->get<std::string>();
  } else if (c->is_object()) {
    type = c->value("type", "");
    if (anthropic) {
      name = c->value("name", "");
      if (c->value("disable_parallel_tool_use", false)) out->parallel_tool_calls = false;
    } else if (c->contains("function") && (*c)["function"].is_object()) {
      name = (*c)["function"].value("name", "");
    }
  } else {
    return r.WrongType("tool_choice", "a string or an object", *c);
  }
  if (anthropic ? type == "auto" : type == "auto")
    out->tool_choice = ToolChoice::kAuto;
  else if (type == "none")
    out->tool_choice = ToolChoice::kNone;
  else if (anthropic ? type == "any" : type == "required")
    out->tool_choice = ToolChoice::kRequired;
  else if (anthropic ? type == "tool" : type == "function")
    out->tool_choice = ToolChoice::kNamed;
  else
    return r.Fail(
        "unknown tool_choice '" + type + "' (" +
            (anthropic ? "auto, any, tool, none" : "none, auto, required, or a function") + ")",
        "tool_choice");
  if (out->tool_choice == ToolChoice::kNamed) {
    if (!HasTool(*out, name))
      return r.Fail("tool_choice names '" + name + "', which is not among the tools",
                    "tool_choice");
    out->tool_choice_name = name;
  }
  if ((out->tool_choice == ToolChoice::kRequired || out->tool_choice == ToolChoice::kNamed) &&
      out->tools.empty())
    return r.Fail("tool_choice requires a tool call but no tools were given", "tool_choice");
  return true;
}

bool ParseFormat(Reader& r, const nlohmann::ordered_json& ordered, bool anthropic,
                 GenerationRequest* out) {
  if (!anthropic) {
    if (const json* rf = r.Find("response_format")) {
      if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
        return r.Fail(
            "'response_format' must be {\"type\": \"text\" | \"json_object\" | "
            "\"json_schema\", ...}",
            "response_format");
      const std::string type = (*rf)["type"];
      if (type == "json_object") {
        out->format = OutputFormat::kJsonObject;
      } else if (type == "json_schema") {
        const json* js = rf->contains("json_schema") ? &(*rf)["json_schema"] : nullptr;
        if (!js || !js->is_object() || !js->contains("schema"))
          return r.Fail("'response_format.json_schema.schema' is required for json_schema",
                        "response_format");
        out->format = OutputFormat::kJsonSchema;
        out->schema = ordered["response_format"]["json_schema"]["schema"];
      } else if (type != "text") {
        return r.Fail("unknown response_format type '" + type + "'", "response_format");
      }
    }
  }
  std::string grammar;
  if (!r.String("grammar", &grammar)) return false;
  if (!grammar.empty()) {
    if (out->format != OutputFormat::kText)
      return r.Fail("'grammar' and 'response_format' cannot be used together", "grammar");
    out->format = OutputFormat::kGrammar;
    out->grammar = std::move(grammar);
  }
  return true;
}

}  // namespace

bool ParseLogitBias(Reader& r, SamplingParams* out) {
  const json* lb = r.Find("logit_bias");
  if (!lb) return true;
  if (!lb->is_object()) return r.WrongType("logit_bias", "an object of token id -> bias", *lb);
  for (const auto& [k, v] : lb->items()) {
    char* end = nullptr;
    const long id = std::strtol(k.c_str(), &end, 10);
    if (k.empty() || *end != '\0' || id < 0 || id > INT32_MAX)
      return r.Fail("'logit_bias' keys must be token ids, got '" + k + "'", "logit_bias");
    if (!v.is_number() || v.get<double>() < -100 || v.get<double>() > 100)
      return r.Fail("'logit_bias' values must be numbers between -100 and 100", "logit_bias");
    out->logit_bias[static_cast<int32_t>(id)] = v.get<float>();
  }
  return true;
}

bool ParseChatBody(Reader& r, const json& body, const nlohmann::ordered_json& ordered,
                   bool anthropic, GenerationRequest* out) {
  if (!r.Require("messages")) return false;
  const json& msgs = body["messages"];
  if (!msgs.is_array()) return r.WrongType("messages", "an array", msgs);
  if (msgs.empty()) return r.Fail("'messages' must not be empty", "messages");
  out->messages = json::array();
  if (anthropic) {
    if (const json* sys = r.Find("system")) {
      std::string text;
      if (!ContentText(r, *sys, "system", &text)) return false;
      out->messages.push_back({{"role", "system"}, {"content", text}});
    }
  }
  std::map<std::string, std::string> names;  // tool call id -> tool name
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json& m = msgs[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return r.WrongType(at, "an object", m);
    if (!(anthropic ? AnthropicMessage(r, m, at, &out->messages, &names)
                    : OpenAIMessage(r, m, at, &out->messages, &names)))
      return false;
  }
  if (!r.Bool("parallel_tool_calls", &out->parallel_tool_calls)) return false;
  return ParseTools(r, ordered, anthropic, out) && ParseToolChoice(r, anthropic, out) &&
         ParseFormat(r, ordered, anthropic, out);
}

bool ParseCompletionFormat(Reader& r, const nlohmann::ordered_json& ordered,
                           GenerationRequest* out) {
  return ParseFormat(r, ordered, false, out);
}

nlohmann::ordered_json ToolsJson(const std::vector<ToolSpec>& tools) {
  using ojson = nlohmann::ordered_json;
  if (tools.empty()) return nullptr;
  ojson out = ojson::array();
  for (const ToolSpec& t : tools) {
    ojson f = {{"name", t.name}};
    if (!t.description.empty()) f["description"] = t.description;
    f["parameters"] = t.parameters.is_null() ? ojson::object() : t.parameters;
    out.push_back({{"type", "function"}, {"function", f}});
  }
  return out;
}

}  // namespace substrate::serve
