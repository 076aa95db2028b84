#include "data/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include <fmt/core.h>

#include "core/error.h"
#include "core/files.h"

namespace zerodp::shards {

static_assert(std::endian::native == std::endian::little,
              "shard tokens are little-endian and read in place");

namespace {

constexpr size_t kWriteBufferBytes = size_t{1} << 20;

[[noreturn]] void io_fail(std::string_view action, const fs::path& path) {
  throw IoError(
      fmt::format("token shard '{}': cannot {}: {}", path.string(), action, std::strerror(errno)));
}

void write_all(int fd, const fs::path& path, const std::byte* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) io_fail("write", path);
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void pwrite_all(int fd, const fs::path& path, const std::byte* data, size_t size, off_t at) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, data, size, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) io_fail("write the header of", path);
    data += n;
    size -= static_cast<size_t>(n);
    at += n;
  }
}

size_t pread_up_to(int fd, const fs::path& path, std::byte* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, data + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) io_fail("read", path);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

std::string quoted(const fs::path& path) { return fmt::format("'{}'", path.string()); }

std::string read_text(std::string_view what, const fs::path& path) {
  files::require_regular_input(what, path);
  std::string text;
  files::read_in_chunks(what, path, [&](std::span<const std::byte> chunk) {
    text.append(reinterpret_cast<const char*>(chunk.data()), chunk.size());
  });
  return text;
}

const char* split_word(Split split) { return split == Split::kTrain ? "train" : "val"; }

}  // namespace

// ---- Shard ----

struct Shard::Mapping {
  fs::path path;
  ShardHeader header;
  std::byte* base = nullptr;  // the whole file, PROT_READ
  size_t size = 0;
  std::vector<std::byte> held;  // an in-memory shard's header and tokens; base points here

  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base != nullptr && held.empty()) ::munmap(base, size);
  }
};

Shard Shard::open(const fs::path& path, const ShardEntry* expected) {
  files::require_regular_input("token shard", path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_fail("open for reading", path);
  auto map = std::make_shared<Mapping>();
  map->path = path;
  try {
    struct stat st {};
    if (::fstat(fd, &st) != 0) io_fail("stat", path);
    const auto file_bytes = static_cast<uint64_t>(st.st_size);
    std::array<std::byte, kHeaderBytes> head{};
    const size_t got = pread_up_to(fd, path, head.data(), head.size());
    map->header = parse_header(std::span(head.data(), got), file_bytes, quoted(path));
    if (expected != nullptr &&
        (expected->width != map->header.width || expected->tokens != map->header.tokens ||
         expected->bytes != file_bytes)) {
      throw CorruptData(fmt::format(
          "shard '{}': the file holds {} {} tokens in {} bytes, but manifest.json lists {} {} "
          "tokens in {} bytes; the file was replaced, or the manifest is another set's",
          path.string(), map->header.tokens, width_name(map->header.width), file_bytes,
          expected->tokens, width_name(expected->width), expected->bytes));
    }
    map->size = static_cast<size_t>(file_bytes);
    void* base = ::mmap(nullptr, map->size, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) io_fail("map", path);
    map->base = static_cast<std::byte*>(base);
    // Samples are read in shuffled order: no readahead past what a window needs.
    ::madvise(base, map->size, MADV_RANDOM);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);  // the mapping keeps the file
  return Shard(std::move(map));
}

Shard Shard::in_memory(std::string name, std::span<const uint32_t> tokens) {
  auto map = std::make_shared<Mapping>();
  map->path = std::move(name);
  map->header = {.width = TokenWidth::kU32, .tokens = tokens.size()};
  const auto head = make_header(TokenWidth::kU32, tokens.size());
  map->held.resize(map->header.file_bytes());
  std::memcpy(map->held.data(), head.data(), head.size());
  // Little-endian, as in a file: the static_assert above holds the host to it.
  std::memcpy(map->held.data() + kHeaderBytes, tokens.data(), tokens.size_bytes());
  map->base = map->held.data();
  map->size = map->held.size();
  return Shard(std::move(map));
}

const fs::path& Shard::path() const { return map_->path; }
std::string Shard::file_name() const { return map_->path.filename().string(); }
TokenWidth Shard::width() const { return map_->header.width; }
uint64_t Shard::tokens() const { return map_->header.tokens; }
uint64_t Shard::file_bytes() const { return map_->size; }
const std::byte* Shard::token_data() const { return map_->base + kHeaderBytes; }

uint32_t Shard::token(uint64_t index) const {
  if (index >= tokens()) {
    throw InvalidArgument(fmt::format("shard '{}': token {} is past its {} tokens",
                                      map_->path.string(), index, tokens()));
  }
  const std::byte* at = token_data() + index * width_bytes(width());
  if (width() == TokenWidth::kU16) {
    uint16_t v;
    std::memcpy(&v, at, sizeof v);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

void Shard::will_need(uint64_t first, uint64_t count) const {
  if (first >= tokens() || count == 0 || !map_->held.empty()) return;
  count = std::min(count, tokens() - first);
  const uint64_t w = width_bytes(width());
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = (kHeaderBytes + first * w) / page * page;
  const uint64_t end = kHeaderBytes + (first + count) * w;
  ::madvise(map_->base + begin, end - begin, MADV_WILLNEED);  // a hint: errors ignored
}

void Shard::drop_page_cache() const {
  if (!map_->held.empty()) return;
  ::madvise(map_->base, map_->size, MADV_DONTNEED);
  const int fd = ::open(map_->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// ---- ShardWriter ----

ShardWriter::ShardWriter(const fs::path& path, TokenWidth width)
    : out_(std::make_unique<files::Output>("token shard", path)), width_(width) {
  if (out_->in_place()) {
    throw InvalidArgument(fmt::format(
        "token shard '{}' is not a regular file; its header is patched in place at the end, "
        "so give a path in a directory",
        path.string()));
  }
  fd_ = ::open(out_->write_path().c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) io_fail("create a file beside", out_->target());
  buffer_.reserve(kWriteBufferBytes);
  buffer_.resize(kHeaderBytes);  // a placeholder: the header is written by finish()
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) ::close(fd_);  // out_ removes the temporary unless committed
}

void ShardWriter::flush() {
  write_all(fd_, out_->write_path(), buffer_.data(), buffer_.size());
  buffer_.clear();
}

void ShardWriter::append(std::span<const uint32_t> tokens) {
  if (finished_) throw InvalidArgument("token shard: append after finish");
  if (tokens.size() > kMaxTokensPerShard - tokens_) {
    throw InvalidArgument(fmt::format(
        "token shard '{}': {} + {} tokens pass llm.c's {} per shard; start another shard",
        out_->target().string(), tokens_, tokens.size(), kMaxTokensPerShard));
  }
  if (width_ == TokenWidth::kU16) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] > 0xFFFF) {
        throw InvalidArgument(fmt::format(
            "token shard '{}': token {} (at {}) does not fit uint16; write a uint32 shard",
            out_->target().string(), tokens[i], tokens_ + i));
      }
    }
  }
  const size_t w = static_cast<size_t>(width_bytes(width_));
  for (size_t done = 0; done < tokens.size();) {
    if (buffer_.size() + w > kWriteBufferBytes) flush();
    const size_t take = std::min(tokens.size() - done, (kWriteBufferBytes - buffer_.size()) / w);
    const size_t at = buffer_.size();
    buffer_.resize(at + take * w);
    std::byte* dst = buffer_.data() + at;
    for (size_t i = 0; i < take; ++i) {
      const uint32_t v = tokens[done + i];
      if (w == 2) {
        const auto v16 = static_cast<uint16_t>(v);
        std::memcpy(dst + i * 2, &v16, 2);
      } else {
        std::memcpy(dst + i * 4, &v, 4);
      }
    }
    payload_crc_.update(dst, take * w);  // the tokens only, never the header placeholder
    done += take;
  }
  tokens_ += tokens.size();
}

ShardEntry ShardWriter::finish() {
  if (finished_) throw InvalidArgument("token shard: finished twice");
  if (tokens_ == 0) {
    throw InvalidArgument(fmt::format(
        "token shard '{}': no tokens; llm.c's header counts 1 or more", out_->target().string()));
  }
  flush();
  const auto header = make_header(width_, tokens_);
  pwrite_all(fd_, out_->write_path(), header.data(), header.size(), 0);
  if (::fsync(fd_) != 0) io_fail("fsync", out_->write_path());
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) io_fail("close", out_->write_path());
  out_->commit();
  finished_ = true;
  Crc32c header_crc;
  header_crc.update(header.data(), header.size());
  const uint64_t payload_bytes = tokens_ * width_bytes(width_);
  const uint32_t crc =
      format_detail::crc32c_combine(header_crc.value(), payload_crc_.value(), payload_bytes);
  return ShardEntry{.file = out_->target().filename().string(),
                    .width = width_,
                    .tokens = tokens_,
                    .bytes = kHeaderBytes + payload_bytes,
                    .crc32c = fmt::format("{:08x}", crc)};
}

// ---- ShardSetWriter ----

struct ShardSetWriter::Stream {
  Split split = Split::kTrain;
  std::unique_ptr<ShardWriter> writer;
  std::vector<ShardEntry> entries;
  uint64_t tokens = 0;
};

ShardSetWriter::ShardSetWriter(ShardSetOptions options)
    : options_(std::move(options)), width_(width_for_vocab(options_.vocab_size)) {
  if (options_.tokens_per_shard < 1 || options_.tokens_per_shard > kMaxTokensPerShard) {
    throw InvalidArgument(fmt::format("tokens per shard {} is invalid; use 1..{}",
                                      options_.tokens_per_shard, kMaxTokensPerShard));
  }
  const std::string& prefix = options_.prefix;
  if (prefix.empty() || prefix.find('/') != std::string::npos ||
      llmc_split_of(prefix + "_train_000000.bin") != "train" ||
      llmc_split_of(prefix + "_val_000000.bin") != "validation") {
    throw InvalidArgument(fmt::format(
        "shard name prefix \"{}\" is invalid; use a name without '/' and without a \"train\" "
        "or \"val\" part between underscores (e.g. \"fineweb\")",
        prefix));
  }
  const fs::path& dir = options_.directory;
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) {
      throw InvalidArgument(fmt::format(
          "shard directory '{}' is not a directory; give a new or empty directory", dir.string()));
    }
    if (!fs::is_empty(dir, ec)) {
      throw InvalidArgument(fmt::format(
          "shard directory '{}' holds files; give a new or empty directory (old shards would "
          "mix with the new set)",
          dir.string()));
    }
  } else if (!fs::create_directories(dir, ec) && ec) {
    throw IoError(
        fmt::format("shard directory '{}': cannot create it: {}", dir.string(), ec.message()));
  }
  // Until finish() replaces it: a directory left by a writer that never finished is refused.
  files::write_output("shard manifest", dir / kManifestFile, incomplete_manifest_json());
  train_ = std::make_unique<Stream>();
  validation_ = std::make_unique<Stream>();
  train_->split = Split::kTrain;
  validation_->split = Split::kValidation;
  manifest_.tokenizer_sha256 = options_.tokenizer_sha256;
  manifest_.vocab_size = options_.vocab_size;
}

ShardSetWriter::~ShardSetWriter() = default;

void ShardSetWriter::finish_shard(Stream& stream) {
  stream.entries.push_back(stream.writer->finish());
  stream.writer.reset();
}

void ShardSetWriter::append(Split split, std::span<const uint32_t> tokens) {
  if (finished_) throw InvalidArgument("shard set: append after finish");
  Stream& stream = split == Split::kTrain ? *train_ : *validation_;
  uint32_t largest = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= options_.vocab_size) {
      throw InvalidArgument(fmt::format(
          "shard set '{}': token {} at position {} of the {} stream is outside the vocabulary "
          "of {} ids",
          options_.directory.string(), tokens[i], stream.tokens + i, split_word(split),
          options_.vocab_size));
    }
    largest = std::max(largest, tokens[i]);
  }
  manifest_.largest_token = std::max<uint64_t>(manifest_.largest_token, largest);
  for (size_t done = 0; done < tokens.size();) {
    if (!stream.writer) {
      const std::string name = fmt::format("{}_{}_{:06d}.bin", options_.prefix, split_word(split),
                                           stream.entries.size());
      stream.writer = std::make_unique<ShardWriter>(options_.directory / name, width_);
    }
    const uint64_t room = options_.tokens_per_shard - stream.writer->tokens();
    const size_t take = static_cast<size_t>(std::min<uint64_t>(room, tokens.size() - done));
    stream.writer->append(tokens.subspan(done, take));
    done += take;
    stream.tokens += take;
    if (stream.writer->tokens() == options_.tokens_per_shard) finish_shard(stream);
  }
}

void ShardSetWriter::add_dropped(const std::string& reason, uint64_t count) {
  manifest_.dropped[reason] += count;
}

void ShardSetWriter::add_text_bytes(Split split, uint64_t bytes) {
  text_bytes_known_ = true;
  auto& total =
      split == Split::kTrain ? manifest_.train_text_bytes : manifest_.validation_text_bytes;
  total = total.value_or(0) + bytes;
}

uint64_t ShardSetWriter::tokens(Split split) const {
  return (split == Split::kTrain ? train_ : validation_)->tokens;
}

Manifest ShardSetWriter::finish() {
  if (finished_) throw InvalidArgument("shard set: finished twice");
  for (Stream* stream : {train_.get(), validation_.get()}) {
    if (stream->writer) finish_shard(*stream);
    if (stream->entries.empty()) {
      throw InvalidArgument(fmt::format(
          "shard set '{}': the {} split has no tokens; a set needs training and validation "
          "tokens",
          options_.directory.string(), stream->split == Split::kTrain ? "training" : "validation"));
    }
  }
  manifest_.train = train_->entries;
  manifest_.validation = validation_->entries;
  if (text_bytes_known_) {
    manifest_.train_text_bytes = manifest_.train_text_bytes.value_or(0);
    manifest_.validation_text_bytes = manifest_.validation_text_bytes.value_or(0);
  }
  manifest_.digest = manifest_digest(manifest_);
  files::write_output("shard manifest", options_.directory / kManifestFile,
                      manifest_json(manifest_));
  finished_ = true;
  return manifest_;
}

// ---- reading a directory ----

uint64_t ShardSet::train_tokens() const {
  uint64_t n = 0;
  for (const Shard& s : train) n += s.tokens();
  return n;
}

uint64_t ShardSet::validation_tokens() const {
  uint64_t n = 0;
  for (const Shard& s : validation) n += s.tokens();
  return n;
}

std::string ShardSet::description() const {
  return fmt::format(
      "{} ({}, digest {}): {} train shard{}, {} tokens; {} validation shard{}, {} "
      "tokens",
      directory.string(), manifest ? "manifest.json" : "llm.c names, no manifest",
      digest.substr(0, 12), train.size(), train.size() == 1 ? "" : "s", train_tokens(),
      validation.size(), validation.size() == 1 ? "" : "s", validation_tokens());
}

namespace {

ShardSet open_with_manifest(const fs::path& directory) {
  const fs::path path = directory / kManifestFile;
  ShardSet set;
  set.directory = directory;
  set.manifest = parse_manifest(read_text("shard manifest", path), quoted(path));
  const auto open_listed = [&](const ShardEntry& e) {
    std::error_code ec;
    if (!fs::exists(directory / e.file, ec)) {
      throw CorruptData(fmt::format(
          "shard directory '{}': manifest.json lists '{}', which is missing; the set is "
          "incomplete (copy the shard back, or write the set again)",
          directory.string(), e.file));
    }
    return Shard::open(directory / e.file, &e);
  };
  for (const ShardEntry& e : set.manifest->train) set.train.push_back(open_listed(e));
  for (const ShardEntry& e : set.manifest->validation) set.validation.push_back(open_listed(e));
  set.digest = set.manifest->digest;
  return set;
}

ShardSet open_llmc_named(const fs::path& directory) {
  std::vector<std::string> train;
  std::vector<std::string> validation;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string_view split = llmc_split_of(name);
    if (split == "both") {
      throw InvalidArgument(fmt::format(
          "shard directory '{}': '{}' is named both a training (_train_) and a validation "
          "(_val_) shard; rename it, or write a manifest.json",
          directory.string(), name));
    }
    if (split == "train") train.push_back(name);
    if (split == "validation") validation.push_back(name);
  }
  if (ec) {
    throw IoError(
        fmt::format("shard directory '{}': cannot list it: {}", directory.string(), ec.message()));
  }
  if (train.empty()) {
    throw InvalidArgument(fmt::format(
        "'{}' holds no manifest.json and no llm.c-named training shard (*_train_*.bin); give a "
        "directory zerodp's shard writer or llm.c's dev/data scripts wrote",
        directory.string()));
  }
  if (validation.empty()) {
    throw InvalidArgument(fmt::format(
        "shard directory '{}': {} training shard(s) but no validation shard (a *_val_*.bin "
        "file); add one (llm.c's scripts write NAME_val_000000.bin), or write the set with a "
        "manifest.json that lists one",
        directory.string(), train.size()));
  }
  std::sort(train.begin(), train.end());
  std::sort(validation.begin(), validation.end());
  ShardSet set;
  set.directory = directory;
  Manifest listed;  // names, widths and counts: what the digest of such a set covers
  const auto open_all = [&](const std::vector<std::string>& names, std::vector<Shard>& shards,
                            std::vector<ShardEntry>& entries) {
    for (const std::string& name : names) {
      shards.push_back(Shard::open(directory / name));
      const Shard& s = shards.back();
      entries.push_back(ShardEntry{.file = name,
                                   .width = s.width(),
                                   .tokens = s.tokens(),
                                   .bytes = s.file_bytes(),
                                   .crc32c = ""});
    }
  };
  open_all(train, set.train, listed.train);
  open_all(validation, set.validation, listed.validation);
  set.digest = manifest_digest(listed);
  return set;
}

}  // namespace

ShardSet open_shard_directory(const fs::path& directory) {
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) {
    throw InvalidArgument(fmt::format(
        "shard directory '{}' is not a directory; give the directory holding the shards",
        directory.string()));
  }
  if (fs::exists(directory / kManifestFile, ec)) return open_with_manifest(directory);
  return open_llmc_named(directory);
}

bool is_shard_directory(const fs::path& directory) {
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) return false;
  if (fs::exists(directory / kManifestFile, ec)) return true;
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    if (llmc_split_of(entry.path().filename().string()) == "train") return true;
  }
  return false;
}

void verify_checksums(const ShardSet& set) {
  if (!set.manifest) {
    throw InvalidArgument(
        fmt::format("shard directory '{}' has no manifest.json, so no checksums to verify",
                    set.directory.string()));
  }
  const std::vector<ShardEntry>* lists[] = {&set.manifest->train, &set.manifest->validation};
  for (const std::vector<ShardEntry>* list : lists) {
    for (const ShardEntry& e : *list) {
      const fs::path path = set.directory / e.file;
      const std::string crc = crc32c_file_hex(path);
      if (crc != e.crc32c) {
        throw CorruptData(fmt::format(
            "shard '{}': CRC-32C {}, but manifest.json records {}; the file changed after it was "
            "written: write the set again",
            path.string(), crc, e.crc32c));
      }
    }
  }
}

}  // namespace zerodp::shards
