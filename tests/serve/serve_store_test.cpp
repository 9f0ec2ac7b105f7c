// `substrate serve --store S --max-ram M` under ../shared/tools/memcap: the server runs a packed
// tiny-coder-moe out of core (weights streamed inside the budget), answers OpenAI and Anthropic
// requests, streamed and not, with the tokens `substrate run --store S --max-ram M` gives, shows
// the runtime's counters in /metrics, and stays under the cap.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "format/model_file.h"
#include "sse_client.h"
#include "store/pack.h"

extern char** environ;

namespace substrate::serve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ParseSse;
using testing::PostStream;

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// `substrate run ARGS --json`'s text, or a string starting with "ERROR".
std::string RunText(const std::string& args) {
  FILE* f = popen((std::string(SUBSTRATE_BINARY) + " run " + args + " --json 2>&1").c_str(), "r");
  if (!f) return "ERROR: popen";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int rc = pclose(f);
  json j = json::parse(out, nullptr, false);
  if (rc != 0 || j.is_discarded() || !j.contains("text")) return "ERROR: " + out;
  return j["text"];
}

// The child process of `parent` (memcap runs the server as its child), or `parent` itself.
pid_t ServerPid(pid_t parent) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) return static_cast<pid_t>(std::stoi(name));
  }
  return parent;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class ServeStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string model = std::string(SUBSTRATE_SHARED_DIR) + "/gguf/tiny-coder-moe-bf16.gguf";
    if (!fs::exists(model)) GTEST_SKIP() << "no fixture " << model;
    dir_ = ::testing::TempDir() + "/serve_store_" + std::to_string(getpid());
    fs::remove_all(dir_);
    auto file = ModelFile::Open(model);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    auto st = PackStore(**file, dir_, PackOptions{});
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    uint64_t data = 0;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().extension() == ".bin") data += e.file_size();
    ASSERT_GT(data, 0u);
    budget_ = data * 4 / 5;  // below the weights: ops and experts stream
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    if (!dir_.empty()) fs::remove_all(dir_);
    if (!log_.empty()) fs::remove(log_);
  }

  // Starts the server (under memcap when it can run here) and waits for its port.
  void StartServer() {
    const std::string memcap = std::string(SUBSTRATE_SHARED_DIR) + "/tools/memcap";
    use_memcap_ = fs::exists(memcap) && geteuid() == 0 &&
                  std::system((memcap + " 64M true >/dev/null 2>&1").c_str()) == 0;
    log_ = dir_ + ".log";
    std::vector<std::string> args;
    if (use_memcap_) {
      cap_ = budget_ + (16ull << 20);  // the budget plus the process: code, stacks, sockets
      args = {memcap, std::to_string(cap_ / 1024) + "K"};
    }
    for (std::string a : {std::string(SUBSTRATE_BINARY), std::string("serve"), std::string("--store"),
                          dir_, std::string("--max-ram"), std::to_string(budget_),
                          std::string("--port"), std::string("0"), std::string("-c"),
                          std::string("256"), std::string("--parallel"), std::string("2")})
      args.push_back(a);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    ASSERT_EQ(posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    const std::regex listening("listening on http://[^:]+:([0-9]+)");
    for (int i = 0; i < 600 && port_ == 0; ++i) {
      std::smatch m;
      const std::string log = ReadAll(log_);
      if (std::regex_search(log, m, listening)) port_ = std::stoi(m[1]);
      int status = 0;
      if (port_ == 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        FAIL() << "serve exited: " << log;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_GT(port_, 0) << ReadAll(log_);
  }

  // Stops the server; returns memcap's line ("" without memcap).
  std::string StopServer() {
    kill(use_memcap_ ? ServerPid(pid_) : pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = 0;
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadAll(log_);
    const std::string log = ReadAll(log_);
    const size_t at = log.find("memcap:");
    return at == std::string::npos ? "" : log.substr(at);
  }

  json Post(const std::string& path, const json& body) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return json{{"_status", -1}};
    json j = json::parse(r->body, nullptr, false);
    j["_status"] = r->status;
    return j;
  }

  std::string StreamText(const std::string& path, json body) {
    body["stream"] = true;
    auto s = PostStream(port_, path, body.dump());
    std::string text;
    for (const auto& e : ParseSse(s.body)) {
      if (e.data == "[DONE]") continue;
      json d = json::parse(e.data);
      if (path == "/v1/messages") {
        if (e.event == "content_block_delta") text += d["delta"]["text"].get<std::string>();
      } else if (!d["choices"].empty()) {
        const json& c = d["choices"][0];
        if (c.contains("text")) text += c["text"].get<std::string>();
        if (c.contains("delta") && c["delta"].contains("content"))
          text += c["delta"]["content"].get<std::string>();
      }
    }
    return text;
  }

  std::string dir_, log_;
  uint64_t budget_ = 0, cap_ = 0;
  bool use_memcap_ = false;
  pid_t pid_ = 0;
  int port_ = 0;
};

TEST_F(ServeStoreTest, AnswersEveryApiLikeRunUnderTheCap) {
  const std::string store = " --store " + dir_ + " --max-ram " + std::to_string(budget_) +
                            " -c 256 --temp 0 ";
  const std::string prompt = "def fibonacci(n):";
  const std::string q = "Write a Python function that returns the square of x.";
  const std::string want_text = RunText(store + "-p " + Quote(prompt) + " -n 24");
  const std::string want_chat = RunText(store + "--chat -p " + Quote(q) + " -n 16");
  ASSERT_EQ(want_text.rfind("ERROR", 0), std::string::npos) << want_text;
  ASSERT_EQ(want_chat.rfind("ERROR", 0), std::string::npos) << want_chat;
  ASSERT_FALSE(want_text.empty());

  StartServer();
  json completion = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}};
  json r = Post("/v1/completions", completion);
  ASSERT_EQ(r["_status"], 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], want_text);
  EXPECT_EQ(StreamText("/v1/completions", completion), want_text);

  json chat = {{"messages", {{{"role", "user"}, {"content", q}}}}, {"max_tokens", 16},
               {"temperature", 0}};
  r = Post("/v1/chat/completions", chat);
  ASSERT_EQ(r["_status"], 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["content"], want_chat);
  EXPECT_EQ(StreamText("/v1/chat/completions", chat), want_chat);

  json msg = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", q}}}},
              {"max_tokens", 16}, {"temperature", 0}};
  r = Post("/v1/messages", msg);
  ASSERT_EQ(r["_status"], 200) << r.dump();
  EXPECT_EQ(r["content"][0]["text"], want_chat);
  EXPECT_EQ(StreamText("/v1/messages", msg), want_chat);

  httplib::Client c("127.0.0.1", port_);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  const std::regex read_total("substrate_runtime_stream_bytes_read_total ([0-9.e+]+)");
  std::smatch got;
  ASSERT_TRUE(std::regex_search(m->body, got, read_total)) << m->body;
  EXPECT_GT(std::stod(got[1]), 0.0) << "nothing streamed: the budget held every weight";
  EXPECT_NE(m->body.find("substrate_runtime_expert_misses_total"), std::string::npos);

  const std::string memcap = StopServer();
  if (!use_memcap_) GTEST_SKIP() << "memcap cannot run here (needs root and a cgroup)";
  std::smatch peak;
  ASSERT_TRUE(std::regex_search(memcap, peak, std::regex("peak_bytes=([0-9]+)"))) << memcap;
  EXPECT_LE(std::stoull(peak[1]), cap_) << memcap;
  EXPECT_NE(memcap.find("oom_kills=0"), std::string::npos) << memcap;
}

}  // namespace
}  // namespace substrate::serve
