// The CUDA backend: Backend over one NVIDIA GPU's memory and a stream (built with
// -DSUBSTRATE_CUDA=ON). This header has no CUDA types, so the layers above include it freely.
//
// Memory: Allocate is cudaMalloc, charged to a ledger of the device's own (device_ledger()), so
// a RAM budget (--max-ram) counts host memory only. Resident weights are copied to the device
// once, when the weight source hands them over (AdoptResidentWeight / AdoptResidentBytes); an
// op finds the device copy of a view (a whole tensor, an expert slice) by its host address.
// Views the backend has not adopted (out-of-core sources, residual tiers read from a store) are
// uploaded per op into a staging buffer; weights past a --max-vram budget are read in place from
// pinned host memory.
//
// Execution: ops are recorded, not launched, and issued on the stream when the host next waits
// for a result (Download, Route, AllFinite, Synchronize). A run of ops between two waits that
// repeats exactly (a decode step: the token ids and positions it reads live in device memory,
// not in the launches) is captured as a CUDA graph the second time and replayed from then on,
// so decode is not bound by kernel launches.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/memory_ledger.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace substrate {

struct CudaBackendOptions {
  int device = 0;      // --gpu N
  bool graphs = true;  // replay repeated op runs as CUDA graphs
  // --max-vram: the device ledger's cap (0: none). Weights are adopted while they leave
  // `reserve` (KV caches, activations, `staging`) and the backend's own work memory free; the
  // rest stay in host memory, pinned, and kernels read them there in place (or, with
  // SUBSTRATE_CUDA_ZEROCOPY=0, each op copies them into the staging buffer of `staging` bytes).
  uint64_t max_vram = 0;
  uint64_t reserve = 0;
  uint64_t staging = 0;
  // The hybrid under a budget: a one-token product over weights read in place from host memory
  // is split by rows, the host's CPU computing its share where the bytes lie (on `host_pool`)
  // while the device reads the rest over the link, the share moving after each split toward
  // where both sides finish together. Null pool: the device reads every row.
  // SUBSTRATE_CUDA_HYBRID=0 turns it off, =F fixes the CPU's share at F (0 < F <= 1).
  ThreadPool* host_pool = nullptr;
  MemoryLedger* host_ledger = nullptr;
};

// Fails (Unavailable-style InvalidArgument) when there is no such device or no driver.
Expected<std::unique_ptr<Backend>> NewCudaBackend(const CudaBackendOptions& options);

// Devices the driver sees (0 without a driver or a GPU).
int CudaDeviceCount();

// The launches a CUDA backend has recorded so far, those issued and those pending (0 for any
// other backend): the op test checks that ops join the launches they mean to.
int64_t CudaLaunches(const Backend& backend);

}  // namespace substrate
