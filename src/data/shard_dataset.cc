#include "data/shard_dataset.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/core.h>

#include "core/error.h"

namespace zerodp {

using shards::Shard;
using shards::TokenWidth;

struct ShardDataset::Stream {
  std::vector<Shard> shards;
  std::vector<uint64_t> starts;  // starts[k]: shard k's first token in the stream; one more: total
  uint64_t total() const { return starts.back(); }
  // The shard holding stream token `at` (< total()).
  size_t shard_of(uint64_t at) const {
    return static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), at) -
                               starts.begin()) -
           1;
  }
};

namespace {

template <typename T>
void convert(const Shard& shard, uint64_t first, size_t count, int32_t* out, uint64_t vocab_size,
             const std::string& name) {
  const std::byte* data = shard.token_data() + first * sizeof(T);
  for (size_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, data + i * sizeof(T), sizeof(T));
    if (static_cast<uint64_t>(v) >= vocab_size) {
      const uint64_t offset = first + i;
      throw CorruptData(fmt::format(
          "{}: token {} at offset {} of shard '{}' (byte {}) is outside the vocabulary of {} ids "
          "(0..{}); the shard is damaged, or was written for a larger vocabulary",
          name, static_cast<uint64_t>(v), offset, shard.path().string(),
          shards::kHeaderBytes + offset * sizeof(T), vocab_size, vocab_size - 1));
    }
    out[i] = static_cast<int32_t>(v);  // < vocab_size <= 2^31
  }
}

std::string set_name(const std::filesystem::path& directory) {
  std::filesystem::path p = directory.lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  const std::string name = p.filename().string();
  return name.empty() || name == "." || name == ".." ? "shards" : name;
}

}  // namespace

ShardDataset::ShardDataset(std::vector<Shard> parts, int64_t seq_len, uint64_t vocab_size,
                           std::string name)
    : seq_len_(seq_len), vocab_size_(vocab_size), name_(std::move(name)) {
  if (seq_len < 1) {
    throw InvalidArgument(
        fmt::format("{}: seq_len {} is invalid; use 1 or more tokens", name_, seq_len));
  }
  if (vocab_size < 1 || vocab_size > shards::kMaxVocabSize) {
    throw InvalidArgument(fmt::format("{}: vocabulary size {} is invalid; use 1..{}", name_,
                                      vocab_size, shards::kMaxVocabSize));
  }
  if (parts.empty()) throw InvalidArgument(fmt::format("{}: no shards given", name_));
  auto stream = std::make_shared<Stream>();
  stream->starts.reserve(parts.size() + 1);
  uint64_t at = 0;
  for (const Shard& s : parts) {
    stream->starts.push_back(at);
    at += s.tokens();
  }
  stream->starts.push_back(at);
  stream->shards = std::move(parts);
  size_ = at < 1 ? 0 : (at - 1) / static_cast<uint64_t>(seq_len);
  stream_ = std::move(stream);
}

uint64_t ShardDataset::tokens() const { return stream_->total(); }

const std::vector<Shard>& ShardDataset::shards() const { return stream_->shards; }

void ShardDataset::read(uint64_t first, std::span<int32_t> out) const {
  const uint64_t total = stream_->total();
  if (first > total || out.size() > total - first) {
    throw InvalidArgument(fmt::format("{}: tokens [{}, {}) pass the stream's end at {}", name_,
                                      first, first + out.size(), total));
  }
  size_t done = 0;
  size_t k = out.empty() ? 0 : stream_->shard_of(first);
  while (done < out.size()) {
    const Shard& shard = stream_->shards[k];
    const uint64_t offset = first + done - stream_->starts[k];
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(out.size() - done, shard.tokens() - offset));
    if (shard.width() == TokenWidth::kU16) {
      convert<uint16_t>(shard, offset, n, out.data() + done, vocab_size_, name_);
    } else {
      convert<uint32_t>(shard, offset, n, out.data() + done, vocab_size_, name_);
    }
    done += n;
    ++k;
  }
}

void ShardDataset::fill(std::span<const uint64_t> indices, std::span<int32_t> inputs,
                        std::span<int32_t> targets) const {
  check_token_batch(name_, size_, seq_len_, indices, inputs.size(), targets.size());
  const size_t T = static_cast<size_t>(seq_len_);
  for (size_t b = 0; b < indices.size(); ++b) {
    // The window's T + 1 tokens: the first T are the inputs, the last T the targets.
    const uint64_t first = indices[b] * T;
    const std::span<int32_t> in = inputs.subspan(b * T, T);
    const std::span<int32_t> out = targets.subspan(b * T, T);
    read(first, in);
    std::copy(in.begin() + 1, in.end(), out.begin());
    read(first + T, out.subspan(T - 1, 1));
  }
}

TokenBatch ShardDataset::batch(std::span<const uint64_t> indices) const {
  TokenBatch out;
  out.batch = static_cast<int64_t>(indices.size());
  out.seq_len = seq_len_;
  out.inputs.resize(indices.size() * static_cast<size_t>(seq_len_));
  out.targets.resize(out.inputs.size());
  fill(indices, out.inputs, out.targets);
  return out;
}

void ShardDataset::prefetch(std::span<const uint64_t> indices) const {
  const auto T = static_cast<uint64_t>(seq_len_);
  for (const uint64_t index : indices) {
    if (index >= size_) continue;
    uint64_t at = index * T;
    const uint64_t end = at + T + 1;
    for (size_t k = stream_->shard_of(at); at < end; ++k) {
      const uint64_t offset = at - stream_->starts[k];
      const uint64_t n = std::min(end - at, stream_->shards[k].tokens() - offset);
      stream_->shards[k].will_need(offset, n);
      at += n;
    }
  }
}

void ShardDataset::drop_page_cache() const {
  for (const Shard& s : stream_->shards) s.drop_page_cache();
}

ShardSplits open_shard_splits(const std::filesystem::path& directory, int64_t seq_len,
                              uint64_t vocab_size) {
  shards::ShardSet set = shards::open_shard_directory(directory);
  if (set.manifest && set.manifest->largest_token >= vocab_size) {
    throw InvalidArgument(fmt::format(
        "shard directory '{}' holds token ids up to {} (manifest.json), outside the model's "
        "vocabulary of {}; use a vocabulary of at least {} ids",
        directory.string(), set.manifest->largest_token, vocab_size,
        set.manifest->largest_token + 1));
  }
  const std::string name = set_name(directory);
  for (const auto& [split, tokens] :
       {std::pair{"train", set.train_tokens()}, std::pair{"validation", set.validation_tokens()}}) {
    if (seq_len >= 1 && tokens < static_cast<uint64_t>(seq_len) + 1) {
      throw InvalidArgument(fmt::format(
          "{}/{}: {} tokens, but one sample needs seq_len + 1 = {}; use a shorter seq_len", name,
          split, tokens, seq_len + 1));
    }
  }
  const std::string set_description = set.description();  // before the shards move
  // The validation text's bytes per token, when the manifest says how many bytes it came from.
  double bytes_per_token = 0;
  if (set.manifest && set.manifest->validation_text_bytes && set.validation_tokens() > 0) {
    bytes_per_token = static_cast<double>(*set.manifest->validation_text_bytes) /
                      static_cast<double>(set.validation_tokens());
  }
  ShardSplits splits{
      .train = ShardDataset(std::move(set.train), seq_len, vocab_size, name + "/train"),
      .validation =
          ShardDataset(std::move(set.validation), seq_len, vocab_size, name + "/validation"),
      .digest = set.digest,
      .tokenizer_sha256 = set.manifest ? set.manifest->tokenizer_sha256 : std::string(),
      .validation_bytes_per_token = bytes_per_token,
      .description = ""};
  splits.description =
      fmt::format("{}, seq_len {}: {} train and {} validation samples", set_description, seq_len,
                  splits.train.size(), splits.validation.size());
  return splits;
}

}  // namespace zerodp
