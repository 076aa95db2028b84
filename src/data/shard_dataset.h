// Language-modelling samples over token shards (data/shards.h): the same public shape as
// TokenDataset (data/dataset.h), over a token stream on disk instead of bytes in memory.
//
// The stream is the shards concatenated in their order; sample i is its tokens
// [i*T, i*T + T + 1): inputs the first T, targets the last T, so consecutive windows share
// one token and size() = (total_tokens - 1) / T, the tail that does not fill a window unused
// (TokenDataset's rule). Windows run across shard boundaries: this is fixed-stride packing of
// the concatenated stream, not document-aligned packing, so a window may hold the end of one
// document and the start of the next (whatever separator the tokenizer put between them,
// e.g. GPT-2's <|endoftext|>, is an ordinary token here).
//
// Reads go through the shards' read-only mappings; every token is checked against the
// vocabulary as it is read (a token >= vocab_size is CorruptData naming the shard and the
// token's offset in it), so no separate scan of the data is needed before training and a
// damaged shard is caught when, and only when, a window touches it.
//
// Immutable and cheap to copy (the shards are shared); every const method is safe from
// several rank threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/shards.h"

namespace zerodp {

class ShardDataset {
 public:
  // Throws InvalidArgument when seq_len < 1, vocab_size is outside 1..2^31, or no shard is
  // given.
  ShardDataset(std::vector<shards::Shard> parts, int64_t seq_len, uint64_t vocab_size,
               std::string name);

  uint64_t size() const { return size_; }
  int64_t seq_len() const { return seq_len_; }
  uint64_t vocab_size() const { return vocab_size_; }
  uint64_t tokens() const;                           // in the whole stream
  const std::string& name() const { return name_; }  // e.g. "fineweb10B/train"
  const std::vector<shards::Shard>& shards() const;

  // Writes sample indices[b] into row b of inputs and targets, each (B, T) int32 with
  // B = indices.size(). Throws InvalidArgument naming the index if one is >= size(), or the
  // spans' sizes if they are not B*T; CorruptData naming the shard and offset of a token
  // >= vocab_size.
  void fill(std::span<const uint64_t> indices, std::span<int32_t> inputs,
            std::span<int32_t> targets) const;
  TokenBatch batch(std::span<const uint64_t> indices) const;

  // The stream's tokens [first, first + out.size()) as int32, checked like fill's. Throws
  // InvalidArgument when the range passes the stream's end.
  void read(uint64_t first, std::span<int32_t> out) const;

  // A hint for the next step: starts reading the windows of `indices` from disk
  // (MADV_WILLNEED over their pages) and returns at once. Indices past size() are skipped.
  void prefetch(std::span<const uint64_t> indices) const;
  // Drops every shard's pages from the page cache (Shard::drop_page_cache): for cold-read
  // benchmarks.
  void drop_page_cache() const;

 private:
  struct Stream;
  std::shared_ptr<const Stream> stream_;
  int64_t seq_len_ = 0;
  uint64_t vocab_size_ = 0;
  uint64_t size_ = 0;
  std::string name_;
};

// The training and validation datasets of a shard directory (shards::open_shard_directory),
// named "<directory name>/train" and "/validation".
struct ShardSplits {
  ShardDataset train;
  ShardDataset validation;
  std::string digest;                     // the set's (ShardSet::digest)
  std::string tokenizer_sha256;           // the manifest's; empty without one
  double validation_bytes_per_token = 0;  // of the validation text; 0 when the set says none
  std::string description;                // ShardSet::description() and the sample counts
};
// Throws InvalidArgument when a split is too short for one window of seq_len + 1 tokens, or
// when the manifest's largest token does not fit vocab_size (the model's vocabulary: named,
// with the size that would fit); what open_shard_directory throws.
ShardSplits open_shard_splits(const std::filesystem::path& directory, int64_t seq_len,
                              uint64_t vocab_size);

}  // namespace zerodp
