#include "data/dataset.h"

#include <algorithm>
#include <cmath>

#include <fmt/core.h>

#include "core/error.h"

namespace zerodp {

const char* task_kind_name(TaskKind kind) {
  switch (kind) {
    case TaskKind::kLanguageModel:
      return "language-model";
    case TaskKind::kImageClassification:
      return "image-classification";
  }
  return "unknown";
}

TokenDataset::TokenDataset(std::shared_ptr<const std::vector<uint8_t>> text, uint64_t begin_byte,
                           uint64_t end_byte, int64_t seq_len, std::string name)
    : text_(std::move(text)),
      begin_byte_(begin_byte),
      end_byte_(end_byte),
      seq_len_(seq_len),
      name_(std::move(name)) {
  if (!text_) throw InvalidArgument(fmt::format("{}: no text given", name_));
  if (seq_len < 1) {
    throw InvalidArgument(
        fmt::format("{}: seq_len {} is invalid; use 1 or more tokens", name_, seq_len));
  }
  if (begin_byte > end_byte || end_byte > text_->size()) {
    throw InvalidArgument(fmt::format("{}: byte range [{}, {}) is not inside the text of {} bytes",
                                      name_, begin_byte, end_byte, text_->size()));
  }
  const uint64_t range_bytes = end_byte - begin_byte;
  size_ = range_bytes < 1 ? 0 : (range_bytes - 1) / static_cast<uint64_t>(seq_len);
}

void check_token_batch(const std::string& name, uint64_t size, int64_t seq_len,
                       std::span<const uint64_t> indices, size_t inputs, size_t targets) {
  const size_t want = indices.size() * static_cast<size_t>(seq_len);
  if (inputs != want || targets != want) {
    throw InvalidArgument(fmt::format(
        "{}: batch of {} samples x seq_len {} needs {} inputs and targets, got {} and {}", name,
        indices.size(), seq_len, want, inputs, targets));
  }
  for (const uint64_t index : indices) {
    if (index >= size) {
      throw InvalidArgument(fmt::format("{}: sample index {} is out of range; {} samples (0..{})",
                                        name, index, size, size == 0 ? 0 : size - 1));
    }
  }
}

void TokenDataset::fill(std::span<const uint64_t> indices, std::span<int32_t> inputs,
                        std::span<int32_t> targets) const {
  check_token_batch(name_, size_, seq_len_, indices, inputs.size(), targets.size());
  const size_t T = static_cast<size_t>(seq_len_);
  const uint8_t* text = text_->data();
  for (size_t b = 0; b < indices.size(); ++b) {
    const uint8_t* window = text + begin_byte_ + indices[b] * T;  // T + 1 bytes
    for (size_t t = 0; t < T; ++t) {
      inputs[b * T + t] = window[t];
      targets[b * T + t] = window[t + 1];
    }
  }
}

std::pair<int, uint64_t> TokenDataset::largest_token() const {
  const auto first = text_->begin() + static_cast<std::ptrdiff_t>(begin_byte_);
  const auto last = text_->begin() + static_cast<std::ptrdiff_t>(end_byte_);
  const auto at = std::max_element(first, last);
  if (at == last) return {0, 0};
  return {*at, static_cast<uint64_t>(at - first)};
}

TokenBatch TokenDataset::batch(std::span<const uint64_t> indices) const {
  TokenBatch out;
  out.batch = static_cast<int64_t>(indices.size());
  out.seq_len = seq_len_;
  out.inputs.resize(indices.size() * static_cast<size_t>(seq_len_));
  out.targets.resize(out.inputs.size());
  fill(indices, out.inputs, out.targets);
  return out;
}

TokenSplits split_text(std::shared_ptr<const std::vector<uint8_t>> text, int64_t seq_len,
                       double validation_fraction, const std::string& name) {
  if (!text) throw InvalidArgument(fmt::format("{}: no text given", name));
  if (!(validation_fraction > 0.0 && validation_fraction < 1.0)) {
    throw InvalidArgument(
        fmt::format("{}: validation fraction {} is invalid; use a value in (0, 1), e.g. 0.02", name,
                    validation_fraction));
  }
  if (seq_len < 1) {
    throw InvalidArgument(
        fmt::format("{}: seq_len {} is invalid; use 1 or more tokens", name, seq_len));
  }
  const uint64_t total_bytes = text->size();
  // floor() of an IEEE double product: the same split on every platform.
  const auto validation_bytes =
      static_cast<uint64_t>(std::floor(static_cast<double>(total_bytes) * validation_fraction));
  const uint64_t split_byte = total_bytes - validation_bytes;
  const uint64_t window_bytes = static_cast<uint64_t>(seq_len) + 1;
  if (split_byte < window_bytes || validation_bytes < window_bytes) {
    // The smallest text for which both parts hold a window, rounded up generously.
    const double need_bytes = static_cast<double>(window_bytes) /
                              std::min(validation_fraction, 1.0 - validation_fraction);
    throw InvalidArgument(fmt::format(
        "{}: {} bytes split into {} training and {} validation bytes (fraction {}), but one "
        "sample needs seq_len + 1 = {} bytes in each; use a shorter seq_len, or a text of at "
        "least {} bytes",
        name, total_bytes, split_byte, validation_bytes, validation_fraction, window_bytes,
        static_cast<uint64_t>(std::ceil(need_bytes)) + 1));
  }
  return TokenSplits{
      .train = TokenDataset(text, 0, split_byte, seq_len, name + "/train"),
      .validation = TokenDataset(text, split_byte, total_bytes, seq_len, name + "/validation")};
}

ImageDataset::ImageDataset(std::shared_ptr<const std::vector<uint8_t>> pixels,
                           std::shared_ptr<const std::vector<uint8_t>> labels, int64_t rows,
                           int64_t cols, int classes, std::string name)
    : pixels_(std::move(pixels)),
      labels_(std::move(labels)),
      rows_(rows),
      cols_(cols),
      classes_(classes),
      name_(std::move(name)) {
  if (!pixels_ || !labels_) throw InvalidArgument(fmt::format("{}: no pixels or labels", name_));
  if (rows < 1 || cols < 1 || classes < 1 || classes > 256) {
    throw InvalidArgument(fmt::format(
        "{}: {}x{} images with {} classes is invalid; use positive sizes and 1..256 classes", name_,
        rows, cols, classes));
  }
  size_ = labels_->size();
  const uint64_t want_bytes = size_ * static_cast<uint64_t>(rows * cols);
  if (pixels_->size() != want_bytes) {
    throw InvalidArgument(fmt::format("{}: {} labels of {}x{} images need {} pixel bytes, got {}",
                                      name_, size_, rows, cols, want_bytes, pixels_->size()));
  }
  for (uint64_t i = 0; i < size_; ++i) {
    if ((*labels_)[i] >= classes) {
      throw InvalidArgument(fmt::format("{}: label {} of sample {} is outside 0..{}", name_,
                                        (*labels_)[i], i, classes - 1));
    }
  }
}

std::span<const uint8_t> ImageDataset::image_bytes(uint64_t index) const {
  if (index >= size_) {
    throw InvalidArgument(
        fmt::format("{}: sample index {} is out of range; {} samples", name_, index, size_));
  }
  const size_t P = static_cast<size_t>(pixels_per_image());
  return std::span<const uint8_t>(*pixels_).subspan(index * P, P);
}

int ImageDataset::label(uint64_t index) const {
  if (index >= size_) {
    throw InvalidArgument(
        fmt::format("{}: sample index {} is out of range; {} samples", name_, index, size_));
  }
  return (*labels_)[index];
}

void ImageDataset::fill(std::span<const uint64_t> indices, std::span<float> pixels,
                        std::span<int32_t> labels) const {
  const size_t P = static_cast<size_t>(pixels_per_image());
  if (pixels.size() != indices.size() * P || labels.size() != indices.size()) {
    throw InvalidArgument(fmt::format(
        "{}: batch of {} samples x {} pixels needs {} pixels and {} labels, got {} and {}", name_,
        indices.size(), P, indices.size() * P, indices.size(), pixels.size(), labels.size()));
  }
  for (size_t b = 0; b < indices.size(); ++b) {
    const std::span<const uint8_t> image = image_bytes(indices[b]);
    for (size_t p = 0; p < P; ++p) pixels[b * P + p] = static_cast<float>(image[p]) / 255.0f;
    labels[b] = (*labels_)[indices[b]];
  }
}

ImageBatch ImageDataset::batch(std::span<const uint64_t> indices) const {
  ImageBatch out;
  out.batch = static_cast<int64_t>(indices.size());
  out.pixels_per_image = pixels_per_image();
  out.pixels.resize(indices.size() * static_cast<size_t>(out.pixels_per_image));
  out.labels.resize(indices.size());
  fill(indices, out.pixels, out.labels);
  return out;
}

uint64_t dataset_size(const Dataset& dataset) {
  return std::visit([](const auto& d) { return d.size(); }, dataset);
}

bool is_language_model_data(const Dataset& dataset) {
  return !std::holds_alternative<ImageDataset>(dataset);
}

TaskKind task_kind(const Dataset& dataset) {
  return is_language_model_data(dataset) ? TaskKind::kLanguageModel
                                         : TaskKind::kImageClassification;
}

const std::string& dataset_name(const Dataset& dataset) {
  return std::visit([](const auto& d) -> const std::string& { return d.name(); }, dataset);
}

}  // namespace zerodp
