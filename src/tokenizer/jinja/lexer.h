// Jinja lexer with the whitespace rules `transformers` renders chat templates with:
// trim_blocks (a newline right after a block or comment tag is dropped), lstrip_blocks
// (spaces and tabs before a block or comment tag on its own line are dropped), `-` / `+`
// whitespace control, comments, raw blocks, and jinja2's removal of one trailing newline.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace substrate::jinja {

enum class TokenType { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  TokenType type;
  std::string text;  // data, name, operator, or the decoded string literal
  int line = 1;
  int64_t int_value = 0;
  double float_value = 0;
};

Expected<std::vector<Token>> Tokenize(const std::string& source);

}  // namespace substrate::jinja
