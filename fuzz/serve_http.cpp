// libFuzzer target: raw bytes to a live HttpServer over loopback (httplib's request parser and
// router under this server's connection handling, framing checks, API keys, the three APIs and
// their handlers) with the deterministic fake backend of the server tests. Each input is one
// connection: its bytes are sent, the sending side shut, the answer read. Any crash, a 5xx, or
// the server not answering /health afterwards (a hang, a lost worker) is a bug.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "serve/fake_backend.h"
#include "serve/server.h"

namespace {

using Clock = std::chrono::steady_clock;

substrate::serve::testing::FakeBackend* backend = nullptr;
substrate::serve::HttpServer* server = nullptr;

// Sends `bytes` on a new connection, shuts the sending side, returns what came back.
std::string Exchange(const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(server->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) __builtin_trap();
  (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);
  const auto end = Clock::now() + std::chrono::seconds(3);
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  signal(SIGPIPE, SIG_IGN);
  backend = new substrate::serve::testing::FakeBackend(64);  // answers end within 64 tokens
  substrate::serve::ServerOptions o;
  o.port = 0;
  o.parallel = 1;
  o.max_queue = 4;
  o.max_body_bytes = 1 << 16;
  o.header_timeout_ms = 300;
  o.request_timeout_ms = 600;
  if (std::getenv("FUZZ_API_KEY")) o.api_key = std::getenv("FUZZ_API_KEY");
  auto s = substrate::serve::HttpServer::Create(backend, o);
  if (!s.ok()) __builtin_trap();
  server = s->release();
  server->Start();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string answer = Exchange(std::string(reinterpret_cast<const char*>(data), size));
  // Every answer of this server is well-formed, and never a server error.
  if (answer.rfind("HTTP/1.1 ", 0) == 0) {
    const int status = std::atoi(answer.c_str() + 9);
    if (status < 100 || status >= 500) __builtin_trap();
  }
  static int n = 0;
  if (++n % 64 == 0) {
    const std::string h = Exchange("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    if (h.rfind("HTTP/1.1 200", 0) != 0) __builtin_trap();
  }
  return 0;
}
