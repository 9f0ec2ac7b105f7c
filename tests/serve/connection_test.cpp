// The server's connection handling and request validation under hostile but fair clients
// (issue: reliability): credentials, disconnects, slow and malformed requests. Raw sockets
// where a well-behaved HTTP client cannot express the case.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <thread>

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

}  // namespace
}  // namespace substrate::serve
