// Test helpers: a streaming POST through httplib::Client and a server-sent-events parser.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace substrate::serve::testing {

struct SseEvent {
  std::string event;  // "" when the event has no "event:" line
  std::string data;
};

// Splits a complete SSE body into events (comments and pings are kept out).
inline std::vector<SseEvent> ParseSse(const std::string& body) {
  std::vector<SseEvent> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    std::string block = body.substr(pos, end - pos);
    pos = end + 2;
    SseEvent ev;
    bool any = false;
    size_t lp = 0;
    while (lp < block.size()) {
      size_t le = block.find('\n', lp);
      if (le == std::string::npos) le = block.size();
      std::string line = block.substr(lp, le - lp);
      lp = le + 1;
      if (line.rfind("event: ", 0) == 0) ev.event = line.substr(7), any = true;
      else if (line.rfind("data: ", 0) == 0) ev.data += line.substr(6), any = true;
    }
    if (any && ev.event != "ping") out.push_back(ev);
  }
  return out;
}

struct StreamResult {
  bool transport_ok = false;
  int status = 0;
  std::string body;
};

// POSTs `body`; on_chunk sees each piece as it arrives and may return false to hang up.
inline StreamResult PostStream(int port, const std::string& path, const std::string& body,
                               httplib::Headers headers = {},
                               std::function<bool(const std::string&)> on_chunk = nullptr) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  cli.set_tcp_nodelay(true);
  StreamResult r;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = std::move(headers);
  req.headers.emplace("Content-Type", "application/json");
  req.body = body;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    std::string piece(data, n);
    r.body += piece;
    return on_chunk ? on_chunk(r.body) : true;
  };
  auto res = cli.send(req);
  if (res) {
    r.transport_ok = true;
    r.status = res->status;
    if (r.body.empty()) r.body = res->body;
  }
  return r;
}

}  // namespace substrate::serve::testing
