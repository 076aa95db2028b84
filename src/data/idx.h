// IDX files (the MNIST / Fashion-MNIST format) and the Fashion-MNIST dataset.
//
// IDX layout, all integers big-endian:
//   bytes 0-1  zero
//   byte  2    element type; 0x08 = unsigned byte, the only type read here
//   byte  3    number of dimensions d
//   4 * d      the dimensions, uint32 each
//   then       prod(dims) elements, row-major, and nothing after them
// So an image file of n 28x28 images has magic 0x00000803 and is 16 + n*784 bytes, a
// label file magic 0x00000801 and 8 + n bytes. Every check failure is CorruptData naming
// the file, the field, and expected vs actual.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace zerodp {

// An IDX array of unsigned bytes.
struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> values;  // prod(dims) bytes, row-major
};

// Parses IDX bytes (already decompressed) with the expected number of dimensions; the
// values keep the buffer (moved in, header dropped in place: no second 47 MB copy).
// `name` (the file) prefixes every message. Throws CorruptData.
IdxArray parse_idx(std::vector<uint8_t> bytes, size_t expected_dims, const std::string& name);

// Reads a gzip'd IDX file (read_gzip_file, then parse_idx).
IdxArray read_idx_gz(const std::filesystem::path& path, size_t expected_dims);

// Where Debian's dataset-fashion-mnist package installs the four files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

enum class Split { kTrain, kValidation };
const char* split_name(Split split);  // "train" / "validation"

// Fashion-MNIST from `dir`: the train split from train-images-idx3-ubyte.gz and
// train-labels-idx1-ubyte.gz (60,000 images), the validation split from the t10k-* files
// (10,000). Images must be 28x28, labels 0..9, and both files must hold the same count.
// Throws IoError when the directory or a file is missing (naming the Debian package
// dataset-fashion-mnist), CorruptData when a file is malformed.
ImageDataset load_fashion_mnist(const std::filesystem::path& dir, Split split);

// The ten Fashion-MNIST class names, by label.
const char* fashion_mnist_class_name(int label);

}  // namespace zerodp
