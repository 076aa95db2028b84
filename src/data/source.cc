#include "data/source.h"

#include <memory>
#include <span>

#include <fmt/core.h>

#include "core/error.h"
#include "core/files.h"
#include "data/encoded_text.h"
#include "data/shard_dataset.h"
#include "data/shards.h"
#include "data/synthetic.h"
#include "data/text.h"
#include "tokenizer/tokenizer.h"

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

// The identity a checkpoint keeps for text encoded as the run starts: the tokenizer's, since
// the in-memory sources' bytes are not part of it (kjv's are pinned, a file's are the user's).
std::string encoded_identity(const std::string& tokenizer_sha256) {
  return "text encoded by the tokenizer of sha256 " + tokenizer_sha256;
}

DataSplits text_splits(std::vector<uint8_t> bytes, const DataOptions& options,
                       const std::string& name, const std::string& origin) {
  if (!options.tokenizer.empty()) {
    EncodedTextSplits e = encode_text_splits(bytes, name, options.tokenizer, options.seq_len,
                                             options.vocab, options.validation_fraction);
    return DataSplits{.train = std::move(e.train),
                      .validation = std::move(e.validation),
                      .description = fmt::format("{}; text from {}", e.description, origin),
                      .identity = encoded_identity(e.tokenizer_sha256),
                      .tokenizer_sha256 = e.tokenizer_sha256,
                      .validation_bytes_per_token = e.validation_bytes_per_token};
  }
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
  std::error_code ec;
  if (!options.tokenizer.empty() &&
      (options.source == "fashion-mnist" || options.source == "synthetic" ||
       std::filesystem::is_directory(options.source, ec))) {
    throw InvalidArgument(fmt::format(
        "--tokenizer encodes text, and --data {} is {}; give kjv or a text file with it, or "
        "leave --tokenizer out",
        options.source,
        options.source == "fashion-mnist" ? "images"
        : options.source == "synthetic"
            ? "synthetic bytes"
            : "a directory (token shards are tokens already: their manifest names the tokenizer)"));
  }
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

uint64_t data_vocabulary(const std::string& source, const std::filesystem::path& tokenizer) {
  if (!tokenizer.empty())
    return static_cast<uint64_t>(tokenizer::Tokenizer(tokenizer).vocab_size());
  std::error_code ec;
  if (!std::filesystem::is_directory(source, ec) || !shards::is_shard_directory(source)) return 0;
  const std::filesystem::path manifest = std::filesystem::path(source) / "manifest.json";
  if (!std::filesystem::exists(manifest, ec)) {
    throw InvalidArgument(fmt::format(
        "--data {}: llm.c's shards without manifest.json do not say their vocabulary; give "
        "--vocab (50257 for GPT-2's tokenizer, 128256 for Llama 3's)",
        source));
  }
  std::string text;
  files::require_regular_input("--data", manifest);
  files::read_in_chunks("--data", manifest, [&](std::span<const std::byte> b) {
    text.append(reinterpret_cast<const char*>(b.data()), b.size());
  });
  return shards::parse_manifest(text, manifest.string()).vocab_size;
}

}  // namespace zerodp
