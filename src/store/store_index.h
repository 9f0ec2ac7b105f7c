// StoreIndex: the parsed manifest of a tiered store (store/pack.h) — every tensor unit's ranges
// per tier, grouped by the op that owns them — plus the store's open data files and a verified
// positioned read. Shared by StoreWeightSource (resident) and runtime/ResidencyManager
// (streaming); it holds no weight bytes itself.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/file_io.h"
#include "format/model_file.h"
#include "model/weight_source.h"
#include "quant/weight_view.h"

namespace substrate {

// One tier of one tensor unit in a data file.
struct StoreRange {
  DType type = DType::kF32;
  uint64_t bytes = 0;
  uint64_t offset = 0;
  uint32_t crc = 0;
  int file = -1;     // index into StoreIndex files; -1 for a tier above max_tier (not opened)
  uint64_t slab_pos = 0;  // where its bytes start in its op's tier area of a slab (StoreOp)
  // How its rows lie (tier 0 of a matrix only): a store packed in the CPU kernels' layout
  // (PackOptions::cpu_layout) holds them interleaved already.
  WeightLayout layout = WeightLayout::kRows;
  std::string what;  // "FILE: tensor 'x' slice s tier k", for errors
};

// A whole tensor, or one expert slice of a 3-D expert tensor.
struct StoreUnit {
  StoreRange tier[3];
  int n_tiers = 0;  // tiers in the store (some may be above max_tier)
  int op = -1;      // index into StoreIndex::ops()
};

struct StoreTensor {
  TensorInfo info;
  bool sliced = false;
  std::vector<StoreUnit> units;  // one, or one per expert slice
};

// An op's data: per tier the aligned spans of file bytes holding all its units' ranges. A packed
// store has one span per tier (pack writes an op's ranges together); a GGUF read in place has one
// per run of adjacent tensors (an expert's gate, up and down slices lie apart). A slab lays out
// tier 0's spans one after the other, each rounded up to 4096, then tier 1's, ...
struct StoreOp {
  struct Span {
    int file = -1;
    uint64_t offset = 0;    // 4096-aligned
    uint64_t bytes = 0;     // a multiple of 4096 where the file allows (packs pad to it)
    uint64_t slab_pos = 0;  // where it lands in its tier's area of a slab (4096-aligned)
  };
  std::string id;
  std::vector<Span> spans[3];
  int n_tiers = 0;  // loadable tiers (<= max_tier + 1)
  std::vector<std::pair<TensorId, int>> units;  // (tensor, slice or -1)
  // Bytes of tier k's area in a slab (its spans, each rounded up to 4096).
  uint64_t TierBytes(int tier) const;
  // Bytes of tiers 0..tier (as laid out in a slab).
  uint64_t SlabBytes(int tier) const;
  // Offset of tier k's area inside a slab laid out as tier 0, tier 1, ...
  uint64_t SlabOffset(int tier) const;
};

struct StoreIndexOptions {
  int max_tier = 2;        // tiers above it are not opened nor checked
  bool direct_io = false;  // open data files with O_DIRECT (falls back where refused)
  Env* env = nullptr;      // opens and reads the store's files; nullptr: Env::Default()
  // OpenGguf: false skips the checksums (a plan made from the tensor table alone, reading
  // nothing; Verify would then fail every range).
  bool checksums = true;
  // OpenGguf: a next-n (MTP) layer's tensors get ops of their own (ListOps with
  // hp.list_nextn); without it they are in no op, so nothing plans or reads them.
  bool with_nextn = false;
};

// The fingerprint of a store's weights at tiers 0..tier, from its manifest alone (nothing else
// is read): every entry's tensor, slice, tier, type, size and CRC32C, and model.gguf's checksum.
// Unlike format/model_fingerprint.h's sampled one, it covers every byte.
Expected<uint64_t> StoreFingerprint(const std::string& dir, int tier, Env* env = nullptr);

class StoreIndex {
 public:
  // Parses STORE/manifest.json, opens model.gguf (metadata) and the data files, and checks every
  // range against its file's size. NotFound without a manifest; Corruption naming the file and
  // tensor for a malformed manifest or a truncated data file.
  static Expected<std::unique_ptr<StoreIndex>> Open(const std::string& dir,
                                                    const StoreIndexOptions& options = {});
  // A GGUF file (or a split GGUF: one data file per part) read in place as a one-tier store
  // (store/gguf_store.cpp): tier 0 of each unit is the tensor's (or expert slice's) own bytes in
  // the file, grouped by op as pack would group them; each range's CRC32C comes from the file's checksum record (store/gguf_checksums.h),
  // computed on first use and recomputed when the file changed.
  static Expected<std::unique_ptr<StoreIndex>> OpenGguf(const std::string& path,
                                                        const StoreIndexOptions& options = {});
  // The GGUF read in place (OpenGguf), or "" for a packed store.
  const std::string& gguf_path() const { return gguf_path_; }
  // Where a GGUF's checksum record is kept ("" when it could not be written).
  const std::string& checksum_record() const { return checksum_record_; }

  const ModelFile& meta() const { return *meta_; }
  const std::string& dir() const { return dir_; }
  int n_tiers() const { return n_tiers_; }
  // The ladder as the manifest names it, for messages: "tiers 0..2 (Q4_K, + Q8_0, + F16)".
  std::string LadderText() const;
  int max_tier() const { return options_.max_tier; }
  // Whether some range is stored in an interleaved layout (a backend must compute on it, or put
  // it back into rows once read).
  bool has_interleaved() const { return has_interleaved_; }

  TensorId Resolve(const std::string& name) const;
  const std::vector<StoreTensor>& tensors() const { return tensors_; }
  const std::vector<StoreOp>& ops() const { return ops_; }
  int FindOp(const std::string& id) const;  // -1 when absent
  const RandomAccessFile& file(int i) const { return *files_[i]; }
  size_t n_files() const { return files_.size(); }

  // The unit that Acquire(id, slice) reads, and for a slice of an unsliced tensor the element
  // offset of that slice within it. InvalidArgument / Unimplemented for a bad id or slice.
  Expected<const StoreUnit*> FindUnit(TensorId id, int slice, uint64_t* offset_el) const;
  // The view of tiers 0..use of a unit whose tier k bytes start at tier_data[k].
  WeightView MakeView(TensorId id, int slice, const StoreUnit& u, uint64_t offset_el, int use,
                      const uint8_t* const tier_data[3]) const;

  // Reads range r into dst (r.bytes) and checks its CRC32C.
  Status ReadVerified(const StoreRange& r, uint8_t* dst) const;
  // Corruption naming file, tensor and offset when data's CRC32C differs from r's.
  Status Verify(const StoreRange& r, const uint8_t* data) const;
  // The same for a CRC32C computed elsewhere (a range checked in pieces).
  Status CheckCrc(const StoreRange& r, uint32_t got) const;

 private:
  StoreIndex() = default;
  Status Parse(const std::string& text);
  Status CheckMatchesModel() const;
  Status VerifyModelFile(const std::string& name, uint64_t bytes, uint32_t crc) const;
  // Opens a data file into files_ (with O_DIRECT when options_ ask). Where the file system
  // refuses O_DIRECT: a warning (once), and read-ahead off (POSIX_FADV_RANDOM), because the readers
  // drop each range from the page cache once read (posix_fadvise DONTNEED) and read-ahead would
  // cache the bytes after it: the cache would grow past the budget.
  Status AddDataFile(const std::string& path);
  // Lays out each op's tiers: its units' ranges grouped into aligned spans, and every range's
  // position in a slab. Corruption (naming the range) for one past the end of its file.
  Status LayOutSpans();

  StoreIndexOptions options_;
  std::string dir_;
  std::unique_ptr<ModelFile> meta_;
  std::vector<std::unique_ptr<RandomAccessFile>> files_;
  std::vector<StoreTensor> tensors_;
  std::unordered_map<std::string, TensorId> ids_;
  std::vector<StoreOp> ops_;
  std::unordered_map<std::string, int> op_ids_;
  bool has_interleaved_ = false;
  int n_tiers_ = 1;
  std::vector<std::string> tier_names_;  // manifest "tiers": a type per tier, or "plan"/"keep"
  std::string gguf_path_;
  std::string checksum_record_;
  bool warned_buffered_ = false;
};

}  // namespace substrate
