// Golden test: every conversation in ../shared/templates/cases renders byte for byte as Python's
// jinja2 rendered it under transformers' settings, and the "error" cases fail with the same
// message. Also runs `substrate template` end to end on one case of each kind.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "tokenizer/chat_template.h"

namespace substrate {
namespace {

const std::string kTemplatesDir = std::string(SUBSTRATE_SHARED_DIR) + "/templates";

// Loads cases.json, or skips the test when the shared fixtures are absent.
#define LOAD_CASES_OR_SKIP(var)                                                            \
  auto var##_text = ReadFileToString(kTemplatesDir + "/cases/cases.json");                 \
  if (!var##_text.ok()) GTEST_SKIP() << "shared template fixtures absent: "                \
                                     << var##_text.status().ToString();                    \
  auto var = nlohmann::ordered_json::parse(*var##_text);                                   \
  ASSERT_TRUE(var.is_array() && !var.empty())

nlohmann::ordered_json ContextOf(const nlohmann::ordered_json& c) {
  nlohmann::ordered_json ctx = c;
  for (const char* k : {"now", "template", "case", "status", "expected_file"}) ctx.erase(k);
  return ctx;
}

TEST(TemplateCases, EveryCaseMatchesPythonJinja2) {
  LOAD_CASES_OR_SKIP(cases);
  size_t ok_cases = 0, error_cases = 0;
  for (const auto& c : cases) {
    const std::string name = c.at("template").get<std::string>() + " / " + c.at("case").get<std::string>();
    SCOPED_TRACE(name);
    auto tmpl = ReadFileToString(kTemplatesDir + "/src/" + c.at("template").get<std::string>());
    ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
    auto expected = ReadFileToString(kTemplatesDir + "/cases/" + c.at("expected_file").get<std::string>());
    ASSERT_TRUE(expected.ok()) << expected.status().ToString();
    TemplateOptions opts;
    auto now = ParseDateTime(c.value("now", std::string("2026-11-29T12:00:00")));
    ASSERT_TRUE(now.ok()) << now.status().ToString();
    std::tm fixed = *now;
    opts.now = [fixed] { return fixed; };
    auto out = RenderChatTemplate(*tmpl, ContextOf(c), opts);
    if (c.at("status") == "ok") {
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      EXPECT_EQ(*out, *expected);
      ++ok_cases;
    } else {
      ASSERT_FALSE(out.ok()) << "rendered although Python refused:\n" << *out;
      EXPECT_EQ(out.status().message(), *expected);
      ++error_cases;
    }
  }
  EXPECT_EQ(ok_cases + error_cases, cases.size());
  EXPECT_GT(error_cases, 0u);
}

TEST(TemplateCases, ParsedTemplateRendersRepeatedly) {
  LOAD_CASES_OR_SKIP(cases);
  const auto& c = cases[0];
  auto tmpl = ReadFileToString(kTemplatesDir + "/src/" + c.at("template").get<std::string>());
  ASSERT_TRUE(tmpl.ok());
  auto parsed = ChatTemplate::Parse(*tmpl);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  auto first = parsed->Render(ContextOf(c));
  auto second = parsed->Render(ContextOf(c));
  ASSERT_EQ(first.ok(), second.ok());
  if (first.ok()) EXPECT_EQ(*first, *second);
  else EXPECT_EQ(first.status().message(), second.status().message());
}

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

CliResult RunCli(const std::string& tmpl, const nlohmann::ordered_json& ctx) {
  const std::string dir = testing::TempDir();
  const std::string ctx_path = dir + "/template_cli_ctx.json";
  const std::string out_path = dir + "/template_cli_out.txt";
  const std::string err_path = dir + "/template_cli_err.txt";
  std::ofstream(ctx_path) << ctx.dump();
  std::string cmd = std::string("'") + SUBSTRATE_BINARY + "' template --template '" + tmpl + "' --context '" +
                    ctx_path + "' > '" + out_path + "' 2> '" + err_path + "'";
  CliResult r;
  int rc = std::system(cmd.c_str());
  r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}

TEST(TemplateCli, RendersCasesAndReportsTemplateErrors) {
  LOAD_CASES_OR_SKIP(cases);
  bool saw_ok = false, saw_error = false;
  for (const auto& c : cases) {
    bool ok = c.at("status") == "ok";
    if ((ok && saw_ok) || (!ok && saw_error)) continue;
    SCOPED_TRACE(c.at("template").get<std::string>() + " / " + c.at("case").get<std::string>());
    auto expected = ReadFileToString(kTemplatesDir + "/cases/" + c.at("expected_file").get<std::string>());
    ASSERT_TRUE(expected.ok());
    CliResult r = RunCli(kTemplatesDir + "/src/" + c.at("template").get<std::string>(), c);
    if (ok) {
      EXPECT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(r.out, *expected);
      saw_ok = true;
    } else {
      EXPECT_EQ(r.exit_code, 1);
      EXPECT_EQ(r.err, *expected + "\n");
      saw_error = true;
    }
  }
  EXPECT_TRUE(saw_ok && saw_error);
}

}  // namespace
}  // namespace substrate
