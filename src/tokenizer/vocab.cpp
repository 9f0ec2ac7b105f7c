// Vocab from GGUF metadata, with llama.cpp's defaults for each tokenizer model and pre-tokenizer.
#include "tokenizer/vocab.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <unordered_map>

#include "format/model_file.h"

namespace substrate {
namespace {

bool OneOf(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (s == n) return true;
  return false;
}

// Texts that end a turn or a document in the models we know; marked control and end-of-generation
// even when the converter typed them as normal tokens.
const char* const kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", "[e~[",
};

// In priority order: the first present becomes `eot` when the metadata does not name one.
const char* const kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>",
    "<end_of_utterance>",
};

}  // namespace

uint32_t TokenAttrFromGgufType(int64_t type) {
  switch (type) {
    case 1: return kAttrNormal;
    case 2: return kAttrUnknown;
    case 3: return kAttrControl;
    case 4: return kAttrUserDefined;
    case 5: return kAttrUnused;
    case 6: return kAttrByte;
    default: return kAttrUndefined;
  }
}

void ApplyVocabDefaults(Vocab* v) {
  if (v->type == VocabType::kSpm) {
    v->bos = 1;
    v->eos = 2;
    v->unk = 0;
    v->add_space_prefix = true;
    v->add_bos = true;
    v->add_eos = false;
    v->clean_spaces = false;
    return;
  }
  const std::string& p = v->pre;
  v->add_space_prefix = false;
  v->clean_spaces = true;
  v->ignore_merges = false;
  v->add_bos = false;
  if (OneOf(p, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                "lfm2", "jina-v5-nano", "tekken", "chameleon"})) {
    v->add_bos = true;
  }
  if (OneOf(p, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                "lfm2", "jina-v5-nano", "minicpm5", "youtu", "tekken",
                "granite-embed-multi-97m"})) {
    v->ignore_merges = true;
  }
  if (OneOf(p, {"deepseek-llm", "deepseek-coder", "deepseek-v3", "spark2_5", "youtu", "command-r",
                "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "qwen35", "poro-chat", "viking",
                "tekken", "smollm", "chameleon", "gpt-4o", "llama4", "kanana2", "talkie",
                "granite-embed-multi-97m", "tiny_aya", "cohere2moe", "superbpe", "trillion",
                "granite-docling", "bailingmoe", "bailingmoe2", "llada-moe", "seed-coder",
                "hunyuan", "hunyuan-dense", "hy_v4", "joyai-llm", "kimi-k2", "ufakzeka", "grok-2",
                "afmoe", "laguna", "minimax-m2", "solar-open"})) {
    v->clean_spaces = false;
  }
}

void FinishVocab(Vocab* v) {
  const int n = v->n_tokens();
  v->attrs.resize(n, kAttrNormal);
  std::unordered_map<std::string_view, TokenId> by_text;
  by_text.reserve(n);
  for (int i = 0; i < n; ++i) by_text.emplace(v->tokens[i], i);
  auto find = [&](const char* t) {
    auto it = by_text.find(t);
    return it == by_text.end() ? kNoToken : it->second;
  };
  if (v->eot == kNoToken) {
    for (const char* t : kEotTexts) {
      if (TokenId id = find(t); id != kNoToken) {
        v->eot = id;
        break;
      }
    }
  }
  std::set<TokenId> eog;
  for (const char* t : kEogTexts) {
    if (TokenId id = find(t); id != kNoToken) eog.insert(id);
  }
  // gpt-oss style vocabularies: "<|end|>" ends a message, not generation, when <|return|> and
  // <|call|> exist.
  if (find("<|return|>") != kNoToken && find("<|call|>") != kNoToken) {
    if (TokenId id = find("<|end|>"); id != kNoToken) eog.erase(id);
  }
  if (v->eos != kNoToken) eog.insert(v->eos);
  if (v->eot != kNoToken) eog.insert(v->eot);
  for (TokenId id : eog) {
    if (!(v->attrs[id] & kAttrUserDefined)) v->attrs[id] |= kAttrControl;
  }
  v->eog.assign(eog.begin(), eog.end());
}

Expected<Vocab> VocabFromMetadata(const Metadata& md) {
  Vocab v;
  ASSIGN_OR_RETURN(v.model, md.GetString("tokenizer.ggml.model"));
  if (v.model == "gpt2") {
    v.type = VocabType::kBpe;
  } else if (v.model == "llama") {
    v.type = VocabType::kSpm;
  } else {
    return Unimplemented("tokenizer: tokenizer.ggml.model '" + v.model +
                         "' is not supported (supported: gpt2, llama)");
  }
  v.pre = md.GetString("tokenizer.ggml.pre", "default");
  if (v.pre.empty()) v.pre = "default";
  ASSIGN_OR_RETURN(v.tokens, md.GetStringArray("tokenizer.ggml.tokens"));
  const size_t n = v.tokens.size();
  if (n == 0) return Corruption("tokenizer: tokenizer.ggml.tokens is empty");
  if (n > (1u << 30)) return Corruption("tokenizer: tokenizer.ggml.tokens has " + std::to_string(n) + " entries");
  for (size_t i = 0; i < n; ++i) {
    if (v.tokens[i].empty()) v.tokens[i] = "[EMPTY_" + std::to_string(i) + "]";
  }
  if (md.Has("tokenizer.ggml.scores")) {
    ASSIGN_OR_RETURN(auto scores, md.GetFloatArray("tokenizer.ggml.scores"));
    if (scores.size() < n) {
      return Corruption("tokenizer: tokenizer.ggml.scores has " + std::to_string(scores.size()) +
                        " entries for " + std::to_string(n) + " tokens");
    }
    v.scores.assign(scores.begin(), scores.begin() + n);
  } else {
    v.scores.assign(n, 0.0f);
  }
  v.attrs.assign(n, kAttrNormal);
  if (md.Has("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(auto types, md.GetIntArray("tokenizer.ggml.token_type"));
    if (types.size() < n) {
      return Corruption("tokenizer: tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                        " entries for " + std::to_string(n) + " tokens");
    }
    for (size_t i = 0; i < n; ++i) v.attrs[i] = TokenAttrFromGgufType(types[i]);
  }
  if (v.type == VocabType::kBpe) {
    if (!md.Has("tokenizer.ggml.merges")) {
      return Corruption("tokenizer: gpt2 tokenizer without tokenizer.ggml.merges");
    }
    ASSIGN_OR_RETURN(v.merges, md.GetStringArray("tokenizer.ggml.merges"));
  }

  ApplyVocabDefaults(&v);
  if (OneOf(v.pre, {"glm4", "chatglm-bpe"})) v.bos = kNoToken;
  auto read_id = [&](const char* key, TokenId* id) {
    if (*id >= static_cast<TokenId>(n)) *id = kNoToken;
    if (!md.Has(key)) return;
    int64_t x = md.GetInt(key, -1);
    if (x >= 0 && x < static_cast<int64_t>(n)) *id = static_cast<TokenId>(x);
  };
  read_id("tokenizer.ggml.bos_token_id", &v.bos);
  read_id("tokenizer.ggml.eos_token_id", &v.eos);
  read_id("tokenizer.ggml.unknown_token_id", &v.unk);
  read_id("tokenizer.ggml.padding_token_id", &v.pad);
  read_id("tokenizer.ggml.eot_token_id", &v.eot);
  auto read_bool = [&](const char* key, bool* b) {
    if (!md.Has(key)) return;
    auto r = md.GetBool(key);
    if (r.ok()) *b = *r;
  };
  read_bool("tokenizer.ggml.add_bos_token", &v.add_bos);
  read_bool("tokenizer.ggml.add_eos_token", &v.add_eos);
  read_bool("tokenizer.ggml.add_space_prefix", &v.add_space_prefix);
  if (v.add_bos && v.bos == kNoToken) {
    return Corruption("tokenizer: tokenizer.ggml.add_bos_token is true but there is no BOS token");
  }
  if (v.add_eos && v.eos == kNoToken) {
    return Corruption("tokenizer: tokenizer.ggml.add_eos_token is true but there is no EOS token");
  }

  // Added-token whitespace rules. GGUF has no standard key for them; a converter that knows them
  // (from tokenizer.json's added_tokens lstrip/rstrip) may list the ids here.
  for (auto [key, bit] : {std::pair{"tokenizer.substrate.lstrip_token_ids", kAttrLStrip},
                          std::pair{"tokenizer.substrate.rstrip_token_ids", kAttrRStrip}}) {
    if (!md.Has(key)) continue;
    ASSIGN_OR_RETURN(auto ids, md.GetIntArray(key));
    for (int64_t id : ids)
      if (id >= 0 && id < static_cast<int64_t>(n)) v.attrs[id] |= bit;
  }
  // Phi-3 GGUFs lose their added tokens' rstrip flag in conversion; llama.cpp restores it by name.
  std::string name = md.GetString("general.name", "");
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  const bool phi3 = name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos;

  FinishVocab(&v);
  if (phi3) {
    for (size_t i = 0; i < n; ++i) {
      const std::string& t = v.tokens[i];
      const bool special = v.attrs[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown);
      if ((special || t == "</s>") && t != "<unk>" && t != "<s>" && t != "<|endoftext|>") {
        v.attrs[i] |= kAttrRStrip;
      }
    }
  }
  return v;
}

}  // namespace substrate
