#include "data/corpus.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"

namespace zerodp::corpus {

namespace {

using Json = nlohmann::json;

constexpr size_t kReadBytes = size_t{1} << 20;

Format format_of(const fs::path& path) {
  return path.filename().string().ends_with(".jsonl") ? Format::kJsonl : Format::kText;
}

bool hidden(const fs::path& path) {
  const std::string name = path.filename().string();
  return !name.empty() && name.front() == '.';
}

// The regular files below `dir`, sorted by their path relative to it, byte by byte.
void add_directory(const fs::path& dir, std::string_view what, std::vector<InputFile>& out) {
  std::vector<std::pair<std::string, fs::path>> found;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec);
  const fs::recursive_directory_iterator end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::path& path = it->path();
    if (hidden(path)) {
      if (it->is_directory(ec) && !it->is_symlink(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_directory(ec)) {
      if (it->is_symlink(ec)) {
        throw InvalidArgument(fmt::format(
            "{} '{}': '{}' is a link to a directory, which is not followed; name the directory "
            "itself as an input",
            what, dir.string(), path.string()));
      }
      continue;
    }
    found.emplace_back(path.lexically_relative(dir).string(), path);
  }
  if (ec) {
    throw IoError(
        fmt::format("{} '{}': cannot list the directory: {}", what, dir.string(), ec.message()));
  }
  if (found.empty()) {
    throw InvalidArgument(fmt::format(
        "{} '{}' is a directory without files to read (names starting with '.' are skipped)", what,
        dir.string()));
  }
  std::sort(found.begin(), found.end());
  for (const auto& [rel, path] : found) {
    out.push_back({path, format_of(path), files::require_regular_input(what, path)});
  }
}

// One more event of a JSONL line's parse; only the top level's `field` is kept.
class FieldSax {
 public:
  explicit FieldSax(const std::string& field) : field_(field) {}

  bool null() { return value("null"); }
  bool boolean(bool) { return value("a boolean"); }
  bool number_integer(Json::number_integer_t) { return value("a number"); }
  bool number_unsigned(Json::number_unsigned_t) { return value("a number"); }
  bool number_float(Json::number_float_t, const std::string&) { return value("a number"); }
  bool binary(Json::binary_t&) { return value("binary data"); }
  bool string(std::string& s) {
    if (depth_ == 1 && matched_) {
      matched_ = false;
      found_ = "a string";
      text_ = std::move(s);
      return true;
    }
    return value("a string");
  }
  bool start_object(size_t) {
    value("an object");
    ++depth_;
    return true;
  }
  bool end_object() {
    --depth_;
    return true;
  }
  bool start_array(size_t) {
    value("an array");
    ++depth_;
    return true;
  }
  bool end_array() {
    --depth_;
    return true;
  }
  bool key(std::string& k) {
    if (depth_ == 1) matched_ = k == field_;
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    error_ = e.what();
    const size_t close = error_.find("] ");
    if (error_.starts_with("[json.exception.") && close != std::string::npos) {
      error_.erase(0, close + 2);
    }
    return false;
  }

  JsonlText result(const std::string& field) && {
    JsonlText r;
    if (!error_.empty()) {
      r.problem = LineProblem::kNotJson;
      r.detail = fmt::format("is not JSON: {}", error_);
    } else if (top_ != "an object") {
      r.problem = LineProblem::kNotObject;
      r.detail = fmt::format("is {}, not a JSON object", top_);
    } else if (found_.empty()) {
      r.problem = LineProblem::kNoField;
      r.detail = fmt::format("has no field \"{}\"", field);
    } else if (found_ != "a string") {
      r.problem = LineProblem::kNotString;
      r.detail = fmt::format("has field \"{}\" holding {}, not a string", field, found_);
    } else {
      r.text = std::move(text_);
    }
    return r;
  }

 private:
  bool value(const char* kind) {
    if (depth_ == 0) top_ = kind;
    if (depth_ == 1 && matched_) {
      matched_ = false;
      found_ = kind;
      text_.clear();
    }
    return true;
  }

  const std::string& field_;
  size_t depth_ = 0;
  bool matched_ = false;
  std::string top_;
  std::string found_;  // the kind of the field's (last) value; empty: no such field
  std::string text_;
  std::string error_;
};

}  // namespace

const char* format_name(Format format) { return format == Format::kJsonl ? "JSONL" : "text"; }

std::vector<InputFile> list_inputs(std::span<const fs::path> named, std::string_view what) {
  std::vector<InputFile> out;
  for (const fs::path& path : named) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      add_directory(path, what, out);
    } else {
      out.push_back({path, format_of(path), files::require_regular_input(what, path)});
    }
  }
  // A file read twice would be trained on twice: named twice, or also below a directory.
  std::set<std::pair<dev_t, ino_t>> seen;
  for (const InputFile& in : out) {
    struct stat st {};
    if (::stat(in.path.c_str(), &st) != 0) continue;  // refused when opened
    if (!seen.insert({st.st_dev, st.st_ino}).second) {
      throw InvalidArgument(fmt::format(
          "{} '{}' is named more than once (directly, or also below a named directory); each "
          "file is read once",
          what, in.path.string()));
    }
  }
  return out;
}

BlockReader::BlockReader(std::vector<InputFile> inputs, size_t block_bytes)
    : inputs_(std::move(inputs)), block_bytes_(block_bytes) {
  if (block_bytes_ < 1 || block_bytes_ > kMaxTextLine) {
    throw InvalidArgument(
        fmt::format("block size {} is invalid; use 1..{} bytes", block_bytes_, kMaxTextLine));
  }
}

BlockReader::~BlockReader() {
  if (fd_ >= 0) ::close(fd_);
}

bool BlockReader::fill() {
  if (eof_) return false;
  buffer_.erase(0, begin_);
  begin_ = 0;
  const size_t at = buffer_.size();
  buffer_.resize(at + kReadBytes);
  ssize_t n;
  do {
    n = ::read(fd_, buffer_.data() + at, kReadBytes);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    const int err = errno;
    buffer_.resize(at);
    throw IoError(fmt::format("input '{}': read error: {}", inputs_[input_].path.string(),
                              std::strerror(err)));
  }
  buffer_.resize(at + static_cast<size_t>(n));
  bytes_read_ += static_cast<uint64_t>(n);
  eof_ = n == 0;
  return n > 0;
}

bool BlockReader::open_next() {
  if (input_ >= inputs_.size()) return false;
  const fs::path& path = inputs_[input_].path;
  files::require_regular_input("input", path);  // it may have changed since it was listed
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    throw IoError(fmt::format("input '{}': cannot open it for reading: {}", path.string(),
                              std::strerror(errno)));
  }
  buffer_.clear();
  begin_ = 0;
  offset_ = 0;
  line_ = 1;
  eof_ = false;
  emitted_ = false;
  return true;
}

void BlockReader::start_block(Block& block) {
  block.index = blocks_++;
  block.input = input_;
  block.line = line_;
  block.offset = offset_;
}

bool BlockReader::next_text(Block& block) {
  size_t scanned = 0;  // bytes past begin_ searched for a newline
  while (true) {
    const size_t have = buffer_.size() - begin_;
    size_t cut = 0;
    if (have >= block_bytes_) {
      const size_t from = begin_ + std::max(scanned, block_bytes_ - 1);
      const size_t nl = buffer_.find('\n', from);
      const size_t limit = block_bytes_ + kMaxTextLine;
      if (nl != std::string::npos && nl - begin_ < limit) {
        cut = nl + 1 - begin_;
      } else if (have >= limit) {
        cut = limit;  // a line past the limit: cut before a byte that starts a character
        while (cut > 1 && (static_cast<unsigned char>(buffer_[begin_ + cut]) & 0xC0) == 0x80 &&
               limit - cut < 3) {
          --cut;
        }
      }
      scanned = have;
    }
    if (cut == 0) {
      if (fill()) continue;
      if (have == 0 && emitted_) return false;
      cut = have;  // the file's last block (an empty file: one empty block)
    }
    start_block(block);
    block.document = documents_ - 1;  // the file's, numbered when it was opened
    block.text.assign(buffer_, begin_, cut);
    begin_ += cut;
    offset_ += cut;
    line_ += static_cast<uint64_t>(std::count(block.text.begin(), block.text.end(), '\n'));
    emitted_ = true;
    return true;
  }
}

bool BlockReader::next_jsonl(Block& block) {
  size_t scanned = 0;
  while (true) {
    size_t nl = buffer_.find('\n', begin_ + scanned);
    if (nl == std::string::npos) {
      scanned = buffer_.size() - begin_;
      if (scanned > kMaxJsonlLine) {
        throw InvalidArgument(fmt::format(
            "input '{}': line {} is longer than {} MiB; a JSONL document must be shorter",
            inputs_[input_].path.string(), line_, kMaxJsonlLine >> 20));
      }
      if (fill()) continue;
      if (begin_ == buffer_.size()) return false;
      nl = buffer_.size();  // the last line, without a newline
    }
    const std::string_view line(buffer_.data() + begin_, nl - begin_);
    const size_t consumed = std::min(nl + 1, buffer_.size()) - begin_;
    const bool blank = line.find_first_not_of(" \t\r") == std::string_view::npos;
    if (blank) {
      ++blank_lines_;
    } else {
      start_block(block);
      block.document = documents_++;
      block.text.assign(line);
    }
    begin_ += consumed;
    offset_ += consumed;
    ++line_;
    scanned = 0;
    if (!blank) return true;
  }
}

bool BlockReader::next(Block& block) {
  while (input_ < inputs_.size()) {
    if (fd_ < 0) {
      open_next();
      if (inputs_[input_].format == Format::kText) ++documents_;  // the file's one document
    }
    const bool got = inputs_[input_].format == Format::kText ? next_text(block) : next_jsonl(block);
    if (got) return true;
    ::close(fd_);
    fd_ = -1;
    ++input_;
  }
  return false;
}

const char* problem_reason(LineProblem problem) {
  switch (problem) {
    case LineProblem::kNone:
      return "";
    case LineProblem::kNotJson:
      return "invalid_json_lines";
    case LineProblem::kNotObject:
      return "non_object_lines";
    case LineProblem::kNoField:
      return "missing_field_lines";
    case LineProblem::kNotString:
      return "non_string_field_lines";
  }
  return "";
}

JsonlText parse_jsonl_line(std::string_view line, const std::string& field) {
  FieldSax sax(field);
  try {
    Json::sax_parse(line.begin(), line.end(), &sax);
  } catch (const std::exception& e) {  // nothing expected: every error goes to parse_error
    JsonlText r;
    r.problem = LineProblem::kNotJson;
    r.detail = fmt::format("is not JSON: {}", e.what());
    return r;
  }
  return std::move(sax).result(field);
}

}  // namespace zerodp::corpus
