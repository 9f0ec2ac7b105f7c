// Jinja parser: tokens to statements, with jinja2's operator precedence (filters and `is`
// bind tighter than arithmetic, `not` looser than comparisons). Unknown filters and tests are
// errors at parse time, as in jinja2, even in branches that never run.
#pragma once

#include <string>

#include "core/status.h"
#include "tokenizer/jinja/ast.h"

namespace substrate::jinja {

// Nesting deeper than this (expressions or blocks) is a syntax error rather than a stack
// overflow.
constexpr int kMaxParseDepth = 200;

Expected<Body> ParseTemplate(const std::string& source);

}  // namespace substrate::jinja
