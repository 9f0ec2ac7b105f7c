// Chat template rendering: JSON context to Jinja values, transformers' globals, the engine.
#include "tokenizer/chat_template.h"

#include <cstdio>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/parser.h"

namespace substrate {

namespace {

using jinja::Value;

Value FromJson(const nlohmann::ordered_json& j, int depth) {
  if (depth > 256) return Value::None();  // nlohmann's own parser stops far earlier
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::None();
    case nlohmann::ordered_json::value_t::boolean: return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::Int(static_cast<int64_t>(u));
      return Value::Float(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::Str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJson(e, depth + 1));
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::NewDict();
      for (const auto& [k, v] : j.items()) d.dict().entries.emplace_back(Value::Str(k), FromJson(v, depth + 1));
      return d;
    }
    default: return Value::None();
  }
}

std::tm LocalNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

}  // namespace

Expected<ChatTemplate> ChatTemplate::Parse(const std::string& source) {
  ASSIGN_OR_RETURN(jinja::Body body, jinja::ParseTemplate(source));
  ChatTemplate t;
  t.body_ = std::make_shared<const jinja::Body>(std::move(body));
  return t;
}

Expected<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context, const TemplateOptions& opts) const {
  if (!context.is_object()) return InvalidArgument("chat template: the context must be a JSON object");
  auto globals = std::make_shared<jinja::DictData>();
  jinja::AddBuiltinGlobals(*globals);
  globals->Set(Value::Str("raise_exception"),
               Value::Function("raise_exception", [](jinja::Evaluator&, jinja::CallArgs& a) -> Expected<Value> {
                 return jinja::TemplateError(a.pos.empty() ? std::string() : jinja::ToStr(a.pos[0]));
               }));
  std::function<std::tm()> clock = opts.now ? opts.now : LocalNow;
  globals->Set(Value::Str("strftime_now"),
               Value::Function("strftime_now", [clock](jinja::Evaluator&, jinja::CallArgs& a) -> Expected<Value> {
                 std::string fmt = a.pos.empty() ? std::string() : jinja::ToStr(a.pos[0]);
                 if (fmt.empty()) return Value::Str("");
                 std::tm tm = clock();
                 std::string buf(256 + fmt.size() * 8, '\0');
                 size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
                 buf.resize(n);
                 return Value::Str(std::move(buf));
               }));
  if (opts.transformers_defaults) {
    globals->Set(Value::Str("tools"), Value::None());
    globals->Set(Value::Str("documents"), Value::None());
    globals->Set(Value::Str("add_generation_prompt"), Value::Bool(false));
  }
  for (const auto& [k, v] : context.items()) globals->Set(Value::Str(k), FromJson(v, 0));
  jinja::Evaluator ev(std::move(globals), opts.limits);
  std::string out;
  RETURN_IF_ERROR(ev.Render(*body_, &out));
  return out;
}

Expected<std::string> RenderChatTemplate(const std::string& tmpl, const nlohmann::ordered_json& context,
                                         const TemplateOptions& opts) {
  ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Parse(tmpl));
  return t.Render(context, opts);
}

Expected<std::tm> ParseDateTime(const std::string& text) {
  std::tm tm{};
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  char sep = 0;
  int n = std::sscanf(text.c_str(), "%d-%d-%d%c%d:%d:%d", &y, &mo, &d, &sep, &h, &mi, &s);
  if (n != 3 && n < 6) return InvalidArgument("date-time '" + text + "': expected YYYY-MM-DDTHH:MM[:SS]");
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 || s < 0 || s > 60)
    return InvalidArgument("date-time '" + text + "': field out of range");
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = s;
  tm.tm_isdst = -1;
  std::tm copy = tm;
  timegm(&copy);  // fills tm_wday / tm_yday for %a, %A, %j
  tm.tm_wday = copy.tm_wday;
  tm.tm_yday = copy.tm_yday;
  return tm;
}

}  // namespace substrate
