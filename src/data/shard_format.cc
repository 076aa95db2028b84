#include "data/shard_format.h"

#include <cstring>
#include <initializer_list>
#include <limits>
#include <set>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/sha256.h"

namespace zerodp::shards {

namespace {

using Json = nlohmann::json;

int32_t load_le32(std::span<const std::byte> bytes, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v |= static_cast<uint32_t>(bytes[at + i]) << (8 * i);
  return static_cast<int32_t>(v);
}

void store_le32(std::span<std::byte> bytes, size_t at, int32_t value) {
  const auto v = static_cast<uint32_t>(value);
  for (size_t i = 0; i < 4; ++i) bytes[at + i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
}

const char* magic_model(int32_t magic) {
  return magic == kMagicU16 ? "GPT-2, uint16 tokens" : "Llama-3, uint32 tokens";
}

bool is_lower_hex(std::string_view s) {
  for (const char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The manifest without its digest: what manifest_digest hashes and manifest_json prints.
Json shard_json(const ShardEntry& s) {
  return Json{{"file", s.file},
              {"token_bytes", width_bytes(s.width)},
              {"tokens", s.tokens},
              {"bytes", s.bytes},
              {"crc32c", s.crc32c}};
}

// "text_bytes" only when known: a manifest without it has the digest it always had.
Json split_json(const std::vector<ShardEntry>& shards, const std::optional<uint64_t>& text_bytes) {
  Json list = Json::array();
  uint64_t tokens = 0;
  for (const ShardEntry& s : shards) {
    list.push_back(shard_json(s));
    tokens += s.tokens;
  }
  Json j{{"tokens", tokens}, {"shards", std::move(list)}};
  if (text_bytes) j["text_bytes"] = *text_bytes;
  return j;
}

Json content_json(const Manifest& m) {
  Json dropped = Json::object();
  for (const auto& [reason, count] : m.dropped) dropped[reason] = count;
  return Json{{"format", std::string(kManifestFormat)},
              {"tokenizer", {{"sha256", m.tokenizer_sha256}, {"vocab_size", m.vocab_size}}},
              {"largest_token", m.largest_token},
              {"dropped", std::move(dropped)},
              {"train", split_json(m.train, m.train_text_bytes)},
              {"validation", split_json(m.validation, m.validation_text_bytes)}};
}

std::string dump(const Json& j, int indent) {
  try {
    return j.dump(indent);
  } catch (const Json::exception& e) {  // a string that is not UTF-8
    throw InvalidArgument(fmt::format("manifest: cannot be written as JSON: {}", e.what()));
  }
}

// Field access for parse_manifest: every failure a CorruptData naming the file and field.
class Fields {
 public:
  explicit Fields(std::string_view what) : what_(what) {}

  [[noreturn]] void fail(std::string_view field, std::string_view problem) const {
    throw CorruptData(fmt::format("{}: field \"{}\" {}", what_, field, problem));
  }
  const Json& at(const Json& j, const std::string& field, std::string_view key) const {
    const auto it = j.find(key);
    if (it == j.end()) fail(join(field, key), "is missing");
    return *it;
  }
  void only(const Json& j, const std::string& field, std::initializer_list<std::string_view> keys,
            std::string_view expected) const {
    if (!j.is_object()) fail(field, fmt::format("is {}, expected {}", j.type_name(), expected));
    for (const auto& [key, value] : j.items()) {
      bool known = false;
      for (const std::string_view k : keys) known = known || key == k;
      if (!known) {
        fail(join(field, key), fmt::format("is not a field of {}; this zerodp reads \"{}\"",
                                           kManifestFormat, kManifestFormat));
      }
    }
  }
  std::string string(const Json& j, const std::string& field, std::string_view key) const {
    const Json& v = at(j, field, key);
    if (!v.is_string()) fail(join(field, key), fmt::format("is {}, expected a string", v.dump()));
    return v.get<std::string>();
  }
  uint64_t count(const Json& j, const std::string& field, std::string_view key) const {
    return count_of(at(j, field, key), join(field, key));
  }
  uint64_t count_of(const Json& v, const std::string& field) const {
    if (!v.is_number_unsigned()) {
      fail(field, fmt::format("is {}, expected a non-negative integer", v.dump()));
    }
    return v.get<uint64_t>();
  }
  static std::string join(std::string_view field, std::string_view key) {
    return field.empty() ? std::string(key) : fmt::format("{}.{}", field, key);
  }

 private:
  std::string_view what_;
};

ShardEntry parse_shard(const Fields& f, const Json& j, const std::string& field) {
  f.only(j, field, {"file", "token_bytes", "tokens", "bytes", "crc32c"}, "a shard object");
  ShardEntry s;
  s.file = f.string(j, field, "file");
  if (!valid_shard_file_name(s.file)) {
    f.fail(field + ".file", fmt::format("is \"{}\", expected a plain file name in the directory "
                                        "(no '/', not \".\", \"..\" or {})",
                                        s.file, kManifestFile));
  }
  const uint64_t width = f.count(j, field, "token_bytes");
  if (width != 2 && width != 4)
    f.fail(field + ".token_bytes", fmt::format("is {}, expected 2 or 4", width));
  s.width = static_cast<TokenWidth>(width);
  s.tokens = f.count(j, field, "tokens");
  if (s.tokens < 1 || s.tokens > kMaxTokensPerShard) {
    f.fail(field + ".tokens", fmt::format("is {}, expected 1..{}", s.tokens, kMaxTokensPerShard));
  }
  s.bytes = f.count(j, field, "bytes");
  if (s.bytes != kHeaderBytes + s.tokens * width) {
    f.fail(field + ".bytes",
           fmt::format("is {}, but {} tokens of {} bytes make a file of {}", s.bytes, s.tokens,
                       width, kHeaderBytes + s.tokens * width));
  }
  s.crc32c = f.string(j, field, "crc32c");
  if (s.crc32c.size() != 8 || !is_lower_hex(s.crc32c)) {
    f.fail(field + ".crc32c", fmt::format("is \"{}\", expected 8 lowercase hex digits", s.crc32c));
  }
  return s;
}

std::vector<ShardEntry> parse_split(const Fields& f, const Json& j, const std::string& field,
                                    std::optional<uint64_t>& text_bytes) {
  f.only(j, field, {"tokens", "shards", "text_bytes"}, "an object");
  if (j.contains("text_bytes")) text_bytes = f.count(j, field, "text_bytes");
  const uint64_t tokens = f.count(j, field, "tokens");
  const Json& list = f.at(j, field, "shards");
  if (!list.is_array() || list.empty()) {
    f.fail(field + ".shards", fmt::format("is {}, expected a list of at least one shard",
                                          list.is_array() ? "empty" : list.type_name()));
  }
  std::vector<ShardEntry> shards;
  uint64_t sum = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    shards.push_back(parse_shard(f, list[i], fmt::format("{}.shards[{}]", field, i)));
    sum += shards.back().tokens;  // < 2^31 per shard: no overflow for any parseable list
  }
  if (sum != tokens) {
    f.fail(field + ".tokens", fmt::format("is {}, but its shards hold {} tokens", tokens, sum));
  }
  return shards;
}

void check_names_distinct(const Fields& f, const Manifest& m) {
  std::set<std::string> seen;
  for (const auto* split : {&m.train, &m.validation}) {
    for (const ShardEntry& s : *split) {
      if (!seen.insert(s.file).second) {
        f.fail(split == &m.train ? "train.shards" : "validation.shards",
               fmt::format("names \"{}\" again; a shard belongs to one split, once", s.file));
      }
    }
  }
}

}  // namespace

const char* width_name(TokenWidth width) { return width == TokenWidth::kU16 ? "uint16" : "uint32"; }

TokenWidth width_for_vocab(uint64_t vocab_size) {
  if (vocab_size < 1 || vocab_size > kMaxVocabSize) {
    throw InvalidArgument(fmt::format("vocabulary size {} is invalid; use 1..{} token ids",
                                      vocab_size, kMaxVocabSize));
  }
  return vocab_size <= 65536 ? TokenWidth::kU16 : TokenWidth::kU32;
}

std::array<std::byte, kHeaderBytes> make_header(TokenWidth width, uint64_t tokens) {
  if (tokens < 1 || tokens > kMaxTokensPerShard) {
    throw InvalidArgument(
        fmt::format("a shard of {} tokens cannot be written; llm.c's header counts 1..{}", tokens,
                    kMaxTokensPerShard));
  }
  std::array<std::byte, kHeaderBytes> header{};
  const bool u16 = width == TokenWidth::kU16;
  store_le32(header, 0, u16 ? kMagicU16 : kMagicU32);
  store_le32(header, 4, u16 ? kVersionU16 : kVersionU32);
  store_le32(header, 8, static_cast<int32_t>(tokens));
  return header;
}

ShardHeader parse_header(std::span<const std::byte> head, uint64_t file_bytes,
                         std::string_view what) {
  if (file_bytes < kHeaderBytes || head.size() < kHeaderBytes) {
    throw CorruptData(fmt::format(
        "shard {}: {} bytes, shorter than llm.c's {}-byte header; not a token shard, or cut off",
        what, file_bytes, kHeaderBytes));
  }
  const int32_t magic = load_le32(head, 0);
  const int32_t version = load_le32(head, 4);
  const int32_t count = load_le32(head, 8);
  if (magic != kMagicU16 && magic != kMagicU32) {
    throw CorruptData(fmt::format(
        "shard {}: magic {} is not llm.c's {} (GPT-2, uint16 tokens) or {} (Llama-3, uint32 "
        "tokens); not a token shard",
        what, magic, kMagicU16, kMagicU32));
  }
  const int32_t want_version = magic == kMagicU16 ? kVersionU16 : kVersionU32;
  if (version != want_version) {
    throw CorruptData(fmt::format("shard {}: version {} with magic {} ({}); expected version {}",
                                  what, version, magic, magic_model(magic), want_version));
  }
  if (count < 1) {
    throw CorruptData(
        fmt::format("shard {}: the header counts {} tokens; a shard holds 1 or more", what, count));
  }
  ShardHeader h{.width = magic == kMagicU16 ? TokenWidth::kU16 : TokenWidth::kU32,
                .tokens = static_cast<uint64_t>(count)};
  if (h.file_bytes() != file_bytes) {
    throw CorruptData(fmt::format(
        "shard {}: the header counts {} {} tokens, a file of {} bytes, but it has {} bytes ({})",
        what, h.tokens, width_name(h.width), h.file_bytes(), file_bytes,
        file_bytes < h.file_bytes() ? "cut off" : "bytes past the last token"));
  }
  return h;
}

uint64_t Manifest::train_tokens() const {
  uint64_t n = 0;
  for (const ShardEntry& s : train) n += s.tokens;
  return n;
}

uint64_t Manifest::validation_tokens() const {
  uint64_t n = 0;
  for (const ShardEntry& s : validation) n += s.tokens;
  return n;
}

std::string incomplete_manifest_json() {
  return dump(Json{{"format", std::string(kManifestFormat)},
                   {std::string(kIncompleteField),
                    "the writer has not finished: shards may be missing or partly written"}},
              2) +
         "\n";
}

std::string manifest_digest(const Manifest& manifest) {
  return sha256_hex(dump(content_json(manifest), -1));
}

std::string manifest_json(const Manifest& manifest) {
  Json j = content_json(manifest);
  j["digest"] = sha256_hex(dump(j, -1));
  return dump(j, 2) + "\n";
}

Manifest parse_manifest(std::string_view text, std::string_view what) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {  // parse_error; out_of_range past 64 bits
    throw CorruptData(fmt::format("{}: not JSON: {}", what, e.what()));
  }
  const Fields f(what);
  if (j.is_object() && j.contains(kIncompleteField)) {
    throw CorruptData(fmt::format(
        "{}: the shard set is incomplete: its writer did not finish (interrupted?); remove the "
        "directory and write the set again",
        what));
  }
  f.only(j, "",
         {"format", "tokenizer", "largest_token", "dropped", "train", "validation", "digest"},
         "a JSON object");
  const std::string format = f.string(j, "", "format");
  if (format != kManifestFormat) {
    f.fail("format", fmt::format("is \"{}\"; this zerodp reads \"{}\"", format, kManifestFormat));
  }
  Manifest m;
  const Json& tokenizer = f.at(j, "", "tokenizer");
  f.only(tokenizer, "tokenizer", {"sha256", "vocab_size"}, "an object");
  m.tokenizer_sha256 = f.string(tokenizer, "tokenizer", "sha256");
  m.vocab_size = f.count(tokenizer, "tokenizer", "vocab_size");
  if (m.vocab_size < 1 || m.vocab_size > kMaxVocabSize) {
    f.fail("tokenizer.vocab_size",
           fmt::format("is {}, expected 1..{}", m.vocab_size, kMaxVocabSize));
  }
  m.largest_token = f.count(j, "", "largest_token");
  if (m.largest_token >= m.vocab_size) {
    f.fail("largest_token", fmt::format("is {}, outside the vocabulary of {} ids (0..{})",
                                        m.largest_token, m.vocab_size, m.vocab_size - 1));
  }
  const Json& dropped = f.at(j, "", "dropped");
  if (!dropped.is_object())
    f.fail("dropped", fmt::format("is {}, expected an object", dropped.type_name()));
  for (const auto& [reason, count] : dropped.items()) {
    m.dropped[reason] = f.count_of(count, Fields::join("dropped", reason));
  }
  m.train = parse_split(f, f.at(j, "", "train"), "train", m.train_text_bytes);
  m.validation = parse_split(f, f.at(j, "", "validation"), "validation", m.validation_text_bytes);
  check_names_distinct(f, m);
  m.digest = f.string(j, "", "digest");
  const std::string content_digest = manifest_digest(m);
  if (m.digest != content_digest) {
    f.fail("digest", fmt::format("is \"{}\", but the content's digest is \"{}\"; the manifest was "
                                 "edited or damaged after it was written",
                                 m.digest, content_digest));
  }
  return m;
}

std::string_view llmc_split_of(std::string_view file_name) {
  constexpr std::string_view kSuffix = ".bin";
  if (file_name.size() <= kSuffix.size() || file_name.front() == '.' ||
      !file_name.ends_with(kSuffix)) {
    return "";
  }
  std::string_view stem = file_name.substr(0, file_name.size() - kSuffix.size());
  bool train = false;
  bool val = false;
  while (true) {
    const size_t cut = stem.find('_');
    const std::string_view part = stem.substr(0, cut);
    train = train || part == "train";
    val = val || part == "val";
    if (cut == std::string_view::npos) break;
    stem.remove_prefix(cut + 1);
  }
  if (train && val) return "both";
  return train ? "train" : val ? "validation" : "";
}

bool valid_shard_file_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name != kManifestFile &&
         name.find('/') == std::string_view::npos && name.find('\0') == std::string_view::npos;
}

namespace format_detail {

namespace {

constexpr uint32_t kCastagnoliReflected = 0x82F63B78u;

// a * b modulo the polynomial, both in the reflected representation (bit 31 is x^0).
uint32_t multiply_mod(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kCastagnoliReflected : b >> 1;
  }
  return product;
}

}  // namespace

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  // x^(8 * length_b) by squaring: power = x^(2^k) with k from 3 (x^8, one byte) upward.
  uint32_t shift = 1u << 31;        // x^0
  uint32_t power = 1u << (31 - 8);  // x^8
  for (uint64_t n = length_b; n != 0; n >>= 1) {
    if (n & 1) shift = multiply_mod(power, shift);
    power = multiply_mod(power, power);
  }
  return multiply_mod(shift, crc_a) ^ crc_b;
}

}  // namespace format_detail

}  // namespace zerodp::shards
