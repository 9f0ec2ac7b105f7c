// Golden tests: our tokenizer against the reference tokenizers' outputs in ../shared.
//   tokenizers/X.gguf.inp/.out  texts and ids from the models' own (HF) tokenizers, vocab-only GGUFs
//   models/tiny-coder/tokenizer_vectors.json  from the HF folder and from the GGUF made from it
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "format/model_file.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace substrate {
namespace {

const std::string kShared = SUBSTRATE_SHARED_DIR;

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The .inp framing: each text is followed by "\n__ggml_vocab_test__\n".
std::vector<std::string> SplitInputs(const std::string& raw) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < raw.size()) {
    size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      out.push_back(raw.substr(pos));
      break;
    }
    out.push_back(raw.substr(pos, next - pos));
    pos = next + sep.size();
  }
  return out;
}

std::vector<std::vector<TokenId>> ReadOutputs(const std::string& raw) {
  std::vector<std::vector<TokenId>> out;
  std::istringstream in(raw);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::vector<TokenId> ids;
    for (long x; ls >> x;) ids.push_back(static_cast<TokenId>(x));
    out.push_back(ids);
  }
  return out;
}

std::unique_ptr<Tokenizer> Load(const std::string& path) {
  auto mf = ModelFile::Open(path);
  EXPECT_TRUE(mf.ok()) << mf.status().ToString();
  if (!mf.ok()) return nullptr;
  auto tok = Tokenizer::FromMetadata((*mf)->metadata());
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  if (!tok.ok()) return nullptr;
  return std::move(tok).value();
}

std::string Show(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) {
    s.push_back(' ');
    s += std::to_string(id);
  }
  return s;
}

class VocabVectors : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabVectors, EncodeMatchesReferenceAndDecodeRoundTrips) {
  const std::string base = kShared + "/tokenizers/ggml-vocab-" + GetParam() + ".gguf";
  if (!std::filesystem::exists(base)) GTEST_SKIP() << base << " not found (../shared absent)";
  auto tok = Load(base);
  ASSERT_TRUE(tok);
  auto texts = SplitInputs(ReadAll(base + ".inp"));
  auto want = ReadOutputs(ReadAll(base + ".out"));
  ASSERT_EQ(texts.size(), want.size());
  ASSERT_GT(texts.size(), 10u);
  int mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto got = tok->Encode(texts[i], {.add_special = false, .parse_special = false});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    if (*got != want[i]) {
      ++mismatches;
      ADD_FAILURE() << GetParam() << " vector " << i << " '" << texts[i] << "'\n  want" << Show(want[i])
                    << "\n  got " << Show(*got);
      continue;
    }
    auto text = tok->Decode(*got);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    EXPECT_EQ(*text, texts[i]) << GetParam() << " vector " << i << " does not decode back";
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Shared, VocabVectors,
                         ::testing::Values("gpt-2", "llama-spm", "phi-3", "deepseek-coder", "starcoder"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

class TinyCoderVectors : public ::testing::TestWithParam<const char*> {};

TEST_P(TinyCoderVectors, EncodeMatchesReference) {
  const std::string model = kShared + GetParam();
  const std::string vectors = kShared + "/models/tiny-coder/tokenizer_vectors.json";
  if (!std::filesystem::exists(model) || !std::filesystem::exists(vectors)) {
    GTEST_SKIP() << model << " or tokenizer_vectors.json not found (../shared absent)";
  }
  auto tok = Load(model);
  ASSERT_TRUE(tok);
  auto cases = nlohmann::json::parse(ReadAll(vectors));
  ASSERT_GT(cases.size(), 3u);
  for (const auto& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    const auto want = c.at("ids").get<std::vector<TokenId>>();
    // The reference is HF `encode`: added tokens in the text are recognised, BOS as the model says.
    auto got = tok->Encode(text, {.add_special = true, .parse_special = true});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, want) << "'" << text << "'\n  want" << Show(want) << "\n  got " << Show(*got);
    auto back = tok->Decode(*got);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
  }
}

INSTANTIATE_TEST_SUITE_P(Shared, TinyCoderVectors,
                         ::testing::Values("/models/tiny-coder", "/gguf/tiny-coder-bf16.gguf"),
                         [](const auto& info) {
                           return std::string(info.index == 0 ? "hf_folder" : "gguf");
                         });

}  // namespace
}  // namespace substrate

namespace substrate {
namespace {

// Streaming one id at a time gives the same text as decoding all at once, on real vocabularies
// where characters are split across byte tokens (emoji, Khmer, CJK in the vectors).
TEST(StreamingDecode, MatchesWholeDecodeOnRealVocabs) {
  for (const char* name : {"gpt-2", "llama-spm"}) {
    const std::string base = kShared + "/tokenizers/ggml-vocab-" + name + ".gguf";
    if (!std::filesystem::exists(base)) GTEST_SKIP() << base << " not found (../shared absent)";
    auto tok = Load(base);
    ASSERT_TRUE(tok);
    for (const std::string& text : SplitInputs(ReadAll(base + ".inp"))) {
      auto ids = tok->Encode(text, {.add_special = false});
      ASSERT_TRUE(ids.ok());
      TokenDecoder dec(*tok, {.strip_leading_space = true});
      std::string streamed;
      for (TokenId id : *ids) {
        auto piece = dec.Push(id);
        ASSERT_TRUE(piece.ok());
        // Every emitted chunk is complete UTF-8 by itself.
        for (size_t i = 0; i < piece->size(); i += std::max(1, Utf8SequenceLength(*piece, i))) {
          ASSERT_GT(Utf8SequenceLength(*piece, i), 0) << name << ": chunk splits a character";
        }
        streamed += *piece;
      }
      streamed += dec.Flush();
      EXPECT_EQ(streamed, text) << name;
    }
  }
}

// The CLI commands end to end on the tiny-coder GGUF.
std::string RunCapture(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  *status = pclose(p);
  return out;
}

TEST(Cli, TokenizeAndDetokenizeRoundTrip) {
  const std::string model = kShared + "/gguf/tiny-coder-bf16.gguf";
  if (!std::filesystem::exists(model)) GTEST_SKIP() << model << " not found (../shared absent)";
  const std::string bin = SUBSTRATE_BINARY;
  int st = -1;
  std::string ids = RunCapture(bin + " tokenize -m '" + model + "' --text 'class A(object):\n    pass\n'", &st);
  EXPECT_EQ(st, 0);
  EXPECT_EQ(ids, "562 415 10 1653 322 270 1375 201\n");
  std::string text = RunCapture(bin + " detokenize -m '" + model + "' 562 415 10 1653 322 270 1375 201", &st);
  EXPECT_EQ(st, 0);
  EXPECT_EQ(text, "class A(object):\n    pass\n");
  RunCapture(bin + " detokenize -m '" + model + "' 1 999999 2>/dev/null", &st);
  EXPECT_NE(st, 0);
  RunCapture(bin + " tokenize -m /nonexistent.gguf --text x 2>/dev/null", &st);
  EXPECT_NE(st, 0);
}

}  // namespace
}  // namespace substrate

namespace substrate {
namespace {

// tiny-coder's golden.json / golden.safetensors were made with the reference tokenizer: the prompt
// ids, the continuation text, and `heldout.tokens` = the first 256 tokens of text/heldout.txt.
std::vector<int32_t> ReadSafetensorsI32(const std::string& path, const std::string& name) {
  std::string raw = ReadAll(path);
  if (raw.size() < 8) return {};
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  if (n > raw.size() - 8) return {};
  auto header = nlohmann::json::parse(raw.substr(8, n), nullptr, false);
  if (header.is_discarded() || !header.contains(name)) return {};
  auto off = header[name]["data_offsets"].get<std::vector<uint64_t>>();
  if (off.size() != 2 || off[1] < off[0] || 8 + n + off[1] > raw.size()) return {};
  std::vector<int32_t> v((off[1] - off[0]) / 4);
  std::memcpy(v.data(), raw.data() + 8 + n + off[0], v.size() * 4);
  return v;
}

TEST(TinyCoderGolden, PromptContinuationAndHeldoutPrefix) {
  const std::string dir = kShared + "/models/tiny-coder";
  const std::string heldout = kShared + "/text/heldout.txt";
  if (!std::filesystem::exists(dir + "/golden.json") || !std::filesystem::exists(heldout)) {
    GTEST_SKIP() << "tiny-coder golden files not found (../shared absent)";
  }
  auto tok = Load(dir);
  ASSERT_TRUE(tok);
  auto g = nlohmann::json::parse(ReadAll(dir + "/golden.json"));
  const auto& greedy = g.at("greedy");
  auto prompt = tok->Encode(greedy.at("prompt_text").get<std::string>());
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(*prompt, greedy.at("prompt").get<std::vector<TokenId>>());
  auto cont = tok->Decode(greedy.at("continuation").get<std::vector<TokenId>>());
  ASSERT_TRUE(cont.ok());
  EXPECT_EQ(*cont, greedy.at("continuation_text").get<std::string>());

  auto want = ReadSafetensorsI32(dir + "/golden.safetensors", "heldout.tokens");
  ASSERT_EQ(want.size(), 256u);
  auto ids = tok->Encode(ReadAll(heldout), {.add_special = false});
  ASSERT_TRUE(ids.ok());
  ASSERT_GE(ids->size(), want.size());
  EXPECT_EQ(std::vector<TokenId>(ids->begin(), ids->begin() + want.size()), want);
}

}  // namespace
}  // namespace substrate
