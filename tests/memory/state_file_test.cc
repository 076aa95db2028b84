// The offload tier's scratch file: what is written comes back, in call order, while the
// caller goes on; nothing stays on disk; a directory that cannot hold it fails at once,
// naming it; and a range past the end is refused.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "memory/state_file.h"
#include "temp_dir.h"

namespace zerodp {
namespace {

using testing::TempDir;

std::vector<std::byte> pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte{static_cast<uint8_t>(i * 31 + seed)};
  return v;
}

TEST(StateFile, ReadsBackWhatWasWrittenInCallOrder) {
  TempDir tmp;
  constexpr size_t kPiece = 100003;  // not a multiple of any block size
  StateFile f(tmp.path(), "rank0.states", 3 * kPiece);
  EXPECT_EQ(f.size(), 3 * kPiece);
  const auto a = pattern(kPiece, 1), b = pattern(kPiece, 2), c = pattern(kPiece, 3);
  // Queued without waiting: a write then a read of the same range sees the write.
  IoWork wa = f.write_async(0, a);
  IoWork wb = f.write_async(kPiece, b);
  std::vector<std::byte> first(kPiece);
  IoWork ra = f.read_async(0, first);
  IoWork wc = f.write_async(2 * kPiece, c);
  std::vector<std::byte> all(3 * kPiece);
  IoWork rall = f.read_async(0, all);
  for (IoWork* w : {&wa, &wb, &ra, &wc, &rall}) w->wait();
  EXPECT_EQ(first, a);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), all.begin()));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), all.begin() + kPiece));
  EXPECT_TRUE(std::equal(c.begin(), c.end(), all.begin() + 2 * kPiece));
  // Overwriting part of a range.
  const auto d = pattern(10, 9);
  f.write_async(kPiece - 5, d).wait();
  std::vector<std::byte> mid(10);
  f.read_async(kPiece - 5, mid).wait();
  EXPECT_EQ(mid, d);
}

// A read's continuation runs on the worker before the next queued job, so reads can share
// one bounce buffer and copy out of it; what the continuation throws is the work's error.
TEST(StateFile, AReadsContinuationRunsBeforeTheNextJob) {
  TempDir tmp;
  constexpr size_t kPiece = 4099;
  StateFile f(tmp.path(), "rank0.states", 4 * kPiece);
  std::vector<std::byte> all = pattern(4 * kPiece, 7);
  f.write_async(0, all).wait();
  std::vector<std::byte> bounce(kPiece), out(4 * kPiece);
  std::vector<IoWork> works;
  for (size_t k = 0; k < 4; ++k) {
    works.push_back(f.read_async(k * kPiece, bounce, [&, k] {
      std::copy(bounce.begin(), bounce.end(),
                out.begin() + static_cast<std::ptrdiff_t>(k * kPiece));
    }));
  }
  for (IoWork& w : works) w.wait();
  EXPECT_EQ(out, all);
  IoWork failing = f.read_async(0, bounce, [] { throw IoError("continuation failed"); });
  EXPECT_THROW(failing.wait(), IoError);
  // The worker goes on after it.
  std::vector<std::byte> again(kPiece);
  f.read_async(kPiece, again).wait();
  EXPECT_TRUE(std::equal(again.begin(), again.end(), all.begin() + kPiece));
}

TEST(StateFile, LeavesNothingOnDisk) {
  TempDir tmp;
  {
    StateFile f(tmp.path(), "rank0.states", 1 << 20);
    EXPECT_TRUE(std::filesystem::is_empty(tmp.path())) << "the open file still has a name";
    f.write_async(0, pattern(4096, 5)).wait();
  }
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path()));
}

TEST(StateFile, FailsAtTheStartWhenTheDirectoryCannotHoldIt) {
  TempDir tmp;
  try {
    StateFile f(tmp.path(), "rank0.states", uint64_t{1} << 50);  // 1 PiB
    ADD_FAILURE() << "a 1 PiB state file was created";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find((tmp.path() / "rank0.states").string()), std::string::npos) << what;
    EXPECT_NE(what.find("cannot reserve"), std::string::npos) << what;
  }
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path()));
  EXPECT_THROW(StateFile(tmp.path() / "missing", "rank0.states", 16), InvalidArgument);
}

TEST(StateFile, RefusesARangePastTheEnd) {
  TempDir tmp;
  StateFile f(tmp.path(), "rank0.states", 100);
  std::vector<std::byte> buf(10);
  EXPECT_THROW((void)f.read_async(95, buf), InvalidArgument);
  EXPECT_THROW((void)f.write_async(101, buf), InvalidArgument);
  f.read_async(90, buf).wait();  // the last 10 bytes are fine
}

}  // namespace
}  // namespace zerodp
