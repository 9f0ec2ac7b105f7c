// The server's connection handling and request validation under hostile but fair clients
// (issue: reliability): credentials, disconnects, slow and malformed requests. Raw sockets
// where a well-behaved HTTP client cannot express the case.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "fake_backend.h"
#include "serve/server.h"

namespace substrate::serve {
namespace {

using nlohmann::json;
using testing::FakeBackend;

class ConnectionTest : public ::testing::Test {
 protected:
  void StartServer(ServerOptions opt = {}) {
    opt.port = 0;
    auto s = HttpServer::Create(&backend_, opt);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    server_->Start();
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  httplib::Client Client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(30, 0);
    return c;
  }
  int PostStatus(const std::string& path, const json& body, httplib::Headers h = {}) {
    auto r = Client().Post(path.c_str(), h, body.dump(), "application/json");
    return r ? r->status : -1;
  }

  FakeBackend backend_{512};
  std::unique_ptr<HttpServer> server_;
};

using Clock = std::chrono::steady_clock;

// A raw client socket, for what an HTTP client library will not do.
class RawConn {
 public:
  explicit RawConn(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~RawConn() { Close(); }
  bool ok() const { return ok_; }
  bool Send(const std::string& s) {
    return ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
  }
  // Everything until the server closes or `timeout` passes.
  std::string ReadAll(std::chrono::milliseconds timeout) {
    std::string out;
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      pollfd p{fd_, POLLIN, 0};
      const int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count());
      if (::poll(&p, 1, std::max(1, left)) <= 0) break;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  bool closed() const { return closed_; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
  bool closed_ = false;
};

std::string PostText(const std::string& path, const std::string& body) {
  return "POST " + path +
         " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

int StatusOf(const std::string& response) {
  return response.rfind("HTTP/1.1 ", 0) == 0 ? std::atoi(response.c_str() + 9) : -1;
}

// RFC 9110: the authentication scheme is case-insensitive; "bearer KEY" was refused as missing.
TEST_F(ConnectionTest, BearerSchemeIsCaseInsensitive) {
  ServerOptions opt;
  opt.api_key = "sekrit";
  StartServer(opt);
  const json req = {{"prompt", "a"}, {"max_tokens", 2}};
  for (const char* auth : {"Bearer sekrit", "bearer sekrit", "BEARER sekrit", "bEaReR   sekrit"})
    EXPECT_EQ(PostStatus("/v1/completions", req, {{"Authorization", auth}}), 200) << auth;
  for (const char* auth : {"Bearersekrit", "Basic sekrit", "bearer sekri", "bearer", "sekrit"})
    EXPECT_EQ(PostStatus("/v1/completions", req, {{"Authorization", auth}}), 401) << auth;
}

// A non-streaming request whose client hangs up frees its slot at once (it generated all its
// tokens with nobody waiting: 4 such clients held every slot for minutes).
TEST_F(ConnectionTest, NonStreamingClientGoneFreesItsSlot) {
  ServerOptions opt;
  opt.parallel = 2;
  StartServer(opt);
  backend_.token_delay_us = 2000;  // 3000 tokens: 6 s each
  const std::string body = R"({"prompt":"def f(","max_tokens":3000,"temperature":0.8})";
  for (int i = 0; i < 2; ++i) {
    RawConn c(server_->port());
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c.Send(PostText("/v1/completions", body)));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }  // both closed
  const auto t0 = Clock::now();
  while (server_->scheduler().Stats().busy > 0 && Clock::now() - t0 < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(server_->scheduler().Stats().busy, 0);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(1));
  EXPECT_EQ(server_->scheduler().Stats().cancelled, 2u);
  // A new short request is answered at once.
  backend_.token_delay_us = 0;
  EXPECT_EQ(PostStatus("/v1/completions", {{"prompt", "abc"}, {"max_tokens", 8}}), 200);
  // A client that stays gets its whole answer.
  auto r = Client().Post("/v1/completions", json{{"prompt", "abc"}, {"max_tokens", 40}}.dump(),
                         "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 40);
}

// Framing a server cannot read a body by is answered at once, not after the read timeout.
TEST_F(ConnectionTest, BadOrMissingContentLengthIsAnsweredAtOnce) {
  ServerOptions opt;
  opt.max_body_bytes = 1 << 20;
  StartServer(opt);
  struct Case {
    std::string headers;
    int status;
  };
  for (const Case& c :
       {Case{"Content-Length: -5\r\n", 400}, Case{"Content-Length: 18446744073709551616\r\n", 400},
        Case{"Content-Length: 12abc\r\n", 400},
        Case{"Content-Length: 5\r\nContent-Length: 6\r\n", 400}, Case{"", 411},
        Case{"Content-Length: 99999999\r\n", 413}}) {
    SCOPED_TRACE(c.headers);
    RawConn conn(server_->port());
    ASSERT_TRUE(conn.ok());
    const auto t0 = Clock::now();
    ASSERT_TRUE(conn.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + c.headers +
                          "Content-Type: application/json\r\n\r\n{\"prompt\""));
    const std::string resp = conn.ReadAll(std::chrono::seconds(5));
    EXPECT_EQ(StatusOf(resp), c.status) << resp;
    EXPECT_NE(resp.find("\"error\""), std::string::npos) << resp;
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
    EXPECT_TRUE(conn.closed());  // the unread body makes the connection unusable
  }
  EXPECT_EQ(Client().Get("/health")->status, 200);
}

// Connections that drip their headers (one byte now and then) or idle between requests hold no
// worker: /health answers at once while more of them are open than the server has workers,
// and a request whose headers are not complete within the deadline gets 408.
TEST_F(ConnectionTest, SlowAndIdleConnectionsDoNotStarveTheServer) {
  ServerOptions opt;
  opt.parallel = 1;
  opt.max_queue = 2;  // 7 workers
  opt.header_timeout_ms = 1500;
  StartServer(opt);
  std::vector<std::unique_ptr<RawConn>> slow;
  for (int i = 0; i < 40; ++i) {
    slow.push_back(std::make_unique<RawConn>(server_->port()));
    ASSERT_TRUE(slow.back()->ok());
  }
  // Idle keep-alive connections too: each made one request and stays open.
  std::vector<std::unique_ptr<httplib::Client>> idle;
  for (int i = 0; i < 20; ++i) {
    idle.push_back(std::make_unique<httplib::Client>("127.0.0.1", server_->port()));
    idle.back()->set_keep_alive(true);
    ASSERT_EQ(idle.back()->Get("/health")->status, 200);
  }
  const std::string request = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  std::atomic<bool> stop{false};
  std::thread drip([&] {
    for (size_t k = 0; k < request.size() && !stop; ++k) {
      for (auto& c : slow) c->Send(request.substr(k, 1));
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  });
  double worst_ms = 0;
  for (int i = 0; i < 10; ++i) {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(3, 0);
    const auto t0 = Clock::now();
    auto r = c.Get("/health");
    worst_ms =
        std::max(worst_ms, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    ASSERT_TRUE(r) << "health timed out with slow clients connected";
    EXPECT_EQ(r->status, 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_LT(worst_ms, 500);
  // The dripping requests ran past their header deadline: 408, closed.
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  for (auto& c : slow) {
    const std::string resp = c->ReadAll(std::chrono::milliseconds(2000));
    EXPECT_EQ(StatusOf(resp), 408) << resp;
    EXPECT_TRUE(c->closed());
  }
  stop = true;
  drip.join();
  EXPECT_EQ(server_->scheduler().Stats().busy, 0);
}

// Keep-alive and pipelining still work through the waiter: two requests in one write.
TEST_F(ConnectionTest, PipelinedRequestsOnOneConnection) {
  StartServer();
  RawConn c(server_->port());
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(
      c.Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n"
             "Connection: close\r\n\r\n"));
  const std::string resp = c.ReadAll(std::chrono::seconds(3));
  EXPECT_NE(resp.find("\"slots\""), std::string::npos) << resp;
  EXPECT_NE(resp.find("fake-model"), std::string::npos) << resp;
  EXPECT_TRUE(c.closed());
}

}  // namespace
}  // namespace substrate::serve
