#include "serve/grammar.h"

#include <algorithm>
#include <map>
#include <utility>

namespace substrate::serve {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxRepeat = 10000;  // {m,n} bounds: each repetition is a rule
constexpr size_t kMaxElements = 4u << 20;

using Range = std::pair<uint32_t, uint32_t>;  // inclusive code point range
using Element = Grammar::Element;
using Seq = std::vector<Element>;

// Sorted, merged, within [0, 0x10FFFF], without the UTF-16 surrogates (not characters).
std::vector<Range> Normalize(std::vector<Range> in, bool negate) {
  std::sort(in.begin(), in.end());
  std::vector<Range> merged;
  for (const Range& r : in) {
    if (!merged.empty() && r.first <= merged.back().second + 1)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  if (negate) {
    std::vector<Range> comp;
    uint32_t next = 0;
    for (const Range& r : merged) {
      if (r.first > next) comp.push_back({next, r.first - 1});
      next = r.second + 1;
    }
    if (next <= kMaxCodePoint) comp.push_back({next, kMaxCodePoint});
    merged.swap(comp);
  }
  std::vector<Range> out;
  for (Range r : merged) {
    r.second = std::min(r.second, kMaxCodePoint);
    if (r.first > r.second) continue;
    if (r.first <= 0xDFFF && r.second >= 0xD800) {
      if (r.first < 0xD800) out.push_back({r.first, 0xD7FF});
      if (r.second > 0xDFFF) out.push_back({0xE000, r.second});
    } else {
      out.push_back(r);
    }
  }
  return out;
}

int Utf8Length(uint32_t cp) {
  return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

void Encode(uint32_t cp, int n, uint8_t* b) {
  if (n == 1) {
    b[0] = static_cast<uint8_t>(cp);
    return;
  }
  static const uint8_t lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
  for (int i = n - 1; i > 0; --i) {
    b[i] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    cp >>= 6;
  }
  b[0] = static_cast<uint8_t>(lead[n] | cp);
}

// Splits a range of code points of one encoded length into byte-range sequences, each byte
// position a contiguous range (the construction RE2 uses for UTF-8 classes).
void SplitSameLength(uint32_t lo, uint32_t hi, int n, std::vector<std::vector<Range>>* out) {
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        SplitSameLength(lo, lo | m, n, out);
        SplitSameLength((lo | m) + 1, hi, n, out);
        return;
      }
      if ((hi & m) != m) {
        SplitSameLength(lo, (hi & ~m) - 1, n, out);
        SplitSameLength(hi & ~m, hi, n, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  Encode(lo, n, a);
  Encode(hi, n, b);
  std::vector<Range> seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out->push_back(std::move(seq));
}

void Utf8Sequences(Range r, std::vector<std::vector<Range>>* out) {
  static const uint32_t lo_of[] = {0, 0, 0x80, 0x800, 0x10000};
  static const uint32_t hi_of[] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  for (int n = 1; n <= 4; ++n) {
    const uint32_t lo = std::max(r.first, lo_of[n]), hi = std::min(r.second, hi_of[n]);
    if (lo <= hi) SplitSameLength(lo, hi, n, out);
  }
}

class Parser {
 public:
  Parser(std::string_view text) : s_(text) {}

  Expected<Grammar> Run(std::string_view root_name) {
    SkipSpace();
    if (pos_ >= s_.size()) return Error("the grammar is empty");
    while (pos_ < s_.size()) {
      std::string name = Name();
      if (name.empty()) return Error("expected a rule name");
      SkipSpace();
      if (s_.substr(pos_, 3) != "::=") return Error("expected '::=' after '" + name + "'");
      pos_ += 3;
      const uint32_t id = RuleId(name);
      if (rules_[id].defined) return Error("rule '" + name + "' is defined twice");
      rules_[id].defined = true;
      rules_[id].line = line_;
      std::vector<Seq> alts;
      RETURN_IF_ERROR(Alternatives(name, &alts));
      rules_[id].alts = std::move(alts);
      SkipSpace();
    }
    for (const RuleDef& r : rules_)
      if (!r.defined)
        return InvalidArgument("grammar: rule '" + r.name + "' is used (line " +
                               std::to_string(r.line) + ") but never defined");
    auto root = ids_.find(std::string(root_name));
    if (root == ids_.end())
      return InvalidArgument("grammar: no rule named '" + std::string(root_name) + "'");
    Grammar g;
    g.byte_sets = std::move(sets_);
    g.literals = std::move(literals_);
    g.chains = std::move(chains_);
    g.root = root->second;
    for (const RuleDef& r : rules_) {
      g.rule_names.push_back(r.name);
      std::vector<uint32_t> starts;
      for (const Seq& alt : r.alts) {
        starts.push_back(static_cast<uint32_t>(g.elements.size()));
        g.elements.insert(g.elements.end(), alt.begin(), alt.end());
        g.elements.push_back({Grammar::kEnd, 0});
      }
      g.rule_alts.push_back(std::move(starts));
    }
    if (g.elements.size() > kMaxElements) return InvalidArgument("grammar: too large");
    RETURN_IF_ERROR(CheckLeftRecursion(g));
    return g;
  }

 private:
  struct RuleDef {
    std::string name;
    std::vector<Seq> alts;
    bool defined = false;
    int line = 0;
  };

  Status Error(const std::string& what) const {
    return InvalidArgument("grammar line " + std::to_string(line_) + ": " + what);
  }

  void SkipSpace() {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        if (c == '\n') ++line_;
        ++pos_;
      } else {
        break;
      }
    }
  }

  static bool NameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
  }
  std::string Name() {
    size_t b = pos_;
    while (pos_ < s_.size() && NameChar(s_[pos_])) ++pos_;
    return std::string(s_.substr(b, pos_ - b));
  }
  // True when the text at pos_ starts a new rule ("name ::=").
  bool AtRuleStart() const {
    size_t p = pos_;
    while (p < s_.size() && NameChar(s_[p])) ++p;
    if (p == pos_) return false;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\r' || s_[p] == '\n')) ++p;
    return s_.substr(p, 3) == "::=";
  }

  uint32_t RuleId(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const uint32_t id = static_cast<uint32_t>(rules_.size());
    rules_.push_back({name, {}, false, line_});
    ids_[name] = id;
    return id;
  }
  uint32_t NewRule(const std::string& base, std::vector<Seq> alts) {
    const uint32_t id = RuleId(base + "/" + std::to_string(++generated_));
    rules_[id].alts = std::move(alts);
    rules_[id].defined = true;
    return id;
  }
  uint32_t Set(const std::bitset<256>& b) {
    for (size_t i = 0; i < sets_.size(); ++i)
      if (sets_[i] == b) return static_cast<uint32_t>(i);
    sets_.push_back(b);
    return static_cast<uint32_t>(sets_.size() - 1);
  }
  Element ByteElement(uint8_t lo, uint8_t hi) {
    std::bitset<256> b;
    for (int c = lo; c <= hi; ++c) b.set(static_cast<size_t>(c));
    return {Grammar::kBytes, Set(b)};
  }

  Status Alternatives(const std::string& rule, std::vector<Seq>* alts) {
    for (;;) {
      Seq seq;
      RETURN_IF_ERROR(Sequence(rule, &seq));
      alts->push_back(std::move(seq));
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == '|') {
        ++pos_;
        continue;
      }
      return Status::Ok();
    }
  }

  Status Sequence(const std::string& rule, Seq* seq) {
    for (;;) {
      SkipSpace();
      if (pos_ >= s_.size()) return Status::Ok();
      const char c = s_[pos_];
      if (c == '|' || c == ')') return Status::Ok();
      if (NameChar(c) && AtRuleStart()) return Status::Ok();
      Seq atom;
      RETURN_IF_ERROR(Atom(rule, &atom));
      RETURN_IF_ERROR(Quantified(rule, std::move(atom), seq));
      if (seq->size() > kMaxElements) return Error("the grammar is too large");
    }
  }

  // The atom as one element (a byte set or a rule reference), wrapping longer runs in a rule.
  Element AsOne(const std::string& rule, Seq atom) {
    if (atom.size() == 1) return atom[0];
    return {Grammar::kRef, NewRule(rule, {std::move(atom)})};
  }

  Status Quantified(const std::string& rule, Seq atom, Seq* seq) {
    if (pos_ >= s_.size()) {
      seq->insert(seq->end(), atom.begin(), atom.end());
      return Status::Ok();
    }
    int lo = 1, hi = 1;  // hi < 0: unbounded
    const char q = s_[pos_];
    if (q == '*')
      lo = 0, hi = -1, ++pos_;
    else if (q == '+')
      lo = 1, hi = -1, ++pos_;
    else if (q == '?')
      lo = 0, hi = 1, ++pos_;
    else if (q == '{') {
      ++pos_;
      auto number = [&](int* out) {
        size_t b = pos_;
        long v = 0;
        while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9' && v <= kMaxRepeat)
          v = v * 10 + (s_[pos_++] - '0');
        *out = static_cast<int>(v);
        return pos_ > b;
      };
      if (!number(&lo)) return Error("expected a number after '{'");
      hi = lo;
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        if (!number(&hi)) hi = -1;
      }
      if (pos_ >= s_.size() || s_[pos_] != '}') return Error("expected '}' to close a repetition");
      ++pos_;
      if (lo > kMaxRepeat || hi > kMaxRepeat)
        return Error("repetition bound over " + std::to_string(kMaxRepeat));
      if (hi >= 0 && hi < lo) return Error("repetition {m,n} with n < m");
    } else {
      seq->insert(seq->end(), atom.begin(), atom.end());
      return Status::Ok();
    }
    if (atom.empty()) return Status::Ok();
    const Element x = AsOne(rule, std::move(atom));
    for (int i = 0; i < lo; ++i) seq->push_back(x);
    if (hi < 0) {
      // star ::= x star | ()   (a tail call: the matcher keeps its stack flat)
      const uint32_t star = RuleId(rule + "/" + std::to_string(++generated_));
      rules_[star].alts = {{x, {Grammar::kRef, star}}, {}};
      rules_[star].defined = true;
      seq->push_back({Grammar::kRef, star});
    } else if (hi > lo) {
      // opt_k ::= x opt_{k-1} | ()   (a chain: opt_k allows k more)
      uint32_t prev = NewRule(rule, {{x}, {}});
      std::vector<uint32_t> chain = {prev};
      for (int k = 2; k <= hi - lo; ++k) {
        prev = NewRule(rule, {{x, {Grammar::kRef, prev}}, {}});
        chain.push_back(prev);
      }
      if (chain.size() > 2) chains_.push_back(std::move(chain));
      seq->push_back({Grammar::kRef, prev});
    }
    return Status::Ok();
  }

  Status Atom(const std::string& rule, Seq* out) {
    const char c = s_[pos_];
    if (c == '"') {
      ++pos_;
      std::string bytes;
      while (pos_ < s_.size() && s_[pos_] != '"') {
        if (s_[pos_] == '\n') return Error("unterminated string literal");
        uint32_t cp;
        RETURN_IF_ERROR(Char(&cp));
        AppendUtf8(cp, &bytes);
      }
      if (pos_ >= s_.size()) return Error("unterminated string literal");
      ++pos_;
      for (unsigned char b : bytes) out->push_back(ByteElement(b, b));
      if (!bytes.empty()) literals_.push_back(bytes);
      return Status::Ok();
    }
    if (c == '[') return Class(rule, out);
    if (c == '.') {
      ++pos_;
      return Ranges(rule, {{0, kMaxCodePoint}}, false, out);
    }
    if (c == '(') {
      ++pos_;
      std::vector<Seq> alts;
      RETURN_IF_ERROR(Alternatives(rule, &alts));
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != ')') return Error("expected ')'");
      ++pos_;
      if (alts.size() == 1)
        *out = std::move(alts[0]);
      else
        out->push_back({Grammar::kRef, NewRule(rule, std::move(alts))});
      return Status::Ok();
    }
    if (NameChar(c)) {
      out->push_back({Grammar::kRef, RuleId(Name())});
      return Status::Ok();
    }
    return Error(std::string("unexpected character '") + c + "'");
  }

  // One character of a literal or class at pos_, with escapes.
  Status Char(uint32_t* cp) {
    if (pos_ >= s_.size()) return Error("unexpected end of the grammar");
    unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c != '\\') {
      // A UTF-8 sequence in the source is one character.
      const int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
      if (n == 0 || pos_ + n > s_.size()) return Error("invalid UTF-8 in the grammar");
      uint32_t v = n == 1 ? c : c & (0xFF >> (n + 1));
      for (int i = 1; i < n; ++i) v = (v << 6) | (static_cast<unsigned char>(s_[pos_ + i]) & 0x3F);
      pos_ += n;
      *cp = v;
      return Status::Ok();
    }
    if (++pos_ >= s_.size()) return Error("a lone '\\' at the end");
    const char e = s_[pos_++];
    auto hex = [&](int digits) -> Status {
      uint32_t v = 0;
      for (int i = 0; i < digits; ++i) {
        if (pos_ >= s_.size()) return Error("short \\x/\\u escape");
        char h = s_[pos_++];
        int d = h >= '0' && h <= '9'   ? h - '0'
                : h >= 'a' && h <= 'f' ? h - 'a' + 10
                : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                       : -1;
        if (d < 0) return Error(std::string("bad hex digit '") + h + "' in an escape");
        v = v * 16 + static_cast<uint32_t>(d);
      }
      if (v > kMaxCodePoint) return Error("escape beyond U+10FFFF");
      *cp = v;
      return Status::Ok();
    };
    switch (e) {
      case 'n':
        *cp = '\n';
        return Status::Ok();
      case 'r':
        *cp = '\r';
        return Status::Ok();
      case 't':
        *cp = '\t';
        return Status::Ok();
      case '0':
        *cp = 0;
        return Status::Ok();
      case 'x':
        return hex(2);
      case 'u':
        return hex(4);
      case 'U':
        return hex(8);
      case '\\':
      case '"':
      case '\'':
      case '[':
      case ']':
      case '-':
      case '^':
      case '/':
        *cp = static_cast<unsigned char>(e);
        return Status::Ok();
    }
    return Error(std::string("unknown escape '\\") + e + "'");
  }

  Status Class(const std::string& rule, Seq* out) {
    ++pos_;  // '['
    bool negate = false;
    if (pos_ < s_.size() && s_[pos_] == '^') negate = true, ++pos_;
    std::vector<Range> ranges;
    while (pos_ < s_.size() && s_[pos_] != ']') {
      uint32_t lo, hi;
      RETURN_IF_ERROR(Char(&lo));
      hi = lo;
      if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
        ++pos_;
        RETURN_IF_ERROR(Char(&hi));
        if (hi < lo) return Error("character range out of order");
      }
      ranges.push_back({lo, hi});
    }
    if (pos_ >= s_.size()) return Error("unterminated character class");
    ++pos_;
    return Ranges(rule, std::move(ranges), negate, out);
  }

  // A character class as one byte set (ASCII only) or a rule of UTF-8 byte sequences.
  Status Ranges(const std::string& rule, std::vector<Range> ranges, bool negate, Seq* out) {
    ranges = Normalize(std::move(ranges), negate);
    if (ranges.empty()) return Error("a character class that matches nothing");
    std::bitset<256> single;
    std::vector<Seq> alts;
    for (const Range& r : ranges) {
      std::vector<std::vector<Range>> seqs;
      Utf8Sequences(r, &seqs);
      for (const auto& sq : seqs) {
        if (sq.size() == 1) {
          for (uint32_t b = sq[0].first; b <= sq[0].second; ++b) single.set(b);
          continue;
        }
        Seq alt;
        for (const Range& br : sq)
          alt.push_back(
              ByteElement(static_cast<uint8_t>(br.first), static_cast<uint8_t>(br.second)));
        alts.push_back(std::move(alt));
      }
    }
    if (single.any()) alts.insert(alts.begin(), Seq{{Grammar::kBytes, Set(single)}});
    if (alts.size() == 1 && alts[0].size() == 1) {
      out->push_back(alts[0][0]);
    } else {
      out->push_back({Grammar::kRef, NewRule(rule, std::move(alts))});
    }
    return Status::Ok();
  }

  // Left recursion would make the matcher expand forever: a rule must consume a byte before
  // it can reach itself again.
  static Status CheckLeftRecursion(const Grammar& g) {
    const size_t n = g.rule_alts.size();
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (uint32_t start : g.rule_alts[r]) {
          uint32_t p = start;
          while (g.elements[p].kind == Grammar::kRef && nullable[g.elements[p].arg]) ++p;
          if (g.elements[p].kind == Grammar::kEnd) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    // first[r]: rules reachable from r without consuming a byte.
    std::vector<std::vector<uint32_t>> first(n);
    for (size_t r = 0; r < n; ++r)
      for (uint32_t start : g.rule_alts[r])
        for (uint32_t p = start; g.elements[p].kind == Grammar::kRef; ++p) {
          first[r].push_back(g.elements[p].arg);
          if (!nullable[g.elements[p].arg]) break;
        }
    std::vector<int> color(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<uint32_t, size_t>> stack;
    for (uint32_t s = 0; s < n; ++s) {
      if (color[s]) continue;
      stack.push_back({s, 0});
      color[s] = 1;
      while (!stack.empty()) {
        auto& [r, i] = stack.back();
        if (i < first[r].size()) {
          const uint32_t t = first[r][i++];
          if (color[t] == 1)
            return InvalidArgument("grammar: rule '" + g.rule_names[t] +
                                   "' is left-recursive (it can reach itself without consuming "
                                   "a character)");
          if (color[t] == 0) {
            color[t] = 1;
            stack.push_back({t, 0});
          }
        } else {
          color[r] = 2;
          stack.pop_back();
        }
      }
    }
    return Status::Ok();
  }

  std::string_view s_;
  size_t pos_ = 0;
  int line_ = 1;
  int generated_ = 0;
  std::vector<RuleDef> rules_;
  std::map<std::string, uint32_t> ids_;
  std::vector<std::bitset<256>> sets_;
  std::vector<std::string> literals_;
  std::vector<std::vector<uint32_t>> chains_;
};

}  // namespace

void AppendUtf8(uint32_t cp, std::string* out) {
  uint8_t b[4];
  const int n = Utf8Length(cp);
  Encode(cp, n, b);
  out->append(reinterpret_cast<const char*>(b), static_cast<size_t>(n));
}

std::string GrammarLiteral(std::string_view bytes) {
  std::string out = "\"";
  static const char* hex = "0123456789ABCDEF";
  for (unsigned char c : bytes) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

namespace {
// A byte as a character-class member.
std::string ClassChar(unsigned char c) {
  static const char* hex = "0123456789ABCDEF";
  if (c == ']' || c == '\\' || c == '^' || c == '-' || c == '[' || c < 0x20 || c >= 0x7F)
    return std::string("\\x") + hex[c >> 4] + hex[c & 15];
  return std::string(1, static_cast<char>(c));
}
}  // namespace

std::string GrammarTextWithout(std::string_view tag) {
  if (tag.empty()) return "[^\\x00]*";
  const unsigned char first = static_cast<unsigned char>(tag[0]);
  const std::string not_first = "[^" + ClassChar(first) + "]";
  const std::string_view rest = tag.substr(1);
  if (rest.find(tag[0]) != std::string_view::npos || rest.empty()) return not_first + "*";
  // A run of the first character, then part of the rest and a character that breaks it (not
  // the first character, which starts over).
  const std::string run = GrammarLiteral(tag.substr(0, 1)) + "+";
  std::string breaks, tails = "\"\"";
  for (size_t k = 0; k < rest.size(); ++k) {
    const std::string part = k ? GrammarLiteral(rest.substr(0, k)) + " " : "";
    breaks += std::string(k ? " | " : "") + part + "[^" + ClassChar(first) +
              ClassChar(static_cast<unsigned char>(rest[k])) + "]";
    if (k) tails += " | " + GrammarLiteral(rest.substr(0, k));
  }
  return "( " + not_first + " | " + run + " ( " + breaks + " ) )* ( " + run + " ( " + tails +
         " ) )?";
}

Expected<Grammar> ParseGrammar(std::string_view text, std::string_view root) {
  Parser p(text);
  return p.Run(root);
}

}  // namespace substrate::serve
