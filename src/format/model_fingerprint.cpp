#include "format/model_fingerprint.h"

#include <fcntl.h>

#include <algorithm>
#include <string>

namespace substrate {
namespace {

// The samples are a few bytes each at increasing offsets: read-ahead would take them for a
// sequential read and cache megabytes after each (the whole file of a small model), which an
// out-of-core run under a budget must not leave behind. Off while sampling, then back to normal.
class NoReadAhead {
 public:
  explicit NoReadAhead(const ModelFile& f) : f_(f) { Advise(POSIX_FADV_RANDOM); }
  ~NoReadAhead() { Advise(POSIX_FADV_NORMAL); }

 private:
  void Advise(int advice) const {
    for (int i = 0; i < f_.n_files(); ++i)
      if (f_.file(i).fd() >= 0) ::posix_fadvise(f_.file(i).fd(), 0, 0, advice);
  }
  const ModelFile& f_;
};

}  // namespace

uint64_t Fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

Expected<uint64_t> WeightFingerprint(const ModelFile& f) {
  uint64_t h = kFnvOffset;
  const std::string arch = f.metadata().GetString("general.architecture", "");
  h = Fnv1a(h, arch.data(), arch.size());
  uint8_t sample[kFingerprintSampleBytes];
  const NoReadAhead no_read_ahead(f);
  for (const TensorInfo& t : f.tensors()) {
    h = Fnv1a(h, t.name.data(), t.name.size());
    const auto type = static_cast<uint32_t>(t.type);
    h = Fnv1a(h, &type, sizeof type);
    for (uint64_t d : t.ne) h = Fnv1a(h, &d, sizeof d);
    h = Fnv1a(h, &t.bytes, sizeof t.bytes);
    for (const TensorPart& p : t.parts) {
      if (p.bytes == 0) continue;
      const uint64_t n = std::min<uint64_t>(kFingerprintSampleBytes, p.bytes);
      const uint64_t span = p.bytes - n;  // sample starts lie in [0, span]
      const RandomAccessFile& file = f.file(p.file);
      for (int s = 0; s < kFingerprintSamples; ++s) {
        const uint64_t at = span * static_cast<uint64_t>(s) / (kFingerprintSamples - 1);
        RETURN_IF_ERROR(file.Read(p.offset + at, n, sample)
                            .WithContext("fingerprint of tensor '" + t.name + "'"));
        h = Fnv1a(h, sample, n);
      }
    }
  }
  return h;
}

}  // namespace substrate
