// Tokenizer: table building, special-token partition, Encode and Decode.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "format/model_file.h"
#include "tokenizer/tokenizer_impl.h"

namespace substrate {

Tokenizer::Tokenizer(Vocab vocab) : vocab_(std::move(vocab)), impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

Expected<std::unique_ptr<Tokenizer>> Tokenizer::FromMetadata(const Metadata& md) {
  ASSIGN_OR_RETURN(Vocab v, VocabFromMetadata(md));
  return FromVocab(std::move(v));
}

Expected<std::unique_ptr<Tokenizer>> Tokenizer::FromVocab(Vocab vocab) {
  std::unique_ptr<Tokenizer> t(new Tokenizer(std::move(vocab)));
  RETURN_IF_ERROR(t->Init());
  return t;
}

namespace {

std::string Unescape2581(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 3, "\xe2\x96\x81") == 0) {
      out.push_back(' ');
      i += 3;
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

// "<0x0A>" -> 10; -1 when the text is not a byte token.
int ParseByteToken(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// Maps a byte-level BPE token's printable characters back to bytes.
std::string DecodeByteLevel(const std::string& t) {
  std::string out;
  out.reserve(t.size());
  for (size_t i = 0; i < t.size();) {
    int len = Utf8SequenceLength(t, i);
    if (len <= 0) {
      out.push_back(t[i++]);
      continue;
    }
    uint32_t cp = static_cast<unsigned char>(t[i]);
    if (len == 2) cp = ((cp & 0x1F) << 6) | (t[i + 1] & 0x3F);
    if (len == 3) cp = ((cp & 0x0F) << 12) | ((t[i + 1] & 0x3F) << 6) | (t[i + 2] & 0x3F);
    if (len == 4) {
      cp = ((cp & 0x07) << 18) | ((t[i + 1] & 0x3F) << 12) | ((t[i + 2] & 0x3F) << 6) |
           (t[i + 3] & 0x3F);
    }
    int b = CodepointToByte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(t, i, len);  // not a byte-level character: keep it as written
    }
    i += len;
  }
  return out;
}

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace

Status Tokenizer::Init() {
  Vocab& v = vocab_;
  Impl& im = *impl_;
  const int n = v.n_tokens();
  if (n == 0) return InvalidArgument("tokenizer: empty vocabulary");
  v.attrs.resize(n, kAttrNormal);
  v.scores.resize(n, 0.0f);
  im.by_text.reserve(n * 2);
  for (int i = 0; i < n; ++i) im.by_text.emplace(v.tokens[i], i);  // first id wins on duplicates
  for (TokenId* id : {&v.bos, &v.eos, &v.unk, &v.pad, &v.eot}) {
    if (*id < kNoToken || *id >= n) *id = kNoToken;
  }

  im.byte_token.fill(kNoToken);
  if (v.type == VocabType::kBpe) {
    for (int b = 0; b < 256; ++b) {
      im.byte_char[b].clear();
      AppendUtf8(ByteToCodepoint(static_cast<uint8_t>(b)), &im.byte_char[b]);
      im.byte_token[b] = im.FindText(im.byte_char[b]);
    }
    im.merges.Reserve(v.merges.size());
    for (size_t r = 0; r < v.merges.size(); ++r) {
      const std::string& m = v.merges[r];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) continue;
      const std::string_view left(m.data(), sp), right(m.data() + sp + 1, m.size() - sp - 1);
      const TokenId l = im.FindText(left), rt = im.FindText(right);
      std::string joined(left);
      joined.append(right);
      const TokenId res = im.FindText(joined);
      if (l == kNoToken || rt == kNoToken || res == kNoToken) continue;
      im.merges.Insert(l, rt, BpeMerge{static_cast<int32_t>(r), res});  // lowest rank wins
    }
    ASSIGN_OR_RETURN(im.pre, PreTokenizer::ForName(v.pre));
  } else {
    for (int i = 0; i < n; ++i) {
      int b = ParseByteToken(v.tokens[i]);
      if (b >= 0 && im.byte_token[b] == kNoToken && (v.attrs[i] & kAttrByte)) im.byte_token[b] = i;
    }
    for (int b = 0; b < 256; ++b) {
      if (im.byte_token[b] != kNoToken) continue;
      char hex[8];
      std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
      im.byte_token[b] = im.FindText(hex);
      if (im.byte_token[b] == kNoToken) im.byte_token[b] = im.FindText(std::string(1, static_cast<char>(b)));
    }
  }

  im.pieces.resize(n);
  for (int i = 0; i < n; ++i) {
    const uint32_t a = v.attrs[i];
    const std::string& t = v.tokens[i];
    std::string& p = im.pieces[i];
    if (a & (kAttrControl | kAttrUnknown | kAttrUserDefined)) {
      p = t;
    } else if (a & kAttrByte) {
      int b = ParseByteToken(t);
      p = b >= 0 ? std::string(1, static_cast<char>(b)) : t;
    } else if (a & kAttrNormal) {
      p = v.type == VocabType::kBpe ? DecodeByteLevel(t) : Unescape2581(t);
    }  // unused / undefined tokens decode to nothing
  }

  for (int i = 0; i < n; ++i) {
    if (v.attrs[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      im.special_by_byte[static_cast<unsigned char>(v.tokens[i][0])].push_back(i);
    }
  }
  for (auto& bucket : im.special_by_byte) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](TokenId a, TokenId b) {
      return v.tokens[a].size() > v.tokens[b].size();
    });
  }
  return Status::Ok();
}

bool Tokenizer::IsControl(TokenId id) const {
  return IsValid(id) && (vocab_.attrs[id] & (kAttrControl | kAttrUnknown));
}

bool Tokenizer::IsEog(TokenId id) const {
  return std::find(vocab_.eog.begin(), vocab_.eog.end(), id) != vocab_.eog.end();
}

const std::string& Tokenizer::Piece(TokenId id) const {
  static const std::string kEmpty;
  return IsValid(id) ? impl_->pieces[id] : kEmpty;
}

TokenId Tokenizer::Find(std::string_view token_text) const { return impl_->FindText(token_text); }

Expected<std::vector<TokenId>> Tokenizer::Encode(std::string_view text,
                                                 const EncodeOptions& opt) const {
  const Vocab& v = vocab_;
  const Impl& im = *impl_;
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  if (opt.add_special && v.add_bos) out.push_back(v.bos);

  EncodeScratch s;
  bool prev_special = true;  // SPM: a fragment after a special token (or at the start) gets ' '
  auto encode_text = [&](std::string_view frag) -> Status {
    if (frag.empty()) return Status::Ok();
    if (v.type == VocabType::kSpm) {
      s.text.clear();
      if (v.add_space_prefix && prev_special) s.text += "\xe2\x96\x81";
      for (char c : frag) {
        if (c == ' ') {
          s.text += "\xe2\x96\x81";
        } else {
          s.text.push_back(c);
        }
      }
      EncodeSpmText(v, im, s.text, s, &out);  // does not touch s.text
      prev_special = false;
      return Status::Ok();
    }
    s.words.clear();
    RETURN_IF_ERROR(im.pre->Split(frag, &s.words));
    for (std::string_view w : s.words) {
      if (w.size() <= 2) {  // too short to be worth a cache lookup
        EncodeBpeWord(v, im, w, s, &out);
        continue;
      }
      auto it = s.cache.find(w);
      if (it != s.cache.end()) {
        out.insert(out.end(), s.cache_ids.begin() + it->second.first,
                   s.cache_ids.begin() + it->second.second);
        continue;
      }
      const size_t before = out.size();
      EncodeBpeWord(v, im, w, s, &out);
      const uint32_t b = static_cast<uint32_t>(s.cache_ids.size());
      s.cache_ids.insert(s.cache_ids.end(), out.begin() + before, out.end());
      s.cache.emplace(w, std::make_pair(b, static_cast<uint32_t>(s.cache_ids.size())));
    }
    return Status::Ok();
  };

  // Cut out added/special tokens (leftmost, longest first), honouring their lstrip/rstrip.
  size_t raw_start = 0, i = 0;
  while (i < text.size()) {
    const auto& bucket = im.special_by_byte[static_cast<unsigned char>(text[i])];
    TokenId hit = kNoToken;
    for (TokenId id : bucket) {
      const uint32_t a = v.attrs[id];
      if (!opt.parse_special && (a & (kAttrControl | kAttrUnknown))) continue;
      const std::string& t = v.tokens[id];
      if (text.size() - i >= t.size() && std::memcmp(text.data() + i, t.data(), t.size()) == 0) {
        hit = id;
        break;
      }
    }
    if (hit == kNoToken) {
      ++i;
      continue;
    }
    size_t raw_end = i;
    if (v.attrs[hit] & kAttrLStrip) {
      while (raw_end > raw_start && IsAsciiSpace(text[raw_end - 1])) --raw_end;
    }
    RETURN_IF_ERROR(encode_text(text.substr(raw_start, raw_end - raw_start)));
    out.push_back(hit);
    prev_special = true;
    i += v.tokens[hit].size();
    if (v.attrs[hit] & kAttrRStrip) {
      while (i < text.size() && IsAsciiSpace(text[i])) ++i;
    }
    raw_start = i;
  }
  RETURN_IF_ERROR(encode_text(text.substr(raw_start)));
  if (opt.add_special && v.add_eos) out.push_back(v.eos);
  return out;
}

Expected<std::string> Tokenizer::Decode(std::span<const TokenId> ids, const DecodeOptions& opt) const {
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) {
    const TokenId id = ids[k];
    if (!IsValid(id)) {
      return InvalidArgument("tokenizer: token id " + std::to_string(id) + " at position " +
                             std::to_string(k) + " is outside the vocabulary (size " +
                             std::to_string(n_vocab()) + ")");
    }
    if (!opt.special && IsControl(id)) continue;
    const std::string& p = impl_->pieces[id];
    if (k == 0 && opt.strip_leading_space && vocab_.add_space_prefix && !p.empty() && p[0] == ' ') {
      out.append(p, 1);
    } else {
      out += p;
    }
  }
  if (opt.clean_spaces && vocab_.clean_spaces) {
    // The HF clean_up_tokenization_spaces rule: no space before . , ! ? and the common
    // contractions.
    static const char* const kRules[][2] = {{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","},
                                            {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
                                            {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto& r : kRules) {
      const size_t from_len = std::strlen(r[0]);
      std::string next;
      next.reserve(out.size());
      size_t pos = 0;
      for (size_t f; (f = out.find(r[0], pos)) != std::string::npos; pos = f + from_len) {
        next.append(out, pos, f - pos);
        next += r[1];
      }
      next.append(out, pos);
      out.swap(next);
    }
  }
  return out;
}

}  // namespace substrate
