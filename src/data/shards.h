// Token shard files and directories: opened, mapped and checked; written as a stream.
//
// The bytes are data/shard_format.h's (llm.c's header, zerodp's manifest.json). This file
// does the I/O:
//   Shard           one shard file, checked and mapped read-only (MADV_RANDOM: samples are
//                   read in shuffled order), cheap to copy, safe to read from every thread.
//   ShardWriter     one shard file written as tokens arrive; the header's count is patched
//                   at the end, the file goes in through files::Output (a temporary beside
//                   it, fsynced, renamed), so a shard that exists under its name is whole.
//   ShardSetWriter  a directory of train and validation shards and its manifest.json,
//                   shards cut every tokens_per_shard tokens.
//   open_shard_directory  the shards a directory names (below).
//
// A directory is read in one of two ways:
//   * with manifest.json: its shards, in its order. Each shard's header is checked against
//     the manifest's width, token count and bytes, and the file's size against both, when it
//     is opened (every open: a read of 1 KiB per shard). The manifest's digest is checked
//     when it is parsed. The CRC-32Cs are read only by verify_checksums (the whole data set:
//     seconds per GB, not for every open).
//   * without one, llm.c's naming (a directory llm.c's dev/data scripts wrote): the *.bin
//     files whose name has a "_"-separated part "train" (fineweb_train_000001.bin,
//     tiny_shakespeare_train.bin) are the training shards, those with a part "val" the
//     validation shards, each sorted by name (byte order); other files are ignored, a name
//     with both parts is refused. A directory without a validation shard is refused, naming
//     the fix (llm.c's scripts always write one; zerodp does not cut one out of the training
//     stream, which would change what "the training set" of such a directory is).
//     Headers and sizes are checked at open; there is nothing else to check.
// Either way a set without a training or a validation shard is refused. Shards of both
// widths may be mixed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/crc32c.h"
#include "data/shard_format.h"

namespace zerodp::files {
class Output;
}

namespace zerodp::shards {

namespace fs = std::filesystem;

class Shard {
 public:
  // Opens `path` (files::require_regular_input), checks its header against its size
  // (parse_header) and, with `expected`, against the manifest's entry, then maps it.
  // Throws InvalidArgument for a path that is no regular file, IoError when it cannot be
  // opened or mapped, CorruptData naming the file and what is wrong.
  static Shard open(const fs::path& path, const ShardEntry* expected = nullptr);
  // A shard held in memory (text encoded as a run starts: data/source.h), the same to its
  // readers as a file's; `name` stands for its path in messages. Its page-cache hints do
  // nothing. Throws InvalidArgument for no tokens or more than kMaxTokensPerShard.
  static Shard in_memory(std::string name, std::span<const uint32_t> tokens);

  const fs::path& path() const;
  std::string file_name() const;
  TokenWidth width() const;
  uint64_t tokens() const;
  uint64_t file_bytes() const;

  // Token i (< tokens()), as stored: no vocabulary check.
  uint32_t token(uint64_t index) const;
  // The token array: tokens() little-endian values of width() bytes each.
  const std::byte* token_data() const;

  // Hints that tokens [first, first + count) will be read soon: madvise(MADV_WILLNEED) over
  // their pages, which starts reading them in. Out-of-range parts are ignored; so are errors.
  void will_need(uint64_t first, uint64_t count) const;
  // Drops the file's pages from the page cache (best effort): this mapping's pages are
  // released (MADV_DONTNEED; they are read again on the next access) and the cache told
  // (posix_fadvise DONTNEED). Pages another process maps or dirty pages stay. For cold-read
  // benchmarks; safe while other threads read (they fault the pages back in).
  void drop_page_cache() const;

 private:
  struct Mapping;
  explicit Shard(std::shared_ptr<const Mapping> mapping) : map_(std::move(mapping)) {}
  std::shared_ptr<const Mapping> map_;
};

// Writes one shard file. Tokens are buffered (1 MiB) and written at the file's end; finish()
// patches the header's count, fsyncs and renames the file into place. Destroyed before
// finish(), it leaves nothing (the temporary is removed).
class ShardWriter {
 public:
  // Throws InvalidArgument when `path` is a directory or no regular file (the header is
  // patched in place, so a device or FIFO cannot take a shard), IoError when the file
  // cannot be created.
  ShardWriter(const fs::path& path, TokenWidth width);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Throws InvalidArgument naming the token and its position when one does not fit the
  // width (>= 65536 in a uint16 shard), or when the shard would pass kMaxTokensPerShard
  // (nothing of that call is appended then). IoError when the disk refuses.
  void append(std::span<const uint32_t> tokens);
  uint64_t tokens() const { return tokens_; }
  TokenWidth width() const { return width_; }

  // The shard's manifest entry (file = the target's file name; crc32c of the whole file).
  // Throws InvalidArgument for a shard with no tokens, IoError when a write fails.
  ShardEntry finish();

 private:
  void flush();

  std::unique_ptr<files::Output> out_;
  int fd_ = -1;
  TokenWidth width_;
  uint64_t tokens_ = 0;
  std::vector<std::byte> buffer_;
  Crc32c payload_crc_;  // of the tokens written so far
  bool finished_ = false;
};

enum class Split { kTrain, kValidation };

struct ShardSetOptions {
  fs::path directory;  // created (with its parents) if missing; must be empty if present
  // File names: PREFIX_train_000000.bin, PREFIX_val_000000.bin, ... (llm.c's naming, so the
  // directory reads the same without its manifest).
  std::string prefix = "shard";
  uint64_t vocab_size = 0;       // the tokenizer's: every token is below it; decides the width
  std::string tokenizer_sha256;  // recorded as given
  uint64_t tokens_per_shard = 100'000'000;  // llm.c's fineweb.py: shard_size = 10**8
};

// Writes a shard directory: tokens appended to either split's stream, shards cut every
// tokens_per_shard tokens, manifest.json written by finish() after every shard is in place.
// Until then manifest.json is a placeholder that marks the set incomplete (shard_format.h),
// so a directory whose writer was interrupted or destroyed unfinished is refused by readers.
class ShardSetWriter {
 public:
  // Throws InvalidArgument for a vocabulary size outside 1..2^31, tokens_per_shard outside
  // 1..kMaxTokensPerShard, a prefix that is empty, holds '/' or a "train" or "val" part, or
  // a directory that holds files; IoError when it cannot be created.
  explicit ShardSetWriter(ShardSetOptions options);
  ~ShardSetWriter();

  // Throws InvalidArgument naming the token and split when one is >= vocab_size.
  void append(Split split, std::span<const uint32_t> tokens);
  // Inputs the writer skipped, counted under `reason` (added up) for the manifest.
  void add_dropped(const std::string& reason, uint64_t count);
  // Bytes of the text that `split`'s tokens were encoded from (added up). Once called for
  // either split, the manifest records "text_bytes" for both (0 for a split never given any);
  // never called, it records none (tokens written without their text).
  void add_text_bytes(Split split, uint64_t bytes);
  uint64_t tokens(Split split) const;

  // Finishes the open shards and writes manifest.json; returns it (digest set). Throws
  // InvalidArgument when a split has no tokens.
  Manifest finish();

 private:
  struct Stream;
  void finish_shard(Stream& stream);

  ShardSetOptions options_;
  TokenWidth width_;
  std::unique_ptr<Stream> train_;
  std::unique_ptr<Stream> validation_;
  Manifest manifest_;
  bool text_bytes_known_ = false;
  bool finished_ = false;
};

struct ShardSet {
  fs::path directory;
  std::optional<Manifest> manifest;  // nullopt: an llm.c directory, read by its names
  std::vector<Shard> train;
  std::vector<Shard> validation;
  // The data set's identity: the manifest's digest; for an llm.c directory, manifest_digest
  // of a manifest listing its shards without CRCs or tokenizer, so names, widths and
  // counts only (not the tokens themselves).
  std::string digest;

  uint64_t train_tokens() const;
  uint64_t validation_tokens() const;
  // One line for the log, e.g. "/d (manifest.json, digest 1a2b3c4d5e6f): 2 train shards,
  // 1000000 tokens; 1 validation shard, 10000 tokens".
  std::string description() const;
};

// Opens a shard directory as described above. Throws InvalidArgument when `directory` is no
// directory or holds no shards by either rule (naming both), IoError and CorruptData as
// Shard::open and parse_manifest do.
ShardSet open_shard_directory(const fs::path& directory);

// Whether `directory` is one open_shard_directory would try: a directory holding
// manifest.json or an llm.c-named training shard. Never throws.
bool is_shard_directory(const fs::path& directory);

// Reads every shard of a manifest's set in full and compares its CRC-32C. Throws
// CorruptData naming the first shard that differs, with both values; InvalidArgument for
// an llm.c directory (no CRCs to compare).
void verify_checksums(const ShardSet& set);

}  // namespace zerodp::shards
