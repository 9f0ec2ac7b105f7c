// Per-tensor type plans for `substrate quantize --plan plan.json`: the compiler decides which
// type each tensor gets; quantize applies it on top of the file type's rules (mix.h overrides).
//
// Accepted JSON (either form):
//   {"tensor_types": {"blk.0.attn_q.weight": "Q4_K", "output.weight": "Q6_K"}}
//   {"blk.0.attn_q.weight": "Q4_K", ...}
// Type names as llama.cpp prints them, any case. Tensors not named keep the mix's choice.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "core/status.h"
#include "format/dtype.h"

namespace substrate {

Expected<std::map<std::string, DType>> ParseTensorTypePlan(std::string_view json);
Expected<std::map<std::string, DType>> LoadTensorTypePlan(const std::string& path);

}  // namespace substrate
