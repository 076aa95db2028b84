// SentencePiece's trainer, set up so that the tokenizer it writes loses nothing:
//
//   byte_fallback=true             a character outside the vocabulary becomes its UTF-8 bytes
//                                  (<0xE2> <0x82> <0xAC>), never <unk>;
//   normalization_rule_name=identity   no NFKC: "ﬁ", full-width letters, NBSP stay as they are;
//   remove_extra_whitespaces=false     leading, trailing and repeated spaces are kept;
//   add_dummy_prefix=false         no space invented before the text (which decode would then
//                                  have to guess away), so a text's pieces are the pieces of
//                                  its parts, and texts can be encoded in pieces;
//   allow_whitespace_only_pieces=true  runs of spaces (indentation) may become one piece;
//   split_digits=true              numbers are digit by digit (as Llama's), so no arithmetic
//                                  hides in arbitrary multi-digit pieces;
//   character_coverage=1.0         every character of the text gets a piece of its own;
//   unk 0, bos 1, eos 2, no pad    Llama's ids;
//   hard_vocab_limit=false         a vocabulary the text cannot fill ends training with what
//                                  it gave, and zerodp says what fits (rather than
//                                  SentencePiece's "Vocabulary size too high" after training);
//   max_sentence_length            the longest line seen (SentencePiece skips longer lines);
//   input_sentence_size            0, every line, unless TrainOptions::sample_lines.
//
// A newline is one token either way: the trainer sees lines, so no piece holds "\n", and
// encode gives it byte fallback's <0x0A>, as Llama 2 does. A user_defined_symbol "\n" would
// only give the same byte a second id.
#include "tokenizer/train.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <fmt/core.h>

#include "core/error.h"
#include "core/files.h"
#include "core/sha256.h"
#include "core/units.h"
#include "tokenizer/tokenizer.h"

namespace zerodp::tokenizer {

namespace {

namespace fs = std::filesystem;
namespace spm = sentencepiece;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kDefaultMaxSentence = 4192;             // SentencePiece's default
constexpr uint64_t kMaxSentenceLimit = uint64_t{1} << 30;  // the most it accepts
constexpr uint64_t kScanReportBytes = uint64_t{256} << 20;
constexpr char32_t kSpaceMark = 0x2581;
constexpr std::string_view kReservedMark = "\xe2\x96\x85";  // U+2585, SentencePiece's unk mark

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One input's lines, "\n" removed (a "\r" before it stays part of the line), counted.
class LineReader {
 public:
  explicit LineReader(const fs::path& path) : path_(path), in_(path, std::ios::binary) {
    if (!in_) {
      throw IoError(fmt::format("--input '{}': cannot open it for reading: {}", path.string(),
                                std::strerror(errno)));
    }
  }
  bool next(std::string& line) {
    if (!std::getline(in_, line)) {
      if (in_.bad()) {
        throw IoError(
            fmt::format("--input '{}': read error after line {}", path_.string(), lines_));
      }
      return false;
    }
    ++lines_;
    bytes_ += line.size() + (in_.eof() ? 0 : 1);
    return true;
  }
  uint64_t lines() const { return lines_; }
  uint64_t bytes() const { return bytes_; }

 private:
  fs::path path_;
  std::ifstream in_;
  uint64_t lines_ = 0;
  uint64_t bytes_ = 0;
};

// The first read: counts, characters, the bound on pieces, UTF-8 checked.
class Scan {
 public:
  // `budget`: substrings are collected until there are this many (the bound is of no use
  // past the vocabulary asked for).
  explicit Scan(uint64_t budget) : budget_(budget), seen_(0x110000, false) {}

  void file(const fs::path& path, TrainResult& r, const TrainProgress& progress) {
    LineReader in(path);
    std::string line;
    uint64_t reported = r.bytes;
    while (in.next(line)) {
      add_line(path, in.lines(), line, r);
      if (progress && r.bytes + in.bytes() - reported >= kScanReportBytes) {
        TrainResult now = r;
        now.bytes += in.bytes();
        progress(TrainPhase::kScanning, now);
        reported = now.bytes;
      }
    }
    r.bytes += in.bytes();
    ++r.files;
  }

  uint64_t characters() const { return characters_; }
  // How many pieces of two or more characters the text allows, or nullopt when at least
  // the budget.
  std::optional<uint64_t> pieces() const {
    if (pieces_.size() >= budget_) return std::nullopt;
    return pieces_.size();
  }
  uint64_t long_lines() const { return long_lines_; }

 private:
  void add_line(const fs::path& path, uint64_t number, const std::string& line, TrainResult& r) {
    size_t bad = 0;
    if (!valid_utf8(line, &bad)) {
      throw InvalidArgument(fmt::format(
          "--input '{}': line {} is not UTF-8 at byte {} of the line (0x{:02X}); a tokenizer is "
          "trained on UTF-8 text (convert it first, e.g. iconv -f LATIN1 -t UTF-8)",
          path.string(), number, bad + 1, static_cast<unsigned char>(line[bad])));
    }
    ++r.lines;
    r.longest_line = std::max<uint64_t>(r.longest_line, line.size());
    if (line.empty()) {
      ++r.empty_lines;
      return;
    }
    if (line.find(kReservedMark) != std::string::npos) {
      ++r.reserved_lines;
      return;
    }
    if (line.size() > kMaxSentenceLimit) {
      ++long_lines_;
      return;
    }
    // Words as SentencePiece's trainer splits them: a run of spaces and the run of other
    // characters after it. No piece crosses from one word into the next.
    std::vector<char32_t> word;
    for (size_t i = 0; i < line.size();) {
      char32_t c = decode_one(line, i);
      if (c == U' ') c = kSpaceMark;  // as the normalizer writes it
      if (c == kSpaceMark && !word.empty() && word.back() != kSpaceMark) {
        add_word(word);
        word.clear();
      }
      word.push_back(c);
      if (c != U'\t' && c != 0 && !seen_[c]) {  // tab and NUL: left to byte fallback
        seen_[c] = true;
        ++characters_;
      }
    }
    add_word(word);
  }

  static char32_t decode_one(const std::string& s, size_t& i) {  // valid UTF-8 only
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    char32_t c = len == 1 ? b : b & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    i += len;
    return c;
  }

  // Every piece SentencePiece makes beyond single characters, BPE's (which include pairs that
  // no longer occur once their parts merged otherwise) and unigram's, is a substring of a word
  // of 2 to 16 characters (max_sentencepiece_length) that a piece may be: no tab or NUL, no
  // digit with anything else (split_digits), the space mark only first or throughout.
  void add_word(const std::vector<char32_t>& word) {
    if (word.size() < 2 || pieces_.size() >= budget_) return;
    // Words seen are skipped; the set of them is only a shortcut, so it is not let grow past
    // a million (the pieces' set is bounded by the budget).
    if (words_.size() >= (size_t{1} << 20)) words_.clear();
    if (!words_.emplace(word.begin(), word.end()).second) return;
    constexpr size_t kMaxPieceChars = 16;
    for (size_t b = 0; b + 1 < word.size(); ++b) {
      bool digit = false, all_space = true, inner_space = false;
      for (size_t e = b; e < word.size() && e - b < kMaxPieceChars; ++e) {
        const char32_t c = word[e];
        if (c == U'\t' || c == 0) break;
        digit = digit || (c >= U'0' && c <= U'9') || (c >= 0xFF10 && c <= 0xFF19);
        all_space = all_space && c == kSpaceMark;
        inner_space = inner_space || (e > b && c == kSpaceMark);
        if (e == b) continue;
        if (digit || (inner_space && !all_space)) break;  // and every longer one
        pieces_.emplace(word.begin() + static_cast<std::ptrdiff_t>(b),
                        word.begin() + static_cast<std::ptrdiff_t>(e + 1));
        if (pieces_.size() >= budget_) return;
      }
    }
  }

  uint64_t budget_;
  std::vector<bool> seen_;
  uint64_t characters_ = 0;
  std::unordered_set<std::u32string> words_;
  std::unordered_set<std::u32string> pieces_;
  uint64_t long_lines_ = 0;
};

// SentencePiece's trainer reads the inputs again through this, a line at a time. Errors do
// not cross SentencePiece's code as exceptions: the iterator ends, reports a failed status,
// and the exception is thrown again once Train returns.
class LineIterator final : public spm::SentenceIterator {
 public:
  LineIterator(const std::vector<fs::path>& inputs, const TrainResult& scanned,
               std::function<void()> at_end)
      : inputs_(inputs), scanned_(scanned), at_end_(std::move(at_end)) {
    advance();
  }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  spm::util::Status status() const override {
    if (!error_) return {};
    return spm::util::Status(spm::util::StatusCode::kDataLoss, "zerodp: an input failed");
  }
  std::exception_ptr error() const { return error_; }

 private:
  void advance() {
    if (done_) return;
    try {
      while (true) {
        if (reader_ && reader_->next(line_)) return;
        if (reader_) {
          lines_ += reader_->lines();
          bytes_ += reader_->bytes();
          reader_.reset();
        }
        if (next_input_ == inputs_.size()) break;
        reader_ = std::make_unique<LineReader>(inputs_[next_input_++]);
      }
      if (lines_ != scanned_.lines || bytes_ != scanned_.bytes) {
        throw IoError(fmt::format(
            "--input: the inputs changed while the tokenizer trained ({} lines and {} bytes "
            "when first read, {} lines and {} bytes the second time); train on files nothing "
            "writes to",
            scanned_.lines, scanned_.bytes, lines_, bytes_));
      }
      done_ = true;
      line_.clear();
      if (at_end_) at_end_();
    } catch (...) {
      error_ = std::current_exception();
      done_ = true;
      line_.clear();
    }
  }

  const std::vector<fs::path>& inputs_;
  const TrainResult& scanned_;
  std::function<void()> at_end_;
  std::unique_ptr<LineReader> reader_;
  size_t next_input_ = 0;
  std::string line_;
  uint64_t lines_ = 0;
  uint64_t bytes_ = 0;
  bool done_ = false;
  std::exception_ptr error_;
};

std::unordered_map<std::string, std::string> trainer_settings(const TrainOptions& o,
                                                              const TrainResult& scanned) {
  int threads = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp(threads, 1, 128);
  const uint64_t max_sentence =
      std::clamp<uint64_t>(scanned.longest_line, kDefaultMaxSentence, kMaxSentenceLimit);
  return {
      {"model_type", model_type_name(o.type)},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "true"},
      {"character_coverage", "1.0"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"hard_vocab_limit", "false"},
      {"max_sentence_length", std::to_string(max_sentence)},
      {"input_sentence_size", std::to_string(o.sample_lines)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(threads)},
      // Errors come back as statuses and are reported by zerodp; its INFO and WARNING lines
      // (every setting, a line per 20 merges) are not printed.
      {"minloglevel", "2"},
  };
}

void check_options(const TrainOptions& o) {
  if (o.inputs.empty()) {
    throw InvalidArgument("--input: no text to train on; give one or more UTF-8 text files");
  }
  if (o.vocab_size <= kSpecialPieces) {
    throw InvalidArgument(fmt::format(
        "--vocab {}: a vocabulary holds {} special pieces (unk, bos, eos and 256 bytes) and a "
        "piece for every character of the text, so it needs more than {}; try 1000 to 32000",
        o.vocab_size, kSpecialPieces, kSpecialPieces));
  }
  if (o.sample_lines > 0 && o.sample_lines <= 100) {
    throw InvalidArgument(fmt::format(
        "--sample-lines {}: SentencePiece samples more than 100 lines; use 0 (every line, the "
        "default) or a sample of more than 100",
        o.sample_lines));
  }
  std::vector<files::Named> ins;
  for (const fs::path& p : o.inputs) {
    files::require_regular_input("--input", p);
    ins.push_back({"--input", p});
  }
  const files::Named outs[] = {{"--out", o.output}};
  files::check_distinct(ins, outs);
  files::probe_output("--out", o.output);  // before minutes of training, not after
}

std::string inputs_text(const TrainOptions& o) {
  if (o.inputs.size() == 1) return fmt::format("'{}'", o.inputs.front().string());
  return fmt::format("the {} inputs", o.inputs.size());
}

void check_scanned(const TrainOptions& o, const TrainResult& r) {
  if (r.lines == r.empty_lines + r.reserved_lines) {
    throw InvalidArgument(fmt::format("--input: {} holds no text to train on ({} lines, {})",
                                      inputs_text(o), r.lines,
                                      format_bytes(static_cast<double>(r.bytes))));
  }
  // A sample's characters are not known before training: SentencePiece checks them.
  if (o.sample_lines == 0 && static_cast<uint64_t>(o.vocab_size) < r.min_vocab) {
    throw InvalidArgument(fmt::format(
        "--vocab {} is too small for {}: it holds {} distinct characters, each needs a piece, "
        "and {} pieces are special (unk, bos, eos, 256 bytes); use --vocab {} or more",
        o.vocab_size, inputs_text(o), r.characters, kSpecialPieces, r.min_vocab));
  }
  if (r.max_vocab != 0 && static_cast<uint64_t>(o.vocab_size) > r.max_vocab) {
    throw InvalidArgument(fmt::format(
        "--vocab {} is too large for {}: it gives at most {} pieces ({} special, {} characters, "
        "{} distinct substrings of its words that a piece may be); use --vocab {} or less "
        "(training may end below that, and then says where), or train on more text",
        o.vocab_size, inputs_text(o), r.max_vocab, kSpecialPieces, r.characters,
        r.max_vocab - r.min_vocab, r.max_vocab));
  }
}

// SentencePiece's trainer on the inputs; the serialized model.
std::string run_trainer(const TrainOptions& o, TrainResult& r, const TrainProgress& progress) {
  const auto t0 = Clock::now();
  LineIterator lines(o.inputs, r, [&] {
    if (progress) progress(TrainPhase::kTraining, r);
  });
  std::string model;
  const spm::util::Status status =
      spm::SentencePieceTrainer::Train(trainer_settings(o, r), &lines, &model);
  r.train_seconds = seconds_since(t0);
  if (lines.error()) std::rethrow_exception(lines.error());
  if (!status.ok()) {
    const std::string text = status.ToString();
    if (text.find("smaller than required_chars") != std::string::npos) {
      throw InvalidArgument(fmt::format(
          "--vocab {} is too small for the {} lines sampled from {}: every character needs a "
          "piece (SentencePiece: {}); use a larger --vocab",
          o.vocab_size, o.sample_lines, inputs_text(o), text));
    }
    throw Error(fmt::format("SentencePiece could not train a {} tokenizer of {} pieces on {}: {}",
                            model_type_name(o.type), o.vocab_size, inputs_text(o), text));
  }
  return model;
}

}  // namespace

ModelType parse_model_type(const std::string& text, const std::string& what) {
  if (text == "bpe") return ModelType::kBpe;
  if (text == "unigram") return ModelType::kUnigram;
  throw InvalidArgument(
      fmt::format("{} '{}' is unknown; use bpe (byte-pair merges, as Llama's tokenizer) or unigram",
                  what, text));
}

const char* model_type_name(ModelType type) { return type == ModelType::kBpe ? "bpe" : "unigram"; }

TrainResult train_tokenizer(const TrainOptions& o, const TrainProgress& progress) {
  check_options(o);
  TrainResult r;
  auto t0 = Clock::now();
  Scan scan(static_cast<uint64_t>(o.vocab_size) + 1);
  for (const fs::path& p : o.inputs) scan.file(p, r, progress);
  r.characters = scan.characters();
  r.min_vocab = kSpecialPieces + r.characters;
  if (scan.pieces()) r.max_vocab = r.min_vocab + *scan.pieces();
  r.scan_seconds = seconds_since(t0);
  if (scan.long_lines() > 0) {
    throw InvalidArgument(fmt::format(
        "--input: {} holds {} line(s) longer than {}, more than SentencePiece's trainer takes; "
        "break them into lines",
        inputs_text(o), scan.long_lines(), format_bytes(static_cast<double>(kMaxSentenceLimit))));
  }
  check_scanned(o, r);
  if (progress) progress(TrainPhase::kScanned, r);

  const std::string model = run_trainer(o, r, progress);
  spm::SentencePieceProcessor check;
  const spm::util::Status loaded = check.LoadFromSerializedProto(model);
  if (!loaded.ok()) {
    throw Error(fmt::format("SentencePiece trained a model it cannot load: {}", loaded.ToString()));
  }
  r.vocab_size = check.GetPieceSize();
  if (r.vocab_size < o.vocab_size) {
    throw InvalidArgument(fmt::format(
        "--vocab {} is too large for {}: {} training ended at {} pieces, all the text gave "
        "with these settings; use --vocab {} or less, or train on more text",
        o.vocab_size, inputs_text(o), model_type_name(o.type), r.vocab_size, r.vocab_size));
  }
  if (progress) progress(TrainPhase::kTrained, r);

  t0 = Clock::now();
  files::write_output("--out", o.output, model);
  r.model_bytes = model.size();
  r.sha256 = sha256_hex(model);
  r.write_seconds = seconds_since(t0);
  if (progress) progress(TrainPhase::kWritten, r);
  return r;
}

}  // namespace zerodp::tokenizer
