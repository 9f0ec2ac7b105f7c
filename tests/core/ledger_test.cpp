#include <gtest/gtest.h>

#include "core/aligned_buffer.h"
#include "core/memory_ledger.h"

namespace substrate {

TEST(MemoryLedger, ChargesAndReleasesPerAccount) {
  MemoryLedger ledger(1000);
  {
    auto a = ledger.Charge("weights", 600);
    ASSERT_TRUE(a.ok());
    auto b = ledger.Charge("kv_cache", 300);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(ledger.current(), 900u);
    EXPECT_EQ(ledger.Accounts()["weights"].current, 600u);
  }
  EXPECT_EQ(ledger.current(), 0u);
  EXPECT_EQ(ledger.peak(), 900u);
}

TEST(MemoryLedger, RefusesOverCapAndNamesTheAccount) {
  MemoryLedger ledger(1000);
  auto a = ledger.Charge("weights", 800);
  ASSERT_TRUE(a.ok());
  auto b = ledger.Charge("scratch", 300);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(b.status().message().find("scratch"), std::string::npos);
  EXPECT_EQ(ledger.current(), 800u);  // a refused charge leaves nothing behind
}

TEST(MemoryLedger, MovedChargeReleasesOnce) {
  MemoryLedger ledger(0);
  auto a = ledger.Charge("w", 10);
  ASSERT_TRUE(a.ok());
  LedgerCharge moved = std::move(a.value());
  LedgerCharge again = std::move(moved);
  EXPECT_EQ(ledger.current(), 10u);
  again.Reset();
  EXPECT_EQ(ledger.current(), 0u);
}

TEST(AlignedBuffer, ChargesTheLedger) {
  MemoryLedger ledger(1 << 20);
  {
    auto buf = AlignedBuffer::Allocate(5000, &ledger, "scratch");
    ASSERT_TRUE(buf.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % 4096, 0u);
    EXPECT_EQ(ledger.current(), 5000u);
  }
  EXPECT_EQ(ledger.current(), 0u);
  EXPECT_FALSE(AlignedBuffer::Allocate(2 << 20, &ledger).ok());
}

TEST(ParseBytes, AcceptsSuffixesAndRejectsJunk) {
  EXPECT_EQ(*ParseBytes("4G"), 4ull << 30);
  EXPECT_EQ(*ParseBytes("512MiB"), 512ull << 20);
  EXPECT_EQ(*ParseBytes("1.5K"), 1536u);
  EXPECT_EQ(*ParseBytes("1000"), 1000u);
  EXPECT_FALSE(ParseBytes("lots").ok());
  EXPECT_FALSE(ParseBytes("4Q").ok());
}

}  // namespace substrate
