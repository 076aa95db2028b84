// SentencePiece tokenizers: a `.model` file loaded once, text to token ids and back.
//
// Any SentencePiece model loads as it is (a Llama-2-family BPE with byte fallback, a unigram
// with NFKC normalization, ...) and encodes exactly as SentencePiece encodes it. A model is
// `lossless()` when its settings make decode(encode(x)) == x for every valid UTF-8 x: identity
// normalization, no dummy prefix, no whitespace removal, all 256 byte pieces (unknown
// characters become bytes). Models from train_tokenizer (tokenizer/train.h) are. For those
// encode() also writes a literal U+2581 (SentencePiece's own space mark, which it would decode
// as a space) as its three byte pieces, so that it too comes back.
//
// Library code only (no sentencepiece header here): the library is linked privately.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zerodp::tokenizer {

class Tokenizer {
 public:
  // Reads `path` once (files::require_regular_input first: a FIFO or a directory is refused
  // as InvalidArgument), computes its SHA-256 from the very bytes it then parses, and loads
  // the model from them. Throws IoError when the file cannot be read, CorruptData naming the
  // file when its bytes are not a SentencePiece model.
  explicit Tokenizer(const std::filesystem::path& path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // The ids of `text`, no bos or eos added. Throws InvalidArgument naming the byte offset
  // when `text` is not valid UTF-8 (SentencePiece would replace the bytes by U+FFFD).
  std::vector<int32_t> encode(std::string_view text) const;
  // The text of `ids`; control ids (bos, eos) give nothing. Throws InvalidArgument naming the
  // first id outside 0..vocab_size()-1.
  std::string decode(std::span<const int32_t> ids) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 when the model has none
  int32_t eos_id() const;  // -1 when the model has none
  int32_t unk_id() const;
  int32_t pad_id() const;  // -1 when the model has none
  // The piece of `id` as the model stores it ("▁the", "<0x0A>", "<s>"). InvalidArgument when
  // `id` is out of range.
  std::string piece(int32_t id) const;
  // True for the 256 byte-fallback pieces <0x00>..<0xFF>.
  bool is_byte(int32_t id) const;

  // decode(encode(x)) == x for every valid UTF-8 x (see the top of this file).
  bool lossless() const;
  // "bpe", "unigram", "word" or "char", from the model's trainer_spec.
  const std::string& model_type() const;
  // The normalization rule's name ("identity", "nmt_nfkc", ...).
  const std::string& normalizer() const;

  // The loaded file: its path as given, its bytes' SHA-256 (lowercase hex) and size.
  const std::filesystem::path& path() const;
  const std::string& sha256() const;
  uint64_t file_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether `text` is valid UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF); when not, the offset of the first bad byte.
bool valid_utf8(std::string_view text, size_t* bad_offset = nullptr);

}  // namespace zerodp::tokenizer
