// End-to-end tests of `substrate run` and `substrate perplexity` through the built binary.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "format/model_file.h"

namespace {

struct Result {
  int rc = -1;
  std::string out;  // stdout and stderr together
};

Result RunCli(const std::string& args) {
  Result r;
  const std::string cmd = std::string(SUBSTRATE_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string Shared(const std::string& rel) { return std::string(SUBSTRATE_SHARED_DIR) + "/" + rel; }
bool Exists(const std::string& p) { return std::filesystem::exists(p); }

void PutString(std::string& b, const std::string& s) {
  const uint64_t n = s.size();
  b.append(reinterpret_cast<const char*>(&n), 8);
  b += s;
}

TEST(CliRun, MissingFileIsAClearError) {
  Result r = RunCli("run -m /nonexistent/model.gguf -p hello");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("/nonexistent/model.gguf"), std::string::npos) << r.out;
}

TEST(CliRun, UnknownArchitectureIsAClearError) {
  // A minimal GGUF v3 with only general.architecture = "frobnicator".
  std::string b = "GGUF";
  const uint32_t version = 3, str_type = 8;
  const uint64_t n_tensors = 0, n_kv = 1;
  b.append(reinterpret_cast<const char*>(&version), 4);
  b.append(reinterpret_cast<const char*>(&n_tensors), 8);
  b.append(reinterpret_cast<const char*>(&n_kv), 8);
  PutString(b, "general.architecture");
  b.append(reinterpret_cast<const char*>(&str_type), 4);
  PutString(b, "frobnicator");
  const std::string path = ::testing::TempDir() + "/model_unknown_arch.gguf";
  std::ofstream(path, std::ios::binary) << b;
  Result r = RunCli("run -m " + path + " -p hello");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("frobnicator"), std::string::npos) << r.out;
  std::filesystem::remove(path);
}

// --max-vram is refused with a reason before any weight is read: without a GPU backend, below
// what the KV cache, activations, staging and the output matrix need, and beside a host budget.
TEST(CliRun, MaxVramIsCheckedBeforeAnyWeightIsRead) {
  const std::string m = Shared("gguf/tiny-coder-Q8_0.gguf");
  if (!Exists(m)) GTEST_SKIP() << "no fixture " << m;
  Result r = RunCli("run -m " + m + " --max-vram 1G -p hi -n 1");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("--max-vram needs --device cuda"), std::string::npos) << r.out;
  r = RunCli("run -m " + m + " --device cuda --max-vram 1M -p hi -n 1");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("is too small for"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("need at least"), std::string::npos) << r.out;
  r = RunCli("run -m " + m + " --device cuda --max-vram 1G --max-ram 1G -p hi -n 1");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("with --store or --max-ram"), std::string::npos) << r.out;
}

TEST(CliRun, PromptLongerThanContextIsAClearError) {
  const std::string m = Shared("gguf/tiny-coder-Q8_0.gguf");
  if (!Exists(m)) GTEST_SKIP() << "no fixture " << m;
  Result r = RunCli("run -m " + m + " -c 16 -n 4 -p \"" + std::string(200, 'x') + " y z\"");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("does not fit the context"), std::string::npos) << r.out;
}

TEST(CliRun, GeneratesAndReportsJson) {
  const std::string m = Shared("gguf/tiny-coder-Q8_0.gguf");
  if (!Exists(m)) GTEST_SKIP() << "no fixture " << m;
  Result r = RunCli("run -m " + m + " -p \"def fibonacci(n):\" -n 16 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["n_generated"].get<int>(), 16);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["peak_bytes"].get<uint64_t>(), 0u);
  EXPECT_FALSE(j["text"].get<std::string>().empty());
  // Seeded sampling is reproducible.
  Result a = RunCli("run -m " + m + " -p \"import os\" -n 12 --temp 0.8 --seed 5");
  Result b = RunCli("run -m " + m + " -p \"import os\" -n 12 --temp 0.8 --seed 5");
  EXPECT_EQ(a.rc, 0);
  EXPECT_EQ(a.out, b.out);
}

double Field(const std::string& out, const std::string& key) {
  auto p = out.find(key + " = ");
  if (p == std::string::npos) return -1;
  return std::atof(out.c_str() + p + key.size() + 3);
}

// Two chunks only (the full 60-chunk table is a measurement: see the report / README).
TEST(CliPerplexity, Bf16AndQ8KlDivergenceOnTwoChunks) {
  const std::string bf16 = Shared("gguf/tiny-coder-bf16.gguf");
  const std::string q8 = Shared("gguf/tiny-coder-Q8_0.gguf");
  const std::string text = Shared("text/heldout.txt");
  if (!Exists(bf16) || !Exists(q8) || !Exists(text)) GTEST_SKIP() << "no fixtures";
  const std::string base = ::testing::TempDir() + "/model_kld_base.bin";
  Result r = RunCli("perplexity -m " + bf16 + " -f " + text + " -c 512 --chunks 2 --kl-divergence-base " + base);
  ASSERT_EQ(r.rc, 0) << r.out;
  const double ppl = Field(r.out, "PPL");
  EXPECT_GT(ppl, 4.0) << r.out;   // the 60-chunk reference is 7.97
  EXPECT_LT(ppl, 14.0) << r.out;
  Result k = RunCli("perplexity -m " + q8 + " -f " + text + " -c 512 --chunks 2 --kl-divergence " + base);
  ASSERT_EQ(k.rc, 0) << k.out;
  const double kld = Field(k.out, "mean KLD");
  EXPECT_GE(kld, 0.0) << k.out;
  EXPECT_LT(kld, 0.002) << k.out;  // reference over 60 chunks: 0.000565
  EXPECT_GT(Field(k.out, "same top token"), 95.0) << k.out;
  std::filesystem::remove(base);
}

// A NaN in one norm weight: the run stops with an error naming the op where non-finite values
// first appear, instead of printing nothing and reporting end-of-generation.
TEST(CliRun, NonFiniteWeightsNameTheFirstOp) {
  const std::string model = std::string(SUBSTRATE_SOURCE_DIR) + "/models/tiny-coder-Q8_0.gguf";
  auto file = substrate::ModelFile::Open(model);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const substrate::TensorInfo* t = (*file)->Find("blk.2.attn_norm.weight");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->type, substrate::DType::kF32);
  const std::string path = ::testing::TempDir() + "/model_nan_norm.gguf";
  std::filesystem::copy_file(model, path, std::filesystem::copy_options::overwrite_existing);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(t->parts[0].offset + 4 * 7));
    const float nan = std::nanf("");
    f.write(reinterpret_cast<const char*>(&nan), 4);
  }
  Result r = RunCli("run -m " + path + " -p 'def f(x):' -n 4");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("NaN"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("'block_2.attn'"), std::string::npos) << r.out;
  // The unmodified file runs.
  EXPECT_EQ(RunCli("run -m " + model + " -p 'def f(x):' -n 4").rc, 0);
  std::filesystem::remove(path);
}

}  // namespace
