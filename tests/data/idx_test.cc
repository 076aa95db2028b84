#include "data/idx.h"

#include <array>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <zlib.h>

#include "core/error.h"
#include "data/gzip.h"
#include "temp_dir.h"

namespace zerodp {
namespace {

using testing::TempDir;

std::vector<uint8_t> be32(uint32_t v) {
  return {static_cast<uint8_t>(v >> 24), static_cast<uint8_t>(v >> 16),
          static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v)};
}

// An IDX byte array: magic, dims, then `values` as given (not checked against dims).
std::vector<uint8_t> idx_bytes(uint32_t magic, std::vector<uint32_t> dims,
                               const std::vector<uint8_t>& values) {
  std::vector<uint8_t> out = be32(magic);
  for (uint32_t d : dims) {
    const auto b = be32(d);
    out.insert(out.end(), b.begin(), b.end());
  }
  out.insert(out.end(), values.begin(), values.end());
  return out;
}

void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void write_gzip(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb1");
  ASSERT_NE(f, nullptr);
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

// Runs `fn`, expecting CorruptData whose message contains every one of `parts`.
template <typename Fn>
void expect_corrupt(Fn fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected CorruptData";
  } catch (const CorruptData& e) {
    for (const auto& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message lacks \"" << part << "\": " << e.what();
    }
  }
}

// A small, valid Fashion-MNIST-shaped directory: `count` 28x28 images for split t10k.
struct FakeFashion {
  explicit FakeFashion(uint32_t count = 5) {
    images.resize(count * 784);
    for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<uint8_t>(i % 256);
    for (uint32_t i = 0; i < count; ++i) labels.push_back(static_cast<uint8_t>(i % 10));
  }
  void write(uint32_t image_magic = 0x803, uint32_t label_magic = 0x801) const {
    write_image_bytes(idx_bytes(image_magic, {image_count(), 28, 28}, images));
    write_label_bytes(idx_bytes(label_magic, {static_cast<uint32_t>(labels.size())}, labels));
  }
  void write_image_bytes(const std::vector<uint8_t>& bytes) const {
    write_gzip(images_path(), bytes);
  }
  void write_label_bytes(const std::vector<uint8_t>& bytes) const {
    write_gzip(labels_path(), bytes);
  }
  uint32_t image_count() const { return static_cast<uint32_t>(images.size() / 784); }
  std::filesystem::path images_path() const { return dir.path() / "t10k-images-idx3-ubyte.gz"; }
  std::filesystem::path labels_path() const { return dir.path() / "t10k-labels-idx1-ubyte.gz"; }

  TempDir dir;
  std::vector<uint8_t> images;
  std::vector<uint8_t> labels;
};

const std::filesystem::path kRealDir = kFashionMnistDir;

#define SKIP_WITHOUT_FASHION_MNIST()                                            \
  if (!std::filesystem::exists(kRealDir / "train-images-idx3-ubyte.gz")) {      \
    GTEST_SKIP() << "Fashion-MNIST not installed in " << kRealDir               \
                 << "; apt-get install dataset-fashion-mnist to run this test"; \
  }

TEST(FashionMnist, RealTrainSplitHas60000BalancedImages) {
  SKIP_WITHOUT_FASHION_MNIST();
  const ImageDataset train = load_fashion_mnist(kRealDir, Split::kTrain);
  EXPECT_EQ(train.size(), 60000u);
  EXPECT_EQ(train.rows(), 28);
  EXPECT_EQ(train.cols(), 28);
  EXPECT_EQ(train.num_classes(), 10);
  std::array<int, 10> per_class{};
  for (uint64_t i = 0; i < train.size(); ++i) ++per_class[static_cast<size_t>(train.label(i))];
  for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[static_cast<size_t>(c)], 6000) << "class " << c;
  // The well-known first training label (an ankle boot) and its first header bytes.
  EXPECT_EQ(train.label(0), 9);
  EXPECT_STREQ(fashion_mnist_class_name(train.label(0)), "Ankle boot");
}

TEST(FashionMnist, RealValidationSplitHas10000ImagesAndNormalizedPixels) {
  SKIP_WITHOUT_FASHION_MNIST();
  const ImageDataset val = load_fashion_mnist(kRealDir, Split::kValidation);
  EXPECT_EQ(val.size(), 10000u);
  EXPECT_EQ(val.name(), "fashion-mnist/validation");
  const std::vector<uint64_t> indices = {0, 9999, 17};
  const ImageBatch batch = val.batch(indices);
  ASSERT_EQ(batch.pixels.size(), 3u * 784u);
  for (size_t b = 0; b < indices.size(); ++b) {
    EXPECT_EQ(batch.labels[b], val.label(indices[b]));
    const auto bytes = val.image_bytes(indices[b]);
    for (size_t p = 0; p < 784; ++p) {
      ASSERT_EQ(batch.pixels[b * 784 + p], static_cast<float>(bytes[p]) / 255.0f);
    }
  }
  float max_pixel = 0;
  for (float v : batch.pixels) {
    ASSERT_GE(v, 0.0f);
    ASSERT_LE(v, 1.0f);
    max_pixel = std::max(max_pixel, v);
  }
  EXPECT_GT(max_pixel, 0.5f);
}

TEST(FashionMnist, ValidFakeDirectoryLoads) {
  FakeFashion fake(7);
  fake.write();
  const ImageDataset ds = load_fashion_mnist(fake.dir.path(), Split::kValidation);
  EXPECT_EQ(ds.size(), 7u);
  EXPECT_EQ(ds.label(3), 3);
  EXPECT_EQ(ds.image_bytes(1)[0], fake.images[784]);
}

TEST(FashionMnist, MissingDirectoryNamesDebianPackage) {
  try {
    load_fashion_mnist("/nonexistent/fashion", Split::kTrain);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/nonexistent/fashion"), std::string::npos) << what;
    EXPECT_NE(what.find("apt-get install dataset-fashion-mnist"), std::string::npos) << what;
  }
}

TEST(FashionMnist, MissingFileIsNamed) {
  FakeFashion fake;
  fake.write();
  std::filesystem::remove(fake.labels_path());
  try {
    load_fashion_mnist(fake.dir.path(), Split::kValidation);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(fake.labels_path().string()), std::string::npos)
        << e.what();
  }
}

TEST(FashionMnist, TruncatedGzipIsRejected) {
  SKIP_WITHOUT_FASHION_MNIST();
  FakeFashion fake;
  fake.write();
  // The first half of the real compressed label file.
  std::vector<uint8_t> packed = read_file_bytes(kRealDir / "t10k-labels-idx1-ubyte.gz");
  packed.resize(packed.size() / 2);
  write_bytes(fake.labels_path(), packed);
  expect_corrupt([&] { load_fashion_mnist(fake.dir.path(), Split::kValidation); },
                 {fake.labels_path().string(), "truncated"});
}

TEST(FashionMnist, NotGzipIsRejected) {
  FakeFashion fake;
  fake.write();
  write_bytes(fake.images_path(), {'h', 'e', 'l', 'l', 'o', '\n'});
  expect_corrupt([&] { load_fashion_mnist(fake.dir.path(), Split::kValidation); },
                 {fake.images_path().string(), "not a gzip file", "68 65"});
}

TEST(FashionMnist, CorruptGzipPayloadIsRejected) {
  FakeFashion fake(50);
  fake.write();
  std::vector<uint8_t> packed = read_file_bytes(fake.images_path());
  for (size_t i = packed.size() / 3; i < packed.size() / 3 + 8; ++i) packed[i] ^= 0x5a;
  write_bytes(fake.images_path(), packed);
  expect_corrupt([&] { load_fashion_mnist(fake.dir.path(), Split::kValidation); },
                 {fake.images_path().string(), "corrupt gzip data"});
}

TEST(FashionMnist, TrailingGarbageAfterGzipIsRejected) {
  FakeFashion fake;
  fake.write();
  std::vector<uint8_t> packed = read_file_bytes(fake.labels_path());
  packed.push_back(0);
  packed.push_back(42);
  write_bytes(fake.labels_path(), packed);
  expect_corrupt([&] { load_fashion_mnist(fake.dir.path(), Split::kValidation); },
                 {fake.labels_path().string(), "2 unexpected bytes"});
}

TEST(FashionMnist, BadImageMagicIsRejected) {
  FakeFashion fake;
  fake.write(/*image_magic=*/0x00000c03);
  expect_corrupt([&] { load_fashion_mnist(fake.dir.path(), Split::kValidation); },
                 {fake.images_path().string(), "magic 0x00000c03", "expected 0x00000803"});
}

TEST(FashionMnist, BadLabelMagicIsRejected) {
  FakeFashion fake;
  fake.write(0x803, /*label_magic=*/0x00000803);
  expect_corrupt([&] { load_fashion_mnist(fake.dir.path(), Split::kValidation); },
                 {fake.labels_path().string(), "expected 0x00000801"});
}

TEST(FashionMnist, HeaderCountLargerThanDataIsRejected) {
  FakeFashion fake(5);
  fake.write();
  fake.write_image_bytes(idx_bytes(0x803, {6, 28, 28}, fake.images));  // claims 6, holds 5
  expect_corrupt([&] { load_fashion_mnist(fake.dir.path(), Split::kValidation); },
                 {fake.images_path().string(), "length 3936", "6x28x28", "4720"});
}

TEST(FashionMnist, LabelCountDifferentFromImageCountIsRejected) {
  FakeFashion fake(5);
  fake.labels.pop_back();
  fake.write();
  expect_corrupt([&] { load_fashion_mnist(fake.dir.path(), Split::kValidation); },
                 {fake.labels_path().string(), "4 labels", "5 images"});
}

TEST(FashionMnist, LabelOutOfRangeIsRejected) {
  FakeFashion fake(5);
  fake.labels[2] = 10;
  fake.write();
  expect_corrupt([&] { load_fashion_mnist(fake.dir.path(), Split::kValidation); },
                 {fake.labels_path().string(), "label 10 of sample 2", "0..9"});
}

TEST(FashionMnist, WrongImageSizeIsRejected) {
  FakeFashion fake(2);
  fake.write();
  fake.write_image_bytes(idx_bytes(0x803, {2, 32, 32}, std::vector<uint8_t>(2 * 32 * 32)));
  expect_corrupt([&] { load_fashion_mnist(fake.dir.path(), Split::kValidation); },
                 {fake.images_path().string(), "32x32", "expected 28x28"});
}

TEST(Gzip, ConcatenatedMembersAreRead) {
  TempDir dir;
  const auto a = dir.path() / "a.gz";
  const auto b = dir.path() / "b.gz";
  write_gzip(a, {'a', 'b'});
  write_gzip(b, {'c'});
  std::vector<uint8_t> both = read_file_bytes(a);
  const std::vector<uint8_t> second = read_file_bytes(b);
  both.insert(both.end(), second.begin(), second.end());
  write_bytes(a, both);
  EXPECT_EQ(read_gzip_file(a), (std::vector<uint8_t>{'a', 'b', 'c'}));
}

TEST(Gzip, EmptyPayloadIsEmpty) {
  TempDir dir;
  const auto path = dir.path() / "empty.gz";
  write_gzip(path, {});
  EXPECT_TRUE(read_gzip_file(path).empty());
}

TEST(Idx, ShortHeaderIsRejected) {
  const std::vector<uint8_t> bytes = {0, 0, 8, 3, 0, 0};
  expect_corrupt([&] { parse_idx(bytes, 3, "x.idx"); }, {"x.idx", "too short"});
}

}  // namespace
}  // namespace zerodp
