#include "core/memory_ledger.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace substrate {

LedgerCharge& LedgerCharge::operator=(LedgerCharge&& other) noexcept {
  if (this != &other) {
    Reset();
    ledger_ = other.ledger_;
    account_ = std::move(other.account_);
    bytes_ = other.bytes_;
    other.ledger_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void LedgerCharge::Reset() {
  if (ledger_ && bytes_) ledger_->Release(account_, bytes_);
  ledger_ = nullptr;
  bytes_ = 0;
}

Expected<LedgerCharge> MemoryLedger::Charge(const std::string& account, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t cap = cap_.load();
  uint64_t now = current_.load();
  if (cap != 0 && now + bytes > cap) {
    return OutOfMemory("memory ledger: charging " + FormatBytes(bytes) + " to '" + account +
                       "' would exceed the cap of " + FormatBytes(cap) + " (" +
                       FormatBytes(now) + " already charged)");
  }
  now += bytes;
  current_.store(now);
  if (now > peak_.load()) peak_.store(now);
  LedgerAccount& a = accounts_[account];
  a.current += bytes;
  if (a.current > a.peak) a.peak = a.current;
  LedgerCharge charge;
  charge.ledger_ = this;
  charge.account_ = account;
  charge.bytes_ = bytes;
  return charge;
}

void MemoryLedger::Release(const std::string& account, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  current_.store(current_.load() - bytes);
  accounts_[account].current -= bytes;
}

uint64_t MemoryLedger::available() const {
  uint64_t cap = cap_.load(), now = current_.load();
  if (cap == 0) return UINT64_MAX;
  return now >= cap ? 0 : cap - now;
}

std::map<std::string, LedgerAccount> MemoryLedger::Accounts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return accounts_;
}

std::string MemoryLedger::ToJson() const {
  nlohmann::json j;
  j["cap"] = cap_.load();
  j["current"] = current_.load();
  j["peak"] = peak_.load();
  nlohmann::json accounts = nlohmann::json::object();
  for (const auto& [name, a] : Accounts()) accounts[name] = {{"current", a.current}, {"peak", a.peak}};
  j["accounts"] = accounts;
  return j.dump();
}

MemoryLedger& MemoryLedger::Global() {
  // Never destroyed: thread-local kernel scratch on pool workers releases its charge when the
  // worker exits, which at process exit can come after function statics constructed later than
  // the pool are gone (a use after free that hung test_runtime at exit).
  static MemoryLedger* ledger = new MemoryLedger();
  return *ledger;
}

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  return buf;
}

Expected<uint64_t> ParseBytes(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return InvalidArgument("not a size: '" + text + "' (expected e.g. 4G, 512M, 1000000)");
  double v = std::strtod(text.substr(0, i).c_str(), nullptr);
  std::string suffix = text.substr(i);
  for (auto& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix.size() > 1 && suffix.back() == 'B') suffix.pop_back();
  if (suffix.size() > 1 && suffix.back() == 'I') suffix.pop_back();
  double mul = 1;
  if (suffix.empty() || suffix == "B") mul = 1;
  else if (suffix == "K") mul = 1024.0;
  else if (suffix == "M") mul = 1024.0 * 1024;
  else if (suffix == "G") mul = 1024.0 * 1024 * 1024;
  else if (suffix == "T") mul = 1024.0 * 1024 * 1024 * 1024;
  else return InvalidArgument("unknown size suffix in '" + text + "' (use K, M, G or T)");
  double bytes = v * mul;
  if (!std::isfinite(bytes) || bytes < 0 || bytes > 1.8e19)
    return InvalidArgument("size out of range: '" + text + "'");
  return static_cast<uint64_t>(bytes);
}

}  // namespace substrate
