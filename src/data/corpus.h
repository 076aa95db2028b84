// Text corpora read for tokenizing (zerodp prepare): the files a list of paths stands for, cut
// into blocks of whole lines as they stream past, and JSONL lines' text fields.
//
// Inputs. Each named path is a regular file or a directory. A directory stands for every
// regular file below it, recursively, sorted by its path relative to the directory, byte by
// byte (what `LC_ALL=C sort` gives: "a/b.txt" < "a/c/d.txt" < "b.txt"); names starting with
// '.' (.git, .DS_Store) are skipped, files and directories alike. A file whose name ends in
// ".jsonl" is JSONL, any other is text. Named paths are read in the order given.
//
// Blocks: the units a reader hands out, each encoded on its own and placed whole in one split.
//   * text: whole lines, cut after the first newline at or past `block_bytes` into the block
//     (the last block of a file ends where the file does, with or without a newline). A line
//     longer than kMaxTextLine is cut at a character boundary (a byte that does not continue a
//     UTF-8 sequence), the only place a block ends inside a line. Every block of a file
//     belongs to one document; an empty file is one block with no text.
//   * JSONL: one line, its newline removed; each line is a document. A line of only spaces,
//     tabs and carriage returns is no document: it is skipped and counted (blank_lines).
// Blocks are numbered over all inputs from 0, in reading order.
//
// Memory: the reader holds a read buffer (1 MiB) and the block it cuts, never a whole file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zerodp::corpus {

namespace fs = std::filesystem;

enum class Format { kText, kJsonl };
// "text" / "JSONL"
const char* format_name(Format format);

struct InputFile {
  fs::path path;  // the named path, or one found below a named directory
  Format format = Format::kText;
  uint64_t bytes = 0;  // its size when listed
};

// The files `named` stands for, in reading order (see the top of this file). `what` is the
// role the user knows the paths by ("input"). Throws InvalidArgument naming the path for one
// that is missing or neither a regular file nor a directory (a FIFO, a device, also below a
// directory), and for a directory that holds no file to read.
std::vector<InputFile> list_inputs(std::span<const fs::path> named, std::string_view what);

inline constexpr size_t kMaxTextLine = size_t{16} << 20;    // 16 MiB
inline constexpr size_t kMaxJsonlLine = size_t{256} << 20;  // 256 MiB

struct Block {
  uint64_t index = 0;     // over all inputs, from 0
  size_t input = 0;       // its file: an index into the reader's inputs()
  uint64_t document = 0;  // over all inputs, from 0: a text file's blocks share one
  uint64_t line = 0;      // the line its first byte is on, from 1
  uint64_t offset = 0;    // its first byte's offset in the file
  std::string text;       // see the top of this file
};

class BlockReader {
 public:
  // Throws InvalidArgument when block_bytes is 0 or above kMaxTextLine.
  BlockReader(std::vector<InputFile> inputs, size_t block_bytes);
  ~BlockReader();
  BlockReader(const BlockReader&) = delete;
  BlockReader& operator=(const BlockReader&) = delete;

  // The next block into `block` (its text replaced); false after the last input's last block.
  // Throws IoError naming the file when it cannot be opened or read, InvalidArgument naming
  // file and line for a JSONL line longer than kMaxJsonlLine.
  bool next(Block& block);

  const std::vector<InputFile>& inputs() const { return inputs_; }
  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t blank_lines() const { return blank_lines_; }  // JSONL lines skipped as blank

 private:
  bool fill();  // reads more of the open file into buffer_; false at its end
  bool open_next();
  bool next_text(Block& block);
  bool next_jsonl(Block& block);
  void start_block(Block& block);

  std::vector<InputFile> inputs_;
  size_t block_bytes_;
  size_t input_ = 0;  // the open file, or the next to open
  int fd_ = -1;
  bool eof_ = false;
  bool emitted_ = false;  // a block of the open file was handed out
  std::string buffer_;
  size_t begin_ = 0;  // the unconsumed bytes of buffer_ start here
  uint64_t offset_ = 0;
  uint64_t line_ = 1;
  uint64_t blocks_ = 0;
  uint64_t documents_ = 0;
  uint64_t bytes_read_ = 0;
  uint64_t blank_lines_ = 0;
};

// What is wrong with a JSONL line, if anything.
enum class LineProblem { kNone, kNotJson, kNotObject, kNoField, kNotString };
// A name for the manifest's dropped counts: "invalid_json_lines", "non_object_lines",
// "missing_field_lines", "non_string_field_lines" ("" for kNone).
const char* problem_reason(LineProblem problem);

struct JsonlText {
  LineProblem problem = LineProblem::kNone;
  std::string text;    // the field's string, unescaped (valid UTF-8), when problem is kNone
  std::string detail;  // otherwise what is wrong, for a message ("is a number, 5", ...)
};

// The string `field` of the JSON object on `line` (the last, when the key repeats). Parsed
// as a stream (nothing of the line kept but the field's string); never throws for any input.
JsonlText parse_jsonl_line(std::string_view line, const std::string& field);

}  // namespace zerodp::corpus
