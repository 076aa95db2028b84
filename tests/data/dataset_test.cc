#include "data/dataset.h"

#include <fstream>
#include <memory>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "data/source.h"
#include "data/synthetic.h"
#include "data/text.h"
#include "temp_dir.h"

namespace zerodp {
namespace {

std::shared_ptr<const std::vector<uint8_t>> text_of(const std::string& s) {
  return std::make_shared<const std::vector<uint8_t>>(s.begin(), s.end());
}

std::string as_string(const std::vector<int32_t>& v) { return std::string(v.begin(), v.end()); }

TEST(TokenDataset, SampleIsWindowAtIndexTimesSeqLen) {
  const TokenDataset ds(text_of("abcdefghij"), 0, 10, 3, "t");
  EXPECT_EQ(ds.size(), 3u);  // (10 - 1) / 3 windows: abcd, defg, ghij
  const std::vector<uint64_t> indices = {1, 0, 2};
  const TokenBatch batch = ds.batch(indices);
  EXPECT_EQ(batch.batch, 3);
  EXPECT_EQ(batch.seq_len, 3);
  EXPECT_EQ(as_string(batch.inputs), "defabcghi");
  EXPECT_EQ(as_string(batch.targets), "efgbcdhij");
}

TEST(TokenDataset, TailShorterThanWindowIsUnused) {
  EXPECT_EQ(TokenDataset(text_of("abcdefghijk"), 0, 11, 3, "t").size(), 3u);
  EXPECT_EQ(TokenDataset(text_of("abcd"), 0, 4, 3, "t").size(), 1u);
  EXPECT_EQ(TokenDataset(text_of("abc"), 0, 3, 3, "t").size(), 0u);
  EXPECT_EQ(TokenDataset(text_of(""), 0, 0, 3, "t").size(), 0u);
}

TEST(TokenDataset, BytesAboveAsciiAreTokensNotNegative) {
  const TokenDataset ds(text_of("\xff\x80\x01"), 0, 3, 2, "t");
  const std::vector<uint64_t> indices = {0};
  const TokenBatch batch = ds.batch(indices);
  EXPECT_EQ(batch.inputs, (std::vector<int32_t>{255, 128}));
  EXPECT_EQ(batch.targets, (std::vector<int32_t>{128, 1}));
}

TEST(TokenDataset, OutOfRangeIndexNamesIt) {
  const TokenDataset ds(text_of("abcdefghij"), 0, 10, 3, "kjv/train");
  const std::vector<uint64_t> indices = {3};
  try {
    ds.batch(indices);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("kjv/train: sample index 3"), std::string::npos)
        << e.what();
  }
}

TEST(TokenDataset, WrongOutputSizeIsRejected) {
  const TokenDataset ds(text_of("abcdefghij"), 0, 10, 3, "t");
  const std::vector<uint64_t> indices = {0, 1};
  std::vector<int32_t> inputs(5), targets(6);
  EXPECT_THROW(ds.fill(indices, inputs, targets), InvalidArgument);
}

TEST(TokenDataset, BadSeqLenOrRangeIsRejected) {
  EXPECT_THROW(TokenDataset(text_of("abc"), 0, 3, 0, "t"), InvalidArgument);
  EXPECT_THROW(TokenDataset(text_of("abc"), 2, 1, 1, "t"), InvalidArgument);
  EXPECT_THROW(TokenDataset(text_of("abc"), 0, 4, 1, "t"), InvalidArgument);
}

TEST(SplitText, ValidationIsTheTailAndWindowsNeverShareBytes) {
  std::string s(1000, '\0');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i % 251);
  const auto text = text_of(s);
  const TokenSplits splits = split_text(text, 7, 0.05, "t");
  EXPECT_EQ(splits.validation.end_byte(), 1000u);
  EXPECT_EQ(splits.validation.begin_byte(), 950u);  // floor(1000 * 0.05) = 50 bytes
  EXPECT_EQ(splits.train.begin_byte(), 0u);
  EXPECT_EQ(splits.train.end_byte(), 950u);
  EXPECT_EQ(splits.train.size(), (950u - 1) / 7);
  EXPECT_EQ(splits.validation.size(), (50u - 1) / 7);
  // The last training window ends at or before the first validation byte.
  const uint64_t last_train_byte = (splits.train.size() - 1) * 7 + 7;  // inclusive
  EXPECT_LT(last_train_byte, splits.validation.begin_byte());
  EXPECT_EQ(splits.train.name(), "t/train");
  EXPECT_EQ(splits.validation.name(), "t/validation");
}

TEST(SplitText, KjvSizedTextSplitsAsDocumented) {
  const auto text = std::make_shared<const std::vector<uint8_t>>(kKjvBytes, 'x');
  const TokenSplits splits = split_text(text, 64, 0.02, "kjv");
  EXPECT_EQ(text->size() - splits.validation.begin_byte(), 88088u);
  EXPECT_EQ(splits.train.size(), (4404412u - 88088u - 1) / 64);  // 67442
  EXPECT_EQ(splits.validation.size(), (88088u - 1) / 64);        // 1376
}

TEST(SplitText, TooShortTextSaysWhatWouldFit) {
  try {
    split_text(text_of(std::string(100, 'a')), 64, 0.02, "tiny.txt");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("tiny.txt"), std::string::npos) << what;
    EXPECT_NE(what.find("65 bytes"), std::string::npos) << what;
  }
  EXPECT_THROW(split_text(text_of(std::string(1000, 'a')), 8, 0.0, "t"), InvalidArgument);
  EXPECT_THROW(split_text(text_of(std::string(1000, 'a')), 8, 1.0, "t"), InvalidArgument);
}

TEST(ImageDataset, PixelsAreBytesOver255) {
  auto pixels =
      std::make_shared<const std::vector<uint8_t>>(std::vector<uint8_t>{0, 51, 255, 1, 2, 3});
  auto labels = std::make_shared<const std::vector<uint8_t>>(std::vector<uint8_t>{7, 2});
  const ImageDataset ds(pixels, labels, 1, 3, 10, "img");
  const std::vector<uint64_t> indices = {1, 0};
  const ImageBatch batch = ds.batch(indices);
  EXPECT_EQ(batch.pixels_per_image, 3);
  EXPECT_EQ(batch.labels, (std::vector<int32_t>{2, 7}));
  EXPECT_EQ(batch.pixels,
            (std::vector<float>{1 / 255.0f, 2 / 255.0f, 3 / 255.0f, 0.0f, 51 / 255.0f, 1.0f}));
}

TEST(ImageDataset, InconsistentStorageIsRejected) {
  auto pixels = std::make_shared<const std::vector<uint8_t>>(5);
  auto labels = std::make_shared<const std::vector<uint8_t>>(2);
  EXPECT_THROW(ImageDataset(pixels, labels, 1, 3, 10, "img"), InvalidArgument);
  auto bad_labels = std::make_shared<const std::vector<uint8_t>>(std::vector<uint8_t>{10});
  auto one_image = std::make_shared<const std::vector<uint8_t>>(3);
  EXPECT_THROW(ImageDataset(one_image, bad_labels, 1, 3, 10, "img"), InvalidArgument);
}

TEST(SyntheticText, DeterministicAndNextByteFollowsCurrent) {
  const auto a = synthetic_text(7, 5000, 20);
  EXPECT_EQ(a, synthetic_text(7, 5000, 20));
  EXPECT_NE(a, synthetic_text(8, 5000, 20));
  std::set<uint8_t> distinct(a.begin(), a.end());
  EXPECT_EQ(distinct.size(), 20u);
  std::vector<int> next(256, -1);  // the byte after each byte is always the same
  for (size_t i = 0; i + 1 < a.size(); ++i) {
    if (next[a[i]] < 0) next[a[i]] = a[i + 1];
    ASSERT_EQ(next[a[i]], a[i + 1]) << "at " << i;
  }
  for (uint8_t c : distinct) {
    EXPECT_GE(c, '!');
    EXPECT_LE(c, '~');
  }
  EXPECT_THROW(synthetic_text(0, 10, 1), InvalidArgument);
  EXPECT_THROW(synthetic_text(0, 10, 95), InvalidArgument);
}

TEST(SyntheticImages, DeterministicSplitsShareClassesNotSamples) {
  const ImageDataset train = synthetic_images(3, Split::kTrain, 200);
  const ImageDataset again = synthetic_images(3, Split::kTrain, 200);
  const ImageDataset val = synthetic_images(3, Split::kValidation, 200);
  EXPECT_EQ(train.size(), 200u);
  EXPECT_EQ(train.pixels_per_image(), 784);
  std::set<int> labels;
  bool any_difference = false;
  for (uint64_t i = 0; i < train.size(); ++i) {
    labels.insert(train.label(i));
    ASSERT_EQ(train.label(i), again.label(i));
    const auto x = train.image_bytes(i);
    const auto y = again.image_bytes(i);
    ASSERT_TRUE(std::equal(x.begin(), x.end(), y.begin()));
    const auto v = val.image_bytes(i);
    any_difference |= !std::equal(x.begin(), x.end(), v.begin());
  }
  EXPECT_EQ(labels.size(), 10u);
  EXPECT_TRUE(any_difference);
  // Two samples of one class are closer to each other than to a sample of another class.
  auto distance = [](std::span<const uint8_t> a, std::span<const uint8_t> b) {
    double d = 0;
    for (size_t p = 0; p < a.size(); ++p) d += std::abs(int{a[p]} - int{b[p]});
    return d;
  };
  uint64_t same = 1;
  while (train.label(same) != train.label(0)) ++same;
  uint64_t other = 1;
  while (train.label(other) == train.label(0)) ++other;
  EXPECT_LT(distance(train.image_bytes(0), train.image_bytes(same)),
            distance(train.image_bytes(0), train.image_bytes(other)));
}

TEST(OpenData, SyntheticLanguageModel) {
  DataOptions options;
  options.source = "synthetic";
  options.seq_len = 16;
  options.synthetic_text_bytes = 10000;
  const DataSplits data = open_data(options);
  ASSERT_TRUE(std::holds_alternative<TokenDataset>(data.train));
  EXPECT_EQ(task_kind(data.train), TaskKind::kLanguageModel);
  EXPECT_EQ(dataset_size(data.train), (9800u - 1) / 16);
  EXPECT_EQ(dataset_size(data.validation), (200u - 1) / 16);
  EXPECT_EQ(dataset_name(data.validation), "synthetic/validation");
  EXPECT_NE(data.description.find("synthetic"), std::string::npos);
}

TEST(OpenData, SyntheticImages) {
  DataOptions options;
  options.source = "synthetic";
  options.task = TaskKind::kImageClassification;
  options.synthetic_train_images = 100;
  options.synthetic_validation_images = 10;
  const DataSplits data = open_data(options);
  ASSERT_TRUE(std::holds_alternative<ImageDataset>(data.train));
  EXPECT_EQ(dataset_size(data.train), 100u);
  EXPECT_EQ(dataset_size(data.validation), 10u);
}

TEST(OpenData, TextFilePath) {
  testing::TempDir dir;
  const auto path = dir.path() / "corpus.txt";
  std::ofstream(path) << std::string(2000, 'z');
  DataOptions options;
  options.source = path.string();
  options.seq_len = 8;
  const DataSplits data = open_data(options);
  EXPECT_EQ(dataset_size(data.train), (1960u - 1) / 8);
  EXPECT_EQ(dataset_name(data.train), "corpus.txt/train");
}

TEST(OpenData, WrongTaskKindIsRejectedNotSubstituted) {
  DataOptions options;
  options.source = "kjv";
  options.task = TaskKind::kImageClassification;
  try {
    open_data(options);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("fashion-mnist or synthetic"), std::string::npos)
        << e.what();
  }
  options.source = "fashion-mnist";
  options.task = TaskKind::kLanguageModel;
  EXPECT_THROW(open_data(options), InvalidArgument);
}

TEST(OpenData, UnknownSourceNamesTheChoices) {
  DataOptions options;
  options.source = "/nonexistent/zerodp/corpus";
  try {
    open_data(options);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/nonexistent/zerodp/corpus"), std::string::npos) << what;
    EXPECT_NE(what.find("kjv, fashion-mnist or synthetic"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace zerodp
