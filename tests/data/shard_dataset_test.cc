#include "data/shard_dataset.h"

#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/random.h"
#include "temp_dir.h"

namespace zerodp {
namespace {

using shards::Shard;
using shards::ShardWriter;
using shards::TokenWidth;
using zerodp::testing::TempDir;
namespace fs = std::filesystem;

std::vector<uint32_t> tokens_below(uint64_t count, uint32_t vocab, uint64_t seed) {
  data_random::SplitMix64 rng(seed);
  std::vector<uint32_t> out(count);
  for (auto& t : out) t = static_cast<uint32_t>(rng.below(vocab));
  return out;
}

Shard write_shard(const fs::path& path, TokenWidth width, std::span<const uint32_t> tokens) {
  ShardWriter writer(path, width);
  writer.append(tokens);
  writer.finish();
  return Shard::open(path);
}

// A stream cut into shards of the given sizes, widths alternating; returns the shards.
std::vector<Shard> write_stream(const fs::path& dir, std::span<const uint32_t> stream,
                                std::initializer_list<size_t> sizes) {
  std::vector<Shard> out;
  size_t at = 0;
  int k = 0;
  for (const size_t n : sizes) {
    const TokenWidth w = k % 2 == 0 ? TokenWidth::kU16 : TokenWidth::kU32;
    out.push_back(
        write_shard(dir / ("s_train_" + std::to_string(k++) + ".bin"), w, stream.subspan(at, n)));
    at += n;
  }
  EXPECT_EQ(at, stream.size());
  return out;
}

TEST(ShardDataset, WindowsAcrossShardBoundariesAreTheConcatenatedStreams) {
  TempDir dir;
  const std::vector<uint32_t> stream = tokens_below(1000, 50257, 1);
  // Shards shorter than a window too (3 and 1 tokens), so one window spans several.
  const std::vector<Shard> shards = write_stream(dir.path(), stream, {400, 3, 1, 250, 346});
  for (const int64_t T : {1, 5, 16, 64, 999}) {
    const ShardDataset ds(shards, T, 50257, "s/train");
    ASSERT_EQ(ds.size(), (stream.size() - 1) / static_cast<uint64_t>(T)) << T;
    EXPECT_EQ(ds.tokens(), stream.size());
    std::vector<uint64_t> indices(ds.size());
    for (uint64_t i = 0; i < ds.size(); ++i) indices[i] = ds.size() - 1 - i;  // any order
    const TokenBatch batch = ds.batch(indices);
    EXPECT_EQ(batch.batch, static_cast<int64_t>(ds.size()));
    EXPECT_EQ(batch.seq_len, T);
    for (size_t b = 0; b < indices.size(); ++b) {
      for (int64_t t = 0; t < T; ++t) {
        const size_t at = indices[b] * static_cast<size_t>(T) + static_cast<size_t>(t);
        ASSERT_EQ(batch.inputs[b * static_cast<size_t>(T) + static_cast<size_t>(t)],
                  static_cast<int32_t>(stream[at]))
            << "T " << T << " sample " << indices[b] << " t " << t;
        ASSERT_EQ(batch.targets[b * static_cast<size_t>(T) + static_cast<size_t>(t)],
                  static_cast<int32_t>(stream[at + 1]));
      }
    }
  }
  EXPECT_EQ(ShardDataset(shards, 1000, 50257, "s").size(), 0u);
}

TEST(ShardDataset, ReadReturnsAnyRangeOfTheStream) {
  TempDir dir;
  const std::vector<uint32_t> stream = tokens_below(300, 60000, 2);
  const std::vector<Shard> shards = write_stream(dir.path(), stream, {100, 100, 100});
  const ShardDataset ds(shards, 8, 60000, "s");
  std::vector<int32_t> out(300);
  ds.read(0, out);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<int32_t>(stream[i]));
  std::vector<int32_t> two(2);
  ds.read(298, two);
  EXPECT_EQ(two[1], static_cast<int32_t>(stream[299]));
  EXPECT_THROW(ds.read(299, two), InvalidArgument);
  EXPECT_NO_THROW(ds.read(300, std::span<int32_t>()));
}

TEST(ShardDataset, ATokenOutsideTheVocabularyNamesShardAndOffset) {
  TempDir dir;
  std::vector<uint32_t> stream = tokens_below(200, 256, 3);
  stream[150] = 300;  // shard 1 (tokens 100..199), its offset 50
  const std::vector<Shard> shards = write_stream(dir.path(), stream, {100, 100});
  const ShardDataset ds(shards, 10, 256, "bytes/train");
  const std::vector<uint64_t> clean = {0, 5, 13, 15};  // windows [0,11) ... [150,161) not 14
  EXPECT_NO_THROW(ds.batch(std::span(clean).first(3)));
  const std::vector<uint64_t> touching = {14};  // window [140, 151)
  try {
    ds.batch(touching);
    FAIL() << "expected CorruptData";
  } catch (const CorruptData& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("bytes/train: token 300 at offset 50 of shard"), std::string::npos) << what;
    EXPECT_NE(what.find("s_train_1.bin"), std::string::npos) << what;
    EXPECT_NE(what.find("(byte 1224)"), std::string::npos) << what;  // 1024 + 50 * 4
    EXPECT_NE(what.find("vocabulary of 256"), std::string::npos) << what;
  }
  const std::vector<uint64_t> starting_there = {15};  // window [150, 161): the input side
  EXPECT_THROW(ds.batch(starting_there), CorruptData);
}

TEST(ShardDataset, IndexAndSpanErrors) {
  TempDir dir;
  const std::vector<uint32_t> stream = tokens_below(31, 100, 4);
  const ShardDataset ds(write_stream(dir.path(), stream, {31}), 10, 100, "s/validation");
  EXPECT_EQ(ds.size(), 3u);
  const std::vector<uint64_t> out_of_range = {3};
  try {
    ds.batch(out_of_range);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("s/validation: sample index 3"), std::string::npos)
        << e.what();
  }
  const std::vector<uint64_t> two = {0, 1};
  std::vector<int32_t> inputs(19), targets(20);
  EXPECT_THROW(ds.fill(two, inputs, targets), InvalidArgument);
  EXPECT_THROW(ShardDataset(ds.shards(), 0, 100, "s"), InvalidArgument);
  EXPECT_THROW(ShardDataset(ds.shards(), 4, 0, "s"), InvalidArgument);
  EXPECT_THROW(ShardDataset({}, 4, 100, "s"), InvalidArgument);
}

TEST(ShardDataset, ConcurrentReadersSeeTheSameBatches) {
  TempDir dir;
  const std::vector<uint32_t> stream = tokens_below(20000, 50257, 5);
  const ShardDataset ds(write_stream(dir.path(), stream, {7000, 6000, 7000}), 32, 50257, "s");
  std::vector<uint64_t> indices(ds.size());
  for (uint64_t i = 0; i < ds.size(); ++i) indices[i] = (i * 7919) % ds.size();
  const TokenBatch expected = ds.batch(indices);
  std::vector<TokenBatch> got(4);
  std::vector<std::thread> threads;
  for (size_t r = 0; r < got.size(); ++r) {
    threads.emplace_back([&, r] {
      ds.prefetch(indices);
      got[r] = ds.batch(indices);
    });
  }
  for (auto& t : threads) t.join();
  for (const TokenBatch& b : got) {
    EXPECT_EQ(b.inputs, expected.inputs);
    EXPECT_EQ(b.targets, expected.targets);
  }
}

TEST(ShardDataset, PrefetchAndDroppedPagesKeepTheData) {
  TempDir dir;
  const std::vector<uint32_t> stream = tokens_below(5000, 50257, 6);
  const ShardDataset ds(write_stream(dir.path(), stream, {2500, 2500}), 16, 50257, "s");
  const std::vector<uint64_t> indices = {0, 155, 156, 310, ds.size() - 1, ds.size() + 5};
  ds.prefetch(indices);  // the last index is past the end: skipped
  const TokenBatch before = ds.batch(std::span(indices).first(5));
  ds.drop_page_cache();
  const TokenBatch after = ds.batch(std::span(indices).first(5));
  EXPECT_EQ(before.inputs, after.inputs);
  EXPECT_EQ(before.targets, after.targets);
}

TEST(ShardSplits, OpensADirectoryForTheEngine) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "tiny/";
  shards::ShardSetWriter writer({.directory = dir,
                                 .prefix = "tiny",
                                 .vocab_size = 1000,
                                 .tokenizer_sha256 = "",
                                 .tokens_per_shard = 500});
  const std::vector<uint32_t> train = tokens_below(1201, 1000, 7);
  const std::vector<uint32_t> val = tokens_below(65, 900, 8);
  writer.append(shards::Split::kTrain, train);
  writer.append(shards::Split::kValidation, val);
  const shards::Manifest m = writer.finish();

  const ShardSplits splits = open_shard_splits(dir, 16, 1000);
  EXPECT_EQ(splits.train.name(), "tiny/train");
  EXPECT_EQ(splits.validation.name(), "tiny/validation");
  EXPECT_EQ(splits.train.size(), 75u);  // 1200 / 16
  EXPECT_EQ(splits.validation.size(), 4u);
  EXPECT_EQ(splits.digest, m.digest);
  EXPECT_NE(splits.description.find("75 train and 4 validation samples"), std::string::npos)
      << splits.description;
  const std::vector<uint64_t> last = {74};
  EXPECT_EQ(splits.train.batch(last).targets.back(), static_cast<int32_t>(train[1200]));

  EXPECT_THROW(open_shard_splits(dir, 65, 1000), InvalidArgument);  // 65 tokens: no window
  try {
    open_shard_splits(dir, 16, static_cast<uint64_t>(m.largest_token));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("at least {} ids", m.largest_token + 1)),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zerodp
