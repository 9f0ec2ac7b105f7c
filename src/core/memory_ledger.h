// The memory ledger: every byte of weights, KV cache and scratch is charged to a named account,
// and the sum is held under one cap. A charge that would exceed the cap fails with OutOfMemory
// naming the account, the request and what is already charged — it never over-commits silently.
//
// A plan's promise ("never above 4 GiB") is checked here at run time and by tools/memcap from
// outside. Thread-safe: charges may come from prefetch workers and the token loop at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "core/status.h"

namespace substrate {

class MemoryLedger;

// RAII handle for bytes charged to one account; releases them when destroyed or Reset().
class LedgerCharge {
 public:
  LedgerCharge() = default;
  LedgerCharge(LedgerCharge&& other) noexcept { *this = std::move(other); }
  LedgerCharge& operator=(LedgerCharge&& other) noexcept;
  LedgerCharge(const LedgerCharge&) = delete;
  LedgerCharge& operator=(const LedgerCharge&) = delete;
  ~LedgerCharge() { Reset(); }

  void Reset();
  uint64_t bytes() const { return bytes_; }

 private:
  friend class MemoryLedger;
  MemoryLedger* ledger_ = nullptr;
  std::string account_;
  uint64_t bytes_ = 0;
};

struct LedgerAccount {
  uint64_t current = 0;
  uint64_t peak = 0;
};

class MemoryLedger {
 public:
  // cap_bytes == 0 means "no cap" (still tracked, never refused).
  explicit MemoryLedger(uint64_t cap_bytes = 0) : cap_(cap_bytes) {}

  // Charges `bytes` to `account` ("weights", "kv_cache", "scratch", "stream_slabs", ...).
  Expected<LedgerCharge> Charge(const std::string& account, uint64_t bytes);

  uint64_t cap() const { return cap_; }
  void set_cap(uint64_t cap_bytes) { cap_ = cap_bytes; }
  uint64_t current() const { return current_.load(); }
  uint64_t peak() const { return peak_.load(); }
  uint64_t available() const;
  std::map<std::string, LedgerAccount> Accounts() const;
  // {"cap":..,"current":..,"peak":..,"accounts":{"weights":{"current":..,"peak":..},..}}
  std::string ToJson() const;

  // The process-wide ledger used when no other is given.
  static MemoryLedger& Global();

 private:
  friend class LedgerCharge;
  void Release(const std::string& account, uint64_t bytes);

  std::atomic<uint64_t> cap_;
  std::atomic<uint64_t> current_{0};
  std::atomic<uint64_t> peak_{0};
  mutable std::mutex mu_;
  std::map<std::string, LedgerAccount> accounts_;
};

// "1.50 GiB" — human-readable sizes for messages.
std::string FormatBytes(uint64_t bytes);
// Parses "4G", "512M", "1.5GiB", "1000000" (powers of 1024 for suffixes).
Expected<uint64_t> ParseBytes(const std::string& text);

}  // namespace substrate
