// Helpers for the model tests: loading models and golden references from ../shared.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend_factory.h"
#include "core/file_io.h"
#include "core/memory_ledger.h"
#include "core/thread_pool.h"
#include "format/model_file.h"
#include "model/model.h"
#include "model/resident_weight_source.h"

namespace substrate::testing {

inline std::string SharedDir() { return SUBSTRATE_SHARED_DIR; }
inline bool Exists(const std::string& p) { return std::filesystem::exists(p); }

// A model opened from a GGUF file or HF folder, weights resident.
struct LoadedModel {
  std::unique_ptr<ModelFile> file;
  std::unique_ptr<ResidentWeightSource> source;
  // Declared after the source, so destroyed before it: a GPU backend unpins the source's memory.
  std::unique_ptr<Backend> backend;  // null: the model's own CPU backend
  std::unique_ptr<Model> model;
};

inline ThreadPool& TestPool() {
  static ThreadPool pool(2);
  return pool;
}

// The device the model tests run on: SUBSTRATE_TEST_DEVICE=cuda runs the golden and greedy tests
// on the GPU (backend/backend_factory.h); unset or "cpu", the CPU.
inline std::string TestDevice() {
  const char* d = std::getenv("SUBSTRATE_TEST_DEVICE");
  return d && *d ? d : "cpu";
}

inline Expected<LoadedModel> LoadModel(const std::string& path, MemoryLedger* ledger) {
  LoadedModel m;
  ASSIGN_OR_RETURN(m.file, ModelFile::Open(path));
  if (TestDevice() == "cpu") {
    ASSIGN_OR_RETURN(m.source, ResidentWeightSource::Load(*m.file, ledger));
    ASSIGN_OR_RETURN(m.model,
                     Model::Create(m.file->metadata(), m.source.get(), &TestPool(), ledger));
    return m;
  }
  BackendChoice choice{TestDevice(), 0};
  if (const char* v = std::getenv("SUBSTRATE_TEST_VRAM"); v && std::string(v) == "half") {
    // The GPU under a budget (--max-vram) that holds about half of the weights: the rest are
    // read from host memory in place (or copied per op: SUBSTRATE_CUDA_ZEROCOPY=0). The
    // backend's own memory is measured on one without a budget.
    uint64_t weights = 0;
    for (const TensorInfo& t : m.file->tensors()) weights += t.bytes;
    ASSIGN_OR_RETURN(auto probe, CreateBackend(choice, &TestPool(), ledger));
    const uint64_t own = probe->device_ledger()->current();
    probe.reset();
    choice.vram_staging = 16u << 20;
    choice.vram_reserve = choice.vram_staging + (256u << 20);  // activations, KV caches
    choice.max_vram = own + choice.vram_reserve + (48u << 20) + weights / 2;
  }
  ASSIGN_OR_RETURN(m.backend, CreateBackend(choice, &TestPool(), ledger));
  ResidentWeightSource::Options ro;
  ro.backend = m.backend.get();
  ASSIGN_OR_RETURN(m.source, ResidentWeightSource::Load(*m.file, ledger, ro));
  ASSIGN_OR_RETURN(m.model,
                   Model::Create(m.file->metadata(), m.source.get(), m.backend.get(), ledger));
  return m;
}

// golden.safetensors: "<seq>.tokens" (int32) and "<seq>.logits" (float32 [len, vocab]).
struct GoldenSeq {
  std::string name;
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

// A small reader of its own (the golden files hold int32 tensors, which the model-weight
// safetensors reader does not accept).
inline Expected<std::vector<GoldenSeq>> ReadGolden(const std::string& folder) {
  const std::string path = folder + "/golden.safetensors";
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  if (bytes.size() < 8) return Corruption(path + ": too short");
  uint64_t hlen = 0;
  std::memcpy(&hlen, bytes.data(), 8);
  if (hlen > bytes.size() - 8) return Corruption(path + ": header past end");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, hlen));
  } catch (const nlohmann::json::exception& e) {
    return Corruption(path + ": " + e.what());
  }
  const uint64_t base = 8 + hlen;
  std::vector<GoldenSeq> out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string name = it.key();
    const std::string suffix = ".tokens";
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    GoldenSeq s;
    s.name = name.substr(0, name.size() - suffix.size());
    if (!header.contains(s.name + ".logits")) return Corruption(path + ": no " + s.name + ".logits");
    const auto& t = *it;
    const auto& l = header[s.name + ".logits"];
    if (t["dtype"] != "I32" || l["dtype"] != "F32") return Corruption(path + ": unexpected dtypes");
    const uint64_t t0 = t["data_offsets"][0], t1 = t["data_offsets"][1];
    const uint64_t l0 = l["data_offsets"][0], l1 = l["data_offsets"][1];
    if (t1 < t0 || l1 < l0 || base + t1 > bytes.size() || base + l1 > bytes.size())
      return Corruption(path + ": data offsets out of range");
    s.tokens.resize((t1 - t0) / 4);
    std::memcpy(s.tokens.data(), bytes.data() + base + t0, s.tokens.size() * 4);
    s.logits.resize((l1 - l0) / 4);
    std::memcpy(s.logits.data(), bytes.data() + base + l0, s.logits.size() * 4);
    out.push_back(std::move(s));
  }
  return out;
}

inline Expected<nlohmann::json> ReadJson(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Corruption(path + ": " + e.what());
  }
}

// ||a - b|| / ||b||
inline double RelError(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace substrate::testing
