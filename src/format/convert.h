// Model conversion to GGUF with plain float types (what `substrate convert` runs): the input's
// catalog and metadata (a HF folder seen through HfModelFile, or a GGUF of F32/F16/BF16 tensors)
// written out with the reference converter's type policy, one tensor (or one expert) in memory at
// a time.
#pragma once

#include <optional>
#include <string>

#include "format/model_file.h"

namespace substrate {

// The type the reference converter stores `tensor` in when the file's type is `out`: F32 for
// 1-D tensors, norms, MoE routers (ffn_gate_inp) and anything not named *.weight; `out` otherwise.
DType ConvertedType(const TensorInfo& tensor, DType out);

// general.file_type for a file of mostly `t` (ALL_F32 0, MOSTLY_F16 1, MOSTLY_BF16 32).
uint32_t GgufFileType(DType t);

// Writes `in` as a GGUF at `out_path`. `out_type` is F32, F16 or BF16; nullopt keeps the type
// most of the input's 2-D tensors have. `progress` shows a bar on a terminal.
Status ConvertToGguf(const ModelFile& in, const std::string& out_path,
                     std::optional<DType> out_type, bool progress = false);

}  // namespace substrate
