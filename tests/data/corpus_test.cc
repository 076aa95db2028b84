#include "data/corpus.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "temp_dir.h"

namespace zerodp::corpus {
namespace {

using zerodp::testing::TempDir;

void write_file(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<Block> read_all(std::vector<InputFile> inputs, size_t block_bytes,
                            uint64_t* blank = nullptr) {
  BlockReader reader(std::move(inputs), block_bytes);
  std::vector<Block> blocks;
  Block b;
  while (reader.next(b)) blocks.push_back(b);
  if (blank != nullptr) *blank = reader.blank_lines();
  return blocks;
}

TEST(Corpus, DirectoriesAreReadRecursivelyInByteOrderWithoutHiddenNames) {
  TempDir tmp;
  const fs::path d = tmp.path() / "d";
  write_file(d / "b.txt", "b\n");
  write_file(d / "a.txt", "a\n");
  write_file(d / "a" / "z.jsonl", "{}\n");
  write_file(d / "A.txt", "A\n");
  write_file(d / ".hidden", "x\n");
  write_file(d / ".git" / "config", "x\n");
  write_file(tmp.path() / "first.txt", "f\n");
  const std::vector<fs::path> named = {tmp.path() / "first.txt", d};
  const std::vector<InputFile> in = list_inputs(named, "input");
  ASSERT_EQ(in.size(), 5u);
  EXPECT_EQ(in[0].path, tmp.path() / "first.txt");
  // Byte order of the relative paths: "A.txt" < "a.txt" ('.' 0x2E) < "a/z.jsonl" ('/' 0x2F).
  EXPECT_EQ(in[1].path, d / "A.txt");
  EXPECT_EQ(in[2].path, d / "a.txt");
  EXPECT_EQ(in[3].path, d / "a" / "z.jsonl");
  EXPECT_EQ(in[4].path, d / "b.txt");
  EXPECT_EQ(in[3].format, Format::kJsonl);
  EXPECT_EQ(in[2].format, Format::kText);
  EXPECT_EQ(in[2].bytes, 2u);
}

TEST(Corpus, InputsThatCannotBeReadAreRefused) {
  TempDir tmp;
  const auto refused = [](const std::vector<fs::path>& named, const std::string& part) {
    try {
      list_inputs(named, "input");
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused({tmp.path() / "missing.txt"}, "missing.txt");
  fs::create_directories(tmp.path() / "empty" / ".only-hidden");
  refused({tmp.path() / "empty"}, "without files");
  write_file(tmp.path() / "d" / "a.txt", "a\n");
  ASSERT_EQ(::mkfifo((tmp.path() / "d" / "fifo").c_str(), 0600), 0);
  refused({tmp.path() / "d"}, "a FIFO");
  refused({tmp.path() / "d" / "fifo"}, "a FIFO");
  refused({tmp.path() / "d" / "a.txt", tmp.path() / "d" / "a.txt"}, "more than once");
}

TEST(Corpus, TextBlocksAreWholeLinesAndGiveTheFileBack) {
  TempDir tmp;
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += "line " + std::to_string(i) + std::string(i % 37, 'x') + "\n";
  text += "no newline at the end";
  write_file(tmp.path() / "t.txt", text);
  write_file(tmp.path() / "empty.txt", "");
  const std::vector<fs::path> named = {tmp.path() / "t.txt", tmp.path() / "empty.txt"};
  const std::vector<Block> blocks = read_all(list_inputs(named, "input"), 100);
  ASSERT_GT(blocks.size(), 20u);
  std::string back;
  uint64_t line = 1;
  for (size_t i = 0; i + 1 < blocks.size(); ++i) {
    const Block& b = blocks[i];
    EXPECT_EQ(b.index, i);
    EXPECT_EQ(b.input, 0u);
    EXPECT_EQ(b.document, 0u);
    EXPECT_EQ(b.offset, back.size());
    EXPECT_EQ(b.line, line);
    if (i + 2 < blocks.size()) {
      EXPECT_GE(b.text.size(), 100u);
      EXPECT_EQ(b.text.back(), '\n');
      // Cut at the first line end at or past 100 bytes: the line before it ended earlier.
      EXPECT_LT(b.text.rfind('\n', b.text.size() - 2) + 1, 100u) << b.text;
    }
    back += b.text;
    line += static_cast<uint64_t>(std::count(b.text.begin(), b.text.end(), '\n'));
  }
  EXPECT_EQ(back, text);
  const Block& empty = blocks.back();  // an empty file: one empty block, its own document
  EXPECT_EQ(empty.input, 1u);
  EXPECT_EQ(empty.document, 1u);
  EXPECT_TRUE(empty.text.empty());
}

TEST(Corpus, ABlockEndsAtTheFirstLineEndThatMakesItBlockBytesLong) {
  TempDir tmp;
  write_file(tmp.path() / "t.txt", "abc\ndefgh\ni\nj\n");
  const std::vector<fs::path> named = {tmp.path() / "t.txt"};
  const std::vector<Block> blocks = read_all(list_inputs(named, "input"), 4);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].text, "abc\n");  // exactly 4 bytes
  EXPECT_EQ(blocks[1].text, "defgh\n");
  EXPECT_EQ(blocks[2].text, "i\nj\n");  // 3 bytes reach no 4: to the next line end
  EXPECT_EQ(blocks[2].line, 3u);
  EXPECT_EQ(blocks[2].offset, 10u);
}

TEST(Corpus, ALineLongerThanTheLimitIsCutAtACharacter) {
  TempDir tmp;
  std::string text = "a\n";
  while (text.size() < kMaxTextLine + 1000) text += "\xc3\xa9";  // é, two bytes
  write_file(tmp.path() / "long.txt", text);
  const std::vector<fs::path> named = {tmp.path() / "long.txt"};
  const std::vector<Block> blocks = read_all(list_inputs(named, "input"), 1);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].text, "a\n");
  EXPECT_LE(blocks[1].text.size(), kMaxTextLine + 1);
  EXPECT_GE(blocks[1].text.size(), kMaxTextLine - 2);
  EXPECT_EQ(static_cast<unsigned char>(blocks[2].text[0]), 0xC3u);  // a character's start
  EXPECT_EQ(blocks[1].text + blocks[2].text, text.substr(2));
  EXPECT_EQ(blocks[2].line, 2u);
}

TEST(Corpus, JsonlLinesAreBlocksAndDocuments) {
  TempDir tmp;
  write_file(tmp.path() / "a.jsonl", "{\"text\": \"one\"}\n\n  \r\n{\"text\": \"two\"}\r\n[1]");
  write_file(tmp.path() / "b.txt", "plain\n");
  const std::vector<fs::path> named = {tmp.path() / "a.jsonl", tmp.path() / "b.txt"};
  uint64_t blank = 0;
  const std::vector<Block> blocks = read_all(list_inputs(named, "input"), 8192, &blank);
  ASSERT_EQ(blocks.size(), 4u);
  EXPECT_EQ(blank, 2u);
  EXPECT_EQ(blocks[0].text, "{\"text\": \"one\"}");
  EXPECT_EQ(blocks[1].text, "{\"text\": \"two\"}\r");
  EXPECT_EQ(blocks[1].line, 4u);
  EXPECT_EQ(blocks[1].offset, 21u);
  EXPECT_EQ(blocks[2].text, "[1]");
  EXPECT_EQ(blocks[2].line, 5u);
  EXPECT_EQ(blocks[3].text, "plain\n");
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(blocks[i].index, i);
    EXPECT_EQ(blocks[i].document, i);
  }
}

TEST(Corpus, JsonlLineParsing) {
  const std::string field = "text";
  const auto ok = [&](const std::string& line, const std::string& want) {
    const JsonlText r = parse_jsonl_line(line, field);
    EXPECT_EQ(r.problem, LineProblem::kNone) << line << ": " << r.detail;
    EXPECT_EQ(r.text, want) << line;
  };
  ok(R"({"text": "In the beginning"})", "In the beginning");
  ok(R"({"id": 1, "meta": {"text": 5}, "text": "caf\u00e9\n\ud83d\ude00"})",
     "caf\xc3\xa9\n\xf0\x9f\x98\x80");
  ok(R"({"text": 5, "text": "last wins"})", "last wins");
  ok(R"( {"text": ""} )", "");
  const auto bad = [&](const std::string& line, LineProblem want, const std::string& part) {
    const JsonlText r = parse_jsonl_line(line, field);
    EXPECT_EQ(r.problem, want) << line;
    EXPECT_NE(r.detail.find(part), std::string::npos) << line << ": " << r.detail;
    EXPECT_NE(std::string(problem_reason(want)), "");
  };
  bad(R"({"text": "x"} trailing)", LineProblem::kNotJson, "is not JSON");
  bad(R"({"text": "x")", LineProblem::kNotJson, "is not JSON");
  bad(R"({"text": "\ud800"})", LineProblem::kNotJson, "is not JSON");
  bad(R"(["text"])", LineProblem::kNotObject, "is an array");
  bad(R"("text")", LineProblem::kNotObject, "is a string");
  bad(R"({"body": "x", "meta": {"text": "y"}})", LineProblem::kNoField, "no field \"text\"");
  bad(R"({"text": null})", LineProblem::kNotString, "holding null");
  bad(R"({"text": {"text": "x"}})", LineProblem::kNotString, "holding an object");
  bad(R"({"text": "x", "text": 5})", LineProblem::kNotString, "holding a number");
}

}  // namespace
}  // namespace zerodp::corpus
