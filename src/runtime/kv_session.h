// Sessions on disk: a conversation's KV cache rows and tokens saved to a file and restored
// later, so that a prompt extending a saved one skips the prefill of what was saved (as
// llama.cpp's --prompt-cache does). The file names the model it belongs to (a fingerprint of
// its architecture, tensor names, types, shapes and weights: sampled bytes of every tensor of a
// GGUF or HF file, or a store's manifest checksums at the tier served), is written to a
// temporary name and renamed, and ends with a CRC32C of everything before it.
#pragma once

#include <cstdint>
#include <string>

#include "core/env.h"
#include "core/status.h"
#include "runtime/engine.h"

namespace substrate {

// The fingerprint of the model `e` runs (reads a few hundred bytes per tensor).
Expected<uint64_t> ModelFingerprint(const Engine& e);

// Writes the tokens of s.cache and their rows to `path` (atomically, through env; nullptr:
// Env::Default()): on any error the previous file at `path` is left as it was.
Status SaveKvSession(const std::string& path, const Engine& e, Session& s, Env* env = nullptr);

// Restores a session saved by SaveKvSession into `s`. Returns false, with *why set and `s`
// unchanged, when the file belongs to another model, KV type or a larger context; a damaged
// or truncated file is a Corruption error naming the file and what is wrong.
Expected<bool> LoadKvSession(const std::string& path, const Engine& e, Session& s, std::string* why,
                             Env* env = nullptr);

}  // namespace substrate
