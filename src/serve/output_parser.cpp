#include "serve/output_parser.h"

#include <algorithm>

#include "serve/json_scan.h"

namespace substrate::serve {

namespace {

// The longest suffix of `t` that is a proper prefix of `word`.
size_t HoldBack(std::string_view t, std::string_view word) {
  for (size_t k = std::min(word.size() - 1, t.size()); k > 0; --k)
    if (t.substr(t.size() - k) == word.substr(0, k)) return k;
  return 0;
}

bool StartsWith(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

}  // namespace

OutputParser::Split OutputParser::Parse(bool final) const {
  Split s;
  std::string_view t = text_;
  // Reasoning first: everything up to the closing tag, when the answer opens with the opening
  // tag (or the prompt left one open).
  std::string_view rest = t;
  if (o_.split_reasoning) {
    size_t body = std::string_view::npos;
    if (o_.thinking_open) {
      body = 0;
    } else {
      const size_t b = SkipJsonSpace(t, 0);
      if (StartsWith(t.substr(b), o_.think_open)) {
        body = b + o_.think_open.size();
      } else if (!final && StartsWith(o_.think_open, t.substr(b))) {
        return s;  // maybe the opening tag: wait
      }
    }
    if (body != std::string_view::npos) {
      const size_t close = t.find(o_.think_close, body);
      if (close == std::string_view::npos) {
        std::string_view r = t.substr(body);
        if (!final) r.remove_suffix(HoldBack(r, o_.think_close));
        s.reasoning = std::string(r);
        return s;
      }
      s.reasoning = std::string(t.substr(body, close - body));
      rest = t.substr(close + o_.think_close.size());
      // The answer after reasoning starts after the blank lines models put there.
      const size_t b = SkipJsonSpace(rest, 0);
      if (b == rest.size() && !final) return s;
      rest.remove_prefix(b);
    }
  }
  if (!o_.parse_tools) {
    s.content = std::string(rest);
    return s;
  }
  ToolParse tp = ParseToolCalls(o_.format, rest, final);
  s.content = std::move(tp.content);
  s.calls = std::move(tp.calls);
  s.has_partial = tp.has_partial;
  s.partial = std::move(tp.partial);
  s.error = std::move(tp.error);
  if (final && (!s.error.empty() || s.calls.empty())) {
    if (o_.tools_required) {
      if (s.error.empty()) s.error = "the answer holds no tool call";
    } else if (s.calls.empty()) {
      // Auto mode: what did not parse as a call is text.
      s.content = std::string(rest);
      s.error.clear();
    }
  }
  return s;
}

std::vector<OutputEvent> OutputParser::Diff(const Split& s) {
  std::vector<OutputEvent> ev;
  // Every field only grows; anything else would contradict what was streamed, and is dropped.
  auto grow = [&](std::string& have, const std::string& now, OutputEvent::Kind kind) {
    if (now.size() > have.size() && StartsWith(now, have)) {
      ev.push_back({kind, 0, now.substr(have.size()), ""});
      have = now;
    }
  };
  grow(reasoning_, s.reasoning, OutputEvent::kReasoning);
  grow(content_, s.content, OutputEvent::kContent);
  auto call = [&](size_t i, const ToolCall& c) {
    if (i == calls_.size()) {
      calls_.push_back({c.name, ""});
      ev.push_back({OutputEvent::kToolStart, static_cast<int>(i), "", c.name});
    }
    if (i < calls_.size() && calls_[i].name == c.name) {
      std::string& have = calls_[i].arguments;
      if (c.arguments.size() > have.size() && StartsWith(c.arguments, have)) {
        ev.push_back(
            {OutputEvent::kToolArgs, static_cast<int>(i), c.arguments.substr(have.size()), ""});
        have = c.arguments;
      }
    }
  };
  for (size_t i = complete_calls_; i < s.calls.size(); ++i) call(i, s.calls[i]);
  complete_calls_ = std::max(complete_calls_, s.calls.size());
  if (s.has_partial && !s.partial.name.empty()) call(s.calls.size(), s.partial);
  return ev;
}

std::vector<OutputEvent> OutputParser::Push(std::string_view text) {
  text_.append(text);
  return Diff(Parse(false));
}

std::vector<OutputEvent> OutputParser::Finish() {
  Split s = Parse(true);
  std::vector<OutputEvent> ev = Diff(s);
  // The answer is the final split (a call streamed while partial that the final text does not
  // complete is left out of it, and is an error when tools were required).
  reasoning_ = s.reasoning;
  content_ = s.content;
  calls_ = s.calls;
  error_ = s.error;
  return ev;
}

}  // namespace substrate::serve
