// Outputs never destroy what they should not: a link stays a link, a FIFO or device is
// written in place rather than replaced, an output that is an input is refused, and a
// failed write leaves the old file whole.
#include "core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "temp_dir.h"

namespace zerodp::files {
namespace {

using testing::TempDir;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void put(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

template <typename E, typename F>
std::string throws(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception of the expected type";
  return "";
}

TEST(Output, ThroughASymlinkReplacesTheTargetAndKeepsTheLink) {
  TempDir tmp;
  put(tmp.path() / "target.json", "old");
  fs::create_symlink("target.json", tmp.path() / "link.json");
  write_output("--report", tmp.path() / "link.json", "new");
  EXPECT_TRUE(fs::is_symlink(tmp.path() / "link.json"));
  EXPECT_EQ(slurp(tmp.path() / "target.json"), "new");
  // A dangling link: the new file is created where it points.
  fs::create_symlink("later.json", tmp.path() / "dangling.json");
  write_output("--report", tmp.path() / "dangling.json", "made");
  EXPECT_TRUE(fs::is_symlink(tmp.path() / "dangling.json"));
  EXPECT_EQ(slurp(tmp.path() / "later.json"), "made");
}

TEST(Output, AFifoIsWrittenInPlaceNotReplaced) {
  TempDir tmp;
  const fs::path fifo = tmp.path() / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Open for reading and writing first, so neither end blocks.
  const int fd = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(fd, 0);
  write_output("--metrics", fifo, "through");
  char buf[16] = {};
  EXPECT_EQ(::read(fd, buf, sizeof buf), 7);
  EXPECT_EQ(std::string(buf, 7), "through");
  ::close(fd);
  EXPECT_TRUE(fs::is_fifo(fifo)) << "the FIFO must not be replaced by a regular file";
}

TEST(Output, AnUncommittedOutputLeavesTheOldFileAndNoTemporary) {
  TempDir tmp;
  put(tmp.path() / "model.safetensors", "old");
  {
    Output out("--out", tmp.path() / "model.safetensors");
    put(out.write_path(), "half");
    EXPECT_NE(out.write_path(), out.target());
  }
  EXPECT_EQ(slurp(tmp.path() / "model.safetensors"), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 1);
}

TEST(Output, ADirectoryIsRefusedNamingTheFlag) {
  TempDir tmp;
  const std::string what =
      throws<InvalidArgument>([&] { write_output("--report", tmp.path(), "x"); });
  EXPECT_NE(what.find("--report '" + tmp.path().string() + "' is a directory"), std::string::npos)
      << what;
}

TEST(CheckDistinct, FindsTheSameFileByInodeLinkOrPath) {
  TempDir tmp;
  const fs::path data = tmp.path() / "data.txt";
  put(data, "text");
  fs::create_hard_link(data, tmp.path() / "hard.txt");
  fs::create_symlink("data.txt", tmp.path() / "soft.txt");
  fs::create_directories(tmp.path() / "sub");
  const std::vector<Named> inputs{{"--data", data}};
  for (const fs::path& out : {data, tmp.path() / "hard.txt", tmp.path() / "soft.txt",
                              tmp.path() / "sub" / ".." / "data.txt"}) {
    const std::vector<Named> outputs{{"--report", out}};
    const std::string what = throws<InvalidArgument>([&] { check_distinct(inputs, outputs); });
    EXPECT_NE(what.find("would overwrite --data"), std::string::npos) << out << ": " << what;
  }
  // Two outputs on one new path.
  const std::vector<Named> two{{"--report", tmp.path() / "r.json"},
                               {"--metrics", tmp.path() / "./r.json"}};
  EXPECT_NE(throws<InvalidArgument>([&] { check_distinct({}, two); }).find("are the same file"),
            std::string::npos);
  // Distinct files pass; devices may repeat.
  const std::vector<Named> fine{{"--report", tmp.path() / "r.json"},
                                {"--metrics", tmp.path() / "m.jsonl"},
                                {"--trace", "/dev/null"},
                                {"--out", "/dev/null"}};
  EXPECT_NO_THROW(check_distinct(inputs, fine));
}

TEST(CheckDistinct, AnInputDirectoryClaimsWhatIsInsideIt) {
  TempDir tmp;
  fs::create_directories(tmp.path() / "ckpt" / "step_00000002");
  const std::vector<Named> inputs{{"checkpoint", tmp.path() / "ckpt" / "step_00000002"}};
  const std::vector<Named> inside{
      {"--out", tmp.path() / "ckpt" / "step_00000002" / "rank_00000.safetensors"}};
  EXPECT_NE(
      throws<InvalidArgument>([&] { check_distinct(inputs, inside); }).find("(it lies inside it)"),
      std::string::npos);
  const std::vector<Named> beside{{"--out", tmp.path() / "ckpt" / "model.safetensors"}};
  EXPECT_NO_THROW(check_distinct(inputs, beside));
}

TEST(Probe, NamesTheFlagOfAnOutputThatCannotBeWritten) {
  TempDir tmp;
  EXPECT_NE(throws<InvalidArgument>([&] {
              probe_output("--trace", "/nonexistent/t.json");
            }).find("--trace '/nonexistent/t.json': its directory '/nonexistent' does not exist"),
            std::string::npos);
  EXPECT_NO_THROW(probe_output("--report", tmp.path() / "r.json"));
  EXPECT_FALSE(fs::exists(tmp.path() / "r.json")) << "a probe leaves nothing behind";
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 0);
  EXPECT_NO_THROW(probe_directory("--checkpoint-dir", tmp.path() / "a" / "b"));
  EXPECT_TRUE(fs::is_directory(tmp.path() / "a" / "b"));
  put(tmp.path() / "file", "x");
  EXPECT_NE(throws<Error>([&] {
              probe_directory("--checkpoint-dir", tmp.path() / "file");
            }).find("--checkpoint-dir"),
            std::string::npos);
}

TEST(RegularInput, RefusesWhatWouldBlockOrNeverEnd) {
  TempDir tmp;
  const fs::path fifo = tmp.path() / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(throws<InvalidArgument>([&] {
              (void)require_regular_input("--config", fifo);
            }).find("is a FIFO"),
            std::string::npos);
  EXPECT_NE(throws<InvalidArgument>([&] {
              (void)require_regular_input("--data", tmp.path());
            }).find("is a directory"),
            std::string::npos);
  EXPECT_NE(throws<InvalidArgument>([&] {
              (void)require_regular_input("--data", "/dev/zero");
            }).find("is a character device"),
            std::string::npos);
  put(tmp.path() / "ok.txt", "12345");
  EXPECT_EQ(require_regular_input("--data", tmp.path() / "ok.txt"), 5u);
}

}  // namespace
}  // namespace zerodp::files
