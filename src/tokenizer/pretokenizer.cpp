// PreTokenizer on PCRE2: compile once (JIT when available), split fragment by fragment.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <algorithm>

namespace substrate {

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  std::string pattern;
  ~Regex() {
    if (code) pcre2_code_free(code);
  }
};

PreTokenizer::~PreTokenizer() = default;

int Utf8SequenceLength(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  const size_t left = s.size() - i;
  const auto cont = [&](size_t k) { return (b(k) & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return left >= 2 && cont(i + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (left < 3 || !cont(i + 1) || !cont(i + 2)) return 0;
    if (c == 0xE0 && b(i + 1) < 0xA0) return 0;  // overlong
    if (c == 0xED && b(i + 1) >= 0xA0) return 0;  // surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (left < 4 || !cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return 0;
    if (c == 0xF0 && b(i + 1) < 0x90) return 0;  // overlong
    if (c == 0xF4 && b(i + 1) >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

Expected<std::unique_ptr<PreTokenizer>> PreTokenizer::FromRegexes(
    const std::vector<std::string>& regexes) {
  std::unique_ptr<PreTokenizer> pt(new PreTokenizer());
  for (const std::string& pattern : regexes) {
    auto re = std::make_unique<Regex>();
    re->pattern = pattern;
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
    if (!re->code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return InvalidArgument("tokenizer: bad pre-tokenizer regex at offset " +
                             std::to_string(err_offset) + ": " +
                             reinterpret_cast<const char*>(msg) + " in '" + pattern + "'");
    }
    // JIT is an optimisation only: without it (unsupported CPU, no executable memory) the
    // interpreter gives the same matches.
    (void)pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);
    pt->regexes_.push_back(std::move(re));
  }
  return pt;
}

Expected<std::unique_ptr<PreTokenizer>> PreTokenizer::ForName(const std::string& name) {
  ASSIGN_OR_RETURN(auto regexes, RegexesFor(name));
  return FromRegexes(regexes);
}

namespace {

// Owns the per-call PCRE2 state, so Split stays const and thread-safe.
struct MatchState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchState() {
    md = pcre2_match_data_create(4, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
    if (mctx && jit_stack) pcre2_jit_stack_assign(mctx, nullptr, jit_stack);
  }
  ~MatchState() {
    if (jit_stack) pcre2_jit_stack_free(jit_stack);
    if (mctx) pcre2_match_context_free(mctx);
    if (md) pcre2_match_data_free(md);
  }
};

// Splits one valid-UTF-8 fragment by `code` into matches and gaps (non-empty pieces only).
Status SplitOne(const pcre2_code* code, const std::string& pattern, std::string_view frag,
                MatchState& st, std::vector<std::string_view>* out) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(frag.data());
  size_t pos = 0;   // where the next search starts
  size_t done = 0;  // end of what has been emitted
  while (pos <= frag.size()) {
    int rc = pcre2_match(code, subject, frag.size(), pos, PCRE2_NO_UTF_CHECK, st.md, st.mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      return Internal("tokenizer: regex '" + pattern + "' failed on a " +
                      std::to_string(frag.size()) + "-byte fragment: " +
                      reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    const size_t ms = ov[0], me = ov[1];
    if (ms > done) out->push_back(frag.substr(done, ms - done));
    if (me > ms) out->push_back(frag.substr(ms, me - ms));
    done = std::max(done, me);
    if (me > ms) {
      pos = me;
    } else {
      // An empty match (a lookahead-only split point): move on by one character.
      if (ms >= frag.size()) break;
      int len = Utf8SequenceLength(frag, ms);
      pos = ms + (len > 0 ? len : 1);
      // The split point stays: text up to it was emitted above.
    }
  }
  if (done < frag.size()) out->push_back(frag.substr(done));
  return Status::Ok();
}

}  // namespace

Status PreTokenizer::Split(std::string_view text, std::vector<std::string_view>* words) const {
  if (text.empty()) return Status::Ok();
  // Stage 0: valid UTF-8 runs; each invalid byte is a word of its own that no regex sees.
  std::vector<std::string_view> cur;
  std::vector<bool> is_raw;  // true for an invalid byte
  {
    size_t run = 0, i = 0;
    while (i < text.size()) {
      int len = Utf8SequenceLength(text, i);
      if (len > 0) {
        i += len;
        continue;
      }
      if (i > run) {
        cur.push_back(text.substr(run, i - run));
        is_raw.push_back(false);
      }
      cur.push_back(text.substr(i, 1));
      is_raw.push_back(true);
      run = ++i;
    }
    if (run < text.size()) {
      cur.push_back(text.substr(run));
      is_raw.push_back(false);
    }
  }
  MatchState st;
  if (!st.md || !st.mctx) return OutOfMemory("tokenizer: cannot allocate PCRE2 match data");
  std::vector<std::string_view> next;
  std::vector<bool> next_raw;
  for (const auto& re : regexes_) {
    next.clear();
    next_raw.clear();
    for (size_t k = 0; k < cur.size(); ++k) {
      if (is_raw[k]) {
        next.push_back(cur[k]);
        next_raw.push_back(true);
        continue;
      }
      RETURN_IF_ERROR(SplitOne(re->code, re->pattern, cur[k], st, &next));
      next_raw.resize(next.size(), false);
    }
    cur.swap(next);
    is_raw.swap(next_raw);
  }
  words->insert(words->end(), cur.begin(), cur.end());
  return Status::Ok();
}

}  // namespace substrate
