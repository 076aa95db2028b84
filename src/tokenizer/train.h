// Training a SentencePiece tokenizer whose decode(encode(x)) == x for any UTF-8 text.
//
// The inputs are read twice, a line at a time: once by zerodp (counting lines, bytes,
// characters, the longest line, and checking that every line is UTF-8), then by
// SentencePiece's trainer through a sentence iterator. Nothing is dropped silently:
// SentencePiece skips lines longer than max_sentence_length (raised here to the longest line;
// a line past its limit of 1 GiB is refused), empty lines (nothing to learn) and lines
// holding U+2585 (a mark it reserves); the last two are counted in the result. The settings
// (docs in train.cc) are SentencePiece's BPE or unigram with byte fallback, identity
// normalization, whitespace kept as it is, digits split, every character of the text covered,
// unk 0 / bos 1 / eos 2 and no pad.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace zerodp::tokenizer {

enum class ModelType { kBpe, kUnigram };

// "bpe" / "unigram"; InvalidArgument naming `what` and the choices otherwise.
ModelType parse_model_type(const std::string& text, const std::string& what = "--type");
const char* model_type_name(ModelType type);

struct TrainOptions {
  std::vector<std::filesystem::path> inputs;  // text files, UTF-8, read line by line
  int vocab_size = 0;
  ModelType type = ModelType::kBpe;
  std::filesystem::path output;  // the .model, written whole or not at all
  // 0: train on every line. N: SentencePiece samples N lines (reservoir, fixed seed).
  uint64_t sample_lines = 0;
  int threads = 0;  // SentencePiece's trainer threads; 0: every core (at most 128)
};

// The pieces every trained vocabulary starts with: unk, bos, eos and the 256 byte pieces.
inline constexpr int kSpecialPieces = 3 + 256;

struct TrainResult {
  uint64_t files = 0;
  uint64_t lines = 0;  // every line of every input
  uint64_t bytes = 0;
  uint64_t empty_lines = 0;     // nothing to learn from (still encoded, as newlines)
  uint64_t reserved_lines = 0;  // holding U+2585, which SentencePiece's trainer skips
  uint64_t longest_line = 0;    // bytes
  uint64_t characters = 0;      // distinct code points (the space counted as U+2581)
  // Pieces the vocabulary must hold: kSpecialPieces + characters (tabs and NULs excluded:
  // SentencePiece leaves them to byte fallback).
  uint64_t min_vocab = 0;
  // The most pieces the text can give: min_vocab + the distinct substrings of its words that
  // a piece may be (2 to 16 characters, digits alone, ...); 0 when that is more than the
  // vocabulary asked for (not counted further).
  uint64_t max_vocab = 0;
  int vocab_size = 0;
  uint64_t model_bytes = 0;
  std::string sha256;  // of the model file written
  double scan_seconds = 0;
  double train_seconds = 0;  // SentencePiece's loading and training
  double write_seconds = 0;
};

enum class TrainPhase {
  kScanning,  // the first read, now and then (every 256 MiB): lines and bytes so far
  kScanned,   // the first read done and its checks passed: every count of the inputs known
  kTraining,  // SentencePiece has taken every line and trains now
  kTrained,
  kWritten,
};
using TrainProgress = std::function<void(TrainPhase, const TrainResult&)>;

// Trains and writes `options.output` (files::Output: atomic, never over an input). Throws
//   InvalidArgument  for a missing or unreadable-kind input, an empty one, text that is not
//                    UTF-8 (naming file, line and byte), a vocabulary too small for the
//                    characters or too large for the text (naming what fits), an output onto an
//                    input;
//   IoError          when an input cannot be read or changed while training, or the output
//                    cannot be written;
//   Error            when SentencePiece fails otherwise (its message).
TrainResult train_tokenizer(const TrainOptions& options, const TrainProgress& progress = {});

}  // namespace zerodp::tokenizer
