// Datasets as the training engine sees them: a number of samples, and a batch for any
// list of sample indices.
//
// Two task kinds, one concrete type each (no virtual interface: a model consumes exactly
// one kind, and `Dataset` is the variant the engine switches on once):
//   TokenDataset  byte-level language modelling: int32 inputs and targets, (B, T).
//   ImageDataset  image classification: float pixels (B, rows*cols) and int32 labels (B).
// Both are immutable views over shared, read-only storage: cheap to copy, and safe to use
// from every rank thread at once. A sample is a pure function of its index, so with the
// sampler's order (data/sampler.h) every batch is a pure function of (seed, epoch, index).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "data/batch.h"
#include "data/shard_dataset.h"

namespace zerodp {

enum class TaskKind { kLanguageModel, kImageClassification };
const char* task_kind_name(TaskKind kind);  // "language-model" / "image-classification"

// Byte-level language-modelling samples over bytes [begin, end) of a text.
//
// Sample i is the window of T+1 bytes starting at begin + i*T: inputs are its first T
// bytes, targets its last T. Consecutive windows share one byte (the last target of one is
// the first input of the next) and otherwise do not overlap, so an epoch reads every byte
// of the range once as a target (but the first), and size() = (end - begin - 1) / T, the
// tail that does not fill a window being unused. Windows never read outside [begin, end),
// which is what keeps the train and validation splits of split_text() apart.
class TokenDataset {
 public:
  static constexpr int kVocabSize = 256;  // byte-level

  // Throws InvalidArgument if seq_len < 1 or [begin, end) is not inside the text.
  TokenDataset(std::shared_ptr<const std::vector<uint8_t>> text, uint64_t begin_byte,
               uint64_t end_byte, int64_t seq_len, std::string name);

  uint64_t size() const { return size_; }
  int64_t seq_len() const { return seq_len_; }
  uint64_t begin_byte() const { return begin_byte_; }
  uint64_t end_byte() const { return end_byte_; }
  const std::string& name() const { return name_; }  // e.g. "kjv/train", for messages
  // The largest token in the samples' bytes, and the first offset (from begin_byte) where it
  // stands: what a vocabulary must hold.
  std::pair<int, uint64_t> largest_token() const;

  // Writes sample indices[b] into row b of inputs and targets, each (B, T) with
  // B = indices.size(). Throws InvalidArgument naming the index if one is >= size(), or the
  // spans' sizes if they are not B*T.
  void fill(std::span<const uint64_t> indices, std::span<int32_t> inputs,
            std::span<int32_t> targets) const;
  TokenBatch batch(std::span<const uint64_t> indices) const;

 private:
  std::shared_ptr<const std::vector<uint8_t>> text_;
  uint64_t begin_byte_ = 0;
  uint64_t end_byte_ = 0;
  int64_t seq_len_ = 0;
  uint64_t size_ = 0;
  std::string name_;
};

// Splits a text into a training part followed by a held-out validation part:
//   validation = the last floor(size * validation_fraction) bytes, training = the rest.
// Both are TokenDatasets over their own byte range, so no training window shares a byte
// with a validation window. For the KJV text (4,404,412 bytes) and the default 0.02 the
// validation part is the last 88,088 bytes: from within 2 Peter 3:5 to the end of
// Revelation (a byte count, not a verse boundary).
// Throws InvalidArgument, naming the text, if validation_fraction is not in (0, 1) or a
// part is too short for one window of seq_len + 1 bytes.
struct TokenSplits {
  TokenDataset train;
  TokenDataset validation;
};
TokenSplits split_text(std::shared_ptr<const std::vector<uint8_t>> text, int64_t seq_len,
                       double validation_fraction, const std::string& name);

// Labelled images of rows x cols bytes (0 = background), e.g. Fashion-MNIST.
// Sample i is image i and label i of the storage, pixels scaled to byte / 255 (no mean or
// standard-deviation normalization: the model sees [0, 1]).
class ImageDataset {
 public:
  // pixels: count * rows * cols bytes, row-major images one after another; labels: count
  // values, each < classes. Throws InvalidArgument when the sizes disagree or a label is
  // out of range (file readers check this first and report CorruptData with the file name).
  ImageDataset(std::shared_ptr<const std::vector<uint8_t>> pixels,
               std::shared_ptr<const std::vector<uint8_t>> labels, int64_t rows, int64_t cols,
               int classes, std::string name);

  uint64_t size() const { return size_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t pixels_per_image() const { return rows_ * cols_; }
  int num_classes() const { return classes_; }
  const std::string& name() const { return name_; }

  // The stored bytes of image i (rows * cols) and its label.
  std::span<const uint8_t> image_bytes(uint64_t index) const;
  int label(uint64_t index) const;

  // Writes sample indices[b] into row b of pixels (B, P) and labels (B). Throws
  // InvalidArgument naming the index or the span sizes when they do not fit.
  void fill(std::span<const uint64_t> indices, std::span<float> pixels,
            std::span<int32_t> labels) const;
  ImageBatch batch(std::span<const uint64_t> indices) const;

 private:
  std::shared_ptr<const std::vector<uint8_t>> pixels_;
  std::shared_ptr<const std::vector<uint8_t>> labels_;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  int classes_ = 0;
  uint64_t size_ = 0;
  std::string name_;
};

// ShardDataset (data/shard_dataset.h): language modelling over token shards on disk.
using Dataset = std::variant<TokenDataset, ImageDataset, ShardDataset>;

// Whether samples are token windows (bytes in memory or token shards), not images.
bool is_language_model_data(const Dataset& dataset);

uint64_t dataset_size(const Dataset& dataset);
TaskKind task_kind(const Dataset& dataset);
const std::string& dataset_name(const Dataset& dataset);

// A training and a held-out validation set of the same kind, and a line for the log.
struct DataSplits {
  Dataset train;
  Dataset validation;
  std::string description;  // e.g. "kjv: 4404412 bytes (cache /x/kjv.txt), seq_len 64, ..."
  // What identifies the data beyond its sample count, for a checkpoint to refuse another
  // set: a token shard set's digest (its manifest's); empty for the in-memory sources.
  std::string identity;
  // The tokenizer the tokens came from (token shards' manifest.json), its sha256; empty for
  // byte-level data and llm.c's shards, which do not say.
  std::string tokenizer_sha256;
  // The validation text's bytes per token, to state a loss per token in bits per byte (so
  // byte-level and tokenized runs compare): 1 for byte-level data, the manifest's bytes over
  // tokens for token shards, 0 when unknown (llm.c's shards say nothing of their text).
  double validation_bytes_per_token = 1.0;
};

}  // namespace zerodp
