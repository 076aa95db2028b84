// open_data: the `--data` choice resolved into a training and a validation set.
//
// Sources (the value of `--data`):
//   kjv            the KJV text (data/text.h), byte-level language modelling
//   fashion-mnist  Fashion-MNIST from the Debian package (data/idx.h), classification
//   synthetic      data/synthetic.h, of the kind `task` asks for
//   a directory    token shards (data/shards.h: zerodp prepare's, with manifest.json, or
//                  llm.c's *_train_*.bin / *_val_*.bin), read from disk as they are needed
//   anything else  a path to a file used as a byte corpus (write ./kjv for a file named so)
// Text sources split into train / validation with split_text(); Fashion-MNIST uses its own
// train and t10k files. With a tokenizer, the KJV or a text file is encoded into tokens as
// the run starts (data/encoded_text.h) instead of read as bytes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "data/dataset.h"
#include "data/idx.h"

namespace zerodp {

struct DataOptions {
  std::string source = "kjv";
  // What the model consumes. A source of the other kind is an InvalidArgument (e.g. the
  // KJV text for an image classifier), never a silent substitute.
  TaskKind task = TaskKind::kLanguageModel;
  int64_t seq_len = 64;               // T, language modelling only
  uint64_t vocab = 256;               // the model's vocabulary: token shards are checked against it
  double validation_fraction = 0.02;  // text sources: the held-out tail
  uint64_t seed = 0;                  // synthetic content
  std::filesystem::path tokenizer;    // a SentencePiece .model for kjv or a text file; empty: bytes
  std::filesystem::path cache_dir;    // kjv; empty = default_cache_dir()
  std::filesystem::path fashion_mnist_dir = kFashionMnistDir;
  std::string bible_program = "bible";
  uint64_t synthetic_text_bytes = uint64_t{1} << 20;  // 1 MiB
  int synthetic_text_period = 64;
  uint64_t synthetic_train_images = 10000;
  uint64_t synthetic_validation_images = 1000;
};

// Throws InvalidArgument (unknown source that is no file, wrong task kind, bad seq_len, a
// tokenizer for a source that is not text),
// IoError (missing package or file) or CorruptData (a file that fails its checks).
DataSplits open_data(const DataOptions& options);

// The vocabulary a source brings, 0 when it brings none (the byte-level sources): a
// tokenizer's size, or a shard directory's (its manifest.json alone is read; the shards are
// opened and checked once, by open_data). Throws InvalidArgument for llm.c's shards, which say
// none, naming --vocab; what Tokenizer or parse_manifest throw for a bad file.
uint64_t data_vocabulary(const std::string& source, const std::filesystem::path& tokenizer);

}  // namespace zerodp
