// Agent features over the real engine and the bundled tiny-coder: a slot saved, the server
// restarted and the slot restored continues with the same tokens as without the restart; the
// prompt cache on disk survives a restart and skips the prefill of a prefix seen before
// (counted: usage, timings.prompt_n, /metrics); constrained decoding with speculative drafts
// gives the tokens plain constrained decoding gives; logit_bias moves the model's choice.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "core/file_io.h"
#include "grammar_test_util.h"
#include "runtime/engine.h"
#include "serve/json_schema.h"
#include "serve/model_backend.h"
#include "serve/server.h"
#include "serve/token_constraint.h"

namespace substrate::serve {
namespace {

using nlohmann::json;

std::string FindTinyCoder() {
  for (std::string p : {std::string(SUBSTRATE_SOURCE_DIR) + "/models/tiny-coder-Q8_0.gguf",
                        std::string(SUBSTRATE_SHARED_DIR) + "/gguf/tiny-coder-Q8_0.gguf"})
    if (FileExists(p)) return p;
  return "";
}

// A server over a freshly loaded model (a restart is destroying this and making another).
struct Running {
  std::unique_ptr<ModelBackend> backend;
  std::unique_ptr<HttpServer> server;

  static std::unique_ptr<Running> Start(const std::string& model, ModelBackendOptions mo,
                                        ServerOptions so) {
    auto r = std::make_unique<Running>();
    mo.path = model;
    mo.context = 1024;
    auto b = ModelBackend::Load(mo);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) return nullptr;
    r->backend = std::move(*b);
    so.port = 0;
    so.parallel = 1;
    auto s = HttpServer::Create(r->backend.get(), so);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return nullptr;
    r->server = std::move(*s);
    r->server->Start();
    return r;
  }
  json Post(const std::string& path, const json& body, int* status = nullptr) {
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(120, 0);
    auto res = c.Post(path.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(res);
    if (!res) return json();
    if (status) *status = res->status;
    return json::parse(res->body, nullptr, false);
  }
  std::string Metrics() {
    httplib::Client c("127.0.0.1", server->port());
    auto res = c.Get("/metrics");
    return res ? res->body : "";
  }
};

double Metric(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

class ModelAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = FindTinyCoder();
    if (model_.empty()) GTEST_SKIP() << "tiny-coder-Q8_0.gguf not in models/ or ../shared/gguf";
    dir_ = ::testing::TempDir() + "substrate_agent_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string model_, dir_;
};

TEST_F(ModelAgentTest, SavedSlotContinuesAfterARestartWithTheSameTokens) {
  ServerOptions so;
  so.slot_save_path = dir_;
  const std::string p1 =
      "import os\n\ndef list_files(path):\n    \"\"\"Return the files under path.\"\"\"\n";
  std::string p2;
  std::string without_restart;
  {
    auto a = Running::Start(model_, {}, so);
    ASSERT_TRUE(a);
    json r1 = a->Post("/v1/completions", {{"prompt", p1}, {"max_tokens", 24}, {"temperature", 0}});
    ASSERT_EQ(r1["choices"].size(), 1u) << r1.dump();
    int status = 0;
    json saved = a->Post("/slots/0?action=save", {{"filename", "slot0.bin"}}, &status);
    ASSERT_EQ(status, 200) << saved.dump();
    EXPECT_GT(saved["n_saved"].get<int>(), 30);
    // The continuation, on the same server: it reuses the slot's cache.
    p2 = p1 + r1["choices"][0]["text"].get<std::string>() + "\n    return";
    json r2 = a->Post("/v1/completions", {{"prompt", p2}, {"max_tokens", 24}, {"temperature", 0}});
    without_restart = r2["choices"][0]["text"];
    EXPECT_GT(r2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 30);
  }
  // A new process in all but name: a new model, new slots, then the slot restored from the file.
  auto b = Running::Start(model_, {}, so);
  ASSERT_TRUE(b);
  int status = 0;
  json restored = b->Post("/slots/0?action=restore", {{"filename", "slot0.bin"}}, &status);
  ASSERT_EQ(status, 200) << restored.dump();
  EXPECT_GT(restored["n_restored"].get<int>(), 30);
  json r2 = b->Post("/v1/completions", {{"prompt", p2}, {"max_tokens", 24}, {"temperature", 0}});
  EXPECT_EQ(r2["choices"][0]["text"], without_restart);
  const int cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, restored["n_restored"].get<int>() - 1) << r2.dump();
  EXPECT_EQ(r2["timings"]["prompt_n"].get<int>(), r2["usage"]["prompt_tokens"].get<int>() - cached);

  // A file that is not a slot file, and one that is absent.
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/junk.bin", "not a session").ok());
  json junk = b->Post("/slots/0?action=restore", {{"filename", "junk.bin"}}, &status);
  EXPECT_EQ(status, 400) << junk.dump();
  b->Post("/slots/0?action=restore", {{"filename", "absent.bin"}}, &status);
  EXPECT_EQ(status, 404);
}

TEST_F(ModelAgentTest, PromptCacheOnDiskSkipsTheRepeatedPrefillAcrossARestart) {
  ModelBackendOptions mo;
  mo.prompt_cache_dir = dir_ + "/cache";
  std::string system = "You review Python code. ";
  for (int i = 0; i < 12; ++i) system += "Point out bugs, style problems and missing tests. ";
  auto chat = [&](const std::string& q) {
    return json{{"messages",
                 {{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", q}}}},
                {"max_tokens", 8},
                {"temperature", 0}};
  };
  std::string first_text;
  int prompt_tokens = 0;
  {
    auto a = Running::Start(model_, mo, {});
    ASSERT_TRUE(a);
    json r = a->Post("/v1/chat/completions", chat("def f(x): return x+1"));
    prompt_tokens = r["usage"]["prompt_tokens"];
    ASSERT_GT(prompt_tokens, 100);
    EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    EXPECT_EQ(r["timings"]["prompt_n"], prompt_tokens);  // all evaluated
    first_text = r["choices"][0]["message"]["content"];
    // The entry is written after the answer went out: wait for it.
    double stores = 0;
    for (int i = 0; i < 200 && stores < 1; ++i) {
      stores = Metric(a->Metrics(), "substrate_prompt_cache_disk_stores_total");
      if (stores < 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(stores, 1);
  }
  auto b = Running::Start(model_, mo, {});
  ASSERT_TRUE(b);
  // The same prompt after the restart: everything but the last token comes from disk.
  json same = b->Post("/v1/chat/completions", chat("def f(x): return x+1"));
  EXPECT_EQ(same["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_tokens - 1)
      << same.dump();
  EXPECT_EQ(same["timings"]["prompt_n"], 1);
  EXPECT_EQ(same["choices"][0]["message"]["content"], first_text);
  const std::string m = b->Metrics();
  EXPECT_EQ(Metric(m, "substrate_prompt_cache_disk_hits_total"), 1);
  EXPECT_EQ(Metric(m, "substrate_prompt_cache_disk_restored_tokens_total"), prompt_tokens - 1);
  // Another question under the same long system prompt: the shared prefix is not evaluated again
  // (a fresh slot: clear it by restarting once more).
  b.reset();
  auto c = Running::Start(model_, mo, {});
  ASSERT_TRUE(c);
  json other = c->Post("/v1/chat/completions", chat("class A: pass"));
  const int cached = other["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GT(cached, prompt_tokens - 20) << other.dump();
  EXPECT_EQ(other["timings"]["prompt_n"].get<int>(),
            other["usage"]["prompt_tokens"].get<int>() - cached);
  // Anthropic reports the same as cache_read_input_tokens.
  json a =
      c->Post("/v1/messages", {{"model", "m"},
                               {"max_tokens", 4},
                               {"system", system},
                               {"messages", {{{"role", "user"}, {"content", "def g(): pass"}}}}});
  EXPECT_GT(a["usage"]["cache_read_input_tokens"].get<int>(), prompt_tokens - 20) << a.dump();
}

TEST_F(ModelAgentTest, ConstrainedDecodingWithDraftsGivesThePlainConstrainedTokens) {
  EngineOptions eo;
  auto engine = Engine::Load(model_, eo);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  auto vocab = ConstraintVocab::FromTokenizer(*e.tokenizer(),
                                              static_cast<int32_t>(e.model().hparams().n_vocab));
  auto schema = nlohmann::ordered_json::parse(R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":20},"args":{"type":"array","items":{"type":"integer"},"maxItems":6},
      "ok":{"type":"boolean"}},"required":["name","args","ok"],"additionalProperties":false})");
  auto text = JsonSchemaGrammar(schema);
  ASSERT_TRUE(text.ok());
  auto grammar = testing::MustParse(*text);
  // A prompt full of the shape the answer takes, so prompt lookup drafts something.
  std::string prompt = "# calls\n";
  for (int i = 0; i < 6; ++i) prompt += "{\"name\": \"add\", \"args\": [1, 2, 3], \"ok\": true}\n";
  auto ids = e.tokenizer()->Encode(prompt, {});
  ASSERT_TRUE(ids.ok());
  std::vector<int32_t> p(ids->begin(), ids->end());
  auto run = [&](int draft_max, GenerateStats* st) {
    auto s = e.NewSession(1024);
    EXPECT_TRUE(s.ok());
    TokenConstraint c(vocab, grammar);
    GenerateOptions go;
    go.max_tokens = 120;
    go.sampling.temperature = 0;
    go.draft_max = draft_max;
    go.processor = &c;
    std::vector<int32_t> toks;
    std::string out;
    auto r = e.Generate(**s, p, go, [&](int32_t t, const std::string& piece) {
      if (t >= 0) toks.push_back(t);
      out += piece;
      return true;
    });
    EXPECT_TRUE(r.ok());
    EXPECT_TRUE(c.status().ok()) << c.status().ToString();
    *st = *r;
    return std::make_pair(toks, out);
  };
  GenerateStats plain{}, drafted{};
  auto [want_toks, want] = run(0, &plain);
  auto [got_toks, got] = run(4, &drafted);
  EXPECT_EQ(plain.stop_reason, "eog") << want;
  EXPECT_TRUE(testing::Accepts(grammar, want)) << want;
  EXPECT_GT(drafted.n_drafted, 0);   // drafts were verified under the mask ...
  EXPECT_GT(drafted.n_accepted, 0);  // ... and some were kept
  EXPECT_EQ(got_toks, want_toks);
  EXPECT_EQ(got, want);
}

// `substrate chat` with input lines on stdin; returns what it printed (or "ERROR ...").
std::string Chat(const std::string& model, const std::string& extra, const std::string& input) {
  const std::string in = ::testing::TempDir() + "chat_input_" + std::to_string(::getpid());
  if (!WriteFileAtomic(in, input).ok()) return "ERROR: input";
  const std::string cmd = std::string(SUBSTRATE_BINARY) + " chat -m '" + model +
                          "' -n 12 --temp 0 -c 512 " + extra + " < '" + in + "' 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return "ERROR: popen";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int rc = pclose(f);
  std::remove(in.c_str());
  return rc == 0 ? out : "ERROR " + out;
}

TEST_F(ModelAgentTest, ChatSessionContinuesTheConversationInALaterRun) {
  // One run, two turns: the reference.
  const std::string both = Chat(model_, "", "def add(a, b):\nclass Stack:\n/exit\n");
  ASSERT_EQ(both.rfind("ERROR", 0), std::string::npos) << both;
  // The same two turns over two runs sharing a session file.
  const std::string session = dir_ + "/talk.session";
  const std::string first = Chat(model_, "--session '" + session + "'", "def add(a, b):\n/exit\n");
  ASSERT_EQ(first.rfind("ERROR", 0), std::string::npos) << first;
  EXPECT_TRUE(FileExists(session));
  EXPECT_TRUE(FileExists(session + ".messages.json"));
  const std::string second = Chat(model_, "--session '" + session + "'", "class Stack:\n/exit\n");
  ASSERT_EQ(second.rfind("ERROR", 0), std::string::npos) << second;
  EXPECT_NE(second.find("2 earlier messages"), std::string::npos) << second;
  // The second run's answer is the second answer of the single run (the history was there).
  const size_t at = both.find("> ", both.find("> ") + 2);  // the second prompt
  ASSERT_NE(at, std::string::npos) << both;
  const std::string want = both.substr(at, both.find("\n", at) - at);
  EXPECT_NE(second.find(want), std::string::npos) << "want: " << want << "\ngot: " << second;
  auto saved = ReadFileToString(session + ".messages.json");
  ASSERT_TRUE(saved.ok());
  EXPECT_EQ(json::parse(*saved).size(), 4u);
}

TEST_F(ModelAgentTest, LogitBiasMovesTheChoice) {
  auto a = Running::Start(model_, {}, {});
  ASSERT_TRUE(a);
  auto x = a->backend->EncodeText("zebra");
  ASSERT_TRUE(x.ok());
  const int32_t id = x->back();
  json body = {{"prompt", "def f(x):"}, {"max_tokens", 3}, {"temperature", 0}};
  json plain = a->Post("/v1/completions", body);
  body["logit_bias"] = {{std::to_string(id), 100}};
  json biased = a->Post("/v1/completions", body);
  const std::string piece = a->backend->engine().tokenizer()->Piece(id);
  EXPECT_EQ(biased["choices"][0]["text"], piece + piece + piece) << biased.dump();
  EXPECT_NE(plain["choices"][0]["text"], biased["choices"][0]["text"]);
}

}  // namespace
}  // namespace substrate::serve
