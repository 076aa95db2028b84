#include "data/shards.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/crc32c.h"
#include "core/error.h"
#include "data/random.h"
#include "data/shard_format.h"
#include "temp_dir.h"

namespace zerodp::shards {
namespace {

using zerodp::testing::file_bytes;
using zerodp::testing::TempDir;

std::vector<uint32_t> tokens_below(uint64_t count, uint32_t vocab, uint64_t seed) {
  data_random::SplitMix64 rng(seed);
  std::vector<uint32_t> out(count);
  for (auto& t : out) t = static_cast<uint32_t>(rng.below(vocab));
  return out;
}

ShardEntry write_shard(const fs::path& path, TokenWidth width, std::span<const uint32_t> tokens) {
  ShardWriter writer(path, width);
  writer.append(tokens);
  return writer.finish();
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

int32_t header_int(const std::string& bytes, size_t i) {
  int32_t v;
  std::memcpy(&v, bytes.data() + 4 * i, 4);
  return v;
}

void set_header_int(std::string& bytes, size_t i, int32_t v) { std::memcpy(&bytes[4 * i], &v, 4); }

// Runs `f`, expecting an exception of type E whose message holds every one of `parts`.
template <typename E, typename F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected an exception";
  } catch (const E& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "missing \"" << part << "\" in: " << e.what();
    }
  }
}

TEST(ShardFormat, WidthFollowsTheVocabulary) {
  EXPECT_EQ(width_for_vocab(256), TokenWidth::kU16);
  EXPECT_EQ(width_for_vocab(50257), TokenWidth::kU16);
  EXPECT_EQ(width_for_vocab(65536), TokenWidth::kU16);
  EXPECT_EQ(width_for_vocab(65537), TokenWidth::kU32);
  EXPECT_EQ(width_for_vocab(128256), TokenWidth::kU32);
  EXPECT_THROW(width_for_vocab(0), InvalidArgument);
  EXPECT_THROW(width_for_vocab(kMaxVocabSize + 1), InvalidArgument);
}

TEST(ShardFormat, HeaderRoundTripsBothLlmcVariants) {
  for (const TokenWidth w : {TokenWidth::kU16, TokenWidth::kU32}) {
    const auto header = make_header(w, 12345);
    const ShardHeader h = parse_header(header, kHeaderBytes + 12345 * width_bytes(w), "x");
    EXPECT_EQ(h.width, w);
    EXPECT_EQ(h.tokens, 12345u);
  }
  EXPECT_THROW(make_header(TokenWidth::kU16, 0), InvalidArgument);
  EXPECT_THROW(make_header(TokenWidth::kU16, kMaxTokensPerShard + 1), InvalidArgument);
}

TEST(ShardFormat, Crc32cCombineEqualsTheWholeCrc) {
  const std::vector<uint32_t> words = tokens_below(4000, 0xFFFFFFFFu, 7);
  const auto* bytes = reinterpret_cast<const std::byte*>(words.data());
  const size_t total = words.size() * 4;
  const uint32_t whole = crc32c(std::span(bytes, total));
  for (const size_t cut : {size_t{0}, size_t{1}, size_t{1024}, size_t{4097}, total - 3, total}) {
    const uint32_t a = crc32c(std::span(bytes, cut));
    const uint32_t b = crc32c(std::span(bytes + cut, total - cut));
    EXPECT_EQ(format_detail::crc32c_combine(a, b, total - cut), whole) << "cut " << cut;
  }
}

TEST(ShardFormat, LlmcNames) {
  EXPECT_EQ(llmc_split_of("fineweb_train_000001.bin"), "train");
  EXPECT_EQ(llmc_split_of("edu_fineweb_val_000000.bin"), "validation");
  EXPECT_EQ(llmc_split_of("tiny_shakespeare_train.bin"), "train");
  EXPECT_EQ(llmc_split_of("tiny_shakespeare_val.bin"), "validation");
  EXPECT_EQ(llmc_split_of("train_000.bin"), "train");
  EXPECT_EQ(llmc_split_of("fineweb_training_000001.bin"), "");
  EXPECT_EQ(llmc_split_of("fineweb_train_000001.bin.tmp"), "");
  EXPECT_EQ(llmc_split_of(".fineweb_train_000001.bin.tmp.12.0"), "");
  EXPECT_EQ(llmc_split_of("manifest.json"), "");
  EXPECT_EQ(llmc_split_of("x_train_val.bin"), "both");
}

TEST(ShardWriter, WritesLlmcsLayoutAndReadsBack) {
  TempDir dir;
  // 700,001 uint16 tokens: 1.4 MB, more than the writer's 1 MiB buffer.
  const std::vector<uint32_t> tokens = tokens_below(700001, 50257, 1);
  const fs::path path = dir.path() / "a_train_000000.bin";
  ShardWriter writer(path, TokenWidth::kU16);
  writer.append(std::span(tokens).first(3));
  writer.append(std::span(tokens).subspan(3));
  EXPECT_FALSE(fs::exists(path));  // not before finish
  const ShardEntry entry = writer.finish();
  const std::string bytes = file_bytes(path);
  ASSERT_EQ(bytes.size(), 1024 + 2 * tokens.size());
  EXPECT_EQ(header_int(bytes, 0), 20240520);
  EXPECT_EQ(header_int(bytes, 1), 1);
  EXPECT_EQ(header_int(bytes, 2), 700001);
  for (size_t i = 3; i < 256; ++i) ASSERT_EQ(header_int(bytes, i), 0) << i;
  EXPECT_EQ(entry.file, "a_train_000000.bin");
  EXPECT_EQ(entry.tokens, tokens.size());
  EXPECT_EQ(entry.bytes, bytes.size());
  EXPECT_EQ(entry.crc32c, crc32c_file_hex(path));

  const Shard shard = Shard::open(path);
  EXPECT_EQ(shard.width(), TokenWidth::kU16);
  ASSERT_EQ(shard.tokens(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(shard.token(i), tokens[i]) << i;
  EXPECT_THROW(shard.token(tokens.size()), InvalidArgument);
}

TEST(ShardWriter, Uint32ShardsUseLlama3sHeader) {
  TempDir dir;
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 128255, 7};
  const fs::path path = dir.path() / "b.bin";
  const ShardEntry entry = write_shard(path, TokenWidth::kU32, tokens);
  const std::string bytes = file_bytes(path);
  EXPECT_EQ(header_int(bytes, 0), 20240801);
  EXPECT_EQ(header_int(bytes, 1), 7);
  EXPECT_EQ(header_int(bytes, 2), 5);
  EXPECT_EQ(entry.crc32c, crc32c_file_hex(path));
  const Shard shard = Shard::open(path);
  EXPECT_EQ(shard.width(), TokenWidth::kU32);
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(shard.token(i), tokens[i]);
}

TEST(ShardWriter, RefusesWhatItCannotWrite) {
  TempDir dir;
  {
    ShardWriter writer(dir.path() / "c.bin", TokenWidth::kU16);
    const std::vector<uint32_t> tokens = {1, 2, 70000};
    expect_error<InvalidArgument>([&] { writer.append(tokens); }, {"70000", "(at 2)", "uint32"});
    expect_error<InvalidArgument>([&] { writer.finish(); }, {"c.bin", "no tokens"});
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));  // unfinished: nothing left behind
  EXPECT_THROW((ShardWriter{dir.path(), TokenWidth::kU16}), InvalidArgument);  // a directory
}

// A valid shard's bytes, for the corruption tests.
std::string valid_shard(const fs::path& dir) {
  const std::vector<uint32_t> tokens = tokens_below(100, 1000, 3);
  write_shard(dir / "good.bin", TokenWidth::kU16, tokens);
  return file_bytes(dir / "good.bin");
}

TEST(Shard, CorruptHeadersAreRefusedNamingTheFile) {
  TempDir dir;
  const std::string good = valid_shard(dir.path());
  const fs::path path = dir.path() / "bad_train_000000.bin";
  const auto refused = [&](const std::string& bytes, std::initializer_list<std::string> parts) {
    write_bytes(path, bytes);
    expect_error<CorruptData>([&] { Shard::open(path); }, parts);
  };
  std::string bytes = good;
  set_header_int(bytes, 0, 20240521);
  refused(bytes, {path.string(), "magic 20240521", "20240520", "20240801"});
  bytes = good;
  set_header_int(bytes, 1, 7);
  refused(bytes, {path.string(), "version 7", "expected version 1"});
  bytes = good;
  set_header_int(bytes, 0, 20240801);  // uint32's magic with uint16's version
  refused(bytes, {path.string(), "version 1", "expected version 7"});
  bytes = good;
  set_header_int(bytes, 2, 101);
  refused(bytes, {path.string(), "101 uint16 tokens", "1226 bytes", "1224 bytes", "cut off"});
  bytes = good;
  set_header_int(bytes, 2, 0);
  refused(bytes, {path.string(), "counts 0 tokens"});
  bytes = good;
  set_header_int(bytes, 2, -5);
  refused(bytes, {path.string(), "counts -5 tokens"});
  refused(good.substr(0, good.size() - 1), {path.string(), "cut off"});
  refused(good + "xx", {path.string(), "past the last token"});
  refused(good.substr(0, 1000), {path.string(), "1000 bytes", "shorter than"});
  refused("", {path.string(), "0 bytes"});
  EXPECT_NO_THROW(Shard::open(dir.path() / "good.bin"));
}

TEST(Shard, NonFilesAndMissingFilesAreRefused) {
  TempDir dir;
  EXPECT_THROW(Shard::open(dir.path()), InvalidArgument);
  EXPECT_THROW(Shard::open(dir.path() / "missing.bin"), Error);
}

TEST(Shard, PrefetchAndDropKeepTheTokens) {
  TempDir dir;
  const std::vector<uint32_t> tokens = tokens_below(50000, 50257, 4);
  write_shard(dir.path() / "p.bin", TokenWidth::kU16, tokens);
  const Shard shard = Shard::open(dir.path() / "p.bin");
  shard.will_need(0, 10);
  shard.will_need(49990, 100);  // clipped
  shard.will_need(60000, 5);    // past the end: ignored
  shard.drop_page_cache();
  for (size_t i = 0; i < tokens.size(); i += 997) EXPECT_EQ(shard.token(i), tokens[i]);
}

ShardSetOptions set_options(const fs::path& dir) {
  return ShardSetOptions{.directory = dir,
                         .prefix = "kjv",
                         .vocab_size = 50257,
                         .tokenizer_sha256 = std::string(64, 'a'),
                         .tokens_per_shard = 1000};
}

TEST(ShardSet, WriterAndManifestRoundTrip) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "set";
  const std::vector<uint32_t> train = tokens_below(2500, 50000, 5);
  const std::vector<uint32_t> val = tokens_below(300, 50257, 6);
  ShardSetWriter writer(set_options(dir));
  writer.append(Split::kTrain, std::span(train).first(999));
  writer.append(Split::kValidation, val);
  writer.append(Split::kTrain, std::span(train).subspan(999));
  writer.add_dropped("empty_documents", 2);
  writer.add_dropped("empty_documents", 1);
  EXPECT_EQ(writer.tokens(Split::kTrain), 2500u);
  const Manifest m = writer.finish();

  ASSERT_EQ(m.train.size(), 3u);  // 1000 + 1000 + 500
  EXPECT_EQ(m.train[0].file, "kjv_train_000000.bin");
  EXPECT_EQ(m.train[2].file, "kjv_train_000002.bin");
  EXPECT_EQ(m.train[2].tokens, 500u);
  ASSERT_EQ(m.validation.size(), 1u);
  EXPECT_EQ(m.validation[0].file, "kjv_val_000000.bin");
  EXPECT_EQ(m.dropped.at("empty_documents"), 3u);
  EXPECT_EQ(m.vocab_size, 50257u);
  uint32_t largest = 0;
  for (uint32_t t : train) largest = std::max(largest, t);
  for (uint32_t t : val) largest = std::max(largest, t);
  EXPECT_EQ(m.largest_token, largest);
  EXPECT_EQ(m.digest, manifest_digest(m));
  for (const ShardEntry& e : m.train) EXPECT_EQ(e.crc32c, crc32c_file_hex(dir / e.file));

  const std::string text = file_bytes(dir / "manifest.json");
  EXPECT_EQ(parse_manifest(text, "m"), m);
  EXPECT_EQ(text, manifest_json(m));

  const ShardSet set = open_shard_directory(dir);
  ASSERT_TRUE(set.manifest.has_value());
  EXPECT_EQ(*set.manifest, m);
  EXPECT_EQ(set.digest, m.digest);
  EXPECT_EQ(set.train.size(), 3u);
  EXPECT_EQ(set.train_tokens(), 2500u);
  EXPECT_EQ(set.validation_tokens(), 300u);
  EXPECT_EQ(set.train[1].token(0), train[1000]);
  EXPECT_NE(set.description().find("3 train shards, 2500 tokens"), std::string::npos)
      << set.description();
  EXPECT_TRUE(is_shard_directory(dir));
  EXPECT_NO_THROW(verify_checksums(set));

  // A token changed in place: sizes and headers still agree, the CRC does not.
  std::string bytes = file_bytes(dir / m.train[1].file);
  bytes[1034] = static_cast<char>(bytes[1034] ^ 1);
  write_bytes(dir / m.train[1].file, bytes);
  const ShardSet changed = open_shard_directory(dir);
  expect_error<CorruptData>([&] { verify_checksums(changed); },
                            {"kjv_train_000001.bin", m.train[1].crc32c});
}

TEST(ShardSet, TheDigestIdentifiesTheData) {
  TempDir tmp;
  std::vector<std::string> digests;
  for (int variant = 0; variant < 3; ++variant) {
    const fs::path dir = tmp.path() / std::to_string(variant);
    std::vector<uint32_t> train = tokens_below(1500, 50257, 8);
    if (variant == 1) train[1234] ^= 1;
    ShardSetOptions options = set_options(dir);
    if (variant == 2) options.tokenizer_sha256 = std::string(64, 'b');
    ShardSetWriter writer(options);
    writer.append(Split::kTrain, train);
    writer.append(Split::kValidation, std::span(train).first(100));
    digests.push_back(writer.finish().digest);
  }
  EXPECT_NE(digests[0], digests[1]);
  EXPECT_NE(digests[0], digests[2]);
  EXPECT_NE(digests[1], digests[2]);
}

TEST(ShardSet, WriterRefusals) {
  TempDir tmp;
  ShardSetOptions options = set_options(tmp.path() / "x");
  options.prefix = "my_val";
  EXPECT_THROW(ShardSetWriter{options}, InvalidArgument);
  options.prefix = "a/b";
  EXPECT_THROW(ShardSetWriter{options}, InvalidArgument);
  options = set_options(tmp.path() / "x");
  options.tokens_per_shard = 0;
  EXPECT_THROW(ShardSetWriter{options}, InvalidArgument);
  options = set_options(tmp.path() / "x");
  options.vocab_size = 0;
  EXPECT_THROW(ShardSetWriter{options}, InvalidArgument);

  fs::create_directories(tmp.path() / "full");
  write_bytes(tmp.path() / "full" / "old.bin", "x");
  expect_error<InvalidArgument>([&] { ShardSetWriter{set_options(tmp.path() / "full")}; },
                                {"holds files"});

  ShardSetWriter writer(set_options(tmp.path() / "x"));
  const std::vector<uint32_t> bad = {1, 2, 50257};
  expect_error<InvalidArgument>([&] { writer.append(Split::kTrain, bad); },
                                {"token 50257 at position 2 of the train stream"});
  const std::vector<uint32_t> good = {1, 2, 3};
  writer.append(Split::kTrain, good);
  expect_error<InvalidArgument>([&] { writer.finish(); }, {"validation split has no tokens"});
}

TEST(ShardSet, AnUnfinishedSetIsRefusedAsIncomplete) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "cut";
  {
    ShardSetWriter writer(set_options(dir));
    const std::vector<uint32_t> tokens = tokens_below(2500, 50257, 13);
    writer.append(Split::kValidation, std::span(tokens).first(100));
    writer.append(Split::kTrain, tokens);  // two llm.c-named shards finished, one open
  }
  EXPECT_TRUE(fs::exists(dir / "kjv_train_000001.bin"));
  EXPECT_TRUE(is_shard_directory(dir));
  expect_error<CorruptData>([&] { open_shard_directory(dir); },
                            {"manifest.json", "incomplete", "write the set again"});
}

// A set's manifest text, to edit.
std::string manifest_text(const fs::path& dir) {
  ShardSetWriter writer(set_options(dir));
  const std::vector<uint32_t> tokens = tokens_below(1200, 50257, 9);
  writer.append(Split::kTrain, tokens);
  writer.append(Split::kValidation, std::span(tokens).first(50));
  writer.finish();
  return file_bytes(dir / "manifest.json");
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(ShardSet, ManifestRulesAreChecked) {
  TempDir tmp;
  const std::string text = manifest_text(tmp.path() / "m");
  const auto refused = [](const std::string& t, std::initializer_list<std::string> parts) {
    expect_error<CorruptData>([&] { parse_manifest(t, "DIR/manifest.json"); }, parts);
  };
  refused("{", {"DIR/manifest.json", "not JSON"});
  refused("[]", {"DIR/manifest.json", "expected a JSON object"});
  refused(replaced(text, "zerodp-token-shards-1", "zerodp-token-shards-9"),
          {"\"format\"", "zerodp-token-shards-9"});
  // Any edit is caught by the digest, even one the other rules allow.
  refused(replaced(text, "\"sha256\": \"aaaa", "\"sha256\": \"baaa"), {"\"digest\"", "edited"});
  refused(replaced(text, "\"tokens\": 1000", "\"tokens\": 1001"),
          {"\"train.shards[0].bytes\" is 3024", "1001 tokens"});
  refused(replaced(text, "\"format\"", "\"extra\": 1, \"format\""), {"\"extra\"", "not a field"});
  refused(replaced(text, "kjv_val_000000.bin", "kjv_train_000000.bin"), {"again"});
  refused(replaced(text, "kjv_val_000000.bin", "../x.bin"), {"plain file name"});
  refused(replaced(text, "\"token_bytes\": 2", "\"token_bytes\": 3"), {"expected 2 or 4"});
  refused(replaced(text, "\"vocab_size\": 50257", "\"vocab_size\": -1"), {"non-negative"});
}

TEST(ShardSet, ManifestTextWithoutDroppedInputsParses) {
  TempDir tmp;
  const std::string text = manifest_text(tmp.path() / "m");
  const Manifest m = parse_manifest(text, "m");
  EXPECT_TRUE(m.dropped.empty());
  EXPECT_EQ(m.validation.at(0).tokens, 50u);
}

TEST(ShardSet, TextBytesAreRecordedForBothSplitsOrNeither) {
  TempDir tmp;
  const std::string plain = manifest_text(tmp.path() / "plain");
  EXPECT_EQ(plain.find("text_bytes"), std::string::npos) << plain;
  const Manifest p = parse_manifest(plain, "m");
  EXPECT_FALSE(p.train_text_bytes.has_value());
  EXPECT_FALSE(p.validation_text_bytes.has_value());

  const fs::path dir = tmp.path() / "text";
  ShardSetWriter writer(set_options(dir));
  const std::vector<uint32_t> tokens = tokens_below(1200, 50257, 9);
  writer.append(Split::kTrain, tokens);
  writer.append(Split::kValidation, std::span(tokens).first(50));
  writer.add_text_bytes(Split::kTrain, 3000);
  writer.add_text_bytes(Split::kTrain, 1234);
  const Manifest m = writer.finish();
  EXPECT_EQ(m.train_text_bytes, 4234u);
  EXPECT_EQ(m.validation_text_bytes, 0u);  // known to be none, not unknown
  const std::string text = file_bytes(dir / "manifest.json");
  EXPECT_NE(text.find("\"text_bytes\": 4234"), std::string::npos) << text;
  EXPECT_EQ(parse_manifest(text, "m"), m);
  EXPECT_EQ(open_shard_directory(dir).manifest, m);
  // The same tokens without their text: another digest, the one sets always had.
  EXPECT_NE(m.digest, p.digest);
  Manifest without = m;
  without.train_text_bytes.reset();
  without.validation_text_bytes.reset();
  EXPECT_EQ(manifest_digest(without), p.digest);

  const auto refused = [](const std::string& t, std::initializer_list<std::string> parts) {
    expect_error<CorruptData>([&] { parse_manifest(t, "DIR/manifest.json"); }, parts);
  };
  refused(replaced(text, "\"text_bytes\": 4234", "\"text_bytes\": 4235"), {"\"digest\"", "edited"});
  refused(replaced(text, "\"text_bytes\": 4234", "\"text_bytes\": -1"),
          {"\"train.text_bytes\"", "non-negative"});
  refused(replaced(text, "\"text_bytes\": 0", "\"text_bytes\": \"0\""),
          {"\"validation.text_bytes\"", "non-negative"});
}

TEST(ShardSet, AShardThatDisagreesWithTheManifestIsRefused) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  manifest_text(dir);
  fs::remove(dir / "kjv_train_000001.bin");
  write_shard(dir / "kjv_train_000001.bin", TokenWidth::kU16, tokens_below(150, 50257, 1));
  expect_error<CorruptData>([&] { open_shard_directory(dir); },
                            {"kjv_train_000001.bin", "150 uint16 tokens", "lists 200"});
  fs::remove(dir / "kjv_train_000001.bin");
  expect_error<CorruptData>([&] { open_shard_directory(dir); },
                            {"lists 'kjv_train_000001.bin', which is missing"});
}

TEST(ShardSet, LlmcNamedDirectoryWithoutManifest) {
  TempDir tmp;
  const fs::path dir = tmp.path();
  const std::vector<uint32_t> a = tokens_below(300, 50257, 10);
  const std::vector<uint32_t> b = tokens_below(200, 128256, 11);
  const std::vector<uint32_t> v = tokens_below(100, 50257, 12);
  // Written out of order, widths mixed, and a file that is no shard.
  write_shard(dir / "fineweb_train_000002.bin", TokenWidth::kU32, b);
  write_shard(dir / "fineweb_train_000001.bin", TokenWidth::kU16, a);
  write_bytes(dir / "README.md", "not a shard");
  EXPECT_TRUE(is_shard_directory(dir));
  expect_error<InvalidArgument>([&] { open_shard_directory(dir); },
                                {"2 training shard(s)", "no validation shard", "_val_"});
  write_shard(dir / "fineweb_val_000000.bin", TokenWidth::kU16, v);

  const ShardSet set = open_shard_directory(dir);
  EXPECT_FALSE(set.manifest.has_value());
  ASSERT_EQ(set.train.size(), 2u);
  EXPECT_EQ(set.train[0].file_name(), "fineweb_train_000001.bin");
  EXPECT_EQ(set.train[1].file_name(), "fineweb_train_000002.bin");
  EXPECT_EQ(set.train[1].width(), TokenWidth::kU32);
  EXPECT_EQ(set.train[1].token(5), b[5]);
  EXPECT_EQ(set.validation_tokens(), 100u);
  EXPECT_EQ(set.digest.size(), 64u);
  EXPECT_EQ(open_shard_directory(dir).digest, set.digest);
  EXPECT_THROW(verify_checksums(set), InvalidArgument);

  write_shard(dir / "odd_train_val.bin", TokenWidth::kU16, v);
  expect_error<InvalidArgument>([&] { open_shard_directory(dir); }, {"odd_train_val.bin"});
}

TEST(ShardSet, EmptyOrNoDirectoryIsRefused) {
  TempDir tmp;
  EXPECT_FALSE(is_shard_directory(tmp.path()));
  expect_error<InvalidArgument>([&] { open_shard_directory(tmp.path()); },
                                {"no manifest.json", "*_train_*.bin"});
  EXPECT_THROW(open_shard_directory(tmp.path() / "missing"), InvalidArgument);
  write_bytes(tmp.path() / "f", "x");
  EXPECT_THROW(open_shard_directory(tmp.path() / "f"), InvalidArgument);
}

}  // namespace
}  // namespace zerodp::shards
