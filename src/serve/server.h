// The HTTP server: routes, API keys, body limits, SSE streaming and /metrics over the
// Scheduler. Listens on loopback unless told otherwise.
//
//   auto server = HttpServer::Create(&backend, options);   // binds (port 0: a free port)
//   (*server)->Start();                                     // serves on a background thread
//   ... (*server)->port() ...
//   (*server)->Stop();
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/memory_ledger.h"
#include "serve/backend.h"
#include "serve/scheduler.h"

namespace substrate::serve {

class ConnectionServer;  // serve/connection.h

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;               // 0: any free port (see HttpServer::port())
  std::string api_key;           // empty: no key needed
  int parallel = 1;              // slots generating at once
  int max_queue = 64;            // requests waiting for a slot before 503/529
  int context = 0;               // tokens per request; 0 or more than the model's: the model's
  uint64_t max_body_bytes = 4ull << 20;
  // A request's headers must arrive within header_timeout_ms of its first byte, and its body
  // within request_timeout_ms (slow clients are cut, not waited for; serve/connection.h).
  int header_timeout_ms = 10000;
  int request_timeout_ms = 60000;
  MemoryLedger* ledger = nullptr;  // reported by /metrics; null: MemoryLedger::Global()
  // "auto": <think>...</think> is returned apart (reasoning_content, thinking blocks);
  // "none": it stays in the text.
  std::string reasoning_format = "auto";
  std::string slot_save_path;  // folder for POST /slots/{id}?action=save|restore; empty: off
};

class HttpServer {
 public:
  // Creates the slots and binds the socket (so port() is known when this returns).
  static Expected<std::unique_ptr<HttpServer>> Create(InferenceBackend* backend,
                                                      const ServerOptions& options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Serves on the calling thread until Stop().
  Status Run();
  // Serves on a background thread.
  void Start();
  // Stops accepting, cancels running generations and joins the background thread.
  void Stop();

  int port() const { return port_; }
  const std::string& host() const { return options_.host; }
  Scheduler& scheduler() { return *scheduler_; }

  // The Prometheus text /metrics returns.
  std::string MetricsText() const;

 private:
  HttpServer() = default;
  void InstallRoutes();
  void InstallGenerateRoutes();  // server_generate.cpp
  void InstallAgentRoutes();     // server_agent_routes.cpp: /slots, /v1/runtime/events, /
  // What /v1/runtime/events sends: tokens/s, slots, the ledger by account, the runtime's ops,
  // expert cache, disk reads and stalls.
  nlohmann::json RuntimeSnapshot() const;

  InferenceBackend* backend_ = nullptr;
  ServerOptions options_;
  int context_ = 0;
  int port_ = 0;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ConnectionServer> http_;
  std::atomic<bool> stopping_{false};  // ends the event streams
  std::thread thread_;
  mutable std::mutex counts_mu_;
  std::map<std::pair<std::string, int>, uint64_t> request_counts_;  // (path, status)
};

}  // namespace substrate::serve
