// A loopback load generator for the server: N concurrent streaming clients for a fixed time,
// some hanging up mid-stream on purpose, every completed answer checked against the expected
// text. Used by bench/serve_load.cpp (the minute-long run) and by a short test.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/protocol.h"

namespace substrate::serve {

struct LoadPrompt {
  Api api = Api::kOpenAIChat;
  nlohmann::json body;    // the request, without "stream" (set by the client)
  std::string expected;   // the full answer a completed request must produce
};

struct LoadOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string api_key;
  int clients = 16;
  double seconds = 60;
  int disconnect_every = 5;  // every Nth request hangs up after a few chunks (0: never)
  uint64_t seed = 1;
};

struct LoadReport {
  int clients = 0;
  double seconds = 0;
  uint64_t started = 0;
  uint64_t completed = 0;
  uint64_t disconnected = 0;  // hung up on purpose
  uint64_t errors = 0;        // transport failures or non-200 answers
  uint64_t mismatches = 0;    // completed answers that differ from the expected text
  uint64_t tokens = 0;        // generated tokens of completed requests (from usage)
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  // Between two stream events that add text, over completed requests (the server sends each
  // token as it is made, so this is the inter-token latency a client sees).
  double itl_p50_ms = 0, itl_p99_ms = 0;
  double tokens_per_second = 0;  // all clients together over the run
  std::vector<std::string> first_errors;  // a few, for the report
  nlohmann::json ToJson() const;
};

// Runs the load; blocks for about options.seconds.
LoadReport RunLoad(const LoadOptions& options, const std::vector<LoadPrompt>& prompts);

// One non-streaming request; returns the answer text (for building expected answers).
Expected<std::string> FetchAnswer(const LoadOptions& options, const LoadPrompt& prompt);

// The process's resident set size in bytes (Linux /proc/self/statm), 0 when unknown.
uint64_t ResidentBytes();

}  // namespace substrate::serve
