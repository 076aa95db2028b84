// Token shards on disk: llm.c's shard header and zerodp's manifest.json, as bytes and text
// (no I/O here: data/shards.h opens, maps and writes the files; fuzz/shards_fuzz.cc feeds
// these parsers arbitrary input).
//
// Shard file (llm.c's format, read and written unchanged). A header of 256 little-endian
// int32, then the tokens, little-endian, nothing after them:
//   header[0]  magic    20240520 (GPT-2: uint16 tokens) or 20240801 (Llama-3: uint32 tokens)
//   header[1]  version  1 with 20240520, 7 with 20240801
//   header[2]  count    tokens in the file, 1 .. 2^31-1 (an int32; llm.c asserts > 0)
//   header[3..255]      0 when zerodp writes them; not read
// so the file holds exactly 1024 + count * width bytes. The pairs are karpathy/llm.c's
// dev/data/data_common.py, HEADERS_INFO ("gpt-2": magic 20240520, version 1, np.uint16;
// "llama-3": magic 20240801, version 7, np.uint32) and write_datafile (header[2] = len(toks),
// asserted < 2**31); llmc/dataloader.h checks magic, version, and the size against the count.
//
// manifest.json (zerodp's, in the shard directory, written after every shard it names: a
// directory with a valid manifest is complete). One JSON object:
//   "format":        "zerodp-token-shards-1"
//   "tokenizer":     {"sha256": "<what the writer gives: the tokenizer file's digest; may be
//                    empty>", "vocab_size": V}            1 <= V <= 2^31
//   "largest_token": the largest token id in any shard    < V
//   "dropped":       {"<reason>": count, ...}  inputs the writer skipped, as it names them
//                    (e.g. "empty_documents"); {} when none
//   "train":         {"tokens": total, "shards": [SHARD, ...]}   at least one shard
//   "validation":    {"tokens": total, "shards": [SHARD, ...]}   at least one shard
//                    Either split may also hold "text_bytes": the bytes of UTF-8 text its
//                    tokens were encoded from (separators excluded), so that a loss in nats
//                    per token converts to bits per byte: loss * tokens / (ln 2 * text_bytes).
//                    Optional: absent in sets written from tokens alone (and in older ones);
//                    a writer that knows it writes it for both splits.
//   "digest":        SHA-256 (hex) of this object without "digest", serialized compactly
//                    with keys sorted (nlohmann::json's dump(): no whitespace, integers in
//                    decimal, UTF-8): the data set's identity. It covers every other field,
//                    so any change to a token (through the shard's CRC), to the order or
//                    split of the shards, or to the tokenizer changes it. In Python:
//                    sha256(json.dumps(m, sort_keys=True, separators=(",", ":"),
//                    ensure_ascii=False).encode()) over the object m without "digest".
// No other field is accepted (a later format gets a new name), so the parsed Manifest holds
// everything the digest covers.
// SHARD = {"file": "<name in the directory>", "token_bytes": 2 | 4, "tokens": count,
//          "bytes": file size = 1024 + count * token_bytes, "crc32c": "<8 hex digits: CRC-32C
//          of the whole file, header included (core/crc32c.h)>"}
// While a writer runs, manifest.json holds {"format": ..., "incomplete": "<why>"} instead
// (incomplete_manifest_json), replaced by the real one when the last shard is in place: a
// directory a killed writer left is refused as incomplete, not read by llm.c's naming as
// the shards it happens to hold.
// Streams are the shards of a split concatenated in the listed order. A file name is a plain
// name (no '/', not "." or "..", not manifest.json) and appears once across both splits, so
// no shard is both trained on and held out.
//
// What is checked when: parse_manifest checks the JSON's shape, every rule above and the
// digest (cheap, at every open); opening a shard checks its header against the manifest's
// width, count and bytes and the file's size (data/shards.h); the CRCs are read in full only
// by shards::verify_checksums (a read of every byte, at the disk's speed: not at every open).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zerodp::shards {

inline constexpr int32_t kMagicU16 = 20240520;  // llm.c GPT-2 shards: uint16 tokens
inline constexpr int32_t kVersionU16 = 1;
inline constexpr int32_t kMagicU32 = 20240801;  // llm.c Llama-3 shards: uint32 tokens
inline constexpr int32_t kVersionU32 = 7;
inline constexpr uint64_t kHeaderInts = 256;
inline constexpr uint64_t kHeaderBytes = kHeaderInts * 4;   // 1024
inline constexpr uint64_t kMaxTokensPerShard = 2147483647;  // header[2] is an int32
// Token ids are handed to models as int32, so a vocabulary holds at most 2^31 ids.
inline constexpr uint64_t kMaxVocabSize = uint64_t{1} << 31;

inline constexpr std::string_view kManifestFile = "manifest.json";
inline constexpr std::string_view kManifestFormat = "zerodp-token-shards-1";

// Bytes per token: 2 (uint16, GPT-2's header) or 4 (uint32, Llama-3's).
enum class TokenWidth : uint8_t { kU16 = 2, kU32 = 4 };
inline uint64_t width_bytes(TokenWidth width) { return static_cast<uint64_t>(width); }
// "uint16" / "uint32"
const char* width_name(TokenWidth width);
// The narrowest width holding every id below vocab_size: uint16 up to 65536 ids.
// Throws InvalidArgument when vocab_size is 0 or above kMaxVocabSize.
TokenWidth width_for_vocab(uint64_t vocab_size);

struct ShardHeader {
  TokenWidth width = TokenWidth::kU16;
  uint64_t tokens = 0;
  uint64_t file_bytes() const { return kHeaderBytes + tokens * width_bytes(width); }
};

// The 1024 header bytes for `tokens` tokens of `width` (the rest zeros). Throws
// InvalidArgument when tokens is 0 or above kMaxTokensPerShard.
std::array<std::byte, kHeaderBytes> make_header(TokenWidth width, uint64_t tokens);

// Checks a shard's header: `head` is the file's first min(file_bytes, 1024) bytes and
// file_bytes its size. Throws CorruptData naming `what` (the shard's path) and what is
// wrong: shorter than a header, an unknown magic, a version that is not the magic's, a
// count below 1, or a size that is not 1024 + count * width (truncated or padded).
ShardHeader parse_header(std::span<const std::byte> head, uint64_t file_bytes,
                         std::string_view what);

struct ShardEntry {
  std::string file;  // a name in the shard directory
  TokenWidth width = TokenWidth::kU16;
  uint64_t tokens = 0;
  uint64_t bytes = 0;  // the file's size: 1024 + tokens * width
  std::string crc32c;  // 8 lowercase hex digits; empty only for an llm.c directory's shards
  bool operator==(const ShardEntry&) const = default;
};

struct Manifest {
  std::string tokenizer_sha256;  // as the writer gave it; may be empty
  uint64_t vocab_size = 0;
  uint64_t largest_token = 0;
  std::map<std::string, uint64_t> dropped;  // reason -> inputs skipped
  std::vector<ShardEntry> train;
  std::vector<ShardEntry> validation;
  // The text each split's tokens came from, in bytes; nullopt when the writer did not say.
  std::optional<uint64_t> train_text_bytes;
  std::optional<uint64_t> validation_text_bytes;
  std::string digest;  // set by manifest_json's caller from manifest_digest, checked on parse
  bool operator==(const Manifest&) const = default;

  uint64_t train_tokens() const;
  uint64_t validation_tokens() const;
};

// The placeholder a writer puts in manifest.json before its first shard (see above).
inline constexpr std::string_view kIncompleteField = "incomplete";
std::string incomplete_manifest_json();

// The manifest as JSON text (indented, keys sorted, "digest" = manifest_digest(manifest)
// whatever manifest.digest holds).
std::string manifest_json(const Manifest& manifest);
// SHA-256 hex of the manifest's JSON without "digest", dumped compactly (see above).
std::string manifest_digest(const Manifest& manifest);
// Parses and checks manifest.json's text. Throws CorruptData naming `what` (the file), the
// field and what is wrong, for anything outside the rules above, a digest that does not
// match the content included; for a writer's placeholder, that the set is incomplete.
Manifest parse_manifest(std::string_view text, std::string_view what);

// How llm.c names the shards of a directory without a manifest: "train" or "validation"
// for a *.bin name whose stem has a "_"-separated part "train" or "val"
// (fineweb_train_000001.bin, tiny_shakespeare_val.bin), "" for any other name, "both" for
// a name with both parts (refused by the reader as ambiguous).
std::string_view llmc_split_of(std::string_view file_name);

// Whether `name` is a plain file name a manifest may list (see above).
bool valid_shard_file_name(std::string_view name);

namespace format_detail {
// CRC-32C of A followed by B, from crc(A), crc(B) and B's length (zlib's crc32_combine over
// the Castagnoli polynomial): how a streaming writer finds the whole file's CRC after
// patching the header written first.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);
}  // namespace format_detail

}  // namespace zerodp::shards
