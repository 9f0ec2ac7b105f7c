// substrate convert HF_DIR -o OUT.gguf [--type f32|f16|bf16|auto]: a Hugging Face checkpoint
// (or a float GGUF) written as a GGUF file, bit-identical to llama.cpp's converter output for the
// supported architectures.
#include <cstdio>

#include "cli/command.h"
#include "format/convert.h"
#include "format/model_file.h"

namespace substrate::cli {
namespace {

int RunConvert(const std::vector<std::string>& args) {
  constexpr const char* kUsage =
      "usage: substrate convert HF_DIR -o OUT.gguf [--type f32|f16|bf16|auto]\n"
      "  auto (default) keeps the checkpoint's own type; 1-D tensors, norms and MoE\n"
      "  routers are always written as f32, as llama.cpp's converter does\n";
  Flags flags(args, {{"-o", "--output", "--type", "--outtype"}, {}, 1});
  if (!flags.status().ok()) return UsageError("convert", flags.status(), kUsage);
  if (flags.help()) return std::fputs(kUsage, stdout), 0;
  std::string out = flags.Get({"-o", "--output"});
  if (flags.positional().size() != 1 || out.empty())
    return UsageError("convert", InvalidArgument("need HF_DIR and -o OUT.gguf"), kUsage);
  std::string type = flags.Get({"--type", "--outtype"}, "auto");
  std::optional<DType> out_type;
  if (type != "auto") {
    out_type = DTypeFromName(type);
    if (!out_type || (*out_type != DType::kF32 && *out_type != DType::kF16 && *out_type != DType::kBF16))
      return PrintError("convert", InvalidArgument("--type must be f32, f16, bf16 or auto, got '" + type + "'"));
  }
  auto in = ModelFile::Open(flags.positional()[0]);
  if (!in.ok()) return PrintError("convert", in.status());
  Status s = ConvertToGguf(**in, out, out_type, /*progress=*/true);
  if (!s.ok()) return PrintError("convert", s);
  std::printf("wrote %s (%zu tensors)\n", out.c_str(), (*in)->tensors().size());
  return 0;
}

CommandRegistrar reg("convert", "convert a Hugging Face checkpoint to GGUF (f32/f16/bf16)", &RunConvert);

}  // namespace
}  // namespace substrate::cli
