#include "data/idx.h"

#include <memory>
#include <span>

#include <fmt/core.h>

#include "core/error.h"
#include "data/gzip.h"

namespace zerodp {
namespace {

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string dims_text(std::span<const uint32_t> dims) {
  std::string out;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) out += 'x';
    out += std::to_string(dims[i]);
  }
  return out;
}

constexpr int64_t kFashionSide = 28;
constexpr int kFashionClasses = 10;

}  // namespace

IdxArray parse_idx(std::vector<uint8_t> bytes, size_t expected_dims, const std::string& name) {
  if (bytes.size() < 4) {
    throw CorruptData(fmt::format("{}: {} bytes is too short for an IDX header (4 bytes of magic)",
                                  name, bytes.size()));
  }
  const uint32_t magic = read_be32(bytes.data());
  const uint32_t expected_magic = 0x00000800u | static_cast<uint32_t>(expected_dims);
  if (magic != expected_magic) {
    throw CorruptData(
        fmt::format("{}: bad IDX magic 0x{:08x}, expected 0x{:08x} (unsigned bytes, {} dimensions)",
                    name, magic, expected_magic, expected_dims));
  }
  const size_t header_bytes = 4 + 4 * expected_dims;
  if (bytes.size() < header_bytes) {
    throw CorruptData(fmt::format("{}: {} bytes is too short for an IDX header of {} bytes", name,
                                  bytes.size(), header_bytes));
  }
  IdxArray out;
  uint64_t count = 1;
  for (size_t d = 0; d < expected_dims; ++d) {
    out.dims.push_back(read_be32(bytes.data() + 4 + 4 * d));
    // Checked before multiplying, so a garbage header cannot overflow the count.
    constexpr uint64_t kMaxValues = uint64_t{1} << 40;
    if (out.dims.back() != 0 && count > kMaxValues / out.dims.back()) {
      throw CorruptData(
          fmt::format("{}: IDX dimensions {} are implausibly large", name, dims_text(out.dims)));
    }
    count *= out.dims.back();
  }
  const uint64_t expected_bytes = header_bytes + count;
  if (bytes.size() != expected_bytes) {
    throw CorruptData(fmt::format(
        "{}: length {} bytes does not match the header: dimensions {} need {} + {} = {} bytes{}",
        name, bytes.size(), dims_text(out.dims), header_bytes, count, expected_bytes,
        bytes.size() < expected_bytes ? " (truncated?)" : " (trailing data?)"));
  }
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(header_bytes));
  out.values = std::move(bytes);
  return out;
}

IdxArray read_idx_gz(const std::filesystem::path& path, size_t expected_dims) {
  return parse_idx(read_gzip_file(path), expected_dims, path.string());
}

const char* split_name(Split split) { return split == Split::kTrain ? "train" : "validation"; }

ImageDataset load_fashion_mnist(const std::filesystem::path& dir, Split split) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw IoError(
        fmt::format("fashion-mnist: directory {} not found; install the Debian package "
                    "dataset-fashion-mnist (apt-get install dataset-fashion-mnist), or point to a "
                    "directory holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
                    "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz",
                    dir.string()));
  }
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::filesystem::path images_path = dir / (prefix + "-images-idx3-ubyte.gz");
  const std::filesystem::path labels_path = dir / (prefix + "-labels-idx1-ubyte.gz");
  for (const auto& path : {images_path, labels_path}) {
    if (!std::filesystem::exists(path, ec)) {
      throw IoError(fmt::format(
          "fashion-mnist: {} not found; reinstall the Debian package dataset-fashion-mnist "
          "(apt-get install --reinstall dataset-fashion-mnist)",
          path.string()));
    }
  }

  IdxArray images = read_idx_gz(images_path, 3);
  if (images.dims[1] != kFashionSide || images.dims[2] != kFashionSide) {
    throw CorruptData(fmt::format("{}: images are {}x{}, expected {}x{}", images_path.string(),
                                  images.dims[1], images.dims[2], kFashionSide, kFashionSide));
  }
  IdxArray labels = read_idx_gz(labels_path, 1);
  if (labels.dims[0] != images.dims[0]) {
    throw CorruptData(fmt::format("{}: {} labels, but {} holds {} images; expected equal counts",
                                  labels_path.string(), labels.dims[0], images_path.string(),
                                  images.dims[0]));
  }
  for (size_t i = 0; i < labels.values.size(); ++i) {
    if (labels.values[i] >= kFashionClasses) {
      throw CorruptData(fmt::format("{}: label {} of sample {} is outside 0..{}",
                                    labels_path.string(), labels.values[i], i,
                                    kFashionClasses - 1));
    }
  }
  return ImageDataset(std::make_shared<const std::vector<uint8_t>>(std::move(images.values)),
                      std::make_shared<const std::vector<uint8_t>>(std::move(labels.values)),
                      kFashionSide, kFashionSide, kFashionClasses,
                      std::string("fashion-mnist/") + split_name(split));
}

const char* fashion_mnist_class_name(int label) {
  static constexpr const char* kNames[kFashionClasses] = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  if (label < 0 || label >= kFashionClasses) {
    throw InvalidArgument(fmt::format("fashion-mnist: label {} is outside 0..9", label));
  }
  return kNames[label];
}

}  // namespace zerodp
