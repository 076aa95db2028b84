#include "core/units.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace zerodp {
namespace {

TEST(Units, ParsesBytesWithDecimalAndBinaryPrefixes) {
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("2GiB"), 2ull << 30);
  EXPECT_EQ(parse_bytes("1.5 KiB"), 1536u);
  EXPECT_EQ(parse_bytes("512MB"), 512000000u);
  EXPECT_EQ(parse_bytes("1e3"), 1000u);
}

TEST(Units, RejectsMalformedSizesNamingTheText) {
  for (const char* bad : {"", "abc", "12XB", "-5", "1GiBx", "nan"}) {
    try {
      (void)parse_bytes(bad, "--memory-per-rank");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--memory-per-rank"), std::string::npos) << e.what();
    }
  }
}

TEST(Units, ParsesBandwidthAndDurations) {
  EXPECT_DOUBLE_EQ(parse_bandwidth("1GB/s"), 1e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("25GiB/s"), 25.0 * 1073741824.0);
  EXPECT_DOUBLE_EQ(parse_seconds("20us"), 20e-6);
  EXPECT_DOUBLE_EQ(parse_seconds("300"), 300.0);
  EXPECT_DOUBLE_EQ(parse_seconds("1.5s"), 1.5);
  EXPECT_THROW((void)parse_bandwidth("0"), InvalidArgument);
  EXPECT_THROW((void)parse_seconds("5 parsecs"), InvalidArgument);
}

TEST(Units, BoundedParsesNameTheRangeInHumanUnits) {
  EXPECT_DOUBLE_EQ(parse_seconds("20us", "--link-latency", 0, 1), 20e-6);
  EXPECT_DOUBLE_EQ(parse_bandwidth("1GB/s", "--disk-bandwidth", 1e3, 1e13), 1e9);
  try {
    (void)parse_seconds("1e6", "--link-latency", 0, 1);
    ADD_FAILURE() << "accepted 1e6 s";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "--link-latency 1e6 is out of range; use 0 s to 1 s");
  }
  try {
    (void)parse_bandwidth("1e20", "--disk-bandwidth", 1e3, 1e13);
    ADD_FAILURE() << "accepted 1e20 B/s";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "--disk-bandwidth 1e20 is out of range; use 1 KB/s to 10 TB/s");
  }
  EXPECT_EQ(format_seconds(300), "5 min");
  EXPECT_EQ(format_seconds(2e-5), "20 us");
}

TEST(Units, FormatsBytesInBinaryUnits) {
  EXPECT_EQ(format_bytes(17), "17 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(3.0 * (1 << 30)), "3.00 GiB");
}

}  // namespace
}  // namespace zerodp
