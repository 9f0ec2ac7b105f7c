// A fingerprint of a model file's weights that reads a few hundred bytes per tensor, not the
// file: per tensor its name, type, shape and size, and samples of its bytes spread over it (the
// first and last bytes, and evenly between). It tells apart two files with the same shapes but
// other weights (a fine-tune, another quantization, a scaled tensor) at the cost of a few
// thousand small positioned reads on a 400 GB model. A change confined to bytes between the
// samples goes unseen: where every byte matters, checksum the file (the store's manifest has a
// CRC32C per range).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "format/model_file.h"

namespace substrate {

// Samples per tensor part and bytes per sample.
inline constexpr int kFingerprintSamples = 8;
inline constexpr uint64_t kFingerprintSampleBytes = 64;

// FNV-1a, 64-bit, continuing from h (start with kFnvOffset).
inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
uint64_t Fnv1a(uint64_t h, const void* data, size_t n);

// The fingerprint of f's architecture, tensor names, types, shapes and sampled weight bytes.
// Errors are the file reads' (a file truncated or gone since it was opened).
Expected<uint64_t> WeightFingerprint(const ModelFile& f);

}  // namespace substrate
