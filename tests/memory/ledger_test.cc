#include "memory/ledger.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace zerodp {
namespace {

TEST(MemoryLedger, TracksCurrentAndPeakPerCategory) {
  MemoryLedger ledger;
  {
    Buffer<float> a(ledger, MemCategory::kMaster, 100);
    EXPECT_EQ(ledger.current(MemCategory::kMaster), 400u);
    Buffer<uint16_t> b(ledger, MemCategory::kParams, 10);
    EXPECT_EQ(ledger.current(MemCategory::kParams), 20u);
    EXPECT_EQ(ledger.current_total(), 420u);
  }
  EXPECT_EQ(ledger.current_total(), 0u);
  EXPECT_EQ(ledger.peak(MemCategory::kMaster), 400u);
  EXPECT_EQ(ledger.peak(MemCategory::kParams), 20u);
  EXPECT_EQ(ledger.peak_total(), 420u);
}

TEST(MemoryLedger, PeakTotalIsThePeakOfTheSumNotTheSumOfPeaks) {
  MemoryLedger ledger;
  { Buffer<float> a(ledger, MemCategory::kActivations, 1000); }
  { Buffer<float> b(ledger, MemCategory::kGathered, 1000); }
  EXPECT_EQ(ledger.peak(MemCategory::kActivations), 4000u);
  EXPECT_EQ(ledger.peak(MemCategory::kGathered), 4000u);
  EXPECT_EQ(ledger.peak_total(), 4000u);
}

TEST(MemoryLedger, BuffersAreZeroedAlignedAndMovable) {
  MemoryLedger ledger;
  Buffer<double> a(ledger, MemCategory::kWorkspace, 33);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], 0.0);
  Buffer<double> b = std::move(a);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(b.size(), 33u);
  EXPECT_EQ(ledger.current(MemCategory::kWorkspace), 33u * 8);
  b.reset();
  EXPECT_EQ(ledger.current_total(), 0u);
}

TEST(MemoryLedger, BudgetOverrunNamesRankCategoryRequestBudgetAndAdvice) {
  MemoryLedger ledger(3, 1024);
  ledger.set_advice("stage 3 on 4 ranks would need 300 B per rank");
  Buffer<uint8_t> held(ledger, MemCategory::kParams, 1000);
  try {
    Buffer<uint8_t> more(ledger, MemCategory::kAdamM, 100);
    FAIL() << "an allocation past the budget succeeded";
  } catch (const OutOfMemory& e) {
    EXPECT_STREQ(e.what(),
                 "rank 3: allocating 100 B of adam_m would hold 1.07 KiB in all, over the "
                 "--memory-per-rank budget of 1.00 KiB (held: params 1000 B); stage 3 on 4 "
                 "ranks would need 300 B per rank");
  }
  // The failed request left no trace.
  EXPECT_EQ(ledger.current_total(), 1000u);
  EXPECT_EQ(ledger.current(MemCategory::kAdamM), 0u);
  EXPECT_EQ(ledger.peak_total(), 1000u);
}

TEST(MemoryLedger, ResetPeaksStartsANewWindow) {
  MemoryLedger ledger;
  Buffer<float> keep(ledger, MemCategory::kMaster, 10);
  { Buffer<float> tmp(ledger, MemCategory::kWorkspace, 100); }
  ledger.reset_peaks();
  EXPECT_EQ(ledger.peak(MemCategory::kWorkspace), 0u);
  EXPECT_EQ(ledger.peak_total(), 40u);
}

}  // namespace
}  // namespace zerodp
