// Unit tests on hand-built vocabularies: the byte mapping, pre-tokenizer splitting, BPE merge order,
// SentencePiece merges and byte fallback, special tokens (parse_special, lstrip/rstrip), the
// streaming decoder, and bad input.
#include <gtest/gtest.h>

#include <random>

#include "format/model_file.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace substrate {
namespace {

// Byte-level char of a byte string ("a b" -> "aĠb").
std::string ByteLevel(std::string_view raw) {
  std::string s;
  for (unsigned char c : raw) AppendUtf8(ByteToCodepoint(c), &s);
  return s;
}

// A byte-level BPE vocab: all 256 byte tokens, then `extra` tokens, with `merges` (raw strings).
Vocab MakeBpe(const std::vector<std::string>& extra, const std::vector<std::pair<std::string, std::string>>& merges,
              const std::string& pre = "gpt-2") {
  Vocab v;
  v.type = VocabType::kBpe;
  v.model = "gpt2";
  v.pre = pre;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(ByteLevel(std::string(1, static_cast<char>(b))));
  for (const auto& t : extra) v.tokens.push_back(ByteLevel(t));
  for (const auto& [l, r] : merges) v.merges.push_back(ByteLevel(l) + " " + ByteLevel(r));
  v.attrs.assign(v.tokens.size(), kAttrNormal);
  ApplyVocabDefaults(&v);
  return v;
}

TokenId Id(const Tokenizer& t, std::string_view raw) { return t.Find(ByteLevel(raw)); }

std::vector<std::string> Words(const std::string& pre, std::string_view text) {
  auto pt = PreTokenizer::ForName(pre);
  EXPECT_TRUE(pt.ok()) << pt.status().ToString();
  std::vector<std::string_view> w;
  EXPECT_TRUE((*pt)->Split(text, &w).ok());
  return {w.begin(), w.end()};
}

TEST(ByteLevel, MappingIsABijectionWithGpt2Values) {
  std::vector<int> seen(512, 0);
  for (int b = 0; b < 256; ++b) {
    uint32_t cp = ByteToCodepoint(static_cast<uint8_t>(b));
    ASSERT_LT(cp, 512u);
    EXPECT_EQ(seen[cp]++, 0) << "codepoint used twice: " << cp;
    EXPECT_EQ(CodepointToByte(cp), b);
  }
  EXPECT_EQ(ByteToCodepoint(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(ByteToCodepoint('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(ByteToCodepoint('a'), static_cast<uint32_t>('a'));
  EXPECT_EQ(CodepointToByte(0x4E00), -1);
}

TEST(PreTokenizer, Gpt2SplitsWordsContractionsAndSpaces) {
  EXPECT_EQ(Words("gpt-2", "Hello world's  foo\n"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " foo", "\n"}));
}

TEST(PreTokenizer, DigitRulesDifferByModel) {
  EXPECT_EQ(Words("llama-bpe", "x 1234567"), (std::vector<std::string>{"x", " ", "123", "456", "7"}));
  EXPECT_EQ(Words("qwen2", "12a"), (std::vector<std::string>{"1", "2", "a"}));
  EXPECT_EQ(Words("starcoder", "x=42"), (std::vector<std::string>{"x", "=", "4", "2"}));
  // llama3's contractions are case-insensitive.
  EXPECT_EQ(Words("llama-bpe", "IT'S"), (std::vector<std::string>{"IT", "'S"}));
}

TEST(PreTokenizer, LookaheadOnlyRegexSplitsDigitsInThrees) {
  EXPECT_EQ(Words("superbpe", "1234567"), (std::vector<std::string>{"1", "234", "567"}));
}

TEST(PreTokenizer, EveryKnownNameCompiles) {
  for (const std::string& name : PreTokenizer::KnownNames()) {
    auto pt = PreTokenizer::ForName(name);
    ASSERT_TRUE(pt.ok()) << name << ": " << pt.status().ToString();
    std::vector<std::string_view> w;
    const std::string text = "Hello, y'all! 12345 \xe4\xbd\xa0\xe5\xa5\xbd  \n\tend";
    ASSERT_TRUE((*pt)->Split(text, &w).ok()) << name;
    std::string joined;
    for (auto x : w) joined += x;
    EXPECT_EQ(joined, text) << name << " lost or reordered bytes";
  }
  EXPECT_GE(PreTokenizer::KnownNames().size(), 60u);
}

TEST(PreTokenizer, UnknownNameAndBadRegexAreErrors) {
  auto a = PreTokenizer::ForName("no-such-pre");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("no-such-pre"), std::string::npos);
  auto b = PreTokenizer::FromRegexes({"(unclosed"});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
}

TEST(PreTokenizer, InvalidUtf8BytesBecomeTheirOwnWords) {
  EXPECT_EQ(Words("gpt-2", "ab\xff\xfe cd"),
            (std::vector<std::string>{"ab", "\xff", "\xfe", " cd"}));
}

TEST(Bpe, LowestRankMergesFirst) {
  // "b c" outranks "a b": abc -> a + bc, even though "ab" is also a merge.
  auto t = Tokenizer::FromVocab(MakeBpe({"bc", "ab"}, {{"b", "c"}, {"a", "b"}}));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto ids = (*t)->Encode("abc", {.add_special = false});
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<TokenId>{Id(**t, "a"), Id(**t, "bc")}));

  // In " ab", "a b" (rank 0) merges before " a" (rank 2), and there is no " "+"ab" merge, so
  // " ab" is never reached although it is a token.
  auto t2 = Tokenizer::FromVocab(MakeBpe({"ab", "abc", " a", " ab"}, {{"a", "b"}, {"ab", "c"}, {" ", "a"}, {" a", "b"}}));
  ASSERT_TRUE(t2.ok());
  auto ids2 = (*t2)->Encode("abc ab ac", {.add_special = false});
  ASSERT_TRUE(ids2.ok());
  EXPECT_EQ(*ids2, (std::vector<TokenId>{Id(**t2, "abc"), Id(**t2, " "), Id(**t2, "ab"), Id(**t2, " a"),
                                         Id(**t2, "c")}));
}

TEST(Bpe, EqualRankPairsMergeLeftmostFirst) {
  auto t = Tokenizer::FromVocab(MakeBpe({"aa"}, {{"a", "a"}}));
  ASSERT_TRUE(t.ok());
  auto ids = (*t)->Encode("aaa", {.add_special = false});
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<TokenId>{Id(**t, "aa"), Id(**t, "a")}));
}

TEST(Bpe, AnyBytesRoundTrip) {
  auto t = Tokenizer::FromVocab(MakeBpe({"ab", "ab "}, {{"a", "b"}, {"ab", " "}}));
  ASSERT_TRUE(t.ok());
  std::mt19937 rng(7);
  for (int iter = 0; iter < 200; ++iter) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 == 0 ? 'a' + rng() % 3 : rng() % 256);
    auto ids = (*t)->Encode(s, {.add_special = false});
    ASSERT_TRUE(ids.ok());
    auto back = (*t)->Decode(*ids);
    ASSERT_TRUE(back.ok());
    ASSERT_EQ(*back, s);
  }
}

TEST(SpecialTokens, ControlOnlyWithParseSpecialUserDefinedAlways) {
  Vocab v = MakeBpe({}, {});
  v.tokens.push_back("<|ctl|>");
  v.attrs.push_back(kAttrControl);
  v.tokens.push_back("<u>");
  v.attrs.push_back(kAttrUserDefined);
  const TokenId ctl = 256, u = 257;
  auto t = Tokenizer::FromVocab(v);
  ASSERT_TRUE(t.ok());
  auto a = (*t)->Encode("x<|ctl|>y", {.add_special = false, .parse_special = true});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<TokenId>{'x', ctl, 'y'}));
  auto b = (*t)->Encode("x<|ctl|>y", {.add_special = false, .parse_special = false});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->size(), 9u);  // spelled out byte by byte
  auto c = (*t)->Encode("x<u>y", {.add_special = false, .parse_special = false});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, (std::vector<TokenId>{'x', u, 'y'}));
  // Decode: control tokens render unless special=false; user-defined always.
  auto d = (*t)->Decode(*a, {.special = false});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, "xy");
  auto e = (*t)->Decode(std::vector<TokenId>{'x', u, ctl}, {.special = false});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, "x<u>");
}

TEST(SpecialTokens, LStripAndRStripSwallowWhitespace) {
  Vocab v = MakeBpe({}, {});
  v.tokens.push_back("<m>");
  v.attrs.push_back(kAttrUserDefined | kAttrLStrip | kAttrRStrip);
  auto t = Tokenizer::FromVocab(v);
  ASSERT_TRUE(t.ok());
  auto ids = (*t)->Encode("a  <m> \n b", {.add_special = false});
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<TokenId>{'a', 256, 'b'}));
}

TEST(SpecialTokens, LongestAtTheLeftmostPositionWins) {
  Vocab v = MakeBpe({}, {});
  for (const char* s : {"<a>", "<a><b>"}) {
    v.tokens.push_back(s);
    v.attrs.push_back(kAttrUserDefined);
  }
  auto t = Tokenizer::FromVocab(v);
  ASSERT_TRUE(t.ok());
  auto ids = (*t)->Encode("<a><b><a>", {.add_special = false});
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<TokenId>{257, 256}));
}

// A SentencePiece vocab: <unk> <s> </s>, 256 byte tokens, then pieces with scores.
Vocab MakeSpm(const std::vector<std::pair<std::string, float>>& pieces) {
  Vocab v;
  v.type = VocabType::kSpm;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.attrs = {kAttrUnknown, kAttrControl, kAttrControl};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    v.tokens.push_back(buf);
    v.attrs.push_back(kAttrByte);
  }
  for (const auto& [p, s] : pieces) {
    v.tokens.push_back(p);
    v.attrs.push_back(kAttrNormal);
  }
  v.scores.assign(v.tokens.size(), 0.0f);
  for (size_t i = 0; i < pieces.size(); ++i) v.scores[259 + i] = pieces[i].second;
  ApplyVocabDefaults(&v);
  FinishVocab(&v);
  return v;
}

TEST(Spm, HighestScoreMergesFirstWithSpacePrefixAndByteFallback) {
  const std::string sp = "\xe2\x96\x81";  // U+2581
  auto t = Tokenizer::FromVocab(MakeSpm({{sp, -1}, {"a", -2}, {"b", -2}, {sp + "a", -3}, {"ab", -1},
                                         {sp + "ab", -4}}));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const TokenId kSp = 259, kA = 260, kB = 261, kAb = 263;
  // "ab" scores higher than "▁a": ▁ + ab, then ▁ab.
  auto ids = (*t)->Encode("ab", {.add_special = false});
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<TokenId>{264}));
  auto withbos = (*t)->Encode("ab", {.add_special = true});
  ASSERT_TRUE(withbos.ok());
  EXPECT_EQ(*withbos, (std::vector<TokenId>{1, 264}));
  // é has no piece: its two UTF-8 bytes come out as <0xC3> <0xA9>.
  auto e = (*t)->Encode("b\xc3\xa9", {.add_special = false});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, (std::vector<TokenId>{kSp, kB, 3 + 0xC3, 3 + 0xA9}));
  auto back = (*t)->Decode(*e);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, "b\xc3\xa9");  // the prefixed space is dropped again
  (void)kA;
  (void)kAb;
}

TEST(Decoder, StreamsOnlyCompleteUtf8) {
  auto t = Tokenizer::FromVocab(MakeBpe({}, {}));
  ASSERT_TRUE(t.ok());
  TokenDecoder d(**t);
  // U+1F642 is F0 9F 99 82: four byte tokens; nothing comes out until the last.
  for (int b : {0xF0, 0x9F, 0x99}) {
    auto s = d.Push(Id(**t, std::string(1, static_cast<char>(b))));
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(*s, "");
  }
  EXPECT_EQ(d.pending(), 3u);
  auto s = d.Push(Id(**t, "\x82"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, "\xf0\x9f\x99\x82");
  // A byte that can never start a character comes out as U+FFFD at once.
  auto bad = d.Push(Id(**t, "\xff"));
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(*bad, "\xef\xbf\xbd");
  // An unfinished character at the end of the stream becomes U+FFFD on Flush.
  ASSERT_TRUE(d.Push(Id(**t, "\xe4")).ok());
  EXPECT_EQ(d.Flush(), "\xef\xbf\xbd");
  auto invalid = d.Push(99999);
  ASSERT_FALSE(invalid.ok());
  EXPECT_NE(invalid.status().message().find("99999"), std::string::npos);
}

TEST(Decoder, DecodeRejectsIdsOutsideTheVocabulary) {
  auto t = Tokenizer::FromVocab(MakeBpe({}, {}));
  ASSERT_TRUE(t.ok());
  auto r = (*t)->Decode(std::vector<TokenId>{1, -5});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("-5"), std::string::npos);
}

TEST(Metadata, MissingOrUnsupportedKeysAreNamed) {
  Metadata md;
  auto a = Tokenizer::FromMetadata(md);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("tokenizer.ggml.model"), std::string::npos) << a.status().ToString();

  md.Set("tokenizer.ggml.model", MetaValue::Str("bert"));
  auto b = Tokenizer::FromMetadata(md);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kUnimplemented);

  md.Set("tokenizer.ggml.model", MetaValue::Str("gpt2"));
  auto c = Tokenizer::FromMetadata(md);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("tokenizer.ggml.tokens"), std::string::npos);

  md.Set("tokenizer.ggml.tokens", MetaValue::StrArray({"a", "b", "ab"}));
  md.Set("tokenizer.ggml.token_type", MetaValue::I32Array({1, 1}));
  auto d = Tokenizer::FromMetadata(md);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("token_type"), std::string::npos) << d.status().ToString();

  md.Set("tokenizer.ggml.token_type", MetaValue::I32Array({1, 1, 1}));
  md.Set("tokenizer.ggml.merges", MetaValue::StrArray({"a b"}));
  md.Set("tokenizer.ggml.pre", MetaValue::Str("qwen2"));
  auto e = Tokenizer::FromMetadata(md);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto ids = (*e)->Encode("ab");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<TokenId>{2}));
}

}  // namespace
}  // namespace substrate
