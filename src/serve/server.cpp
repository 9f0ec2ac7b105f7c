#include "serve/server.h"

#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "core/log.h"
#include "serve/connection.h"
#include "serve/protocol.h"

namespace substrate::serve {

namespace {

using Clock = std::chrono::steady_clock;

// A gone client makes send() raise SIGPIPE (httplib does not pass MSG_NOSIGNAL); the server
// must see that as a failed write, not die of it.
void IgnoreSigpipe() {
  struct sigaction sa {};
  sigaction(SIGPIPE, nullptr, &sa);
  if (sa.sa_handler == SIG_DFL) {
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, nullptr);
  }
}

Api ApiForPath(const std::string& path) {
  if (path.rfind("/v1/messages", 0) == 0) return Api::kAnthropicMessages;
  if (path.rfind("/v1/completions", 0) == 0) return Api::kOpenAICompletion;
  return Api::kOpenAIChat;
}

ApiError MakeError(int status, std::string type, std::string message, std::string code = "") {
  ApiError e;
  e.http_status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

void SendError(httplib::Response& res, Api api, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(ErrorBody(api, e), "application/json");
}

// Equal-time comparison, so that the key cannot be guessed byte by byte from response times.
bool SameKey(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i % std::max<size_t>(b.size(), 1)];
  return diff == 0 && !b.empty();
}

// The credentials of "Authorization: Bearer KEY". The scheme is case-insensitive (RFC 9110
// 11.1: "bearer KEY" is the same header), and any run of spaces may follow it.
std::string BearerToken(const std::string& auth) {
  static constexpr std::string_view kScheme = "bearer";
  if (auth.size() <= kScheme.size() ||
      (auth[kScheme.size()] != ' ' && auth[kScheme.size()] != '\t'))
    return "";
  for (size_t i = 0; i < kScheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(auth[i])) != kScheme[i]) return "";
  size_t p = kScheme.size();
  while (p < auth.size() && (auth[p] == ' ' || auth[p] == '\t')) ++p;
  return auth.substr(p);
}

// A POST's body framing, checked before httplib reads the body: without a Content-Length (and
// not chunked) httplib reads until the client closes, and a negative or overflowing one parses
// as a huge length it then tries to skip: both held the connection until the read timeout.
// Returns the status to answer at once (411, 400, 413), or 0.
int BodyFramingError(const httplib::Request& req, uint64_t max_body, std::string* why) {
  if (req.method != "POST" && req.method != "PUT" && req.method != "PATCH") return 0;
  const std::string te = req.get_header_value("Transfer-Encoding");
  if (!te.empty()) return 0;  // chunked: httplib reads chunk by chunk, bounded by the limit
  if (!req.has_header("Content-Length")) {
    *why = "a request body needs a Content-Length header";
    return 411;
  }
  if (req.get_header_value_count("Content-Length") > 1) {
    *why = "more than one Content-Length header";
    return 400;
  }
  const std::string v = req.get_header_value("Content-Length");
  uint64_t n = 0;
  bool ok = !v.empty() && v.size() <= 19;
  for (char c : v) ok = ok && c >= '0' && c <= '9';
  if (ok) n = std::stoull(v);
  if (!ok) {
    *why = "Content-Length '" + v.substr(0, 40) + "' is not a byte count";
    return 400;
  }
  if (n > max_body) {
    *why = "request body is larger than the limit of " + std::to_string(max_body) + " bytes";
    return 413;
  }
  return 0;
}

}  // namespace

Expected<std::unique_ptr<HttpServer>> HttpServer::Create(InferenceBackend* backend,
                                                         const ServerOptions& options) {
  IgnoreSigpipe();
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->backend_ = backend;
  s->options_ = options;
  if (!s->options_.ledger) s->options_.ledger = &MemoryLedger::Global();
  const int model_ctx = backend->ContextLength();
  s->context_ = options.context > 0 ? std::min(options.context, model_ctx) : model_ctx;
  if (s->context_ < 2) return InvalidArgument("serve: context of " + std::to_string(s->context_) +
                                              " tokens is too small");
  ASSIGN_OR_RETURN(s->scheduler_, Scheduler::Create(backend, options.parallel, options.max_queue));

  // Every streaming client holds a worker, and so does every request waiting in the queue; a
  // few more serve /health and /metrics while all of them are busy. Connections between
  // requests or still sending headers hold none (serve/connection.h).
  ConnectionLimits limits;
  limits.workers = options.parallel + options.max_queue + 4;
  limits.header_timeout_ms = options.header_timeout_ms;
  limits.request_timeout_ms = options.request_timeout_ms;
  s->http_ = std::make_unique<ConnectionServer>(limits);
  s->http_->set_payload_max_length(options.max_body_bytes);
  s->http_->set_tcp_nodelay(true);
  s->InstallRoutes();

  if (options.port == 0) {
    s->port_ = s->http_->bind_to_any_port(options.host);
    if (s->port_ <= 0)
      return IOError("serve: cannot bind to " + options.host + " (any port)");
  } else {
    if (options.port < 0 || options.port > 65535)
      return InvalidArgument("serve: port " + std::to_string(options.port) + " out of range");
    if (!s->http_->bind_to_port(options.host, options.port))
      return IOError("serve: cannot bind to " + options.host + ":" + std::to_string(options.port) +
                     " (in use, or the address is not local)");
    s->port_ = options.port;
  }
  if (!s->http_->RaiseBacklog(1024))
    LOG_WARN("serve: could not raise the listen backlog; bursts of connections may stall");
  return s;
}

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Run() {
  if (!http_->listen_after_bind()) return IOError("serve: the listening socket failed");
  return Status::Ok();
}

void HttpServer::Start() {
  thread_ = std::thread([this] { (void)Run(); });
  // The socket is bound already, so connections queue; wait only so is_running() is true.
  for (int i = 0; i < 2000 && !http_->is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void HttpServer::Stop() {
  // Cancel generations first: httplib's stop waits for every handler, and a streaming handler
  // ends when its job does (an event stream when it sees stopping_).
  stopping_ = true;
  if (scheduler_) scheduler_->Shutdown();
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
  if (http_) http_->Shutdown();
  // Destroying the scheduler cancels generations, which lets streaming handlers finish.
  scheduler_.reset();
  http_.reset();
}

void HttpServer::InstallRoutes() {
  httplib::Server& http = *http_;

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    std::string why;
    if (const int status = BodyFramingError(req, options_.max_body_bytes, &why)) {
      const Api api = ApiForPath(req.path);
      const bool anthropic = api == Api::kAnthropicMessages;
      const char* type = status == 413 && anthropic ? "request_too_large" : "invalid_request_error";
      SendError(res, api, MakeError(status, type, why, status == 413 ? "request_too_large" : ""));
      ConnectionServer::CloseAfterResponse();  // its body, if any, is unread
      return httplib::Server::HandlerResponse::Handled;
    }
    if (options_.api_key.empty() || req.path.rfind("/v1/", 0) != 0)
      return httplib::Server::HandlerResponse::Unhandled;
    std::string key;
    const std::string auth = req.get_header_value("Authorization");
    key = BearerToken(auth);
    if (key.empty()) key = req.get_header_value("x-api-key");
    if (SameKey(key, options_.api_key)) return httplib::Server::HandlerResponse::Unhandled;
    Api api = ApiForPath(req.path);
    ApiError e = MakeError(401,
                           api == Api::kAnthropicMessages ? "authentication_error"
                                                          : "invalid_request_error",
                           key.empty() ? "missing API key (send 'Authorization: Bearer KEY' or "
                                         "'x-api-key: KEY')"
                                       : "invalid API key",
                           "invalid_api_key");
    SendError(res, api, e);
    return httplib::Server::HandlerResponse::Handled;
  });

  // httplib's own errors (no route, body over the limit, bad request line) arrive here with
  // an empty body; ours already have one.
  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.content_provider_)
      return httplib::Server::HandlerResponse::Unhandled;
    Api api = ApiForPath(req.path);
    const bool anthropic = api == Api::kAnthropicMessages;
    ApiError e;
    if (res.status == 413) {
      e = MakeError(413, anthropic ? "request_too_large" : "invalid_request_error",
                    "request body is larger than the limit of " +
                        std::to_string(options_.max_body_bytes) + " bytes",
                    "request_too_large");
    } else if (res.status == 404) {
      e = MakeError(404, anthropic ? "not_found_error" : "invalid_request_error",
                    "no route for " + req.method + " " + req.path, "not_found");
    } else if (res.status == 405) {
      e = MakeError(405, "invalid_request_error", "method " + req.method + " not allowed on " +
                                                      req.path);
    } else {
      e = MakeError(res.status, res.status < 500 ? "invalid_request_error" : "api_error",
                    "HTTP " + std::to_string(res.status) + " for " + req.method + " " + req.path);
    }
    SendError(res, api, e);
    return httplib::Server::HandlerResponse::Handled;
  }));

  http.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        LOG_ERROR("serve: %s %s: %s", req.method.c_str(), req.path.c_str(), what.c_str());
        SendError(res, ApiForPath(req.path),
                  MakeError(500, "api_error", "internal error: " + what));
      });

  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    std::lock_guard<std::mutex> lock(counts_mu_);
    // Only known paths get their own series, so that scanners cannot grow the map.
    static const char* kKnown[] = {"/health", "/metrics", "/v1/models", "/v1/chat/completions",
                                   "/v1/completions", "/v1/messages",
                                   "/v1/messages/count_tokens"};
    std::string path = "other";
    for (const char* k : kKnown)
      if (req.path == k) path = k;
    ++request_counts_[{path, res.status}];
  });

  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    SchedulerStats st = scheduler_->Stats();
    nlohmann::json j = {{"status", "ok"},
                        {"model", backend_->ModelId()},
                        {"slots", st.slots},
                        {"slots_busy", st.busy},
                        {"queued", st.queued}};
    res.set_content(j.dump(), "application/json");
  });

  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(MetricsText(), "text/plain; version=0.0.4");
  });

  auto models = [this](const httplib::Request& req, httplib::Response& res) {
    const bool anthropic = req.has_header("anthropic-version");
    res.set_content(ModelsBody(backend_->ModelId(), context_, anthropic), "application/json");
  };
  http.Get("/v1/models", models);

  InstallGenerateRoutes();
  InstallAgentRoutes();
}

std::string HttpServer::MetricsText() const {
  std::ostringstream o;
  auto metric = [&](const char* name, const char* type, const char* help) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  SchedulerStats st = scheduler_->Stats();
  metric("substrate_requests_total", "counter", "HTTP requests answered, by path and status.");
  {
    std::lock_guard<std::mutex> lock(counts_mu_);
    for (const auto& [key, n] : request_counts_)
      o << "substrate_requests_total{path=\"" << key.first << "\",status=\"" << key.second
        << "\"} " << n << '\n';
  }
  metric("substrate_queue_depth", "gauge", "Requests waiting for a slot.");
  o << "substrate_queue_depth " << st.queued << '\n';
  metric("substrate_slots_busy", "gauge", "Slots generating now.");
  o << "substrate_slots_busy " << st.busy << '\n';
  metric("substrate_slots_total", "gauge", "Parallel slots.");
  o << "substrate_slots_total " << st.slots << '\n';
  metric("substrate_generations_total", "counter", "Generations ended, by outcome.");
  o << "substrate_generations_total{outcome=\"completed\"} " << st.completed << '\n'
    << "substrate_generations_total{outcome=\"cancelled\"} " << st.cancelled << '\n'
    << "substrate_generations_total{outcome=\"failed\"} " << st.failed << '\n';
  metric("substrate_prompt_tokens_total", "counter", "Prompt tokens of finished generations.");
  o << "substrate_prompt_tokens_total " << st.prompt_tokens << '\n';
  metric("substrate_prompt_cached_tokens_total", "counter",
         "Prompt tokens whose KV cache was reused (prompt cache hits).");
  o << "substrate_prompt_cached_tokens_total " << st.cached_tokens << '\n';
  metric("substrate_generated_tokens_total", "counter", "Tokens generated.");
  o << "substrate_generated_tokens_total " << st.generated_tokens << '\n';
  metric("substrate_tokens_per_second", "gauge", "Generated tokens per second, last 5 s, all slots.");
  o << "substrate_tokens_per_second " << scheduler_->RecentTokensPerSecond() << '\n';
  metric("substrate_decode_tokens_per_second", "gauge",
         "Generated tokens per second of decoding, per request, averaged over all requests.");
  o << "substrate_decode_tokens_per_second "
    << (st.decode_seconds > 0 ? st.generated_tokens / st.decode_seconds : 0.0) << '\n';
  metric("substrate_prefill_seconds_total", "counter", "Time spent evaluating prompts.");
  o << "substrate_prefill_seconds_total " << st.prefill_seconds << '\n';
  metric("substrate_time_to_first_token_seconds", "summary",
         "From request queued to first generated token.");
  o << "substrate_time_to_first_token_seconds_sum " << st.ttft_seconds_sum << '\n'
    << "substrate_time_to_first_token_seconds_count " << st.ttft_count << '\n';
  const MemoryLedger& ledger = *options_.ledger;
  metric("substrate_memory_ledger_bytes", "gauge", "Bytes charged to the memory ledger, by account.");
  for (const auto& [account, a] : ledger.Accounts())
    o << "substrate_memory_ledger_bytes{account=\"" << account << "\"} " << a.current << '\n';
  o << "substrate_memory_ledger_bytes{account=\"total\"} " << ledger.current() << '\n';
  metric("substrate_memory_ledger_peak_bytes", "gauge", "Highest total charge so far.");
  o << "substrate_memory_ledger_peak_bytes " << ledger.peak() << '\n';
  metric("substrate_memory_ledger_cap_bytes", "gauge", "The ledger's cap (0: none).");
  o << "substrate_memory_ledger_cap_bytes " << ledger.cap() << '\n';
  const nlohmann::json rt = backend_->RuntimeStats();
  if (rt.contains("constraint")) {
    metric("substrate_constraint_masks_total", "counter", "Token masks of constrained decoding.");
    o << "substrate_constraint_masks_total " << rt["constraint"].value("masks", uint64_t{0}) << '\n';
    metric("substrate_constraint_mask_seconds_total", "counter", "Time computing token masks.");
    o << "substrate_constraint_mask_seconds_total " << rt["constraint"].value("mask_seconds", 0.0)
      << '\n';
  }
  if (rt.contains("batching")) {
    // Continuous batching: sequences per step = sequences_total / steps_total.
    const nlohmann::json& b = rt["batching"];
    metric("substrate_batch_steps_total", "counter", "Model passes run for the slots together.");
    o << "substrate_batch_steps_total " << b.value("steps", uint64_t{0}) << '\n';
    metric("substrate_batch_sequences_total", "counter", "Sequences in those passes, summed.");
    o << "substrate_batch_sequences_total " << b.value("sequences", uint64_t{0}) << '\n';
    metric("substrate_batch_rows_total", "counter", "Tokens evaluated in those passes.");
    o << "substrate_batch_rows_total " << b.value("rows", uint64_t{0}) << '\n';
    metric("substrate_batch_max_sequences", "gauge", "Most sequences one pass has held.");
    o << "substrate_batch_max_sequences " << b.value("max_sequences", uint64_t{0}) << '\n';
    metric("substrate_batch_compute_seconds_total", "counter", "Time in those passes.");
    o << "substrate_batch_compute_seconds_total " << b.value("compute_seconds", 0.0) << '\n';
    metric("substrate_batch_gather_seconds_total", "counter",
           "Time passes waited for the slots to queue their tokens.");
    o << "substrate_batch_gather_seconds_total " << b.value("gather_seconds", 0.0) << '\n';
  }
  if (rt.contains("prompt_cache")) {
    const nlohmann::json& pc = rt["prompt_cache"];
    metric("substrate_prompt_cache_disk_hits_total", "counter",
           "Prompts that restored a prefix from the prompt cache on disk.");
    o << "substrate_prompt_cache_disk_hits_total " << pc.value("hits", uint64_t{0}) << '\n';
    metric("substrate_prompt_cache_disk_restored_tokens_total", "counter",
           "Prompt tokens restored from the prompt cache on disk (not evaluated).");
    o << "substrate_prompt_cache_disk_restored_tokens_total " << pc.value("restored_tokens", uint64_t{0}) << '\n';
    metric("substrate_prompt_cache_disk_stores_total", "counter", "Entries written to the prompt cache.");
    o << "substrate_prompt_cache_disk_stores_total " << pc.value("stores", uint64_t{0}) << '\n';
    metric("substrate_prompt_cache_disk_bytes", "gauge", "Bytes the prompt cache on disk holds.");
    o << "substrate_prompt_cache_disk_bytes " << pc.value("bytes", uint64_t{0}) << '\n';
  }
  // The out-of-core runtime's counters (none for a resident model); totals are counters.
  for (const auto& [name, value] : backend_->RuntimeCounters()) {
    const std::string full = "substrate_runtime_" + name;
    const bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
    metric(full.c_str(), total ? "counter" : "gauge", "Out-of-core runtime (ResidencyManager).");
    o << full << ' ' << value << '\n';
  }
  return o.str();
}

}  // namespace substrate::serve
