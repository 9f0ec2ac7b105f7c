#include "runtime/kv_session.h"

#include <cstring>
#include <memory>
#include <vector>

#include "core/file_io.h"
#include "format/model_file.h"
#include "format/model_fingerprint.h"
#include "runtime/residency_manager.h"
#include "store/crc32c.h"
#include "store/store_index.h"

namespace substrate {
namespace {

constexpr char kMagic[8] = {'S', 'B', 'K', 'V', 'S', 'E', 'S', '1'};

struct Header {
  char magic[8];
  uint64_t fingerprint;
  uint32_t kv_type;
  uint32_t n_layer;
  uint64_t k_row_bytes;
  uint64_t v_row_bytes;
  uint64_t n_tokens;
};
static_assert(sizeof(Header) == 48, "the header is written as it sits in memory");

uint64_t FileBytes(const Header& h) {
  return sizeof(Header) + 4 * h.n_tokens +
         uint64_t{h.n_layer} * h.n_tokens * (h.k_row_bytes + h.v_row_bytes) + 4;
}

}  // namespace

Expected<uint64_t> ModelFingerprint(const Engine& e) {
  ASSIGN_OR_RETURN(uint64_t h, WeightFingerprint(e.file()));
  // A store's model.gguf has no tensors: the weights are its manifest's ranges, at the tier the
  // runtime serves (a session made at tier 0 is not one made at tier 2).
  const std::string& path = e.file().path();
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  if (e.file().tensors().empty() && Env::Default()->FileExists(dir + "/manifest.json")) {
    const ResidencyManager* rm = e.runtime();
    ASSIGN_OR_RETURN(uint64_t store, StoreFingerprint(dir, rm ? rm->serve_tier() : 2));
    h = Fnv1a(h, &store, sizeof store);
  }
  return h;
}

Status SaveKvSession(const std::string& path, const Engine& e, Session& s, Env* env) {
  KvCache& c = s.cache;
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  ASSIGN_OR_RETURN(h.fingerprint, ModelFingerprint(e));
  h.kv_type = static_cast<uint32_t>(c.type());
  h.n_layer = static_cast<uint32_t>(c.n_layer());
  h.k_row_bytes = c.k_row_bytes();
  h.v_row_bytes = c.v_row_bytes();
  h.n_tokens = static_cast<uint64_t>(c.n_past());
  ASSIGN_OR_RETURN(auto w, AtomicFileWriter::Create(path, env));
  uint32_t crc = 0;
  auto put = [&](const void* p, uint64_t n) {
    crc = Crc32c(p, n, crc);
    return w->Append(p, n);
  };
  RETURN_IF_ERROR(put(&h, sizeof h));
  RETURN_IF_ERROR(put(c.tokens().data(), 4 * h.n_tokens));
  for (int l = 0; l < c.n_layer(); ++l) {
    RETURN_IF_ERROR(put(c.KeyBytes(l), h.n_tokens * h.k_row_bytes));
    RETURN_IF_ERROR(put(c.ValueBytes(l), h.n_tokens * h.v_row_bytes));
  }
  RETURN_IF_ERROR(w->Append(&crc, sizeof crc));
  return w->Commit();
}

Expected<bool> LoadKvSession(const std::string& path, const Engine& e, Session& s, std::string* why,
                             Env* env) {
  ASSIGN_OR_RETURN(auto f, (env ? env : Env::Default())->NewRandomAccessFile(path, false));
  auto corrupt = [&](const std::string& what) {
    return Corruption("session file '" + path + "': " + what);
  };
  Header h{};
  if (f->size() < sizeof h + 4) return corrupt("too short for a session file");
  RETURN_IF_ERROR(f->Read(0, sizeof h, &h));
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return corrupt("not a session file");
  if (h.n_layer > (1u << 16) || h.n_tokens > (1ull << 24) || h.k_row_bytes > (1ull << 24) ||
      h.v_row_bytes > (1ull << 24))
    return corrupt("header out of range");
  if (f->size() != FileBytes(h))
    return corrupt("size " + std::to_string(f->size()) + " bytes, the header says " +
                   std::to_string(FileBytes(h)) + " (truncated or damaged)");
  KvCache& c = s.cache;
  ASSIGN_OR_RETURN(const uint64_t fingerprint, ModelFingerprint(e));
  if (h.fingerprint != fingerprint) {
    *why = "it was saved with another model";
  } else if (h.kv_type != static_cast<uint32_t>(c.type()) ||
             h.n_layer != static_cast<uint32_t>(c.n_layer()) || h.k_row_bytes != c.k_row_bytes() ||
             h.v_row_bytes != c.v_row_bytes()) {
    *why = "its KV cache type differs (--kv-type)";
  } else if (static_cast<int64_t>(h.n_tokens) > c.n_ctx()) {
    *why = "its " + std::to_string(h.n_tokens) + " tokens exceed the context of " +
           std::to_string(c.n_ctx());
  } else {
    why->clear();
  }
  if (!why->empty()) return false;

  // Read into the cache, checksumming as we go: its rows are overwritten, so it is emptied
  // first and holds the tokens only once everything checked out.
  c.Clear();
  uint32_t crc = Crc32c(&h, sizeof h);
  std::vector<int32_t> tokens(h.n_tokens);
  uint64_t off = sizeof h;
  auto get = [&](void* dst, uint64_t n) -> Status {
    RETURN_IF_ERROR(f->Read(off, n, dst));
    crc = Crc32c(dst, n, crc);
    off += n;
    return Status::Ok();
  };
  RETURN_IF_ERROR(get(tokens.data(), 4 * h.n_tokens));
  for (int l = 0; l < c.n_layer(); ++l) {
    RETURN_IF_ERROR(get(c.KeyBytes(l), h.n_tokens * h.k_row_bytes));
    RETURN_IF_ERROR(get(c.ValueBytes(l), h.n_tokens * h.v_row_bytes));
  }
  uint32_t want = 0;
  RETURN_IF_ERROR(f->Read(off, sizeof want, &want));
  if (want != crc) return corrupt("checksum mismatch (damaged)");
  const int64_t n_vocab = e.model().hparams().n_vocab;
  for (int32_t t : tokens)
    if (t < 0 || t >= n_vocab)
      return corrupt("token id " + std::to_string(t) + " outside the vocabulary");
  RETURN_IF_ERROR(c.RestoreTokens(std::move(tokens)));
  return true;
}

}  // namespace substrate
