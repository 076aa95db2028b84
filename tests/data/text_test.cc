#include "data/text.h"

#include <sys/stat.h>
#include <chrono>
#include <cstdlib>

#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <unistd.h>

#include "core/error.h"
#include "core/sha256.h"
#include "temp_dir.h"

namespace zerodp {
namespace {

using testing::TempDir;

bool bible_installed() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    if (::access((std::filesystem::path(dirs.substr(start, end - start)) / "bible").c_str(),
                 X_OK) == 0) {
      return true;
    }
    start = end + 1;
  }
  return false;
}

#define SKIP_WITHOUT_BIBLE()                                                                \
  if (!bible_installed()) {                                                                 \
    GTEST_SKIP() << "the `bible` program is not on PATH; apt-get install bible-kjv to run " \
                    "this test";                                                            \
  }

template <typename E, typename Fn>
std::string expect_throw(Fn fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

TEST(Kjv, PreparedTextHasPinnedLengthAndDigest) {
  SKIP_WITHOUT_BIBLE();
  TempDir dir;
  const auto cache_dir = dir.path() / "nested" / "cache";  // created on demand
  const auto start = std::chrono::steady_clock::now();
  const KjvText kjv = load_kjv(cache_dir);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(kjv.prepared);
  EXPECT_FALSE(kjv.replaced_bad_cache);
  ASSERT_EQ(kjv.bytes.size(), 4404412u);
  EXPECT_EQ(sha256_hex(std::as_bytes(std::span(kjv.bytes))).substr(0, 16), "cd45f0c9cedab8e4");
  EXPECT_EQ(std::string(kjv.bytes.begin(), kjv.bytes.begin() + 6), "Ge1:1 ");
  EXPECT_EQ(kjv.cache_file, cache_dir / kKjvCacheName);
  EXPECT_EQ(std::filesystem::file_size(kjv.cache_file), kKjvBytes);
  // Only the cache file is left: no temporaries.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(cache_dir)) ++entries;
  EXPECT_EQ(entries, 1);
  RecordProperty("prepare_seconds", std::to_string(seconds));
}

TEST(Kjv, SecondLoadReadsVerifiedCache) {
  SKIP_WITHOUT_BIBLE();
  TempDir dir;
  const KjvText first = load_kjv(dir.path());
  // A missing program proves the second load does not run it.
  const KjvText second = load_kjv(dir.path(), "zerodp-no-such-program");
  EXPECT_FALSE(second.prepared);
  EXPECT_EQ(second.bytes, first.bytes);
}

TEST(Kjv, BadCacheIsRebuilt) {
  SKIP_WITHOUT_BIBLE();
  TempDir dir;
  std::ofstream(dir.path() / kKjvCacheName) << "not the bible";
  const KjvText kjv = load_kjv(dir.path());
  EXPECT_TRUE(kjv.prepared);
  EXPECT_TRUE(kjv.replaced_bad_cache);
  EXPECT_EQ(std::filesystem::file_size(dir.path() / kKjvCacheName), kKjvBytes);
}

TEST(Kjv, MissingProgramSaysToInstallBibleKjv) {
  TempDir dir;
  const std::string what =
      expect_throw<IoError>([&] { load_kjv(dir.path(), "zerodp-no-such-program"); });
  EXPECT_NE(what.find("zerodp-no-such-program"), std::string::npos) << what;
  EXPECT_NE(what.find("apt-get install bible-kjv"), std::string::npos) << what;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / kKjvCacheName));
}

TEST(Kjv, FailingProgramReportsExitStatus) {
  TempDir dir;
  const std::string what = expect_throw<IoError>([&] { load_kjv(dir.path(), "false"); });
  EXPECT_NE(what.find("exited with status 1"), std::string::npos) << what;
}

TEST(Kjv, WrongTextIsCorruptDataWithExpectedAndActual) {
  TempDir dir;
  // `true` exits 0 and prints nothing: the wrong text.
  const std::string what = expect_throw<CorruptData>([&] { load_kjv(dir.path(), "true"); });
  EXPECT_NE(what.find("printed 0 bytes"), std::string::npos) << what;
  EXPECT_NE(what.find("4404412"), std::string::npos) << what;
  EXPECT_NE(what.find(kKjvSha256), std::string::npos) << what;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / kKjvCacheName));
}

TEST(DefaultCacheDir, FollowsXdgThenHome) {
  const char* old_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved_xdg = old_xdg ? old_xdg : "";
  ::setenv("XDG_CACHE_HOME", "/xdg/cache", 1);
  EXPECT_EQ(default_cache_dir(), std::filesystem::path("/xdg/cache/zerodp"));
  ::setenv("XDG_CACHE_HOME", "relative/is/ignored", 1);
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') {
    EXPECT_EQ(default_cache_dir(), std::filesystem::path(home) / ".cache" / "zerodp");
  }
  if (old_xdg) {
    ::setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
  } else {
    ::unsetenv("XDG_CACHE_HOME");
  }
}

TEST(TextCorpus, ReadsAnyFile) {
  TempDir dir;
  std::ofstream(dir.path() / "t.txt") << "hello\n";
  const auto bytes = read_text_corpus(dir.path() / "t.txt");
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "hello\n");
}

TEST(TextCorpus, AMissingFileIsRefusedNamingTheFlagAndIt) {
  const std::string what =
      expect_throw<InvalidArgument>([&] { read_text_corpus("/nonexistent/corpus.txt"); });
  EXPECT_NE(what.find("--data '/nonexistent/corpus.txt'"), std::string::npos) << what;
}

// Neither is read: a FIFO would block the first read, a directory cannot be.
TEST(TextCorpus, WhatIsNotARegularFileIsRefusedBeforeReading) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir.path() / "fifo").c_str(), 0600), 0);
  for (const auto& p : {dir.path() / "fifo", dir.path()}) {
    const std::string what = expect_throw<InvalidArgument>([&] { read_text_corpus(p); });
    EXPECT_NE(what.find("give a regular file"), std::string::npos) << what;
  }
}

TEST(TextCorpus, EmptyFileIsInvalidArgument) {
  TempDir dir;
  std::ofstream(dir.path() / "empty.txt").flush();
  const std::string what =
      expect_throw<InvalidArgument>([&] { read_text_corpus(dir.path() / "empty.txt"); });
  EXPECT_NE(what.find("empty.txt"), std::string::npos) << what;
}

}  // namespace
}  // namespace zerodp
