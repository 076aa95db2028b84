// zerodp prepare: text files, directories of them and JSONL files, tokenized into a directory
// of llm.c token shards (train and validation) with zerodp's manifest.json, streamed: the
// process holds a few blocks per thread, never a whole input.
//
// The pipeline: one reader (this thread) cuts the inputs into blocks (data/corpus.h) and
// groups them into batches; --threads workers encode batches (parsing JSONL lines, checking
// UTF-8, then Tokenizer::encode); this thread appends each batch's tokens to the writer in
// input order, so the shards are the same bytes whatever the thread count. At most two
// batches per worker are in flight.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <fmt/core.h>

#include "commands.h"
#include "core/error.h"
#include "core/files.h"
#include "core/mutex.h"
#include "core/sysinfo.h"
#include "core/units.h"
#include "data/corpus.h"
#include "data/shards.h"
#include "tokenizer/tokenizer.h"

namespace zerodp::cli {

namespace {

namespace fs = std::filesystem;
namespace tk = zerodp::tokenizer;
using Clock = std::chrono::steady_clock;
using corpus::Block;

constexpr uint64_t kDefaultValEvery = 50;
constexpr uint64_t kDefaultBlockBytes = 8192;
// A batch, the unit a worker takes: blocks until this much text (or kBatchBlocks blocks).
constexpr size_t kBatchBytes = size_t{256} << 10;
constexpr size_t kBatchBlocks = 4096;

struct Flags {
  std::string tokenizer;
  std::string out;
  std::vector<std::string> inputs;
  std::string text_field = "text";
  uint64_t val_every = kDefaultValEvery;
  std::string block_size = "8KiB";
  uint64_t tokens_per_shard = 100'000'000;
  std::string prefix = "shard";
  int threads = 0;
  bool skip_bad = false;
  std::string cache_dir;
  bool quiet = false;
};

// One block encoded: its tokens, or why (some of) its text was dropped.
struct Encoded {
  std::vector<int32_t> ids;
  uint64_t text_bytes = 0;      // the text the ids came from
  bool empty_document = false;  // a document with no text (an empty file, a JSONL "")
  const char* drop_reason = nullptr;
  uint64_t dropped = 0;  // lines dropped under drop_reason (--skip-bad)
};

struct Batch {
  std::vector<Block> blocks;
  std::vector<Encoded> encoded;
  size_t text_bytes = 0;
};

// The line and byte-in-line of `offset` into a block that starts at `first_line`.
std::pair<uint64_t, size_t> line_of(const Block& b, size_t offset) {
  const std::string_view before(b.text.data(), offset);
  const auto line = b.line + static_cast<uint64_t>(std::count(before.begin(), before.end(), '\n'));
  const size_t nl = before.rfind('\n');
  return {line, nl == std::string_view::npos ? offset : offset - nl - 1};
}

class Encoder {
 public:
  Encoder(const tk::Tokenizer& t, const Flags& f, const std::vector<corpus::InputFile>& inputs)
      : t_(t), f_(f), inputs_(inputs) {}

  void encode(Batch& batch) const {
    batch.encoded.resize(batch.blocks.size());
    for (size_t i = 0; i < batch.blocks.size(); ++i) {
      batch.encoded[i] = encode_block(batch.blocks[i]);
    }
  }

 private:
  Encoded encode_block(const Block& b) const {
    Encoded e;
    size_t bad = 0;
    const bool jsonl = inputs_[b.input].format == corpus::Format::kJsonl;
    if (!tk::valid_utf8(b.text, &bad)) {
      if (!f_.skip_bad) refuse_utf8(b, bad);
      e.drop_reason = "invalid_utf8_lines";
      if (jsonl) {
        e.dropped = 1;
        return e;
      }
      return encode_valid_lines(b);
    }
    if (!jsonl) {
      e.empty_document = b.text.empty();
      e.text_bytes = b.text.size();
      e.ids = t_.encode(b.text);
      return e;
    }
    corpus::JsonlText line = corpus::parse_jsonl_line(b.text, f_.text_field);
    if (line.problem != corpus::LineProblem::kNone) {
      if (!f_.skip_bad) {
        throw InvalidArgument(fmt::format(
            "input '{}': line {} {}; each line of a .jsonl file is a JSON object with a string "
            "field \"{}\" (--text-field names another); --skip-bad drops such lines, counted",
            where(b), b.line, line.detail, f_.text_field));
      }
      e.drop_reason = corpus::problem_reason(line.problem);
      e.dropped = 1;
      return e;
    }
    e.empty_document = line.text.empty();
    e.text_bytes = line.text.size();
    e.ids = t_.encode(line.text);
    return e;
  }

  // --skip-bad: a text block's lines that are UTF-8, encoded; the others counted.
  Encoded encode_valid_lines(const Block& b) const {
    Encoded e;
    e.drop_reason = "invalid_utf8_lines";
    std::string kept;
    for (size_t at = 0; at < b.text.size();) {
      const size_t nl = b.text.find('\n', at);
      const size_t end = nl == std::string::npos ? b.text.size() : nl + 1;
      const std::string_view line(b.text.data() + at, end - at);
      if (tk::valid_utf8(line)) {
        kept.append(line);
      } else {
        ++e.dropped;
      }
      at = end;
    }
    e.text_bytes = kept.size();
    e.ids = t_.encode(kept);
    return e;
  }

  [[noreturn]] void refuse_utf8(const Block& b, size_t bad) const {
    const bool jsonl = inputs_[b.input].format == corpus::Format::kJsonl;
    const auto [line, byte] = jsonl ? std::pair<uint64_t, size_t>{b.line, bad} : line_of(b, bad);
    throw InvalidArgument(fmt::format(
        "input '{}': line {} is not UTF-8 at byte {} of the line (0x{:02X}, byte {} of the "
        "file); convert the text to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8), or --skip-bad to "
        "drop such lines, counted",
        where(b), line, byte, static_cast<unsigned char>(b.text[bad]), b.offset + bad));
  }

  std::string where(const Block& b) const { return inputs_[b.input].path.string(); }

  const tk::Tokenizer& t_;
  const Flags& f_;
  const std::vector<corpus::InputFile>& inputs_;
};

// Workers that run tasks in any order; the caller keeps the futures in order.
class Workers {
 public:
  explicit Workers(int count) {
    for (int i = 0; i < count; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~Workers() {
    {
      MutexLock lock(mu_);
      stop_ = true;
      queue_.clear();  // abandoned: their futures report broken promises, never read
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  std::future<void> submit(std::function<void()> task) {
    std::packaged_task<void()> job(std::move(task));
    std::future<void> done = job.get_future();
    {
      MutexLock lock(mu_);
      queue_.push_back(std::move(job));
    }
    cv_.notify_one();
    return done;
  }

 private:
  void loop() {
    while (true) {
      std::packaged_task<void()> job;
      {
        MutexLock lock(mu_);
        while (!stop_ && queue_.empty()) cv_.wait(mu_);
        if (stop_) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job();  // an exception is kept in the future
    }
  }

  Mutex mu_;
  CondVar cv_;
  std::deque<std::packaged_task<void()>> queue_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// Counts for the summary.
struct Totals {
  uint64_t blocks[2] = {0, 0};
  uint64_t documents[2] = {0, 0};  // runs of a document's blocks in one split (separators)
  uint64_t text_bytes[2] = {0, 0};
  uint64_t input_documents = 0;  // documents of the inputs that gave tokens
  uint64_t tokens = 0;
  std::map<std::string, uint64_t> dropped;
};

// Appends encoded blocks in input order: a document's consecutive blocks in one split are one
// document there, marked by bos before it (or eos after it, for a tokenizer without bos).
class Appender {
 public:
  Appender(shards::ShardSetWriter& writer, const tk::Tokenizer& t) : writer_(writer) {
    if (t.bos_id() >= 0) bos_ = static_cast<uint32_t>(t.bos_id());
    if (t.bos_id() < 0 && t.eos_id() >= 0) eos_ = static_cast<uint32_t>(t.eos_id());
  }

  void add(const Block& b, uint64_t val_every, Encoded& e) {
    if (e.drop_reason != nullptr && e.dropped > 0) totals_.dropped[e.drop_reason] += e.dropped;
    if (e.empty_document) ++totals_.dropped["empty_documents"];
    if (e.ids.empty()) return;
    const bool val = (b.index + 1) % val_every == 0;
    const shards::Split split = val ? shards::Split::kValidation : shards::Split::kTrain;
    const int s = val ? 1 : 0;
    if (!open_ || open_document_ != b.document || open_split_ != split) {
      close();
      if (bos_) append(split, std::span(&*bos_, 1));
      open_ = true;
      open_document_ = b.document;
      open_split_ = split;
      ++totals_.documents[s];
    }
    if (totals_.input_documents == 0 || last_document_ != b.document) {
      ++totals_.input_documents;
      last_document_ = b.document;
    }
    ++totals_.blocks[s];
    totals_.text_bytes[s] += e.text_bytes;
    writer_.add_text_bytes(split, e.text_bytes);
    append(split, std::span(reinterpret_cast<const uint32_t*>(e.ids.data()), e.ids.size()));
    e.ids = {};
  }

  // Ends the open document (eos, for a tokenizer without bos) and records the dropped counts.
  Totals finish(uint64_t blank_lines) {
    close();
    if (blank_lines > 0) totals_.dropped["blank_lines"] += blank_lines;
    for (const auto& [reason, count] : totals_.dropped) writer_.add_dropped(reason, count);
    return totals_;
  }
  uint64_t tokens() const { return totals_.tokens; }

 private:
  void close() {
    if (open_ && eos_) append(open_split_, std::span(&*eos_, 1));
    open_ = false;
  }
  void append(shards::Split split, std::span<const uint32_t> tokens) {
    writer_.append(split, tokens);
    totals_.tokens += tokens.size();
  }

  shards::ShardSetWriter& writer_;
  std::optional<uint32_t> bos_;
  std::optional<uint32_t> eos_;
  bool open_ = false;
  uint64_t open_document_ = 0;
  uint64_t last_document_ = 0;
  shards::Split open_split_ = shards::Split::kTrain;
  Totals totals_;
};

// "12.34 MB/s" (10^6 bytes, as disks and network links are rated).
std::string mb_per_s(uint64_t bytes, double seconds) {
  return fmt::format("{:.2f} MB/s", seconds > 0 ? static_cast<double>(bytes) / seconds / 1e6 : 0.0);
}

// A line on stderr now and then: rewritten in place on a terminal, every 10 s otherwise.
class Progress {
 public:
  Progress(bool enabled, uint64_t total_bytes)
      : enabled_(enabled), tty_(enabled && isatty(fileno(stderr)) != 0), total_(total_bytes) {}

  void update(uint64_t bytes, uint64_t tokens, bool force = false) {
    if (!enabled_) return;
    const auto now = Clock::now();
    if (!force && now - last_ < (tty_ ? std::chrono::milliseconds(500) : std::chrono::seconds(10)))
      return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    const std::string line = fmt::format(
        "zerodp prepare: read {} of {} ({:.0f}%), {}, {} tokens", format_bytes(double(bytes)),
        format_bytes(double(total_)), total_ > 0 ? 100.0 * double(bytes) / double(total_) : 100.0,
        mb_per_s(bytes, s), tokens);
    if (tty_) {
      fmt::print(stderr, "\r{:<90}", line);
    } else {
      fmt::print(stderr, "{}\n", line);
    }
    std::fflush(stderr);
  }
  // On a terminal, the line at the end, kept (the summary follows); elsewhere nothing more.
  void done(uint64_t bytes, uint64_t tokens) {
    if (!tty_) return;
    update(bytes, tokens, true);
    fmt::print(stderr, "\n");
  }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  bool enabled_;
  bool tty_;
  uint64_t total_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_ = Clock::now();
};

// Reads, encodes (on `threads` workers, or here for 1) and appends every block in order.
Totals run_blocks(corpus::BlockReader& reader, const Encoder& encoder, Appender& appender,
                  const Flags& f, int threads, Progress& progress) {
  const auto take = [&](Batch& batch) {
    for (size_t i = 0; i < batch.blocks.size(); ++i) {
      appender.add(batch.blocks[i], f.val_every, batch.encoded[i]);
    }
    progress.update(reader.bytes_read(), appender.tokens());
  };
  std::optional<Workers> workers;
  if (threads > 1) workers.emplace(threads);
  std::deque<std::pair<std::shared_ptr<Batch>, std::future<void>>> flight;
  bool more = true;
  while (more) {
    auto batch = std::make_shared<Batch>();
    Block block;
    while (batch->text_bytes < kBatchBytes && batch->blocks.size() < kBatchBlocks &&
           (more = reader.next(block))) {
      batch->text_bytes += block.text.size();
      batch->blocks.push_back(std::move(block));
    }
    if (batch->blocks.empty()) break;
    if (!workers) {
      encoder.encode(*batch);
      take(*batch);
      continue;
    }
    flight.emplace_back(batch, workers->submit([batch, &encoder] { encoder.encode(*batch); }));
    while (flight.size() >= 2 * static_cast<size_t>(threads) || (!more && !flight.empty())) {
      flight.front().second.get();  // the first error in input order is the one reported
      take(*flight.front().first);
      flight.pop_front();
    }
  }
  while (!flight.empty()) {
    flight.front().second.get();
    take(*flight.front().first);
    flight.pop_front();
  }
  return appender.finish(reader.blank_lines());
}

std::string separator_text(const tk::Tokenizer& tok, uint64_t runs) {
  const std::string each = fmt::format("each of the {} documents in the splits", runs);
  if (tok.bos_id() >= 0) return fmt::format("bos {} starts {}", tok.bos_id(), each);
  if (tok.eos_id() >= 0) return fmt::format("eos {} ends {}", tok.eos_id(), each);
  return "no separators (the tokenizer has neither bos nor eos)";
}

void print_summary(const Flags& f, const corpus::BlockReader& reader, const Totals& t,
                   const shards::Manifest& m, const tk::Tokenizer& tok, double seconds) {
  const uint64_t bytes = reader.bytes_read();
  const uint64_t text = t.text_bytes[0] + t.text_bytes[1];
  const size_t files = reader.inputs().size();
  fmt::print(stderr,
             "zerodp prepare: {} file{}, {} in {} ({}): {} document{}, {} of text -> {} tokens "
             "({:.4f} per byte)\n",
             files, files == 1 ? "" : "s", format_bytes(double(bytes)), format_seconds(seconds),
             mb_per_s(bytes, seconds), t.input_documents, t.input_documents == 1 ? "" : "s",
             format_bytes(double(text)), t.tokens,
             text > 0 ? double(t.tokens) / double(text) : 0.0);
  const auto split = [&](const char* name, const std::vector<shards::ShardEntry>& shards, int s,
                         const std::string& note) {
    uint64_t tokens = 0;
    for (const shards::ShardEntry& e : shards) tokens += e.tokens;
    fmt::print(stderr, "  {:<10} {:>12} tokens, {} shard{}, {} blocks{}, {} of text\n", name,
               tokens, shards.size(), shards.size() == 1 ? "" : "s", t.blocks[s], note,
               format_bytes(double(t.text_bytes[s])));
  };
  split("train", m.train, 0, "");
  split("validation", m.validation, 1, fmt::format(" (1 in {})", f.val_every));
  std::string dropped;
  for (const auto& [reason, count] : t.dropped) {
    dropped += fmt::format("{}{} {}", dropped.empty() ? "" : ", ", count, reason);
  }
  fmt::print(
      stderr, "  {}; dropped: {}\n  wrote {}: manifest.json digest {}, tokenizer sha256 {}\n",
      separator_text(tok, t.documents[0] + t.documents[1]), dropped.empty() ? "none" : dropped,
      f.out, m.digest.substr(0, 12), tok.sha256().substr(0, 12));
}

// A run that fails leaves no shard directory behind (one that never finished would be
// refused by readers, and by the next run as not empty): the files it wrote are removed, and
// the directory when the run created it. Armed once the writer took the directory (new or
// empty), so nothing that was there before is touched.
class RemoveOnFailure {
 public:
  RemoveOnFailure(std::unique_ptr<shards::ShardSetWriter>& writer, fs::path dir, std::string prefix,
                  bool created)
      : writer_(writer), dir_(std::move(dir)), prefix_(std::move(prefix)), created_(created) {}
  ~RemoveOnFailure() {
    if (committed_) return;
    writer_.reset();  // removes its open shard's temporary
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      if (name == shards::kManifestFile ||
          (name.starts_with(prefix_ + "_") && name.ends_with(".bin"))) {
        fs::remove(e.path(), ec);
      }
    }
    if (created_) fs::remove(dir_, ec);  // only when empty
  }
  RemoveOnFailure(const RemoveOnFailure&) = delete;
  RemoveOnFailure& operator=(const RemoveOnFailure&) = delete;
  void commit() { committed_ = true; }

 private:
  std::unique_ptr<shards::ShardSetWriter>& writer_;
  fs::path dir_;
  std::string prefix_;
  bool created_;
  bool committed_ = false;
};

int run_prepare(const Flags& f) {
  if (f.val_every < 2) {
    throw InvalidArgument(fmt::format(
        "--val-every {} is invalid; use 2 or more (every N-th block goes to validation)",
        f.val_every));
  }
  const uint64_t block_bytes = parse_bytes(f.block_size, "--block-size");
  if (block_bytes < 1 || block_bytes > corpus::kMaxTextLine) {
    throw InvalidArgument(fmt::format("--block-size {} is invalid; use 1B..{}", f.block_size,
                                      format_bytes(double(corpus::kMaxTextLine))));
  }
  if (f.tokens_per_shard < 1 || f.tokens_per_shard > shards::kMaxTokensPerShard) {
    throw InvalidArgument(
        fmt::format("--tokens-per-shard {} is invalid; use 1..{} (llm.c's "
                    "header counts an int32)",
                    f.tokens_per_shard, shards::kMaxTokensPerShard));
  }
  const int threads = f.threads > 0 ? f.threads : usable_cores();
  if (f.threads < 0 || threads > 1024) {
    throw InvalidArgument(
        fmt::format("--threads {} is invalid; use 1..1024 (0: every core)", f.threads));
  }
  std::vector<fs::path> named;
  std::vector<files::Named> ins = {{"--tokenizer", f.tokenizer}};
  for (const std::string& in : f.inputs) {
    named.push_back(resolve_text_input(in, f.cache_dir));
    ins.push_back({"input", named.back()});
  }
  const files::Named outs[] = {{"--out", f.out}};
  files::check_distinct(ins, outs);
  std::vector<corpus::InputFile> inputs = corpus::list_inputs(named, "input");
  uint64_t total = 0;
  for (const corpus::InputFile& in : inputs) total += in.bytes;

  const tk::Tokenizer tok(f.tokenizer);
  if (!tok.lossless() && !f.quiet) {
    fmt::print(stderr,
               "zerodp prepare: note: tokenizer '{}' is not lossless (its normalization or "
               "whitespace rules change some texts): each block of a text file is encoded as a "
               "text of its own, and decoding may not give the input back exactly\n",
               f.tokenizer);
  }
  std::error_code ec;
  const bool created = !fs::exists(f.out, ec);
  auto writer = std::make_unique<shards::ShardSetWriter>(
      shards::ShardSetOptions{.directory = f.out,
                              .prefix = f.prefix,
                              .vocab_size = static_cast<uint64_t>(tok.vocab_size()),
                              .tokenizer_sha256 = tok.sha256(),
                              .tokens_per_shard = f.tokens_per_shard});
  RemoveOnFailure cleanup(writer, f.out, f.prefix, created);
  corpus::BlockReader reader(std::move(inputs), static_cast<size_t>(block_bytes));
  const Encoder encoder(tok, f, reader.inputs());
  Appender appender(*writer, tok);
  Progress progress(!f.quiet, total);
  const Totals totals = run_blocks(reader, encoder, appender, f, threads, progress);
  progress.done(reader.bytes_read(), totals.tokens);
  if (totals.blocks[1] == 0 || totals.blocks[0] == 0) {
    throw InvalidArgument(fmt::format(
        "the inputs make {} block{} with text, {} for training and {} for validation (1 block "
        "in {}); both splits need one: lower --val-every or --block-size",
        totals.blocks[0] + totals.blocks[1], totals.blocks[0] + totals.blocks[1] == 1 ? "" : "s",
        totals.blocks[0], totals.blocks[1], f.val_every));
  }
  const shards::Manifest m = writer->finish();
  cleanup.commit();
  if (!f.quiet) print_summary(f, reader, totals, m, tok, progress.seconds());
  return 0;
}

void add_flags(CLI::App& app, Flags& f) {
  app.add_option("INPUTS", f.inputs,
                 "Text files, *.jsonl files and directories of them; kjv: the KJV Bible "
                 "(what train --data kjv uses)")
      ->required();
  app.add_option("--tokenizer", f.tokenizer,
                 "A SentencePiece .model (zerodp tokenizer train's, a Llama tokenizer.model)")
      ->required();
  app.add_option("--out", f.out, "The shard directory to write: new or empty")->required();
  app.add_option("--text-field", f.text_field,
                 "The field of each JSONL object that holds its text (default text)");
  app.add_option("--val-every", f.val_every,
                 "Every N-th block goes to the validation shards (default 50: 2% of the blocks)");
  app.add_option("--block-size", f.block_size,
                 "Text files are cut into blocks of whole lines of about this size (default "
                 "8KiB)");
  app.add_option("--tokens-per-shard", f.tokens_per_shard,
                 "Tokens per shard file (default 100000000, llm.c's; at most 2^31-1)");
  app.add_option("--prefix", f.prefix,
                 "Shard file names: PREFIX_train_000000.bin, PREFIX_val_000000.bin (default "
                 "shard)");
  app.add_option("--threads", f.threads, "Encoding threads (default 0: every core)");
  app.add_flag("--skip-bad", f.skip_bad,
               "Drop lines that are not UTF-8 and JSONL lines without a string text field, "
               "counted in manifest.json, instead of stopping");
  app.add_option("--cache-dir", f.cache_dir,
                 "Where the input kjv is prepared "
                 "(default ~/.cache/zerodp)");
  app.add_flag("--quiet", f.quiet, "Print nothing on success");
}

}  // namespace

Runner add_prepare(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  add_flags(app, *f);
  app.footer(
      "Documents: a text file is one, each line of a .jsonl file (a JSON object) another (its\n"
      "--text-field string). Each document's tokens follow the tokenizer's bos id (zerodp's\n"
      "tokenizers: 1); with a tokenizer without bos, they are followed by its eos instead.\n"
      "Validation: text files are cut into blocks of whole lines, each ending at the first\n"
      "line end that makes it --block-size bytes or more (a line past 16 MiB is cut at a\n"
      "character); a JSONL line is one block. Blocks are numbered across the inputs in order,\n"
      "and the N-th, 2N-th, ... (--val-every N) go to the validation shards whole, the others\n"
      "to training. Where a document's blocks change split, a new document starts in each\n"
      "split (a bos again): what lies between two separators is contiguous text. The defaults\n"
      "send 10 blocks of the KJV (81 KiB, 1.9%) to validation.\n"
      "Encoding: block by block, which for zerodp's tokenizers gives the ids of the whole text\n"
      "(no piece spans a line end); a tokenizer that is not lossless (Llama's adds a space at\n"
      "the start of each encoding) sees each block as a text of its own, and prepare says so.\n"
      "Directories: every file below, recursively, in byte order of the paths below it\n"
      "(LC_ALL=C sort), names starting with '.' skipped; *.jsonl files are JSONL.\n"
      "Threads: blocks are encoded in parallel and written in input order, so the shards are\n"
      "the same bytes for any --threads.\n"
      "Bad input stops the run naming its file and line: text that is not UTF-8, a JSONL line\n"
      "that is not a JSON object or lacks the string field. --skip-bad drops such lines and\n"
      "counts them (manifest.json \"dropped\", and the summary). Empty documents and blank\n"
      "JSONL lines hold no text: always skipped, and counted the same way.\n"
      "manifest.json records the tokenizer's sha256 and each split's text_bytes, the UTF-8\n"
      "bytes its tokens came from: bits per byte = loss * tokens / (ln 2 * text_bytes).\n"
      "A run that fails removes what it wrote.\n"
      "Examples:\n"
      "  zerodp tokenizer train --input kjv --vocab 8192 --out kjv8k.model\n"
      "  zerodp prepare --tokenizer kjv8k.model --out kjv-shards kjv\n"
      "  zerodp prepare --tokenizer tok.model --out shards books/ web.jsonl --text-field "
      "content");
  return [f](Launch) { return run_prepare(*f); };
}

}  // namespace zerodp::cli
