// The backend seam holds: model/ says what to compute and never calls a kernel itself. Checked
// twice: no file of src/model includes a kernels/ header, and the model library, as linked,
// references no symbol the kernels library defines (so a call through some other header fails
// too).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace substrate {
namespace {

namespace fs = std::filesystem;

// Symbols `nm` lists for `lib` with `flags`, one per line (names only).
std::set<std::string> Symbols(const std::string& flags, const fs::path& lib) {
  std::set<std::string> out;
  const std::string cmd = "nm " + flags + " '" + lib.string() + "' 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char line[4096];
  while (std::fgets(line, sizeof line, p)) {
    std::istringstream in(line);
    std::string a, b, c;
    in >> a >> b >> c;
    // "ADDR T name" for defined symbols, "U name" for undefined ones.
    const std::string& name = c.empty() ? b : c;
    const std::string& type = c.empty() ? a : b;
    if (type.size() == 1 && name.size() > 1) out.insert(name);
  }
  pclose(p);
  return out;
}

TEST(Layering, ModelIncludesNoKernelHeader) {
  const fs::path dir = fs::path(SUBSTRATE_SOURCE_DIR) / "src" / "model";
  ASSERT_TRUE(fs::exists(dir));
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path());
    std::string line;
    ++files;
    while (std::getline(in, line))
      EXPECT_EQ(line.find("#include \"kernels/"), std::string::npos)
          << entry.path().filename() << ": " << line;
  }
  EXPECT_GT(files, 10);
}

TEST(Layering, ModelLibraryCallsNoKernel) {
  const fs::path build = fs::path(SUBSTRATE_BINARY).parent_path();
  const fs::path model = build / "libsubstrate_model.a", kernels = build / "libsubstrate_kernels.a";
  if (!fs::exists(model) || !fs::exists(kernels)) GTEST_SKIP() << "libraries not at " << build;
  const std::set<std::string> defined = Symbols("-g --defined-only", kernels);
  const std::set<std::string> undefined = Symbols("-u", model);
  if (defined.empty()) GTEST_SKIP() << "nm gave no symbols (binutils missing?)";
  ASSERT_FALSE(undefined.empty());
  // The check can see a call: the backend library does reference the kernels.
  const std::set<std::string> backend_refs = Symbols("-u", build / "libsubstrate_backend.a");
  int backend_calls = 0;
  for (const std::string& s : backend_refs) backend_calls += defined.count(s);
  EXPECT_GT(backend_calls, 0);
  for (const std::string& s : undefined)
    EXPECT_EQ(defined.count(s), 0u) << "model/ calls a kernel directly: " << s;
}

}  // namespace
}  // namespace substrate
