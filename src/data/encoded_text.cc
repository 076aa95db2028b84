#include "data/encoded_text.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <thread>

#include <fmt/core.h>

#include "core/error.h"
#include "core/sysinfo.h"
#include "data/shards.h"
#include "tokenizer/tokenizer.h"

namespace zerodp {
namespace {

namespace tk = tokenizer;

constexpr size_t kBlockBytes = 64 * 1024;

// The first line start at or after `at`; in a text without one, the first character start.
size_t boundary_at_or_after(std::string_view text, size_t at) {
  if (at == 0 || at >= text.size()) return std::min(at, text.size());
  if (text[at - 1] == '\n') return at;
  const size_t nl = text.find('\n', at);
  if (nl != std::string_view::npos) return nl + 1;
  while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
  return at;
}

// Whole-line blocks of about kBlockBytes each (a line past it is a block of its own).
std::vector<std::string_view> blocks_of(std::string_view text) {
  std::vector<std::string_view> out;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = std::min(begin + kBlockBytes, text.size());
    if (end < text.size()) {
      const size_t nl = text.find('\n', end - 1);
      end = nl == std::string_view::npos ? text.size() : nl + 1;
    }
    out.push_back(text.substr(begin, end - begin));
    begin = end;
  }
  return out;
}

// One document's tokens: every block encoded, on every core, concatenated in order, with the
// tokenizer's separator.
std::vector<uint32_t> encode_document(const tk::Tokenizer& tok, std::string_view text) {
  const std::vector<std::string_view> blocks = blocks_of(text);
  std::vector<std::vector<int32_t>> ids(blocks.size());
  const size_t workers = std::min<size_t>(static_cast<size_t>(usable_cores()), blocks.size());
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(workers);
  for (size_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      try {
        for (size_t b = w; b < blocks.size(); b += workers) ids[b] = tok.encode(blocks[b]);
      } catch (...) {
        errors[w] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  std::vector<uint32_t> out;
  if (tok.bos_id() >= 0) out.push_back(static_cast<uint32_t>(tok.bos_id()));
  for (const auto& block : ids) out.insert(out.end(), block.begin(), block.end());
  if (tok.bos_id() < 0 && tok.eos_id() >= 0) out.push_back(static_cast<uint32_t>(tok.eos_id()));
  return out;
}

// In pieces no longer than a shard may be.
std::vector<shards::Shard> as_shards(const std::string& name, const std::vector<uint32_t>& tokens) {
  std::vector<shards::Shard> out;
  for (size_t at = 0; at < tokens.size(); at += shards::kMaxTokensPerShard) {
    const size_t n = std::min<size_t>(shards::kMaxTokensPerShard, tokens.size() - at);
    out.push_back(shards::Shard::in_memory(name, std::span(tokens).subspan(at, n)));
  }
  return out;
}

void require_utf8(std::string_view text, const std::string& name) {
  size_t bad = 0;
  if (tk::valid_utf8(text, &bad)) return;
  const size_t line = static_cast<size_t>(std::count(text.begin(), text.begin() + bad, '\n')) + 1;
  throw InvalidArgument(fmt::format(
      "{}: not UTF-8 at line {}, byte {} (0x{:02X}); a tokenizer encodes UTF-8 text only "
      "(convert it first, e.g. iconv -f LATIN1 -t UTF-8)",
      name, line, bad, static_cast<unsigned>(static_cast<unsigned char>(text[bad]))));
}

}  // namespace

EncodedTextSplits encode_text_splits(const std::vector<uint8_t>& bytes, const std::string& name,
                                     const std::filesystem::path& tokenizer, int64_t seq_len,
                                     uint64_t vocab_size, double validation_fraction) {
  if (!(validation_fraction > 0.0 && validation_fraction < 1.0)) {
    throw InvalidArgument(
        fmt::format("{}: validation fraction {} is invalid; use a value in (0, 1), e.g. 0.02", name,
                    validation_fraction));
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  require_utf8(text, name);
  const tk::Tokenizer tok(tokenizer);
  if (static_cast<uint64_t>(tok.vocab_size()) > vocab_size) {
    throw InvalidArgument(fmt::format(
        "--tokenizer '{}' has {} ids, more than the model's vocabulary of {}; use --vocab {} or "
        "more (or leave --vocab out: the tokenizer's is taken)",
        tokenizer.string(), tok.vocab_size(), vocab_size, tok.vocab_size()));
  }
  // floor() of an IEEE double product, as split_text: the same split on every platform.
  const auto validation_bytes =
      static_cast<uint64_t>(std::floor(static_cast<double>(text.size()) * validation_fraction));
  const size_t split = boundary_at_or_after(text, text.size() - validation_bytes);
  const std::string_view train_text = text.substr(0, split);
  const std::string_view validation_text = text.substr(split);
  const std::vector<uint32_t> train = encode_document(tok, train_text);
  const std::vector<uint32_t> validation = encode_document(tok, validation_text);
  for (const auto& [part, tokens] :
       {std::pair{"train", &train}, std::pair{"validation", &validation}}) {
    if (tokens->size() < static_cast<uint64_t>(seq_len) + 1) {
      throw InvalidArgument(fmt::format(
          "{}/{}: {} tokens (from {} bytes split at byte {}, the next line start after the last "
          "{} bytes), but one sample needs seq_len + 1 = {}; use a shorter seq_len, a smaller "
          "vocabulary's tokenizer or a longer text",
          name, part, tokens->size(), text.size(), split, validation_bytes, seq_len + 1));
    }
  }
  const std::string origin = fmt::format("{} (encoded by {})", name, tokenizer.string());
  EncodedTextSplits out{
      .train = ShardDataset(as_shards(origin, train), seq_len, vocab_size, name + "/train"),
      .validation =
          ShardDataset(as_shards(origin, validation), seq_len, vocab_size, name + "/validation"),
      .tokenizer_sha256 = tok.sha256(),
      .validation_bytes_per_token =
          static_cast<double>(validation_text.size()) / static_cast<double>(validation.size()),
      .description = ""};
  out.description = fmt::format(
      "{}: {} bytes encoded by {} ({} ids) into {} train tokens (bytes 0..{}) and {} "
      "validation tokens, seq_len {}: {} train and {} validation samples",
      name, text.size(), tokenizer.string(), tok.vocab_size(), train.size(), split,
      validation.size(), seq_len, out.train.size(), out.validation.size());
  return out;
}

}  // namespace zerodp
