// substrate tokenize -m MODEL [--text T | -f FILE] [--no-special] [--parse-special] [--pieces]
// substrate detokenize -m MODEL [--no-special] IDS...
//
// MODEL is a GGUF file or a HF folder; only its tokenizer metadata is read.
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/command.h"
#include "format/model_file.h"
#include "tokenizer/tokenizer.h"

namespace substrate::cli {
namespace {

Expected<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model) {
  if (model.empty()) return InvalidArgument("missing -m MODEL (a .gguf file or a HF folder)");
  ASSIGN_OR_RETURN(auto mf, ModelFile::Open(model));
  auto tok = Tokenizer::FromMetadata(mf->metadata());
  if (!tok.ok()) return tok.status().WithContext(model);
  return tok;
}

int RunTokenize(const std::vector<std::string>& args) {
  const char* kCmd = "tokenize";
  constexpr const char* kUsage =
      "usage: substrate tokenize -m MODEL [--text T | -f FILE] [--no-special] [--parse-special]"
      " [--pieces]\n"
      "  prints the token ids of the text, separated by spaces\n"
      "  --no-special     do not add BOS/EOS even where the model asks for them\n"
      "  --parse-special  recognise control tokens written in the text (<|im_start|>)\n"
      "  --pieces         print id:'piece' pairs, one per line\n";
  Flags f(args, {{"-m", "--model", "--text", "-t", "-f", "--file"},
                 {"--no-special", "--parse-special", "--pieces"}});
  if (!f.status().ok()) return UsageError(kCmd, f.status(), kUsage);
  if (f.help()) return std::fputs(kUsage, stdout), 0;
  const std::string file = f.Get({"-f", "--file"});
  const bool has_text = f.Has("--text") || f.Has("-t");
  if (has_text == !file.empty()) {
    return PrintError(kCmd, InvalidArgument("give exactly one of --text T or -f FILE"));
  }
  std::string text;
  if (has_text) {
    text = f.Get({"--text", "-t"});
  } else {
    std::ifstream in(file, std::ios::binary);
    if (!in) return PrintError(kCmd, IOError("cannot open '" + file + "'"));
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  auto tok = LoadTokenizer(f.Get({"-m", "--model"}));
  if (!tok.ok()) return PrintError(kCmd, tok.status());
  EncodeOptions opt;
  opt.add_special = !f.Has("--no-special");
  opt.parse_special = f.Has("--parse-special");
  auto ids = (*tok)->Encode(text, opt);
  if (!ids.ok()) return PrintError(kCmd, ids.status());
  std::string out;
  if (f.Has("--pieces")) {
    for (TokenId id : *ids) out += std::to_string(id) + ":'" + (*tok)->Piece(id) + "'\n";
  } else {
    for (size_t i = 0; i < ids->size(); ++i) {
      if (i) out.push_back(' ');
      out += std::to_string((*ids)[i]);
    }
    out.push_back('\n');
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int RunDetokenize(const std::vector<std::string>& args) {
  const char* kCmd = "detokenize";
  constexpr const char* kUsage =
      "usage: substrate detokenize -m MODEL [--no-special] IDS...\n"
      "  prints the text of the ids (separated by spaces or commas, one or many arguments),\n"
      "  byte for byte, without an added newline\n"
      "  --no-special  leave out control tokens (<|im_end|>, <s>)\n";
  Flags f(args, {{"-m", "--model"}, {"--no-special"}, -1});
  if (!f.status().ok()) return UsageError(kCmd, f.status(), kUsage);
  if (f.help()) return std::fputs(kUsage, stdout), 0;
  std::vector<TokenId> ids;
  for (const std::string& a : f.positional()) {
    std::string s = a;
    for (char& c : s)
      if (c == ',' || c == '[' || c == ']') c = ' ';
    std::istringstream in(s);
    for (std::string w; in >> w;) {
      char* end = nullptr;
      long long x = std::strtoll(w.c_str(), &end, 10);
      if (*end != '\0' || x < INT32_MIN || x > INT32_MAX) {
        return PrintError(kCmd, InvalidArgument("'" + w + "' is not a token id"));
      }
      ids.push_back(static_cast<TokenId>(x));
    }
  }
  auto tok = LoadTokenizer(f.Get({"-m", "--model"}));
  if (!tok.ok()) return PrintError(kCmd, tok.status());
  DecodeOptions opt;
  opt.special = !f.Has("--no-special");
  auto text = (*tok)->Decode(ids, opt);
  if (!text.ok()) return PrintError(kCmd, text.status());
  std::fwrite(text->data(), 1, text->size(), stdout);
  return 0;
}

CommandRegistrar reg_tokenize("tokenize", "print the token ids of a text (-m MODEL --text T | -f FILE)",
                              &RunTokenize);
CommandRegistrar reg_detokenize("detokenize", "print the text of token ids (-m MODEL IDS...)",
                                &RunDetokenize);

}  // namespace
}  // namespace substrate::cli
