// The cost of constrained decoding per token on a large vocabulary: the token mask of a JSON
// schema's grammar (TokenConstraint::Apply on a logits row, then Accept) at every step of
// writing a realistic document, as a model would under the mask. Prints JSON: per-token mask
// time (mean, p50, p99, max), how many masks needed a trie walk (new grammar states) and what
// one costs, against the 1 ms per token limit. Times are the thread's CPU time (the machine may
// be shared).
//
//   bench_grammar_mask [--vocab F.gguf]... [--size 150000] [--seed 1]
//
// The vocabulary: the pieces of the given tokenizers (deduplicated), filled up to --size with
// merges of two existing pieces (as BPE training makes them), so prefixes are shared like a
// real 150k vocabulary's; without --vocab, only merges grown from single bytes and words.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "format/model_file.h"
#include "serve/json_schema.h"
#include "serve/token_constraint.h"
#include "tokenizer/tokenizer.h"

using namespace substrate;
using namespace substrate::serve;

namespace {

std::vector<std::string> BuildVocab(const std::vector<std::string>& files, size_t size,
                                    uint64_t seed) {
  std::set<std::string> seen;
  std::vector<std::string> pieces;
  auto add = [&](const std::string& p) {
    if (!p.empty() && p.size() <= 48 && seen.insert(p).second) pieces.push_back(p);
  };
  for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
  for (const std::string& f : files) {
    auto file = ModelFile::Open(f);
    if (!file.ok()) {
      std::fprintf(stderr, "bench_grammar_mask: %s\n", file.status().ToString().c_str());
      std::exit(1);
    }
    auto tok = Tokenizer::FromMetadata((*file)->metadata());
    if (!tok.ok()) {
      std::fprintf(stderr, "bench_grammar_mask: %s: %s\n", f.c_str(),
                   tok.status().ToString().c_str());
      std::exit(1);
    }
    for (int id = 0; id < (*tok)->n_vocab(); ++id)
      if (!(*tok)->IsControl(id)) add((*tok)->Piece(id));
  }
  for (const char* w :
       {" the",  " of",    " and",   " to", " in",  " is", " for", " on", " with", " as",
        "\"",    "\":",    "\": \"", "\",", "{\"",  "\"}", " {",   "},",  "],",    "[\"",
        " true", " false", " null",  "ing", "tion", "er",  "ed",   " a",  " an",   "es"})
    add(w);
  std::mt19937_64 rng(seed);
  while (pieces.size() < size) {
    const std::string& a = pieces[rng() % pieces.size()];
    const std::string& b = pieces[rng() % pieces.size()];
    if (a.size() + b.size() <= 16) add(a + b);
  }
  return pieces;
}

// CPU time of this thread, in ms: on a shared machine, time the process was not running does
// not count.
double ThreadMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  size_t size = 150000;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--vocab" && i + 1 < argc)
      files.push_back(argv[++i]);
    else if (a == "--size" && i + 1 < argc)
      size = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--seed" && i + 1 < argc)
      seed = std::strtoull(argv[++i], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: bench_grammar_mask [--vocab F.gguf]... [--size N] [--seed S]\n");
      return 2;
    }
  }
  const auto t_vocab = std::chrono::steady_clock::now();
  std::vector<std::string> pieces = BuildVocab(files, size, seed);
  pieces.push_back("");  // end of generation
  const int32_t eog = static_cast<int32_t>(pieces.size() - 1);
  auto vocab = ConstraintVocab::FromPieces(pieces, {eog});
  const double build_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_vocab).count();

  // A tool call's arguments: nested objects, enums, numbers, an array, long free-text strings.
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(R"({
    "type": "object", "additionalProperties": false,
    "required": ["title", "priority", "assignee", "labels", "estimate", "body", "due"],
    "properties": {
      "title": {"type": "string", "maxLength": 120},
      "priority": {"enum": ["low", "medium", "high", "critical"]},
      "assignee": {"type": "object", "additionalProperties": false, "required": ["name", "email"],
                   "properties": {"name": {"type": "string"}, "email": {"type": "string"}}},
      "labels": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 6},
      "estimate": {"type": "number"},
      "body": {"type": "string"},
      "due": {"type": "string", "format": "date"},
      "done": {"type": "boolean"}
    }})");
  const std::string doc = nlohmann::ordered_json::parse(R"({
    "title": "Streamed experts stall the decoder when the SSD queue is saturated by prefetches",
    "priority": "high",
    "assignee": {"name": "Ada Lovelace", "email": "ada@example.com"},
    "labels": ["runtime", "prefetch", "moe", "io_uring"],
    "estimate": 3.5,
    "body": "When more than eight experts miss the cache in one layer, the prefetch scheduler issues reads for the next layer before the current misses complete. The decoder then waits on reads it did not need yet. Expected: demand reads first, prefetches after; measure stall time per token before and after, on the 30B model under a 16 GiB budget, and report the bandwidth ratio against the same-run read probe. Notes: the plan's deadlines already give the order; the admission check should use them.",
    "due": "2026-12-04",
    "done": false})")
                              .dump(1);

  auto text = JsonSchemaGrammar(schema);
  if (!text.ok()) {
    std::fprintf(stderr, "bench_grammar_mask: %s\n", text.status().ToString().c_str());
    return 1;
  }
  auto parsed = ParseGrammar(*text);
  if (!parsed.ok()) {
    std::fprintf(stderr, "bench_grammar_mask: %s\n", parsed.status().ToString().c_str());
    return 1;
  }
  auto grammar = std::make_shared<const Grammar>(std::move(*parsed));

  // Write `doc` under the mask, each step the longest allowed token that continues it.
  const TokenTrie& trie = *vocab->trie;
  std::vector<float> logits(pieces.size());
  std::vector<double> step_ms;
  std::vector<double> walk_ms;
  TokenConstraint c(vocab, grammar);
  size_t at = 0;
  uint64_t walks_before = 0;
  while (true) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    const double t0 = ThreadMs();
    c.Apply(logits.data(), static_cast<int64_t>(logits.size()), {});
    const double ms = ThreadMs() - t0;
    step_ms.push_back(ms);
    if (c.stats().mask_walks > walks_before) walk_ms.push_back(ms);
    walks_before = c.stats().mask_walks;
    if (at == doc.size()) {
      if (std::isinf(logits[eog])) {
        std::fprintf(stderr,
                     "bench_grammar_mask: the document is complete but the mask forbids the end\n");
        return 1;
      }
      break;
    }
    // Longest piece matching doc[at..] that the mask allows (walk the trie along the text).
    int32_t best = -1;
    size_t best_len = 0;
    int depth = 0;
    for (size_t i = 0; i < trie.size() && at + depth < doc.size();) {
      if (trie.depths()[i] <= depth) break;  // left the subtree of the matched prefix
      if (trie.bytes()[i] != static_cast<uint8_t>(doc[at + depth])) {
        i = static_cast<size_t>(trie.next()[i]);
        continue;
      }
      ++depth;
      const int32_t t = trie.token()[i];
      if (t >= 0 && !std::isinf(logits[t])) best = t, best_len = depth;
      ++i;
    }
    if (best < 0) {
      std::fprintf(stderr, "bench_grammar_mask: the mask forbids the document at byte %zu: %.40s\n",
                   at, doc.c_str() + at);
      return 1;
    }
    const double t1 = ThreadMs();
    c.Accept(best);
    step_ms.back() += ThreadMs() - t1;
    if (!c.status().ok()) {
      std::fprintf(stderr, "bench_grammar_mask: %s\n", c.status().ToString().c_str());
      return 1;
    }
    at += best_len;
  }
  double sum = 0;
  for (double v : step_ms) sum += v;
  const double mean = sum / static_cast<double>(step_ms.size());
  const double p99 = Percentile(step_ms, 0.99);
  double walk_sum = 0;
  for (double v : walk_ms) walk_sum += v;
  nlohmann::ordered_json out = {
      {"bench", "grammar_mask"},
      {"vocab_tokens", pieces.size()},
      {"vocab_files", files.size()},
      {"trie_nodes", trie.size()},
      {"vocab_build_s", build_s},
      {"document_bytes", doc.size()},
      {"tokens_generated", step_ms.size()},
      {"mask_ms_mean", mean},
      {"mask_ms_p50", Percentile(step_ms, 0.5)},
      {"mask_ms_p99", p99},
      {"mask_ms_max", Percentile(step_ms, 1.0)},
      {"trie_walks", walk_ms.size()},
      {"trie_walk_ms_mean", walk_ms.empty() ? 0.0 : walk_sum / static_cast<double>(walk_ms.size())},
      {"trie_nodes_stepped_per_walk",
       walk_ms.empty()
           ? 0.0
           : static_cast<double>(c.stats().nodes_stepped) / static_cast<double>(walk_ms.size())},
      {"subtrees_taken_whole_per_walk",
       walk_ms.empty()
           ? 0.0
           : static_cast<double>(c.stats().subtrees_taken) / static_cast<double>(walk_ms.size())},
      {"cached_fraction",
       1.0 - static_cast<double>(walk_ms.size()) / static_cast<double>(step_ms.size())},
      {"clock", "thread cpu time"},
      {"limit_ms", 1.0},
      {"ratio_mean", mean / 1.0},
      {"ratio_p99", p99 / 1.0},
  };
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}
