// Soak and abuse of `substrate serve`, as a hostile but fair client: starts the binary on a free
// port over a model and, for a given time, mixes
//   - requests of every API, streamed and not, checked for a whole answer;
//   - clients that hang up mid-stream, or while a non-streaming answer is generated;
//   - a corpus of malformed requests (bad JSON, wrong types and ranges, bad or missing
//     Content-Length, oversized headers and bodies, unknown paths), each expecting its 4xx;
//   - slow clients: one dripping a whole request within the header deadline (must be
//     answered), one stalling in its headers (must get 408);
//   - connection floods (dozens opened at once, left idle or half-written, then dropped);
//   - a /health probe every 200 ms (its latency says whether the server was starved).
// Prints one JSON object: requests, errors by kind, p99 latencies, the server's RSS after a
// warm-up and after the run, its slots busy after. Exits 1 on any 5xx, hang (no answer within
// 60 s), leaked slot, or answer of the wrong kind; 2 on bad arguments or a server that will not
// start.
//
//   bench_serve_abuse --binary build/substrate -m models/tiny-coder-Q8_0.gguf [--seconds 60]
//                     [--clients 8] [--parallel 2] [--max-tokens 24] [--ctx 512]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr int kHangMs = 60000;  // no answer within this: a hang

std::string Arg(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return fallback;
}

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

struct Exchange {
  int status = -1;
  std::string response;
  double ms = 0;
  bool hang = false;       // nothing (or not all) within kHangMs
  bool transport = false;  // could not connect or send
};

// How a client ends an exchange: reads to the end, or hangs up early.
struct Hangup {
  size_t after_bytes = 0;  // > 0: close once this many response bytes arrived
  int after_ms = 0;        // > 0: close this long after sending, whatever arrived
};

// Sends `request` (which asks for Connection: close) and reads the response to the end.
// `drip_ms` > 0 sends it a byte at a time.
Exchange Send(int port, const std::string& request, Hangup hangup = {}, int drip_ms = 0) {
  Exchange x;
  const auto t0 = Clock::now();
  const int fd = Connect(port);
  if (fd < 0) {
    x.transport = true;
    return x;
  }
  bool sent = true;
  if (drip_ms > 0) {
    for (size_t i = 0; i < request.size() && sent; ++i) {
      sent = SendAll(fd, request.substr(i, 1));
      std::this_thread::sleep_for(std::chrono::milliseconds(drip_ms));
    }
  } else {
    sent = SendAll(fd, request);
  }
  // A server may answer (411, 413) and close before reading all of a request: still read.
  const auto end =
      Clock::now() + std::chrono::milliseconds(hangup.after_ms > 0 ? hangup.after_ms : kHangMs);
  bool eof = false;
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    const int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count());
    if (::poll(&p, 1, std::max(1, left)) <= 0) continue;
    char buf[8192];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      eof = true;
      break;
    }
    x.response.append(buf, static_cast<size_t>(n));
    if (hangup.after_bytes > 0 && x.response.size() >= hangup.after_bytes) break;
  }
  ::close(fd);
  x.ms = MsSince(t0);
  if (x.response.rfind("HTTP/1.1 ", 0) == 0) x.status = std::atoi(x.response.c_str() + 9);
  const bool hung_up = hangup.after_bytes > 0 || hangup.after_ms > 0;
  if (!eof && !hung_up) x.hang = true;
  if (!sent && x.status < 0) x.transport = true;
  return x;
}

std::string Post(const std::string& path, const std::string& body, const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" + extra +
         "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

std::string Get(const std::string& path) {
  return "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
}

struct Malformed {
  const char* name;
  std::string request;
  std::vector<int> statuses;  // any of these
};

std::vector<Malformed> Corpus(uint64_t max_body) {
  const std::string chat = "/v1/chat/completions", comp = "/v1/completions", msgs = "/v1/messages";
  const std::string user = R"("messages":[{"role":"user","content":"hi"}])";
  std::vector<Malformed> c = {
      {"json_truncated", Post(chat, R"({"messages": [)"), {400}},
      {"json_not_object", Post(chat, "[1,2,3]"), {400}},
      {"json_garbage", Post(chat, "\x01\x02not json"), {400}},
      {"messages_string", Post(chat, R"({"messages":"hi"})"), {400}},
      {"role_unknown", Post(chat, R"({"messages":[{"role":"wizard","content":"x"}]})"), {400}},
      {"content_number", Post(chat, R"({"messages":[{"role":"user","content":5}]})"), {400}},
      {"max_tokens_negative", Post(chat, "{" + user + R"(,"max_tokens":-4})"), {400}},
      {"temperature_string", Post(chat, "{" + user + R"(,"temperature":"hot"})"), {400}},
      {"top_p_2", Post(chat, "{" + user + R"(,"top_p":2})"), {400}},
      {"top_k_negative", Post(chat, "{" + user + R"(,"top_k":-3})"), {400}},
      {"stream_string", Post(chat, "{" + user + R"(,"stream":"yes"})"), {400}},
      {"n_0", Post(chat, "{" + user + R"(,"n":0})"), {400}},
      {"n_1000", Post(chat, "{" + user + R"(,"n":1000})"), {400}},
      {"stop_number", Post(chat, "{" + user + R"(,"stop":7})"), {400}},
      {"top_logprobs_50", Post(chat, "{" + user + R"(,"logprobs":true,"top_logprobs":50})"), {400}},
      {"nesting_deep", Post(chat, std::string(5000, '[') + std::string(5000, ']')), {400}},
      {"prompt_ids_out_of_vocab",
       Post(comp, R"({"prompt":[1,2,999999999],"max_tokens":2})"),
       {400}},
      {"prompt_missing", Post(comp, R"({"max_tokens":2})"), {400}},
      {"echo", Post(comp, R"({"prompt":"x","echo":true})"), {400}},
      {"anthropic_no_max_tokens", Post(msgs, R"({"model":"m",)" + user + "}"), {400}},
      {"anthropic_system_role",
       Post(msgs, R"({"model":"m","max_tokens":2,"messages":[{"role":"system","content":"x"}]})"),
       {400}},
      {"empty_body", Post(chat, ""), {400}},
      {"content_length_negative",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: "
       "-5\r\n\r\n{}",
       {400}},
      {"content_length_2_64",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: "
       "18446744073709551616\r\n\r\n{}",
       {400}},
      {"content_length_missing",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n{}",
       {411}},
      {"content_length_over_limit",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " +
           std::to_string(max_body + 1) + "\r\n\r\n{}",
       {413}},
      {"body_over_limit", Post(chat, std::string(max_body + 10, ' ')), {413}},
      {"chunked_bad_size",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: "
       "chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
       {400}},
      {"request_line_garbage", "HELLO THERE\r\n\r\n", {400}},
      {"header_too_long",
       "GET /health HTTP/1.1\r\nX-Big: " + std::string(80000, 'a') + "\r\n\r\n",
       {431}},
      {"path_unknown", Post("/v1/nope", "{}"), {404}},
      {"method_wrong", Get(chat), {404, 405}},
  };
  return c;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

uint64_t RssBytes(pid_t pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/statm").c_str(), "r");
  if (!f) return 0;
  unsigned long long size = 0, resident = 0;
  const int got = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0) {
    ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

json Health(int port, double* ms = nullptr) {
  Exchange x = Send(port, Get("/health"));
  if (ms) *ms = x.ms;
  if (x.status != 200) return json();
  const size_t body = x.response.find("\r\n\r\n");
  return json::parse(x.response.substr(body == std::string::npos ? 0 : body + 4), nullptr, false);
}

class Abuse {
 public:
  Abuse(int port, int max_tokens, uint64_t max_body)
      : port_(port), max_tokens_(max_tokens), corpus_(Corpus(max_body)) {}

  // Counts the outcome; `ok` says whether the answer was of the expected kind.
  void Record(const std::string& kind, const Exchange& x, bool ok, bool timed = true) {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_;
    ++by_kind_[kind];
    if (timed && !x.hang) latencies_.push_back(x.ms);
    std::string err;
    if (x.hang)
      err = "hang";
    else if (x.status >= 500)
      err = "5xx";
    else if (x.transport)
      err = "transport";
    else if (!ok)
      err = "unexpected";
    if (err.empty()) return;
    ++errors_[err];
    if (examples_.size() < 8)
      examples_.push_back(kind + ": " + err + " (status " + std::to_string(x.status) +
                          "): " + x.response.substr(0, 200));
  }

  void Valid(std::mt19937_64& rng) {
    const bool stream = rng() % 2;
    const int api = static_cast<int>(rng() % 3);
    const std::string s = stream ? "true" : "false", n = std::to_string(max_tokens_);
    std::string req, done;
    if (api == 0) {
      req = Post(
          "/v1/chat/completions",
          R"({"messages":[{"role":"user","content":"Write a function that adds two numbers."}],"max_tokens":)" +
              n + R"(,"stream":)" + s + "}");
      done = stream ? "[DONE]" : "\"choices\"";
    } else if (api == 1) {
      req = Post("/v1/completions", R"({"prompt":"def fibonacci(n):","max_tokens":)" + n +
                                        R"(,"temperature":0.7,"stream":)" + s + "}");
      done = stream ? "[DONE]" : "\"choices\"";
    } else {
      req = Post(
          "/v1/messages",
          R"({"model":"m","messages":[{"role":"user","content":"Sort a list."}],"max_tokens":)" +
              n + R"(,"stream":)" + s + "}");
      done = stream ? "message_stop" : "\"content\"";
    }
    Exchange x = Send(port_, req);
    Record(stream ? "stream" : "complete", x,
           x.status == 200 && x.response.find(done) != std::string::npos);
  }

  void HangUp(std::mt19937_64& rng) {
    const bool stream = rng() % 2;
    const std::string body =
        std::string(R"({"prompt":"def f(","max_tokens":2000,"temperature":0.8,"stream":)") +
        (stream ? "true" : "false") + "}";
    Hangup h;
    if (stream) h.after_bytes = 400 + rng() % 400;  // the headers and a few events
    h.after_ms = 100 + static_cast<int>(rng() % 400);
    Exchange x = Send(port_, Post("/v1/completions", body), h);
    Record(stream ? "stream_hangup" : "complete_hangup", x, x.status == -1 || x.status == 200,
           false);
  }

  void Bad(std::mt19937_64& rng) { BadCase(corpus_[rng() % corpus_.size()]); }
  // Every case of the corpus once.
  void EveryBadCase() {
    for (const Malformed& m : corpus_) BadCase(m);
  }
  void BadCase(const Malformed& m) {
    Exchange x = Send(port_, m.request);
    const bool ok = std::find(m.statuses.begin(), m.statuses.end(), x.status) != m.statuses.end();
    Record(std::string("malformed:") + m.name, x, ok);
  }

  // A request dripped a byte every 40 ms (well within the header deadline): answered.
  void SlowButOk() {
    Exchange x = Send(port_, Get("/v1/models"), {}, 40);
    Record("slow_ok", x, x.status == 200, false);
  }

  // Half the headers, then silence: the server's header deadline answers 408 and closes.
  void Stall() {
    Exchange x = Send(port_, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le");
    Record("slow_stall", x, x.status == 408, false);
  }

  // Dozens of connections at once: idle, half a request line, or a whole request never read.
  void Flood(std::mt19937_64& rng) {
    std::vector<int> fds;
    for (int i = 0; i < 64; ++i) {
      const int fd = Connect(port_);
      if (fd < 0) continue;
      if (i % 3 == 1) SendAll(fd, "GET /heal");
      if (i % 3 == 2) SendAll(fd, Get("/health"));
      fds.push_back(fd);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200 + rng() % 800));
    for (int fd : fds) ::close(fd);
    std::lock_guard<std::mutex> lock(mu_);
    ++by_kind_["flood"];
    connections_flooded_ += fds.size();
  }

  void Probe() {
    double ms = 0;
    const json h = Health(port_, &ms);
    std::lock_guard<std::mutex> lock(mu_);
    ++health_probes_;
    health_ms_.push_back(ms);
    if (h.is_discarded() || h.is_null()) {
      ++errors_["health_failed"];
    }
  }

  json Report() const {
    std::lock_guard<std::mutex> lock(mu_);
    json kinds = json::object(), errors = json::object();
    std::map<std::string, uint64_t> grouped;
    for (const auto& [k, n] : by_kind_)
      grouped[k.rfind("malformed:", 0) == 0 ? "malformed" : k] += n;
    for (const auto& [k, n] : grouped) kinds[k] = n;
    for (const auto& [k, n] : errors_) errors[k] = n;
    return {{"requests", requests_},
            {"requests_by_kind", kinds},
            {"malformed_cases", corpus_.size()},
            {"connections_flooded", connections_flooded_},
            {"errors", errors},
            {"error_examples", examples_},
            {"latency_p50_ms", Percentile(latencies_, 0.50)},
            {"latency_p99_ms", Percentile(latencies_, 0.99)},
            {"health_probes", health_probes_},
            {"health_p99_ms", Percentile(health_ms_, 0.99)},
            {"health_max_ms",
             health_ms_.empty() ? 0.0 : *std::max_element(health_ms_.begin(), health_ms_.end())}};
  }
  uint64_t failures() const {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t n = 0;
    for (const auto& [k, v] : errors_) n += v;
    return n;
  }

 private:
  int port_, max_tokens_;
  std::vector<Malformed> corpus_;
  mutable std::mutex mu_;
  uint64_t requests_ = 0, health_probes_ = 0, connections_flooded_ = 0;
  std::map<std::string, uint64_t> by_kind_, errors_;
  std::vector<double> latencies_, health_ms_;
  std::vector<std::string> examples_;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string binary = Arg(argc, argv, "--binary", "");
  const std::string model = Arg(argc, argv, "-m", "");
  if (binary.empty() || model.empty()) {
    std::fprintf(
        stderr,
        "usage: bench_serve_abuse --binary SUBSTRATE -m MODEL [--seconds 60] [--clients 8]\n"
        "                         [--parallel 2] [--max-tokens 24] [--ctx 512]\n");
    return 2;
  }
  const double seconds = std::atof(Arg(argc, argv, "--seconds", "60").c_str());
  const int clients = std::max(1, std::atoi(Arg(argc, argv, "--clients", "8").c_str()));
  const std::string parallel = Arg(argc, argv, "--parallel", "2");
  const int max_tokens = std::atoi(Arg(argc, argv, "--max-tokens", "24").c_str());
  const std::string ctx = Arg(argc, argv, "--ctx", "512");
  constexpr uint64_t kMaxBody = 1 << 20;

  signal(SIGPIPE, SIG_IGN);
  const int port = FreePort();
  const std::string log = "/tmp/serve_abuse_" + std::to_string(getpid()) + ".log";
  const pid_t server = fork();
  if (server == 0) {
    const std::string p = std::to_string(port), body = std::to_string(kMaxBody);
    if (!std::freopen(log.c_str(), "w", stderr)) _exit(127);
    execl(binary.c_str(), binary.c_str(), "serve", "-m", model.c_str(), "--port", p.c_str(),
          "--parallel", parallel.c_str(), "-c", ctx.c_str(), "--max-body", body.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  auto stop_server = [&] {
    kill(server, SIGTERM);
    int st = 0;
    for (int i = 0; i < 100 && waitpid(server, &st, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (waitpid(server, &st, WNOHANG) == 0) {
      kill(server, SIGKILL);
      waitpid(server, &st, 0);
    }
    return st;
  };
  bool up = false;
  for (int i = 0; i < 600 && !up; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    int st = 0;
    if (waitpid(server, &st, WNOHANG) != 0) break;
    up = !Health(port).is_null();
  }
  if (!up) {
    std::fprintf(stderr, "bench_serve_abuse: the server did not start (see %s)\n", log.c_str());
    stop_server();
    return 2;
  }

  Abuse abuse(port, max_tokens, kMaxBody);
  auto run = [&](double secs, bool warm) {  // warm: valid requests only
    const auto end = Clock::now() + std::chrono::duration<double>(secs);
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&, c] {
        std::mt19937_64 rng(1234 + c + (warm ? 1000 : 0));
        while (Clock::now() < end) {
          const int pick = static_cast<int>(rng() % 10);
          if (pick < 4)
            abuse.Valid(rng);
          else if (pick < 6)
            abuse.HangUp(rng);
          else
            abuse.Bad(rng);
        }
      });
    if (!warm) {
      threads.emplace_back([&] {  // slow clients
        while (Clock::now() < end) {
          abuse.SlowButOk();
          abuse.Stall();
        }
      });
      threads.emplace_back([&] {  // floods
        std::mt19937_64 rng(99);
        while (Clock::now() < end) {
          abuse.Flood(rng);
          std::this_thread::sleep_for(std::chrono::milliseconds(1000));
        }
      });
      threads.emplace_back([&] {  // /health
        while (Clock::now() < end) {
          abuse.Probe();
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
      });
    }
    for (auto& t : threads) t.join();
  };

  // Warm-up (thread stacks, allocator arenas, every slot's KV cache), then the baseline.
  Abuse warm(port, max_tokens, kMaxBody);
  {
    const auto end = Clock::now() + std::chrono::duration<double>(std::min(5.0, seconds / 5 + 1));
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&, c] {
        std::mt19937_64 rng(777 + c);
        while (Clock::now() < end) warm.Valid(rng);
      });
    for (auto& t : threads) t.join();
  }
  const uint64_t rss_before = RssBytes(server);
  const auto t0 = Clock::now();
  abuse.EveryBadCase();
  run(seconds, false);
  const double ran = MsSince(t0) / 1000;

  // Every slot must come free and the queue empty once the clients are gone.
  json h;
  for (int i = 0; i < 150; ++i) {
    h = Health(port);
    if (h.is_object() && h.value("slots_busy", -1) == 0 && h.value("queued", -1) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const uint64_t rss_after = RssBytes(server);
  const int busy = h.is_object() ? h.value("slots_busy", -1) : -1;
  const int queued = h.is_object() ? h.value("queued", -1) : -1;
  const int exit_status = stop_server();

  json out = abuse.Report();
  out["seconds"] = ran;
  out["clients"] = clients;
  out["parallel"] = std::atoi(parallel.c_str());
  out["model"] = model;
  out["rss_mb_before"] = static_cast<double>(rss_before) / 1048576.0;
  out["rss_mb_after"] = static_cast<double>(rss_after) / 1048576.0;
  out["slots_busy_after"] = busy;
  out["queued_after"] = queued;
  out["server_exit"] = WIFEXITED(exit_status) ? WEXITSTATUS(exit_status) : -WTERMSIG(exit_status);
  const bool leaked = busy != 0 || queued != 0;
  const bool crashed = !WIFEXITED(exit_status) || WEXITSTATUS(exit_status) != 0;
  out["pass"] = !leaked && !crashed && abuse.failures() == 0;
  std::printf("%s\n", out.dump(1).c_str());
  if (out["pass"].get<bool>())
    std::remove(log.c_str());
  else
    std::fprintf(stderr, "bench_serve_abuse: FAILED (server log: %s)\n", log.c_str());
  return out["pass"].get<bool>() ? 0 : 1;
}
