// `substrate quantize IN OUT --size BYTES|--bpw BITS -f TEXT ...`: calibrate (cached), plan the
// file to the byte, quantize with importance, print the mix (cmd_quantize.cpp's usage).
#pragma once

#include <string>

#include "cli/command.h"
#include "core/thread_pool.h"
#include "format/model_file.h"

namespace substrate::cli {

int QuantizeToSize(const Flags& flags, const ModelFile& in, const std::string& out_path,
                   ThreadPool& pool, int threads);

}  // namespace substrate::cli
