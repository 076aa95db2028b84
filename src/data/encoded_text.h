// A text encoded by a tokenizer as the run starts (`--data FILE --tokenizer tok.model`): the
// tokens of data/shard_dataset.h, held in memory instead of read from shards.
//
// The text is split as the byte-level sources split it (data/dataset.h's split_text: the
// last floor(size * fraction) bytes are validation), the boundary then moved forward to the
// next line start (or, in a text without one, character) so that no character and no line
// is cut. Each part is one document: the tokenizer's bos before it, or with no bos its eos
// after it, as `zerodp prepare` marks a text file. A part is encoded in blocks of whole lines
// (about 64 KiB) on every core and put back in order, so the tokens are those of `prepare`
// for zerodp's tokenizers, whose pieces never span a line end, and the same for any core
// count.
//
// Everything is in memory: the text and 4 bytes a token. For a corpus that does not fit,
// `zerodp prepare` writes shards once and `--data DIR` reads them from disk.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data/shard_dataset.h"

namespace zerodp {

struct EncodedTextSplits {
  ShardDataset train;
  ShardDataset validation;
  std::string tokenizer_sha256;
  double validation_bytes_per_token = 0;  // the validation part's text bytes over its tokens
  std::string description;
};

// Throws InvalidArgument naming `name` when the text is not UTF-8 (with its line and byte),
// the fraction is not in (0, 1), a part is too short for one window of seq_len + 1 tokens, or
// the tokenizer's vocabulary does not fit vocab_size; what the Tokenizer throws for its file.
EncodedTextSplits encode_text_splits(const std::vector<uint8_t>& text, const std::string& name,
                                     const std::filesystem::path& tokenizer, int64_t seq_len,
                                     uint64_t vocab_size, double validation_fraction);

}  // namespace zerodp
