// zerodp tokenizer: train a SentencePiece tokenizer (BPE or unigram) that gives back every
// byte of any UTF-8 text, and encode text to token ids or decode ids to text with any
// SentencePiece .model (a Llama tokenizer.model included).
//
// encode writes the whole text as one sequence of ids (newlines are tokens like any other),
// as decimal ids separated by spaces, and starts a new output line after each token that
// ends a line of the text, so the output's lines follow the input's. decode reads decimal ids
// separated by any whitespace, however laid out.
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/core.h>

#include "commands.h"
#include "core/error.h"
#include "core/files.h"
#include "core/units.h"
#include "data/text.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/train.h"

namespace zerodp::cli {

namespace {

namespace fs = std::filesystem;
namespace tk = zerodp::tokenizer;
using Clock = std::chrono::steady_clock;

struct TrainFlags {
  std::vector<std::string> inputs;
  int vocab = 0;
  std::string type = "bpe";
  std::string out;
  uint64_t sample_lines = 0;
  int threads = 0;
  std::string cache_dir;
  bool quiet = false;
};

struct CodecFlags {
  std::string tokenizer;
  std::string input = "-";
  std::string out;  // empty: stdout
  bool bos = false;
  bool eos = false;
  bool quiet = false;
};

void print_train_progress(tk::TrainPhase phase, const tk::TrainResult& r, const TrainFlags& f) {
  switch (phase) {
    case tk::TrainPhase::kScanning:
      fmt::print(stderr, "zerodp tokenizer train: read {} lines, {} so far\n", r.lines,
                 format_bytes(static_cast<double>(r.bytes)));
      break;
    case tk::TrainPhase::kScanned:
      fmt::print(stderr,
                 "zerodp tokenizer train: {} file{}, {} lines ({} empty), {}, longest line {} "
                 "bytes, {} distinct characters (read in {})\n",
                 r.files, r.files == 1 ? "" : "s", r.lines, r.empty_lines,
                 format_bytes(static_cast<double>(r.bytes)), r.longest_line, r.characters,
                 format_seconds(r.scan_seconds));
      if (r.reserved_lines > 0) {
        fmt::print(stderr,
                   "zerodp tokenizer train: {} line{} hold U+2585, which SentencePiece's trainer "
                   "reserves: not trained on (they still encode, by byte fallback)\n",
                   r.reserved_lines, r.reserved_lines == 1 ? "" : "s");
      }
      break;
    case tk::TrainPhase::kTraining:
      fmt::print(stderr, "zerodp tokenizer train: training {} to {} pieces on {}...\n", f.type,
                 f.vocab,
                 f.sample_lines == 0 ? std::string("every line")
                                     : fmt::format("a sample of {} lines", f.sample_lines));
      break;
    case tk::TrainPhase::kTrained:
      fmt::print(stderr, "zerodp tokenizer train: {} pieces in {}\n", r.vocab_size,
                 format_seconds(r.train_seconds));
      break;
    case tk::TrainPhase::kWritten:
      fmt::print(stderr, "zerodp tokenizer train: wrote {} ({}, sha256 {})\n", f.out,
                 format_bytes(static_cast<double>(r.model_bytes)), r.sha256);
      break;
  }
}

int run_train(const TrainFlags& f) {
  tk::TrainOptions o;
  for (const std::string& in : f.inputs) o.inputs.push_back(resolve_text_input(in, f.cache_dir));
  o.vocab_size = f.vocab;
  o.type = tk::parse_model_type(f.type);
  o.output = f.out;
  o.sample_lines = f.sample_lines;
  o.threads = f.threads;
  tk::TrainProgress progress;
  if (!f.quiet) {
    progress = [&f](tk::TrainPhase phase, const tk::TrainResult& r) {
      print_train_progress(phase, r, f);
    };
  }
  tk::train_tokenizer(o, progress);
  return 0;
}

// A whole input: a file (checked as an input first) or "-", stdin.
std::string read_input(const std::string& what, const std::string& input) {
  std::string text;
  if (input == "-") {
    char buf[1 << 16];
    while (true) {
      const ssize_t n = ::read(STDIN_FILENO, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw IoError(fmt::format("{}: read error on stdin", what));
      if (n == 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    return text;
  }
  files::require_regular_input(what, input);
  files::read_in_chunks(what, input, [&](std::span<const std::byte> chunk) {
    text.append(reinterpret_cast<const char*>(chunk.data()), chunk.size());
  });
  return text;
}

// `text` to --out (whole or not at all) or to stdout.
void write_result(const CodecFlags& f, const std::string& text) {
  if (!f.out.empty()) {
    files::write_output("--out", f.out, text);
    return;
  }
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
    throw IoError("could not write the result to stdout");
  }
}

void check_paths(const CodecFlags& f, const std::string& what) {
  if (f.out.empty()) return;
  std::vector<files::Named> ins = {{"--tokenizer", f.tokenizer}};
  if (f.input != "-") ins.push_back({what, f.input});
  const files::Named outs[] = {{"--out", f.out}};
  files::check_distinct(ins, outs);
}

int run_encode(const CodecFlags& f) {
  check_paths(f, "TEXT");
  const tk::Tokenizer t(f.tokenizer);
  const std::string text = read_input("TEXT", f.input);
  const auto t0 = Clock::now();
  std::vector<int32_t> ids = t.encode(text);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (f.bos) ids.insert(ids.begin(), t.bos_id());
  if (f.eos) ids.push_back(t.eos_id());
  // A line break after each token that ends a line of the text, a space after the others.
  std::vector<bool> ends_line(static_cast<size_t>(t.vocab_size()));
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    const std::string p = t.piece(id);
    ends_line[static_cast<size_t>(id)] =
        t.is_byte(id) ? p == "<0x0A>" : !p.empty() && p.back() == '\n';
  }
  std::string out;
  out.reserve(ids.size() * 6);
  for (size_t i = 0; i < ids.size(); ++i) {
    fmt::format_to(std::back_inserter(out), "{}", ids[i]);
    const bool last = i + 1 == ids.size();
    out += (last || ends_line[static_cast<size_t>(ids[i])]) ? '\n' : ' ';
  }
  write_result(f, out);
  if (!f.quiet) {
    fmt::print(
        stderr, "zerodp tokenizer encode: {} -> {} tokens ({:.4f} per byte) in {} ({}/s){}\n",
        format_bytes(static_cast<double>(text.size())), ids.size(),
        text.empty() ? 0.0 : static_cast<double>(ids.size()) / static_cast<double>(text.size()),
        format_seconds(seconds),
        format_bytes(seconds > 0 ? static_cast<double>(text.size()) / seconds : 0.0),
        t.lossless() ? "" : "; this tokenizer is not lossless: decode may differ");
  }
  return 0;
}

// Decimal ids separated by whitespace; InvalidArgument naming the line of anything else.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& where) {
  std::vector<int32_t> ids;
  size_t line = 1;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '\n') ++line;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
      continue;
    }
    int64_t v = 0;
    size_t j = i;
    while (j < text.size() && text[j] >= '0' && text[j] <= '9' && v <= INT32_MAX) {
      v = v * 10 + (text[j] - '0');
      ++j;
    }
    const bool ended =
        j == text.size() || text[j] == ' ' || text[j] == '\t' || text[j] == '\n' || text[j] == '\r';
    if (j == i || !ended || v > INT32_MAX) {
      size_t k = i;
      while (k < text.size() && k < i + 20 && text[k] != ' ' && text[k] != '\n') ++k;
      throw InvalidArgument(fmt::format(
          "{}: line {}: '{}' is not a token id; decode reads the decimal ids, separated by "
          "whitespace, that zerodp tokenizer encode writes",
          where, line, text.substr(i, k - i)));
    }
    ids.push_back(static_cast<int32_t>(v));
    i = j;
  }
  return ids;
}

int run_decode(const CodecFlags& f) {
  check_paths(f, "IDS");
  const tk::Tokenizer t(f.tokenizer);
  const std::string where = f.input == "-" ? std::string("stdin") : f.input;
  const std::vector<int32_t> ids = parse_ids(read_input("IDS", f.input), where);
  const auto t0 = Clock::now();
  const std::string text = t.decode(ids);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  write_result(f, text);
  if (!f.quiet) {
    fmt::print(stderr, "zerodp tokenizer decode: {} tokens -> {} in {}\n", ids.size(),
               format_bytes(static_cast<double>(text.size())), format_seconds(seconds));
  }
  return 0;
}

int run_info(const CodecFlags& f) {
  const tk::Tokenizer t(f.tokenizer);
  fmt::print(
      "{}: {} pieces, {} (normalizer {}), unk {}, bos {}, eos {}, pad {}, {}\nsha256 {} ({} "
      "bytes)\n",
      f.tokenizer, t.vocab_size(), t.model_type(), t.normalizer().empty() ? "-" : t.normalizer(),
      t.unk_id(), t.bos_id(), t.eos_id(), t.pad_id(),
      t.lossless() ? "lossless (decode gives back any UTF-8 text it encoded)"
                   : "not lossless (its normalization or whitespace rules change some texts)",
      t.sha256(), t.file_bytes());
  return 0;
}

void add_train_flags(CLI::App& app, TrainFlags& f) {
  app.add_option("--input", f.inputs,
                 "UTF-8 text files to learn from, read line by line; kjv: the KJV Bible "
                 "(what train --data kjv uses)")
      ->required();
  app.add_option("--vocab", f.vocab,
                 "Pieces in the vocabulary, the 259 special ones (unk, bos, eos, 256 bytes) "
                 "included")
      ->required();
  app.add_option("--type", f.type, "bpe (default; Llama's kind) or unigram");
  app.add_option("--out", f.out, "The .model file to write (whole or not at all)")->required();
  app.add_option("--sample-lines", f.sample_lines,
                 "Train on a random sample of this many lines (fixed seed); default 0: every "
                 "line");
  app.add_option("--threads", f.threads, "SentencePiece's trainer threads (default: every core)");
  app.add_option("--cache-dir", f.cache_dir,
                 "Where --input kjv is prepared (default ~/.cache/zerodp)");
  app.add_flag("--quiet", f.quiet, "Print nothing on success");
  app.footer(
      "The tokenizer gives back every byte of any UTF-8 text: byte fallback (a character it\n"
      "has no piece for becomes its bytes), no normalization, spaces, tabs and newlines kept\n"
      "as they are, digits one by one. Ids: unk 0, bos 1, eos 2.\n"
      "Examples:\n"
      "  zerodp tokenizer train --input kjv --vocab 4096 --out kjv4k.model\n"
      "  zerodp tokenizer train --input a.txt b.txt --vocab 32000 --type unigram --out tok.model\n"
      "  zerodp tokenizer train --input big.txt --vocab 32000 --sample-lines 2000000 --out "
      "tok.model");
}

void add_codec_flags(CLI::App& app, CodecFlags& f, const char* input_help) {
  app.add_option("--tokenizer", f.tokenizer,
                 "A SentencePiece .model (zerodp tokenizer train's, a Llama tokenizer.model)")
      ->required();
  app.add_option("INPUT", f.input, input_help);
  app.add_option("--out", f.out, "Write here (whole or not at all) instead of stdout");
  app.add_flag("--quiet", f.quiet, "Print nothing on stderr");
}

}  // namespace

fs::path resolve_text_input(const std::string& input, const std::string& cache_dir) {
  if (input != "kjv") return input;
  const fs::path dir = cache_dir.empty() ? default_cache_dir() : fs::path(cache_dir);
  return load_kjv(dir).cache_file;
}

Runner add_tokenizer(CLI::App& app) {
  app.require_subcommand(1);
  auto train = std::make_shared<TrainFlags>();
  auto encode = std::make_shared<CodecFlags>();
  auto decode = std::make_shared<CodecFlags>();
  auto info = std::make_shared<CodecFlags>();
  CLI::App* train_app = app.add_subcommand("train", "Train a SentencePiece tokenizer on text");
  add_train_flags(*train_app, *train);
  CLI::App* encode_app = app.add_subcommand("encode", "Text to token ids");
  add_codec_flags(*encode_app, *encode, "The text to encode, a file or - for stdin (default)");
  encode_app->add_flag("--bos", encode->bos, "Start with the bos id");
  encode_app->add_flag("--eos", encode->eos, "End with the eos id");
  encode_app->footer(
      "The whole text is one sequence; the ids are written in decimal, separated by spaces,\n"
      "with a line break after each token that ends a line of the text.\n"
      "Examples:\n"
      "  zerodp tokenizer encode --tokenizer kjv4k.model book.txt --out book.ids\n"
      "  echo 'In the beginning' | zerodp tokenizer encode --tokenizer kjv4k.model");
  CLI::App* decode_app = app.add_subcommand("decode", "Token ids to text");
  add_codec_flags(*decode_app, *decode, "Decimal ids separated by whitespace, or - (default)");
  decode_app->footer(
      "Writes exactly the decoded bytes. Control ids (bos, eos) decode to nothing.\n"
      "Examples:\n"
      "  zerodp tokenizer decode --tokenizer kjv4k.model book.ids --out book.txt\n"
      "  zerodp tokenizer encode --tokenizer t.model a.txt | zerodp tokenizer decode "
      "--tokenizer t.model | cmp - a.txt");
  CLI::App* info_app = app.add_subcommand("info", "A tokenizer's size, special ids and settings");
  info_app->add_option("--tokenizer", info->tokenizer, "A SentencePiece .model")->required();
  app.footer(
      "Examples:\n"
      "  zerodp tokenizer train --input kjv --vocab 4096 --out kjv4k.model\n"
      "  zerodp tokenizer encode --tokenizer kjv4k.model text.txt > text.ids\n"
      "  zerodp tokenizer decode --tokenizer kjv4k.model text.ids | cmp - text.txt\n"
      "  zerodp tokenizer info --tokenizer llama/tokenizer.model\n"
      "Run 'zerodp tokenizer SUBCOMMAND --help' for a subcommand's options.");
  return [=](Launch) {
    if (train_app->parsed()) return run_train(*train);
    if (encode_app->parsed()) return run_encode(*encode);
    if (decode_app->parsed()) return run_decode(*decode);
    if (info_app->parsed()) return run_info(*info);
    return kExitUsage;
  };
}

}  // namespace zerodp::cli
