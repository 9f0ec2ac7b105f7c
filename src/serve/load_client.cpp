#include "serve/load_client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>
#include <unistd.h>

#include <httplib.h>

namespace substrate::serve {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

const char* PathFor(Api api) {
  switch (api) {
    case Api::kOpenAIChat: return "/v1/chat/completions";
    case Api::kOpenAICompletion: return "/v1/completions";
    case Api::kAnthropicMessages: return "/v1/messages";
  }
  return "/";
}

httplib::Headers AuthHeaders(const LoadOptions& o) {
  httplib::Headers h;
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  return h;
}

// Incremental SSE reader: feeds bytes, pulls out text deltas and the token count.
struct SseState {
  std::string buffer;
  std::string text;
  uint64_t tokens = 0;
  bool done = false;
  bool error = false;
  std::string error_text;

  void Feed(Api api, const char* data, size_t n) {
    buffer.append(data, n);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      std::string block = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      std::string payload;
      size_t pos = 0;
      while (pos < block.size()) {
        size_t le = block.find('\n', pos);
        if (le == std::string::npos) le = block.size();
        if (block.compare(pos, 6, "data: ") == 0) payload += block.substr(pos + 6, le - pos - 6);
        pos = le + 1;
      }
      if (payload.empty()) continue;
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      json j = json::parse(payload, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        error = true;
        error_text = "unparsable event: " + payload.substr(0, 200);
        continue;
      }
      if (j.contains("error")) {
        error = true;
        error_text = payload.substr(0, 300);
        continue;
      }
      if (api == Api::kAnthropicMessages) {
        const std::string type = j.value("type", "");
        if (type == "content_block_delta") text += j["delta"].value("text", "");
        if (type == "message_delta") tokens = j["usage"].value("output_tokens", 0);
        if (type == "message_stop") done = true;
      } else {
        if (j.contains("usage") && j["usage"].is_object())
          tokens = j["usage"].value("completion_tokens", 0);
        if (j.contains("choices") && !j["choices"].empty()) {
          const json& c = j["choices"][0];
          if (api == Api::kOpenAIChat && c.contains("delta") && c["delta"].contains("content"))
            text += c["delta"]["content"].get<std::string>();
          if (api == Api::kOpenAICompletion && c.contains("text"))
            text += c["text"].get<std::string>();
        }
      }
    }
  }
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(q * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

json LoadReport::ToJson() const {
  return {{"clients", clients},
          {"seconds", seconds},
          {"requests_started", started},
          {"completed", completed},
          {"disconnected_on_purpose", disconnected},
          {"errors", errors},
          {"mismatches", mismatches},
          {"generated_tokens", tokens},
          {"ttft_ms_p50", ttft_p50_ms},
          {"ttft_ms_p99", ttft_p99_ms},
          {"itl_ms_p50", itl_p50_ms},
          {"itl_ms_p99", itl_p99_ms},
          {"tokens_per_second", tokens_per_second},
          {"first_errors", first_errors}};
}

Expected<std::string> FetchAnswer(const LoadOptions& o, const LoadPrompt& p) {
  httplib::Client cli(o.host, o.port);
  cli.set_read_timeout(300, 0);
  cli.set_tcp_nodelay(true);
  json body = p.body;
  body["stream"] = false;
  auto res = cli.Post(PathFor(p.api), AuthHeaders(o), body.dump(), "application/json");
  if (!res) return IOError("load: request failed: " + httplib::to_string(res.error()));
  if (res->status != 200)
    return IOError("load: HTTP " + std::to_string(res->status) + ": " + res->body);
  json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded()) return Corruption("load: response is not JSON");
  if (p.api == Api::kAnthropicMessages) return j["content"][0].value("text", "");
  if (p.api == Api::kOpenAIChat) return j["choices"][0]["message"].value("content", "");
  return j["choices"][0].value("text", "");
}

LoadReport RunLoad(const LoadOptions& o, const std::vector<LoadPrompt>& prompts) {
  LoadReport report;
  report.clients = o.clients;
  std::mutex mu;
  std::vector<double> ttfts, itls;
  std::atomic<uint64_t> request_no{0};
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(o.seconds));
  auto worker = [&](int client) {
    std::mt19937_64 rng(o.seed * 7919 + client);
    httplib::Client cli(o.host, o.port);
    cli.set_read_timeout(120, 0);
    cli.set_keep_alive(true);
    // Headers and body go out as two writes: without TCP_NODELAY, Nagle holds the body until
    // the server's delayed ACK (40 ms on Linux), which would be measured as time to first token.
    cli.set_tcp_nodelay(true);
    while (Clock::now() < deadline && !prompts.empty()) {
      const uint64_t n = request_no.fetch_add(1) + 1;
      const LoadPrompt& p = prompts[rng() % prompts.size()];
      const bool hang_up = o.disconnect_every > 0 && n % o.disconnect_every == 0;
      const int hang_after = 1 + static_cast<int>(rng() % 8);
      json body = p.body;
      body["stream"] = true;
      if (p.api != Api::kAnthropicMessages) body["stream_options"] = {{"include_usage", true}};

      SseState sse;
      int chunks = 0;
      double ttft = -1;
      std::vector<double> gaps;
      const auto t0 = Clock::now();
      auto last_text = t0;
      httplib::Request req;
      req.method = "POST";
      req.path = PathFor(p.api);
      req.headers = AuthHeaders(o);
      req.headers.emplace("Content-Type", "application/json");
      req.body = body.dump();
      req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
        size_t before = sse.text.size();
        sse.Feed(p.api, data, len);
        if (sse.text.size() > before) {
          const auto now = Clock::now();
          if (ttft < 0)
            ttft = std::chrono::duration<double, std::milli>(now - t0).count();
          else
            gaps.push_back(std::chrono::duration<double, std::milli>(now - last_text).count());
          last_text = now;
        }
        return !(hang_up && ++chunks >= hang_after);
      };
      auto res = cli.send(req);
      std::lock_guard<std::mutex> lock(mu);
      ++report.started;
      if (hang_up && !res) {
        ++report.disconnected;
        cli.stop();  // a fresh connection next time
        continue;
      }
      if (!res || res->status != 200 || sse.error || !sse.done) {
        ++report.errors;
        if (report.first_errors.size() < 5)
          report.first_errors.push_back(
              !res ? "transport: " + httplib::to_string(res.error()) + " on " + req.path +
                         " after " + std::to_string(sse.buffer.size() + sse.text.size()) +
                         " bytes" + (hang_up ? " (hang-up planned)" : "")
                   : "HTTP " + std::to_string(res->status) + " " + res->body.substr(0, 200) +
                         sse.error_text);
        continue;
      }
      ++report.completed;
      report.tokens += sse.tokens;
      if (ttft >= 0) ttfts.push_back(ttft);
      itls.insert(itls.end(), gaps.begin(), gaps.end());
      if (sse.text != p.expected) {
        ++report.mismatches;
        if (report.first_errors.size() < 5)
          report.first_errors.push_back("mismatch: got '" + sse.text.substr(0, 120) +
                                        "' want '" + p.expected.substr(0, 120) + "'");
      }
    }
  };
  std::vector<std::thread> threads;
  for (int c = 0; c < o.clients; ++c) threads.emplace_back(worker, c);
  for (auto& t : threads) t.join();
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  report.ttft_p50_ms = Percentile(ttfts, 0.50);
  report.ttft_p99_ms = Percentile(ttfts, 0.99);
  report.itl_p50_ms = Percentile(itls, 0.50);
  report.itl_p99_ms = Percentile(itls, 0.99);
  report.tokens_per_second = report.seconds > 0 ? report.tokens / report.seconds : 0;
  return report;
}

uint64_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long long size = 0, resident = 0;
  int got = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace substrate::serve
