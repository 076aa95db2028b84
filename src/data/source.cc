#include "data/source.h"

#include <memory>

#include <fmt/core.h>

#include "core/error.h"
#include "data/shard_dataset.h"
#include "data/shards.h"
#include "data/synthetic.h"
#include "data/text.h"

namespace zerodp {
namespace {

void require_task(const DataOptions& options, TaskKind provides) {
  if (options.task == provides) return;
  throw InvalidArgument(
      fmt::format("data: --data {} provides {} data, but the model needs {} data; use {}",
                  options.source, task_kind_name(provides), task_kind_name(options.task),
                  options.task == TaskKind::kLanguageModel ? "kjv, synthetic or a text file path"
                                                           : "fashion-mnist or synthetic"));
}

DataSplits text_splits(std::vector<uint8_t> bytes, const DataOptions& options,
                       const std::string& name, const std::string& origin) {
  const auto text = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  TokenSplits splits = split_text(text, options.seq_len, options.validation_fraction, name);
  std::string description = fmt::format(
      "{}: {} bytes ({}), seq_len {}: train {} windows (bytes 0..{}), validation {} windows "
      "(last {} bytes)",
      name, text->size(), origin, options.seq_len, splits.train.size(), splits.train.end_byte(),
      splits.validation.size(), text->size() - splits.validation.begin_byte());
  return DataSplits{.train = std::move(splits.train),
                    .validation = std::move(splits.validation),
                    .description = std::move(description),
                    .identity = {},
                    .tokenizer_sha256 = {},
                    .validation_bytes_per_token = 1.0};
}

}  // namespace

DataSplits open_data(const DataOptions& options) {
  if (options.source == "kjv") {
    require_task(options, TaskKind::kLanguageModel);
    const std::filesystem::path cache_dir =
        options.cache_dir.empty() ? default_cache_dir() : options.cache_dir;
    KjvText kjv = load_kjv(cache_dir, options.bible_program);
    const std::string origin =
        fmt::format("{} {}", kjv.prepared ? "prepared into" : "cache", kjv.cache_file.string());
    return text_splits(std::move(kjv.bytes), options, "kjv",
                       kjv.replaced_bad_cache ? origin + ", replacing a bad cache" : origin);
  }
  if (options.source == "fashion-mnist") {
    require_task(options, TaskKind::kImageClassification);
    ImageDataset train = load_fashion_mnist(options.fashion_mnist_dir, Split::kTrain);
    ImageDataset validation = load_fashion_mnist(options.fashion_mnist_dir, Split::kValidation);
    std::string description = fmt::format(
        "fashion-mnist: {} train and {} validation images of {}x{} from {}", train.size(),
        validation.size(), train.rows(), train.cols(), options.fashion_mnist_dir.string());
    return DataSplits{.train = std::move(train),
                      .validation = std::move(validation),
                      .description = std::move(description),
                      .identity = {},
                      .tokenizer_sha256 = {},
                      .validation_bytes_per_token = 1.0};
  }
  if (options.source == "synthetic") {
    if (options.task == TaskKind::kLanguageModel) {
      return text_splits(
          synthetic_text(options.seed, options.synthetic_text_bytes, options.synthetic_text_period),
          options, "synthetic",
          fmt::format("period {}, seed {}", options.synthetic_text_period, options.seed));
    }
    ImageDataset train =
        synthetic_images(options.seed, Split::kTrain, options.synthetic_train_images);
    ImageDataset validation =
        synthetic_images(options.seed, Split::kValidation, options.synthetic_validation_images);
    std::string description =
        fmt::format("synthetic: {} train and {} validation images of 28x28, seed {}", train.size(),
                    validation.size(), options.seed);
    return DataSplits{.train = std::move(train),
                      .validation = std::move(validation),
                      .description = std::move(description),
                      .identity = {},
                      .tokenizer_sha256 = {},
                      .validation_bytes_per_token = 1.0};
  }

  const std::filesystem::path path(options.source);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw InvalidArgument(fmt::format(
        "data: '{}' is not kjv, fashion-mnist or synthetic, and no file of that name exists",
        options.source));
  }
  require_task(options, TaskKind::kLanguageModel);
  if (std::filesystem::is_directory(path, ec)) {
    if (!shards::is_shard_directory(path)) {
      throw InvalidArgument(fmt::format(
          "--data '{}' is a directory without token shards (no manifest.json, no llm.c-named "
          "*_train_*.bin); give a shard directory (zerodp prepare writes one), a text file, kjv "
          "or synthetic",
          options.source));
    }
    ShardSplits s = open_shard_splits(path, options.seq_len, options.vocab);
    return DataSplits{.train = std::move(s.train),
                      .validation = std::move(s.validation),
                      .description = std::move(s.description),
                      .identity = std::move(s.digest),
                      .tokenizer_sha256 = std::move(s.tokenizer_sha256),
                      .validation_bytes_per_token = s.validation_bytes_per_token};
  }
  return text_splits(read_text_corpus(path), options, path.filename().string(), path.string());
}

}  // namespace zerodp
