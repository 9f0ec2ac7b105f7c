// tokenizer.ggml.* metadata from a HF folder's tokenizer.json / tokenizer_config.json /
// chat_template.jinja, as the reference converter writes it for byte-level BPE tokenizers
// (tokenizer.ggml.model "gpt2"): tokens in id order (holes become "[PAD<id>]", type UNUSED),
// token types (NORMAL 1, CONTROL 3, USER_DEFINED 4, UNUSED 5), merges as "a b" strings, special
// token ids from tokenizer_config.json (looked up among tokenizer.json's added tokens) and then
// config.json's *_token_id, add_bos/add_eos flags, and the chat template.
#include <functional>
#include <map>

#include "core/log.h"
#include "format/hf_internal.h"

namespace substrate::hf {
namespace {

using nlohmann::json;

enum TokenType : int32_t { kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5 };

std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

Expected<json> ReadJson(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 512ull << 20));
  try {
    return json::parse(text);
  } catch (const std::exception& e) {
    return Corruption("'" + path + "' is not valid JSON: " + e.what());
  }
}

// The converter's does_token_look_special().
bool LooksSpecial(const std::string& t) {
  if (t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]") return true;
  auto wrapped = [&](const std::string& a, const std::string& b) {
    return t.size() >= a.size() + b.size() && t.rfind(a, 0) == 0 &&
           t.compare(t.size() - b.size(), b.size(), b) == 0;
  };
  return wrapped("<|", "|>") || wrapped("<\xef\xbd\x9c", "\xef\xbd\x9c>");  // also fullwidth ｜
}

void ReplaceAll(std::string* s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s->find(from, p)) != std::string::npos; p += to.size())
    s->replace(p, from.size(), to);
}

// tokenizer.ggml.pre from the pre-tokenizer's regex (the converter hashes the tokenization of a
// probe text instead; the regex identifies the same families).
std::string DetectPre(const json& tj) {
  const char* kLlama3 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
      "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const char* kQwen2 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
      "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  std::vector<std::string> splits;
  bool byte_level_regex = false;
  std::function<void(const json&)> walk = [&](const json& p) {
    if (!p.is_object()) return;
    std::string type = p.value("type", "");
    if (type == "Sequence") {
      if (auto it = p.find("pretokenizers"); it != p.end() && it->is_array())
        for (const auto& q : *it) walk(q);
    } else if (type == "ByteLevel") {
      auto ur = p.find("use_regex");
      if (ur == p.end() || (ur->is_boolean() && ur->get<bool>())) byte_level_regex = true;
    } else if (type == "Split") {
      auto pat = p.find("pattern");
      if (pat != p.end() && pat->is_object()) {
        auto re = pat->find("Regex");
        if (re != pat->end() && re->is_string()) splits.push_back(re->get<std::string>());
      }
    }
  };
  if (auto it = tj.find("pre_tokenizer"); it != tj.end()) walk(*it);
  if (splits.empty() && byte_level_regex) return "gpt-2";
  if (splits.size() == 1 && splits[0] == kLlama3) return "llama-bpe";
  if (splits.size() == 1 && splits[0] == kQwen2) return "qwen2";
  LOG_WARN("tokenizer.json: unrecognised pre-tokenizer, writing tokenizer.ggml.pre = default");
  return "default";
}

}  // namespace

Status AddTokenizerMetadata(const std::string& dir, const json& config, Metadata* md) {
  const std::string tj_path = Join(dir, "tokenizer.json");
  if (!FileExists(tj_path)) return Status::Ok();
  ASSIGN_OR_RETURN(json tj, ReadJson(tj_path));
  auto err = [&](const std::string& what) { return Corruption("'" + tj_path + "': " + what); };
  if (!tj.is_object()) return err("not a JSON object");
  auto model = tj.find("model");
  if (model == tj.end() || !model->is_object()) return err("has no 'model' object");
  if (model->value("type", "") != "BPE") {
    LOG_WARN("%s: tokenizer model '%s' is not BPE; no tokenizer metadata written", tj_path.c_str(),
             model->value("type", "?").c_str());
    return Status::Ok();
  }
  auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object()) return err("model has no 'vocab' object");

  std::map<int64_t, std::string> by_id;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0) return err("vocab id of '" + it.key() + "' is not a non-negative integer");
    by_id[it->get<int64_t>()] = it.key();
  }
  struct Added { std::string content; bool special; };
  std::map<int64_t, Added> added;
  json added_tokens = json::array();
  if (auto at = tj.find("added_tokens"); at != tj.end() && at->is_array()) {
    added_tokens = *at;
    for (const auto& a : *at) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string())
        return err("an added token has no integer 'id' or string 'content'");
      int64_t id = a["id"].get<int64_t>();
      if (id < 0) return err("added token with negative id");
      added[id] = {a["content"].get<std::string>(), a.value("special", false)};
      by_id[id] = a["content"].get<std::string>();
    }
  }
  int64_t n_vocab = ConfigInt(config, "vocab_size").value_or(by_id.empty() ? 0 : by_id.rbegin()->first + 1);
  if (n_vocab <= 0 || n_vocab > (1 << 22)) return err("vocabulary size " + std::to_string(n_vocab) + " is absurd");

  std::vector<std::string> tokens(n_vocab);
  std::vector<int32_t> types(n_vocab);
  for (int64_t i = 0; i < n_vocab; ++i) {
    auto it = by_id.find(i);
    if (it == by_id.end()) {
      tokens[i] = "[PAD" + std::to_string(i) + "]";
      types[i] = kUnused;
      continue;
    }
    tokens[i] = it->second;
    auto ad = added.find(i);
    if (ad == added.end()) {
      types[i] = kNormal;
    } else if (ad->second.special || LooksSpecial(tokens[i])) {
      types[i] = kControl;
    } else {
      ReplaceAll(&tokens[i], "\xe2\x96\x81", " ");  // pre-normalize SentencePiece spaces
      types[i] = kUserDefined;
    }
  }

  md->Set("tokenizer.ggml.model", MetaValue::Str("gpt2"));
  md->Set("tokenizer.ggml.pre", MetaValue::Str(DetectPre(tj)));
  md->Set("tokenizer.ggml.tokens", MetaValue::StrArray(tokens));
  md->Set("tokenizer.ggml.token_type", MetaValue::I32Array(types));

  std::vector<std::string> merges;
  if (auto mj = model->find("merges"); mj != model->end() && mj->is_array()) {
    merges.reserve(mj->size());
    for (const auto& m : *mj) {
      if (m.is_string()) {
        merges.push_back(m.get<std::string>());
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        // Pairs (transformers >= 4.45) may hold spaces; the "a b" form encodes them as U+0120.
        std::string a = m[0].get<std::string>(), b = m[1].get<std::string>();
        ReplaceAll(&a, " ", "\xc4\xa0");
        ReplaceAll(&b, " ", "\xc4\xa0");
        merges.push_back(a + " " + b);
      } else {
        return err("unknown merges format");
      }
    }
  }
  if (!merges.empty()) md->Set("tokenizer.ggml.merges", MetaValue::StrArray(merges));

  json tc = json::object();
  if (std::string p = Join(dir, "tokenizer_config.json"); FileExists(p)) {
    ASSIGN_OR_RETURN(tc, ReadJson(p));
    if (!tc.is_object()) return Corruption("'" + p + "' is not a JSON object");
  }
  // Special token ids: tokenizer_config.json first, then config.json for the rest.
  static const char* kTypes[] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
  static const char* kKeys[] = {"bos_token_id", "eos_token_id", "unknown_token_id",
                                "seperator_token_id", "padding_token_id", "cls_token_id",
                                "mask_token_id"};
  std::vector<std::pair<int, int64_t>> ids;  // (type index, id) in the order they were found
  auto set_id = [&](int typ, std::optional<int64_t> id) {
    if (!id || *id < 0 || *id >= n_vocab) return;
    for (auto& [t, v] : ids) if (t == typ) return;
    ids.emplace_back(typ, *id);
  };
  std::vector<std::pair<std::string, bool>> add_flags;
  for (int t = 0; t < 7; ++t) {
    std::string typ = kTypes[t];
    if (auto a = tc.find("add_" + typ + "_token"); a != tc.end() && a->is_boolean() &&
                                                  (typ == "bos" || typ == "eos"))
      add_flags.emplace_back("tokenizer.ggml.add_" + typ + "_token", a->get<bool>());
    auto e = tc.find(typ + "_token");
    if (e == tc.end()) continue;
    std::string content;
    if (e->is_string()) content = e->get<std::string>();
    else if (e->is_object() && e->contains("content") && (*e)["content"].is_string())
      content = (*e)["content"].get<std::string>();
    else continue;
    for (const auto& a : added_tokens) {
      if (a["content"].get<std::string>() == content) {
        set_id(t, a["id"].get<int64_t>());
        break;
      }
    }
  }
  for (int t = 0; t < 7; ++t) set_id(t, ConfigInt(config, std::string(kTypes[t]) + "_token_id"));
  for (auto& [t, id] : ids) md->Set(std::string("tokenizer.ggml.") + kKeys[t], MetaValue::U32(static_cast<uint32_t>(id)));
  for (auto& [k, v] : add_flags) md->Set(k, MetaValue::Bool(v));

  // Chat template: tokenizer_config.json's (a string, or named templates), else the .jinja file.
  auto ct = tc.find("chat_template");
  if (ct != tc.end() && ct->is_string()) {
    md->Set("tokenizer.chat_template", MetaValue::Str(ct->get<std::string>()));
  } else if (ct != tc.end() && ct->is_array()) {
    std::vector<std::string> names;
    for (const auto& t : *ct) {
      if (!t.is_object() || !t.contains("name") || !t.contains("template") || !t["name"].is_string() ||
          !t["template"].is_string())
        continue;
      std::string name = t["name"].get<std::string>();
      if (name == "default") {
        md->Set("tokenizer.chat_template", MetaValue::Str(t["template"].get<std::string>()));
      } else {
        md->Set("tokenizer.chat_template." + name, MetaValue::Str(t["template"].get<std::string>()));
        names.push_back(name);
      }
    }
    if (!names.empty()) md->Set("tokenizer.chat_templates", MetaValue::StrArray(names));
  } else if (std::string p = Join(dir, "chat_template.jinja"); FileExists(p)) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(p, 16 << 20));
    md->Set("tokenizer.chat_template", MetaValue::Str(text));
  }
  return Status::Ok();
}

}  // namespace substrate::hf
