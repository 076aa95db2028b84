// libFuzzer target for the token-shard formats (`make fuzz`): shards::parse_header (llm.c's
// 1024-byte shard header) and shards::parse_manifest (manifest.json), data/shard_format.h.
//
// The input is a whole shard file: parse_header must throw CorruptData naming the file, or
// return a header whose width and count make exactly the input's size. An input starting
// with '{' is also a manifest candidate: parse_manifest must throw CorruptData naming the
// file, or return a manifest that keeps every rule of the format (names plain and distinct,
// sizes that match the counts, the largest token inside the vocabulary, a digest of its
// content) and that writes back to text parsing to the same manifest.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <span>
#include <string>
#include <string_view>

#include "core/error.h"
#include "data/shard_format.h"

namespace {

namespace shards = zerodp::shards;

constexpr std::string_view kWhat = "fuzz-input";

[[noreturn]] void die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "shards_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check(bool ok, const char* what, const std::string& detail = "") {
  if (!ok) die(what, detail);
}

void check_names_file(const zerodp::CorruptData& e, std::string_view prefix) {
  const std::string message = e.what();
  check(message.starts_with(std::string(prefix)), "error does not name the file", message);
}

void check_manifest(const shards::Manifest& m) {
  check(m.vocab_size >= 1 && m.vocab_size <= shards::kMaxVocabSize, "vocab size out of range");
  check(m.largest_token < m.vocab_size, "largest token outside the vocabulary");
  check(!m.train.empty() && !m.validation.empty(), "a split without shards");
  std::set<std::string> names;
  for (const auto* split : {&m.train, &m.validation}) {
    for (const shards::ShardEntry& s : *split) {
      check(shards::valid_shard_file_name(s.file), "a file name that is not plain", s.file);
      check(names.insert(s.file).second, "a file listed twice", s.file);
      check(s.tokens >= 1 && s.tokens <= shards::kMaxTokensPerShard, "token count", s.file);
      check(s.bytes == shards::kHeaderBytes + s.tokens * shards::width_bytes(s.width),
            "bytes disagree with the count", s.file);
      check(s.crc32c.size() == 8, "crc32c is not 8 digits", s.file);
    }
  }
  check(m.digest == shards::manifest_digest(m), "digest does not match the content");
  const shards::Manifest again = shards::parse_manifest(shards::manifest_json(m), "rewritten");
  check(again == m, "manifest does not round-trip through its text");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span file(reinterpret_cast<const std::byte*>(data), size);
  try {
    const shards::ShardHeader h =
        shards::parse_header(file.first(std::min<size_t>(size, shards::kHeaderBytes)), size, kWhat);
    check(h.file_bytes() == size, "header accepted for a file of another size");
    check(h.tokens >= 1 && h.tokens <= shards::kMaxTokensPerShard, "token count out of range");
  } catch (const zerodp::CorruptData& e) {
    check_names_file(e, std::string("shard ") + std::string(kWhat) + ": ");
  }
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string_view split = shards::llmc_split_of(text);
  check(split.empty() || split == "train" || split == "validation" || split == "both",
        "llmc_split_of returned something else");
  if (size > 0 && data[0] == '{') {
    try {
      check_manifest(shards::parse_manifest(text, kWhat));
    } catch (const zerodp::CorruptData& e) {
      check_names_file(e, std::string(kWhat) + ": ");
    }
  }
  return 0;
}
