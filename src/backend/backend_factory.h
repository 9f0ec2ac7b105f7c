// Choosing the compute backend of a run by name: "cpu" (CpuBackend, the default) or "cuda"
// (CudaBackend on GPU `gpu`, when the build has it: -DSUBSTRATE_CUDA=ON).
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/memory_ledger.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace substrate {

struct BackendChoice {
  std::string device = "cpu";
  int gpu = 0;
  // A device backend's memory budget (--max-vram; 0: all of it). `vram_reserve` of it stays
  // for what the run allocates after the weights (KV caches, activations, staging for the
  // weights it does not hold); weights past the rest are read from host memory per op.
  uint64_t max_vram = 0;
  uint64_t vram_reserve = 0;
  uint64_t vram_staging = 0;  // of vram_reserve: the staging buffer's size
};

// `pool` and `ledger` (the host's) must outlive the backend; a device backend charges its own
// memory to its device ledger (Backend::device_ledger).
Expected<std::unique_ptr<Backend>> CreateBackend(const BackendChoice& choice, ThreadPool* pool,
                                                 MemoryLedger* ledger);

// Whether this build has the named backend.
bool BackendBuilt(const std::string& device);

}  // namespace substrate
