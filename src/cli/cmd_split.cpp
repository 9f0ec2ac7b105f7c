// substrate split IN.gguf OUT_PREFIX (--max-size SIZE | --tensors N): writes IN as a split GGUF,
// OUT_PREFIX-00001-of-0000N.gguf ..., the layout of llama.cpp's gguf-split (format/gguf_split.h),
// which every command that takes a GGUF reads as one model.
#include <cstdio>

#include "cli/command.h"
#include "core/memory_ledger.h"
#include "format/gguf_reader.h"
#include "format/gguf_split.h"

namespace substrate::cli {
namespace {

constexpr const char* kUsage =
    "usage: substrate split IN.gguf OUT_PREFIX (--max-size SIZE | --tensors N)\n"
    "Writes IN as a split GGUF: OUT_PREFIX-00001-of-0000N.gguf ... OUT_PREFIX-0000N-of-0000N.gguf,\n"
    "as llama.cpp's gguf-split does (the first part holds the metadata; each part is a whole\n"
    "GGUF). Every command that takes a GGUF model reads the parts as one model, given any of\n"
    "their names.\n"
    "  --max-size SIZE  at most SIZE of tensor data per part (e.g. 2G; a larger tensor gets\n"
    "                   a part of its own)\n"
    "  --tensors N      N tensors per part\n";

int RunSplit(const std::vector<std::string>& args) {
  Flags f(args, {{"--max-size", "--tensors"}, {}, 2});
  if (!f.status().ok()) return UsageError("split", f.status(), kUsage);
  if (f.help()) return std::fputs(kUsage, stdout), 0;
  if (f.positional().size() != 2)
    return UsageError("split", InvalidArgument("give IN.gguf and OUT_PREFIX"), kUsage);
  if (f.Has("--max-size") == f.Has("--tensors"))
    return UsageError("split", InvalidArgument("give one of --max-size SIZE or --tensors N"), kUsage);
  GgufSplitOptions o;
  if (f.Has("--max-size")) {
    auto b = ParseBytes(f.Get({"--max-size"}));
    if (!b.ok()) return UsageError("split", b.status(), kUsage);
    if (*b == 0) return UsageError("split", InvalidArgument("--max-size must be more than 0"), kUsage);
    o.max_bytes = *b;
  } else {
    auto n = f.GetInt({"--tensors"}, 0);
    if (!n.ok()) return UsageError("split", n.status(), kUsage);
    if (*n < 1 || *n > (1 << 30))
      return UsageError("split", InvalidArgument("--tensors must be at least 1"), kUsage);
    o.max_tensors = static_cast<int>(*n);
  }
  const std::string& out = f.positional()[1];
  if (ParseGgufSplitPath(out + ".gguf") || out.ends_with(".gguf"))
    return UsageError("split", InvalidArgument("OUT_PREFIX is the name before -00001-of-0000N.gguf"),
                      kUsage);
  auto in = GgufFile::Open(f.positional()[0]);
  if (!in.ok()) return PrintError("split", in.status());
  auto parts = WriteGgufSplit(**in, out, o);
  if (!parts.ok()) return PrintError("split", parts.status());
  for (const std::string& p : *parts) std::printf("%s\n", p.c_str());
  return 0;
}

CommandRegistrar reg("split", "write a GGUF as a split GGUF (NAME-00001-of-0000N.gguf, ...)",
                     &RunSplit);

}  // namespace
}  // namespace substrate::cli
