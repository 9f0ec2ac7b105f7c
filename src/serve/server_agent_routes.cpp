// Routes beyond generation: slot files (POST /slots/{id}?action=save|restore), the engine's
// live numbers as server-sent events (GET /v1/runtime/events), and the web page (GET /).
#include <httplib.h>

#include <chrono>
#include <thread>

#include "serve/connection.h"
#include "serve/protocol.h"
#include "serve/server.h"
#include "serve/web_page.h"

namespace substrate::serve {

namespace {

using Clock = std::chrono::steady_clock;

void SendJsonError(httplib::Response& res, int status, const std::string& message) {
  ApiError e = BadRequest(message);
  e.http_status = status;
  if (status >= 500) e.type = "api_error";
  if (status == 404) e.type = "not_found_error";
  res.status = status;
  res.set_content(ErrorBody(Api::kOpenAIChat, e), "application/json");
}

// Slot file names: a plain name inside --slot-save-path, never a path out of it.
bool SafeFileName(const std::string& n) {
  if (n.empty() || n.size() > 128 || n[0] == '.') return false;
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return false;
  return n.find("..") == std::string::npos;
}

double Ms(Clock::time_point since) {
  return std::chrono::duration<double, std::milli>(Clock::now() - since).count();
}

}  // namespace

nlohmann::json HttpServer::RuntimeSnapshot() const {
  SchedulerStats st = scheduler_->Stats();
  const MemoryLedger& ledger = *options_.ledger;
  nlohmann::json accounts = nlohmann::json::object();
  for (const auto& [name, a] : ledger.Accounts()) accounts[name] = a.current;
  return {
      {"time_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count()},
      {"model", backend_->ModelId()},
      {"tokens_per_second", scheduler_->RecentTokensPerSecond()},
      {"slots", st.slots},
      {"slots_busy", st.busy},
      {"queued", st.queued},
      {"tokens",
       {{"generated", st.generated_tokens},
        {"prompt", st.prompt_tokens},
        {"cached", st.cached_tokens}}},
      {"memory",
       {{"cap", ledger.cap()},
        {"current", ledger.current()},
        {"peak", ledger.peak()},
        {"accounts", accounts}}},
      {"runtime", backend_->RuntimeStats()},
  };
}

void HttpServer::InstallAgentRoutes() {
  httplib::Server& http = *http_;

  http.Post(R"(/slots/(\d+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (options_.slot_save_path.empty())
      return SendJsonError(res, 501,
                           "slot files are off: start the server with --slot-save-path DIR");
    const int id = std::atoi(req.matches[1].str().c_str());
    const std::string action = req.get_param_value("action");
    if (action != "save" && action != "restore")
      return SendJsonError(res, 400, "unknown action '" + action + "' (save or restore)");
    nlohmann::json body = nlohmann::json::parse(req.body, nullptr, false);
    std::string name;
    if (body.is_object() && body.contains("filename") && body["filename"].is_string())
      name = body["filename"];
    if (!SafeFileName(name))
      return SendJsonError(res, 400,
                           "'filename' must be a plain file name (letters, digits, '.', '_', '-'; "
                           "no path, not starting with '.')");
    const std::string path = options_.slot_save_path + "/" + name;
    const auto t0 = Clock::now();
    size_t n_tokens = 0;
    Status st = scheduler_->WithSlot(id, [&](Session& s) -> Status {
      if (action == "save") {
        RETURN_IF_ERROR(s.Save(path));
      } else {
        RETURN_IF_ERROR(s.Restore(path));
      }
      n_tokens = s.CachedTokens().size();
      return Status::Ok();
    });
    if (!st.ok()) {
      const int code = st.code() == StatusCode::kInvalidArgument ? 400
                       : st.code() == StatusCode::kNotFound || st.code() == StatusCode::kIOError
                           ? (action == "restore" ? 404 : 500)
                       : st.code() == StatusCode::kCorruption ? 400
                                                              : 500;
      return SendJsonError(res, code, st.message());
    }
    nlohmann::json out = {{"id_slot", id}, {"filename", name}};
    if (action == "save") {
      out["n_saved"] = n_tokens;
      out["timings"] = {{"save_ms", Ms(t0)}};
    } else {
      out["n_restored"] = n_tokens;
      out["timings"] = {{"restore_ms", Ms(t0)}};
    }
    res.set_content(out.dump(), "application/json");
  });

  // The engine at work, every interval_ms (default 500): one `stats` event per interval with
  // RuntimeSnapshot's object. Documented in docs/serve-agents.md.
  http.Get("/v1/runtime/events", [this](const httplib::Request& req, httplib::Response& res) {
    int interval = 500;
    if (req.has_param("interval_ms"))
      interval = std::atoi(req.get_param_value("interval_ms").c_str());
    interval = std::clamp(interval, 100, 10000);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream", [this, interval](size_t, httplib::DataSink& sink) {
          for (;;) {
            if (stopping_.load()) {
              sink.done();
              return true;
            }
            const std::string ev = "event: stats\ndata: " + RuntimeSnapshot().dump() + "\n\n";
            if (!sink.write(ev.data(), ev.size())) return false;
            for (int waited = 0; waited < interval && !stopping_.load(); waited += 50)
              std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
        });
  });

  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-cache");
    res.set_content(kWebPage, "text/html; charset=utf-8");
  });
}

}  // namespace substrate::serve
