// The grammar notation, its byte automaton and the token mask: what a grammar accepts and
// rejects, UTF-8 classes, repetition bounds, errors naming the problem, masks that admit
// exactly the tokens that continue the text, end-of-generation only when complete, lazy
// triggers, and logit_bias.
#include "serve/grammar.h"

#include <gtest/gtest.h>

#include <cmath>

#include "grammar_test_util.h"
#include "serve/token_constraint.h"

namespace substrate::serve {
namespace {

using testing::Accepts;
using testing::Continues;
using testing::MustParse;

TEST(Grammar, LiteralsClassesAndRepetition) {
  auto g = MustParse(R"(
    root ::= "id-" [a-c]+ digits? ("!" | "?"){0,2}   # comment
    digits ::= [0-9]{2,3}
  )");
  ASSERT_TRUE(g);
  for (const char* ok : {"id-a", "id-abc12", "id-c123!?", "id-b!!"})
    EXPECT_TRUE(Accepts(g, ok)) << ok;
  for (const char* bad : {"id-", "id-d", "id-a1", "id-a1234", "id-a!!!", "xid-a"})
    EXPECT_FALSE(Accepts(g, bad)) << bad;
  EXPECT_TRUE(Continues(g, "id-"));
  EXPECT_FALSE(Continues(g, "id-x"));
}

TEST(Grammar, EscapesAndUnicodeClasses) {
  auto g = MustParse(R"(root ::= "\"" [^"\\\x00-\x1F]* "\"" [α-ω] "\u00e9" . "\n")");
  ASSERT_TRUE(g);
  EXPECT_TRUE(Accepts(g, "\"caf\xC3\xA9 \xF0\x9F\x98\x80\"\xCE\xB2\xC3\xA9x\n"));
  EXPECT_TRUE(Accepts(g, "\"\"\xCF\x89\xC3\xA9\xE2\x82\xAC\n"));
  EXPECT_FALSE(Accepts(g, "\"a\"b\xC3\xA9x\n"));            // 'b' is not in [α-ω]
  EXPECT_FALSE(Accepts(g, "\"\x01\"\xCE\xB2\xC3\xA9x\n"));  // a control character
  EXPECT_FALSE(Continues(g, "\"\xC3("));                    // a broken UTF-8 sequence
  EXPECT_FALSE(Continues(g, "\"\xED\xA0\x80"));             // a surrogate is not a character
}

TEST(Grammar, RecursionAndLongRepetitionKeepStacksFlat) {
  auto g = MustParse(R"(
    root ::= value
    value ::= "[" ( value ("," value)* )? "]" | [0-9]
  )");
  ASSERT_TRUE(g);
  EXPECT_TRUE(Accepts(g, "[[1,[2,3]],[],4]"));
  EXPECT_FALSE(Accepts(g, "[[1,2]"));
  // A long repetition is a tail call: the automaton's states do not grow with its length.
  auto star = MustParse("root ::= [a-z]* \"!\"");
  GrammarAutomaton a(star);
  int32_t s = a.start();
  for (int i = 0; i < 10000; ++i) s = a.Step(s, 'a');
  ASSERT_GE(s, 0);
  EXPECT_LE(a.n_states(), 3u);
  EXPECT_TRUE(a.accepting(a.Step(s, '!')));
}

TEST(Grammar, ErrorsNameTheProblem) {
  auto undefined = ParseGrammar("root ::= thing");
  ASSERT_FALSE(undefined.ok());
  EXPECT_NE(undefined.status().message().find("'thing'"), std::string::npos);
  auto left = ParseGrammar("root ::= root \"a\" | \"b\"");
  ASSERT_FALSE(left.ok());
  EXPECT_NE(left.status().message().find("left-recursive"), std::string::npos);
  auto indirect = ParseGrammar("root ::= x\nx ::= y? root \"a\" | \"b\"\ny ::= \"c\"");
  ASSERT_FALSE(indirect.ok());
  EXPECT_NE(indirect.status().message().find("left-recursive"), std::string::npos);
  auto unterminated = ParseGrammar("root ::= \"abc\n");
  ASSERT_FALSE(unterminated.ok());
  EXPECT_NE(unterminated.status().message().find("line 1"), std::string::npos);
  EXPECT_FALSE(ParseGrammar("root ::= [z-a]").ok());
  EXPECT_FALSE(ParseGrammar("root ::= \"a\"{3,1}").ok());
  EXPECT_FALSE(ParseGrammar("").ok());
  EXPECT_FALSE(ParseGrammar("other ::= \"a\"").ok());  // no root
  EXPECT_FALSE(ParseGrammar("root ::= \"a\"\nroot ::= \"b\"").ok());
}

TEST(Grammar, TextWithoutATag) {
  auto g = MustParse("root ::= ( " + GrammarTextWithout("</think>") + " ) \"</think>\" \"ok\"");
  ASSERT_TRUE(g);
  EXPECT_TRUE(Accepts(g, "a < b </thin </ </think>ok"));
  EXPECT_TRUE(Accepts(g, "<<</think>ok"));
  EXPECT_TRUE(Accepts(g, "</thi</think>ok"));
  EXPECT_FALSE(Accepts(g, "x</think>y</think>ok"));  // the tag ends the reasoning
  EXPECT_FALSE(Continues(g, "x</think>y"));
}

TEST(TokenConstraint, MaskAdmitsExactlyTheTokensThatContinue) {
  const std::vector<std::string> pieces = {"a", "b", "ab", "abc", "ba", "c", "!", ""};
  auto vocab = ConstraintVocab::FromPieces(pieces, {7});
  auto g = MustParse("root ::= \"ab\" [c]? \"!\"");
  TokenConstraint c(vocab, g);
  auto allowed = [&] {
    std::vector<float> l(pieces.size(), 0.0f);
    c.Apply(l.data(), static_cast<int64_t>(l.size()), {});
    std::string s;
    for (size_t i = 0; i < l.size(); ++i)
      if (!std::isinf(l[i])) s += i == 7 ? "<eog>" : "[" + pieces[i] + "]";
    return s;
  };
  EXPECT_EQ(allowed(), "[a][ab][abc]");
  c.Accept(0);  // "a"
  EXPECT_EQ(allowed(), "[b]");
  c.Accept(1);  // "b"
  EXPECT_EQ(allowed(), "[c][!]");
  EXPECT_FALSE(c.complete());
  c.Accept(6);  // "!"
  EXPECT_TRUE(c.complete());
  EXPECT_EQ(allowed(), "<eog>");  // only the end
  EXPECT_TRUE(c.status().ok());
  c.Accept(0);  // a token the mask forbade: the constraint fails closed
  EXPECT_FALSE(c.status().ok());
}

TEST(TokenConstraint, LazyTriggerAndLogitBias) {
  const std::vector<std::string> pieces = {"x", "<go>", "<g", "o>", "1", "2", ""};
  auto vocab = ConstraintVocab::FromPieces(pieces, {6});
  auto g = MustParse("root ::= \"<go>\" [12]");
  TokenConstraint c(vocab, g, {{5, -100.0f}}, {"<go>"});
  std::vector<float> l(pieces.size(), 0.0f);
  c.Apply(l.data(), 7, {});
  EXPECT_FALSE(std::isinf(l[0]));  // free before the trigger
  EXPECT_FLOAT_EQ(l[5], -100.0f);  // logit_bias
  c.Accept(0);
  c.Accept(2);  // "<g"
  EXPECT_FALSE(c.active());
  c.Accept(3);  // "o>": the trigger completes across two tokens
  EXPECT_TRUE(c.active());
  std::fill(l.begin(), l.end(), 0.0f);
  c.Apply(l.data(), 7, {});
  EXPECT_TRUE(std::isinf(l[0]));
  EXPECT_FALSE(std::isinf(l[4]));
  EXPECT_TRUE(std::isinf(l[6]));  // not complete yet: no end
  c.Accept(4);
  EXPECT_TRUE(c.complete());
}

TEST(TokenConstraint, MemoryIsChargedToTheLedgerAndACapFailsClosed) {
  const std::vector<std::string> pieces = {"a", "b", ""};
  auto vocab = ConstraintVocab::FromPieces(pieces, {2});
  auto g = MustParse("root ::= [ab]{1,40}");
  MemoryLedger ledger;
  {
    TokenConstraint c(vocab, g);
    c.set_ledger(&ledger);
    std::vector<float> l(3, 0.0f);
    c.Apply(l.data(), 3, {});
    EXPECT_GT(ledger.Accounts()["grammar"].current, 0u);
    EXPECT_TRUE(c.status().ok());
  }
  EXPECT_EQ(ledger.Accounts()["grammar"].current, 0u);  // released with the constraint

  MemoryLedger tight(1000);
  TokenConstraint c(vocab, g);
  c.set_ledger(&tight);
  std::vector<float> l(3, 0.0f);
  c.Apply(l.data(), 3, {});
  EXPECT_FALSE(c.status().ok());
  std::fill(l.begin(), l.end(), 0.0f);
  c.Apply(l.data(), 3, {});
  EXPECT_TRUE(std::isinf(l[0]) && std::isinf(l[1]));  // only the end is left: generation stops
  EXPECT_FALSE(std::isinf(l[2]));
}

TEST(TokenConstraint, RandomSentencesStayInTheGrammar) {
  auto g = MustParse(R"(
    root ::= "{" pair ("," pair){0,3} "}"
    pair ::= "\"" [a-z]{1,8} "\":" ( [0-9]+ | "true" | "\"" [^"\\]{0,12} "\"" )
  )");
  ASSERT_TRUE(g);
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const std::string s = testing::RandomSentence(g, seed);
    EXPECT_TRUE(Accepts(g, s)) << s;
  }
}

}  // namespace
}  // namespace substrate::serve
