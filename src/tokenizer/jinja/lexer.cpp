// Jinja lexer. Mirrors jinja2's rules for where text ends and tags begin, including the
// whitespace rules of trim_blocks/lstrip_blocks, so that rendered bytes match Python's.
#include "tokenizer/jinja/lexer.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "tokenizer/jinja/value.h"

namespace substrate::jinja {

namespace {

Status SyntaxError(int line, const std::string& what) {
  return InvalidArgument("template syntax error (line " + std::to_string(line) + "): " + what);
}

bool StartsWith(const std::string& s, size_t pos, const char* lit) {
  return s.compare(pos, std::strlen(lit), lit) == 0;
}

bool IsNameStart(unsigned char c) { return std::isalpha(c) || c == '_' || c >= 0x80; }
bool IsNameChar(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding of a string literal's body.
Expected<std::string> DecodeEscapes(const std::string& body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      continue;
    }
    char e = body[++i];
    switch (e) {
      case '\n': break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x':
      case 'u':
      case 'U': {
        size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t k = 0; k < digits; ++k) {
          int h = i + 1 + k < body.size() ? HexValue(body[i + 1 + k]) : -1;
          if (h < 0) return SyntaxError(line, std::string("truncated \\") + e + " escape in string literal");
          cp = cp * 16 + static_cast<uint32_t>(h);
        }
        if (cp > 0x10FFFF) return SyntaxError(line, "illegal Unicode character in string literal");
        i += digits;
        AppendUtf8(out, cp);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
            cp = cp * 8 + static_cast<uint32_t>(body[++i] - '0');
          AppendUtf8(out, cp);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  Expected<std::vector<Token>> Run() {
    const size_t n = src_.size();
    while (pos_ < n) {
      size_t k = pos_;
      while ((k = src_.find('{', k)) != std::string::npos) {
        if (k + 1 < n && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) break;
        ++k;
      }
      if (k == std::string::npos) {
        EmitData(src_.substr(pos_));
        Advance(n);
        break;
      }
      char kind = src_[k + 1];
      char sign = k + 2 < n && (src_[k + 2] == '-' || src_[k + 2] == '+') ? src_[k + 2] : 0;
      size_t raw_end = kind == '%' ? MatchRawBegin(k) : 0;
      std::string text = src_.substr(pos_, k - pos_);
      ApplyLeftStrip(text, sign, kind != '{');
      EmitData(text);
      Advance(k);
      size_t body = k + 2 + (sign ? 1 : 0);
      if (raw_end) {
        RETURN_IF_ERROR(LexRaw(raw_end));
      } else if (kind == '#') {
        RETURN_IF_ERROR(LexComment(body));
      } else {
        RETURN_IF_ERROR(LexTag(kind, body));
      }
    }
    tokens_.push_back(Token{TokenType::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  // The text before a tag: `-` strips all whitespace; otherwise lstrip_blocks drops the
  // spaces between the line's start and a block or comment tag.
  void ApplyLeftStrip(std::string& text, char sign, bool lstrip_applies) {
    if (sign == '-') {
      text = StripPySpace(text, false, true);
    } else if (sign != '+' && lstrip_applies) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && l_pos < text.size() && SkipPySpace(text, l_pos) == text.size())
        text.resize(l_pos);
    }
  }

  void EmitData(const std::string& text) {
    if (!text.empty()) tokens_.push_back(Token{TokenType::kData, text, line_});
  }

  void Advance(size_t to) {
    for (size_t i = pos_; i < to; ++i) line_ += src_[i] == '\n';
    pos_ = to;
  }

  // Matches `{%[-+]?\s*raw\s*(-%}\s*|%})` at k; returns the end offset, or 0.
  size_t MatchRawBegin(size_t k) {
    size_t j = k + 2;
    if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) ++j;
    j = SkipPySpace(src_, j);
    if (!StartsWith(src_, j, "raw")) return 0;
    j = SkipPySpace(src_, j + 3);
    if (StartsWith(src_, j, "-%}")) return SkipPySpace(src_, j + 3);
    if (StartsWith(src_, j, "%}")) return j + 2;
    return 0;
  }

  // Closing of a block tag at j: `+%}`, `-%}\s*` or `%}\n?` (trim_blocks). Returns end or 0.
  size_t MatchBlockEnd(size_t j) const {
    if (StartsWith(src_, j, "+%}")) return j + 3;
    if (StartsWith(src_, j, "-%}")) return SkipPySpace(src_, j + 3);
    if (StartsWith(src_, j, "%}")) return j + 2 + (j + 2 < src_.size() && src_[j + 2] == '\n');
    return 0;
  }

  Status LexComment(size_t j) {
    for (; j < src_.size(); ++j) {
      size_t end = 0;
      if (StartsWith(src_, j, "+#}")) end = j + 3;
      else if (StartsWith(src_, j, "-#}")) end = SkipPySpace(src_, j + 3);
      else if (StartsWith(src_, j, "#}")) end = j + 2 + (j + 2 < src_.size() && src_[j + 2] == '\n');
      if (end) {
        line_starting_ = src_[end - 1] == '\n';
        Advance(end);
        return Status::Ok();
      }
    }
    return SyntaxError(line_, "Missing end of comment tag");
  }

  Status LexRaw(size_t begin_end) {
    line_starting_ = src_[begin_end - 1] == '\n';
    Advance(begin_end);
    for (size_t k = pos_; (k = src_.find("{%", k)) != std::string::npos; ++k) {
      size_t j = k + 2;
      char sign = j < src_.size() && (src_[j] == '-' || src_[j] == '+') ? src_[j] : 0;
      if (sign) ++j;
      j = SkipPySpace(src_, j);
      if (!StartsWith(src_, j, "endraw")) continue;
      size_t end = MatchBlockEnd(SkipPySpace(src_, j + 6));
      if (!end) continue;
      std::string text = src_.substr(pos_, k - pos_);
      ApplyLeftStrip(text, sign, true);
      EmitData(text);
      line_starting_ = src_[end - 1] == '\n';
      Advance(end);
      return Status::Ok();
    }
    return SyntaxError(line_, "Missing end of raw directive");
  }

  Status LexTag(char kind, size_t j) {
    const bool block = kind == '%';
    tokens_.push_back(Token{block ? TokenType::kBlockBegin : TokenType::kVarBegin, "", line_});
    Advance(j);
    std::vector<char> balance;
    while (true) {
      j = pos_;
      if (j >= src_.size())
        return SyntaxError(line_, std::string("unexpected end of template, expected '") +
                                      (block ? "end of statement block'" : "end of print statement'"));
      if (balance.empty()) {
        size_t end = 0;
        if (block) end = MatchBlockEnd(j);
        else if (StartsWith(src_, j, "-}}")) end = SkipPySpace(src_, j + 3);
        else if (StartsWith(src_, j, "}}")) end = j + 2;
        if (end) {
          tokens_.push_back(Token{block ? TokenType::kBlockEnd : TokenType::kVarEnd, "", line_});
          line_starting_ = src_[end - 1] == '\n';
          Advance(end);
          return Status::Ok();
        }
      }
      unsigned char c = static_cast<unsigned char>(src_[j]);
      size_t ws = SkipPySpace(src_, j);
      if (ws > j) {
        Advance(ws);
        continue;
      }
      if (std::isdigit(c)) {
        RETURN_IF_ERROR(LexNumber(j));
        continue;
      }
      if (IsNameStart(c)) {
        size_t e = j;
        while (e < src_.size() && IsNameChar(static_cast<unsigned char>(src_[e]))) ++e;
        tokens_.push_back(Token{TokenType::kName, src_.substr(j, e - j), line_});
        Advance(e);
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t e = j + 1;
        while (e < src_.size() && src_[e] != static_cast<char>(c)) e += src_[e] == '\\' ? 2 : 1;
        if (e >= src_.size()) return SyntaxError(line_, std::string("unexpected char '") + static_cast<char>(c) + "' (unterminated string)");
        ASSIGN_OR_RETURN(std::string s, DecodeEscapes(src_.substr(j + 1, e - j - 1), line_));
        tokens_.push_back(Token{TokenType::kString, std::move(s), line_});
        Advance(e + 1);
        continue;
      }
      static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                   "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};
      const char* op = nullptr;
      for (const char* o : kOps)
        if (StartsWith(src_, j, o)) {
          op = o;
          break;
        }
      if (!op) return SyntaxError(line_, std::string("unexpected char '") + static_cast<char>(c) + "'");
      std::string o(op);
      if (o == "(" || o == "[" || o == "{") {
        if (balance.size() > 256) return SyntaxError(line_, "brackets nested too deeply");
        balance.push_back(o == "(" ? ')' : o == "[" ? ']' : '}');
      } else if (o == ")" || o == "]" || o == "}") {
        if (balance.empty()) return SyntaxError(line_, "unexpected '" + o + "'");
        if (balance.back() != o[0])
          return SyntaxError(line_, "unexpected '" + o + "', expected '" + std::string(1, balance.back()) + "'");
        balance.pop_back();
      }
      tokens_.push_back(Token{TokenType::kOp, o, line_});
      Advance(j + o.size());
    }
  }

  Status LexNumber(size_t j) {
    auto digits = [&](size_t p) {
      while (p < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[p])) ||
                                 (src_[p] == '_' && p + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p + 1])))))
        ++p;
      return p;
    };
    size_t e = digits(j);
    bool is_float = false;
    bool after_dot = j > 0 && src_[j - 1] == '.';
    if (!after_dot && e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      e = digits(e + 1);
      is_float = true;
    }
    if (!after_dot && e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t p = e + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) {
        e = digits(p);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = j; i < e; ++i)
      if (src_[i] != '_') text += src_[i];
    Token t{is_float ? TokenType::kFloat : TokenType::kInt, text, line_};
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      t.int_value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) return SyntaxError(line_, "integer literal too large: " + text);
    }
    tokens_.push_back(std::move(t));
    Advance(e);
    return Status::Ok();
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

Expected<std::vector<Token>> Tokenize(const std::string& source) {
  // jinja2 normalizes newlines to "\n" and drops one trailing newline (keep_trailing_newline).
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src)).Run();
}

}  // namespace substrate::jinja
