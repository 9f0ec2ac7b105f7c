#include "backend/backend_factory.h"

#include "backend/cpu/cpu_backend.h"
#ifdef SUBSTRATE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace substrate {

bool BackendBuilt(const std::string& device) {
  if (device == "cpu") return true;
#ifdef SUBSTRATE_HAVE_CUDA
  if (device == "cuda") return true;
#endif
  return false;
}

Expected<std::unique_ptr<Backend>> CreateBackend(const BackendChoice& choice, ThreadPool* pool,
                                                 MemoryLedger* ledger) {
  if (choice.device == "cpu") {
    if (choice.max_vram)
      return InvalidArgument("--max-vram is a GPU's memory budget: it needs --device cuda");
    return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(pool, ledger));
  }
  if (choice.device == "cuda") {
#ifdef SUBSTRATE_HAVE_CUDA
    CudaBackendOptions o;
    o.device = choice.gpu;
    o.max_vram = choice.max_vram;
    o.reserve = choice.vram_reserve;
    o.staging = choice.vram_staging;
    o.host_pool = pool;
    o.host_ledger = ledger;
    return NewCudaBackend(o);
#else
    return InvalidArgument(
        "--device cuda: this build has no CUDA backend (configure with -DSUBSTRATE_CUDA=ON)");
#endif
  }
  return InvalidArgument("unknown device '" + choice.device + "' (expected cpu or cuda)");
}

}  // namespace substrate
