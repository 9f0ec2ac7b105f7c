// libFuzzer target: the store's manifest reader (StoreIndex::Open: the manifest's fields, tiers,
// slices, ranges against the data files, model.gguf's checksum, the op layout) on arbitrary
// manifest.json bytes, over a real store packed once at start-up from the bundled model.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "format/model_file.h"
#include "store/pack.h"
#include "store/store_index.h"

namespace {
std::string dir;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  dir = (std::filesystem::temp_directory_path() / ("fuzz_store_" + std::to_string(getpid())))
            .string();
  auto f = substrate::ModelFile::Open(std::string(SUBSTRATE_SOURCE_DIR) +
                                      "/models/tiny-coder-Q8_0.gguf");
  if (!f.ok()) __builtin_trap();
  substrate::PackOptions o;
  o.keep_skeleton = true;
  o.residuals = {substrate::DType::kQ8_0};  // a tier 1 too, where the shapes allow
  if (!substrate::PackStore(**f, dir, o).ok()) __builtin_trap();
  std::atexit([] { std::filesystem::remove_all(dir); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FILE* m = std::fopen((dir + "/manifest.json").c_str(), "wb");
  if (!m) __builtin_trap();
  std::fwrite(data, 1, size, m);
  std::fclose(m);
  for (int max_tier : {0, 2}) {
    substrate::StoreIndexOptions o;
    o.max_tier = max_tier;
    (void)substrate::StoreIndex::Open(dir, o);
  }
  return 0;
}
