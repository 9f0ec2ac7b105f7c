// libFuzzer target: the tokenizers on arbitrary bytes: the bundled model's byte-level BPE (Qwen
// pre-tokenizer) and, when ../shared is there, SentencePiece (llama) and GPT-2 vocabularies.
// The first byte picks the tokenizer and the options; the rest is the text. Byte-level BPE must
// give back the exact bytes (Decode(Encode(x)) == x, invalid UTF-8 included); the same bytes
// read as token ids must decode (or be refused) without a crash, also through TokenDecoder.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "format/model_file.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Loaded {
  std::unique_ptr<substrate::Tokenizer> tok;
  bool byte_level = false;
};

std::vector<Loaded>& Tokenizers() {
  static std::vector<Loaded> all = [] {
    std::vector<Loaded> out;
    const std::pair<std::string, bool> files[] = {
        {std::string(SUBSTRATE_SOURCE_DIR) + "/models/tiny-coder-Q8_0.gguf", true},
        {std::string(SUBSTRATE_SHARED_DIR) + "/tokenizers/ggml-vocab-llama-spm.gguf", false},
        {std::string(SUBSTRATE_SHARED_DIR) + "/tokenizers/ggml-vocab-gpt-2.gguf", true}};
    for (const auto& [path, byte_level] : files) {
      auto f = substrate::ModelFile::Open(path);
      if (!f.ok()) continue;
      auto t = substrate::Tokenizer::FromMetadata((*f)->metadata());
      if (t.ok()) out.push_back({std::move(*t), byte_level});
    }
    if (out.empty()) __builtin_trap();  // the bundled model is part of the repo
    return out;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  auto& all = Tokenizers();
  const Loaded& t = all[data[0] % all.size()];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  substrate::EncodeOptions eo;
  eo.add_special = data[0] & 0x10;
  eo.parse_special = data[0] & 0x20;
  auto ids = t.tok->Encode(text, eo);
  if (ids.ok()) {
    for (substrate::TokenId id : *ids)
      if (!t.tok->IsValid(id)) __builtin_trap();
    if (t.byte_level && !eo.add_special && !eo.parse_special) {
      substrate::DecodeOptions d;
      d.special = true;
      d.strip_leading_space = false;
      auto back = t.tok->Decode(*ids, d);
      if (!back.ok() || *back != text) __builtin_trap();
    }
  }
  // The bytes as ids: valid or refused, never a crash; streamed the same as decoded at once.
  std::vector<substrate::TokenId> raw((size - 1) / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
  for (substrate::TokenId& id : raw) id = id % (t.tok->n_vocab() + 8);  // mostly valid, some not
  (void)t.tok->Decode(raw);
  substrate::TokenDecoder stream(*t.tok);
  for (substrate::TokenId id : raw) (void)stream.Push(id);
  (void)stream.Flush();
  return 0;
}
