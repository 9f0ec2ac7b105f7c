// TraceWriter: the runtime's JSONL event log (`--trace FILE.jsonl`), one object per line:
//   {"ev":"op","op":"block_3.ffn","tier":2,"bytes":N,"start_us":..,"end_us":..,"hit":true,"stall_us":..}
//   {"ev":"read","op":"block_4.attn","file":"block_4.attn.t0.bin","offset":0,"bytes":N,
//    "start_us":..,"end_us":..,"direct":true,"uring":true,"issue_us":..,"during":"block_3.ffn"}
//   {"ev":"tier","op":"block_3.ffn","from":0,"to":1,"why":"escalate","start_us":..,"end_us":..}
//   {"ev":"token","pool_used":N,"pool_bytes":N,"escalated":K,"held":false,"start_us":..,"end_us":..}
//   {"ev":"monitor","state":"latency_critical","latency_ratio":..,"bw_ratio":..,"start_us":..,..}
// (the adaptive runtime's tier switches, its state after each token, the runtime monitor's
// transitions); an op event whose residual was skipped (fallback) carries "skip":true.
// A read's issue_us is when it was queued and `during` the op begun last then (the window that
// issued it: a plan's prefetch start_during, or the depth rule's); start_us is when it ran.
// Events are appended to an in-memory buffer under a mutex (no I/O on the token path) and a
// background thread writes full buffers. Only whole lines reach the file, so a killed run leaves
// a readable prefix. A log, not an artifact: written in place rather than through a temp file
// (which a SIGKILL would leave behind).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/env.h"
#include "core/status.h"

namespace substrate {

struct OpEvent {
  const std::string* op = nullptr;
  int tier = 0;
  uint64_t bytes = 0;
  int64_t start_us = 0, end_us = 0, stall_us = 0;
  bool hit = true;
  bool skip = false;       // ran on its resident skeleton, its residual skipped (fallback)
  const char* where = "";  // "resident", "stream", "expert"
};

struct ReadEvent {
  const std::string* op = nullptr;
  const std::string* file = nullptr;
  uint64_t offset = 0, bytes = 0;
  int64_t start_us = 0, end_us = 0;
  bool direct = false, uring = false;
  int64_t issue_us = 0;
  const std::string* during = nullptr;  // null: issued outside any op (at open)
};

class TraceWriter {
 public:
  // Creates (truncates) `path` through env (nullptr: Env::Default()). A write error (a full
  // disk) stops the log, never the run: Flush() reports it.
  static Expected<std::unique_ptr<TraceWriter>> Open(const std::string& path, Env* env = nullptr);
  ~TraceWriter();  // flushes and joins the writer thread

  void Op(const OpEvent& e);      // thread-safe
  void Read(const ReadEvent& e);  // thread-safe
  // An adaptive-runtime event at `at_us`: `fields` are the JSON members after "ev", without
  // braces (thread-safe).
  void Runtime(const char* ev, const std::string& fields, int64_t at_us);
  Status Flush();  // writes what is buffered; the first write error, if any

 private:
  TraceWriter(std::string path, std::unique_ptr<WritableFile> file)
      : path_(std::move(path)), file_(std::move(file)) {}
  void Append(const std::string& line);
  void WriterLoop();
  Status WriteAll(const std::string& buf);

  std::string path_;
  std::unique_ptr<WritableFile> file_;
  std::mutex mu_, write_mu_;
  std::condition_variable cv_;
  std::string buf_, pending_;
  bool stop_ = false;
  Status error_;
  std::thread thread_;
};

// Escapes a string for a JSON value (ids and file names: no control characters expected).
std::string JsonQuote(const std::string& s);

}  // namespace substrate
