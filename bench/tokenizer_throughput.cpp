// Tokenizer throughput: encodes a text file with a model's tokenizer and prints JSON.
//
//   bench_tokenizer_throughput MODEL TEXT [REPS]
//   e.g. bench_tokenizer_throughput ../shared/gguf/tiny-coder-bf16.gguf ../shared/text/heldout.txt
//
// Figure: MB/s of input text encoded (best of REPS, one thread). The limit it is compared with is
// the speed of merely reading the text once (a byte-sum over the buffer), which no tokenizer can
// beat; `ratio` is how close we are to it. Decode speed (ids -> text) is reported beside it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "format/model_file.h"
#include "tokenizer/tokenizer.h"

using namespace substrate;

namespace {
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL TEXT [REPS]\n", argv[0]);
    return 2;
  }
  const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
  std::ifstream in(argv[2], std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot open %s\n", argv[2]);
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();

  const double t_load0 = Now();
  auto mf = ModelFile::Open(argv[1]);
  if (!mf.ok()) {
    std::fprintf(stderr, "%s\n", mf.status().ToString().c_str());
    return 1;
  }
  auto tok = Tokenizer::FromMetadata((*mf)->metadata());
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  const double load_s = Now() - t_load0;

  double best_enc = 1e30, best_dec = 1e30, best_read = 1e30;
  size_t n_tokens = 0;
  bool round_trip = false;
  volatile unsigned sink = 0;
  for (int r = 0; r < reps; ++r) {
    double t0 = Now();
    unsigned sum = 0;
    for (unsigned char c : text) sum += c;
    sink = sink + sum;
    best_read = std::min(best_read, Now() - t0);

    t0 = Now();
    auto ids = (*tok)->Encode(text, {.add_special = false, .parse_special = false});
    best_enc = std::min(best_enc, Now() - t0);
    if (!ids.ok()) {
      std::fprintf(stderr, "%s\n", ids.status().ToString().c_str());
      return 1;
    }
    n_tokens = ids->size();
    t0 = Now();
    auto back = (*tok)->Decode(*ids);
    best_dec = std::min(best_dec, Now() - t0);
    round_trip = back.ok() && *back == text;
  }
  const double mb = text.size() / 1e6;
  const double enc_mbs = mb / best_enc, read_mbs = mb / best_read;
  std::printf(
      "{\"bench\": \"tokenizer_throughput\", \"model\": \"%s\", \"text_bytes\": %zu, \"tokens\": %zu,"
      " \"load_s\": %.4f, \"encode_s\": %.4f, \"encode_mb_per_s\": %.2f,"
      " \"encode_tokens_per_s\": %.0f, \"decode_s\": %.5f, \"decode_mb_per_s\": %.1f,"
      " \"limit\": \"one read pass over the text\", \"limit_mb_per_s\": %.1f, \"ratio\": %.4f,"
      " \"round_trip\": %s, \"reps\": %d}\n",
      argv[1], text.size(), n_tokens, load_s, best_enc, enc_mbs, n_tokens / best_enc, best_dec,
      mb / best_dec, read_mbs, enc_mbs / read_mbs, round_trip ? "true" : "false", reps);
  return 0;
}
