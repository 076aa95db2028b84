#include "tokenizer/tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <optional>

#include <fmt/core.h>

#include "core/error.h"
#include "core/files.h"
#include "core/sha256.h"
#include "core/units.h"

namespace zerodp::tokenizer {

namespace {

namespace fs = std::filesystem;
namespace spm = sentencepiece;

// Larger than any tokenizer (Llama's is 0.5 MB, a 256k-piece Gemma's 4 MB): a file past this
// is not one, and is refused before it is read into memory.
constexpr uint64_t kMaxModelBytes = uint64_t{1} << 30;

// SentencePiece's space mark, U+2581, as UTF-8.
constexpr std::string_view kSpaceMark = "\xe2\x96\x81";

// Encoding and decoding work on pieces of about this size where the model allows (see
// Impl::cuts_at_newlines): the same ids, without SentencePiece holding a whole corpus's
// lattice or piece list at once.
constexpr size_t kEncodeChunkBytes = size_t{1} << 12;
constexpr size_t kDecodeChunkIds = size_t{1} << 12;

// What the model's protobuf says about its normalization and training, read from the bytes
// with a minimal protobuf reader: the installed headers give only the processor, whose API
// does not expose these fields.
struct ModelFacts {
  std::string model_type = "unigram";  // trainer_spec.model_type (default UNIGRAM)
  std::string normalizer;              // normalizer_spec.name
  bool has_charsmap = false;           // normalizer_spec.precompiled_charsmap non-empty
  bool has_rule_tsv = false;
  bool add_dummy_prefix = true;  // the proto's defaults
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
  bool has_denormalizer = false;  // denormalizer_spec with a charsmap
};

// A protobuf message's fields in order; false at the first malformed one.
class ProtoReader {
 public:
  explicit ProtoReader(std::string_view bytes) : p_(bytes) {}

  struct Field {
    uint32_t number = 0;
    uint32_t wire = 0;
    uint64_t varint = 0;       // wire type 0
    std::string_view bytes{};  // wire type 2
  };

  // The next field into `f`; false at the end or on malformed bytes (`ok()` tells which).
  bool next(Field& f) {
    if (p_.empty()) return false;
    uint64_t key = 0;
    if (!varint(key)) return fail();
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire = static_cast<uint32_t>(key & 7);
    switch (f.wire) {
      case 0:
        return varint(f.varint) || fail();
      case 1:
        return skip(8);
      case 5:
        return skip(4);
      case 2: {
        uint64_t n = 0;
        if (!varint(n) || n > p_.size()) return fail();
        f.bytes = p_.substr(0, static_cast<size_t>(n));
        p_.remove_prefix(static_cast<size_t>(n));
        return true;
      }
      default:
        return fail();  // groups (3, 4) are not in SentencePiece's protos
    }
  }
  bool ok() const { return ok_; }

 private:
  bool varint(uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64 && !p_.empty(); shift += 7) {
      const auto b = static_cast<uint8_t>(p_.front());
      p_.remove_prefix(1);
      v |= uint64_t{b & 0x7Fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  bool skip(size_t n) {
    if (p_.size() < n) return fail();
    p_.remove_prefix(n);
    return true;
  }
  bool fail() {
    ok_ = false;
    p_ = {};
    return false;
  }

  std::string_view p_;
  bool ok_ = true;
};

// ModelProto: trainer_spec = 2 (model_type = 3), normalizer_spec = 3 (name = 1,
// precompiled_charsmap = 2, add_dummy_prefix = 3, remove_extra_whitespaces = 4,
// escape_whitespaces = 5, normalization_rule_tsv = 6), denormalizer_spec = 5.
std::optional<ModelFacts> read_facts(std::string_view model) {
  ModelFacts facts;
  ProtoReader top(model);
  ProtoReader::Field f;
  while (top.next(f)) {
    if (f.wire != 2) continue;
    ProtoReader sub(f.bytes);
    ProtoReader::Field g;
    if (f.number == 2) {
      while (sub.next(g)) {
        if (g.number != 3 || g.wire != 0) continue;
        static constexpr const char* kTypes[] = {"?", "unigram", "bpe", "word", "char"};
        facts.model_type = g.varint < 5 ? kTypes[g.varint] : fmt::format("type {}", g.varint);
      }
    } else if (f.number == 3) {
      while (sub.next(g)) {
        if (g.number == 1 && g.wire == 2) facts.normalizer = std::string(g.bytes);
        if (g.number == 2 && g.wire == 2) facts.has_charsmap = !g.bytes.empty();
        if (g.number == 3 && g.wire == 0) facts.add_dummy_prefix = g.varint != 0;
        if (g.number == 4 && g.wire == 0) facts.remove_extra_whitespaces = g.varint != 0;
        if (g.number == 5 && g.wire == 0) facts.escape_whitespaces = g.varint != 0;
        if (g.number == 6 && g.wire == 2) facts.has_rule_tsv = !g.bytes.empty();
      }
    } else if (f.number == 5) {
      while (sub.next(g)) {
        if (g.number == 2 && g.wire == 2 && !g.bytes.empty()) facts.has_denormalizer = true;
      }
    } else {
      continue;
    }
    if (!sub.ok()) return std::nullopt;
  }
  if (!top.ok()) return std::nullopt;
  return facts;
}

std::string read_model_file(const fs::path& path, std::string& sha256_hex_out) {
  const uint64_t size = files::require_regular_input("--tokenizer", path);
  if (size > kMaxModelBytes) {
    throw CorruptData(fmt::format(
        "--tokenizer '{}' is {}, larger than any SentencePiece model (at most {} here); give "
        "the tokenizer's .model file (e.g. tokenizer.model)",
        path.string(), format_bytes(static_cast<double>(size)),
        format_bytes(static_cast<double>(kMaxModelBytes))));
  }
  std::string bytes;
  bytes.reserve(static_cast<size_t>(size));
  Sha256 hash;
  files::read_in_chunks("--tokenizer", path, [&](std::span<const std::byte> chunk) {
    if (bytes.size() + chunk.size() > kMaxModelBytes) {
      throw CorruptData(fmt::format("--tokenizer '{}' grew past {} while it was read",
                                    path.string(),
                                    format_bytes(static_cast<double>(kMaxModelBytes))));
    }
    hash.update(chunk);
    bytes.append(reinterpret_cast<const char*>(chunk.data()), chunk.size());
  });
  sha256_hex_out = hash.hex_digest();
  return bytes;
}

}  // namespace

bool valid_utf8(std::string_view text, size_t* bad_offset) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the second byte's range (RFC 3629's table)
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong forms
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
    }
    bool ok = len > 0 && i + len <= n && s[i + 1] >= lo && s[i + 1] <= hi;
    for (size_t k = 2; ok && k < len; ++k) ok = s[i + k] >= 0x80 && s[i + k] <= 0xBF;
    if (!ok) {
      if (bad_offset != nullptr) *bad_offset = i;
      return false;
    }
    i += len;
  }
  return true;
}

struct Tokenizer::Impl {
  spm::SentencePieceProcessor sp;
  fs::path path;
  std::string sha256;
  uint64_t file_bytes = 0;
  ModelFacts facts;
  bool lossless = false;
  // Text may be encoded in pieces cut after a newline, and ids decoded in pieces cut before a
  // non-byte id, with the same result as whole: no dummy prefix or whitespace removal (which
  // act at the start of each call) and no piece that holds a newline (so none spans a cut).
  bool cuts_at_newlines = false;
  std::vector<int> space_mark_bytes;  // the byte pieces of U+2581, for lossless models

  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  void encode_lossless(std::string_view text, std::vector<int32_t>& out) const;
};

Tokenizer::Tokenizer(const fs::path& path) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  const std::string bytes = read_model_file(path, m.sha256);
  m.file_bytes = bytes.size();
  const auto refuse = [&](const std::string& why) {
    return CorruptData(fmt::format(
        "--tokenizer '{}' ({} bytes, sha256 {}) is not a SentencePiece model: {}; give a .model "
        "file written by SentencePiece's trainer (zerodp tokenizer train, spm_train, a Llama "
        "tokenizer.model)",
        path.string(), bytes.size(), m.sha256, why));
  };
  if (bytes.empty()) throw refuse("the file is empty");
  const spm::util::Status status = m.sp.LoadFromSerializedProto(bytes);
  if (!status.ok()) throw refuse(status.ToString());
  const std::optional<ModelFacts> facts = read_facts(bytes);
  if (!facts) throw refuse("its protobuf fields do not parse");
  if (m.sp.GetPieceSize() <= 0) throw refuse("it holds no pieces");
  m.facts = *facts;

  bool all_bytes = true;
  for (int b = 0; b < 256 && all_bytes; ++b) {
    all_bytes = m.sp.IsByte(m.sp.PieceToId(fmt::format("<0x{:02X}>", b)));
  }
  bool newline_free = true;
  for (int id = 0; id < m.sp.GetPieceSize() && newline_free; ++id) {
    newline_free = m.sp.IsByte(id) || m.sp.IdToPiece(id).find('\n') == std::string::npos;
  }
  const ModelFacts& f = m.facts;
  const bool plain_whitespace =
      !f.add_dummy_prefix && !f.remove_extra_whitespaces && f.escape_whitespaces;
  const bool identity = (f.normalizer == "identity" && !f.has_charsmap) ||
                        (f.normalizer.empty() && !f.has_charsmap && !f.has_rule_tsv);
  m.cuts_at_newlines = plain_whitespace && newline_free;
  m.lossless = plain_whitespace && identity && all_bytes && !f.has_denormalizer;
  if (m.lossless) {
    for (const char c : kSpaceMark) {
      m.space_mark_bytes.push_back(
          m.sp.PieceToId(fmt::format("<0x{:02X}>", static_cast<unsigned char>(c))));
    }
  }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  // Whole where the model's settings act at the start of a call; else cut after newlines.
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.size();
    if (cuts_at_newlines && text.size() - begin > kEncodeChunkBytes) {
      const size_t nl = text.find('\n', begin + kEncodeChunkBytes);
      if (nl != std::string_view::npos) end = nl + 1;
    }
    std::vector<int> ids;
    const spm::util::Status status = sp.Encode(text.substr(begin, end - begin), &ids);
    if (!status.ok()) {
      throw Error(fmt::format("tokenizer '{}': SentencePiece could not encode {} bytes: {}",
                              path.string(), end - begin, status.ToString()));
    }
    out.insert(out.end(), ids.begin(), ids.end());
    begin = end;
  }
}

void Tokenizer::Impl::encode_lossless(std::string_view text, std::vector<int32_t>& out) const {
  // SentencePiece writes every space as U+2581 and decodes every U+2581 as a space, so a
  // literal U+2581 would come back a space: it is written as its byte pieces, which decode to
  // their bytes as they are, and the text between is encoded as usual. With no dummy prefix
  // and no whitespace removal, encoding the parts one by one is encoding the whole.
  size_t begin = 0;
  while (true) {
    const size_t mark = text.find(kSpaceMark, begin);
    const size_t end = mark == std::string_view::npos ? text.size() : mark;
    encode_plain(text.substr(begin, end - begin), out);
    if (mark == std::string_view::npos) return;
    out.insert(out.end(), space_mark_bytes.begin(), space_mark_bytes.end());
    begin = mark + kSpaceMark.size();
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  size_t bad = 0;
  if (!valid_utf8(text, &bad)) {
    throw InvalidArgument(fmt::format(
        "tokenizer '{}': the text is not UTF-8 at byte {} (0x{:02X}); SentencePiece encodes "
        "UTF-8 only (convert the text first, e.g. iconv -f LATIN1 -t UTF-8)",
        impl_->path.string(), bad, static_cast<unsigned char>(text[bad])));
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  if (impl_->lossless) {
    impl_->encode_lossless(text, out);
  } else {
    impl_->encode_plain(text, out);
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  const Impl& m = *impl_;
  const int32_t n = vocab_size();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= n) {
      throw InvalidArgument(fmt::format(
          "tokenizer '{}': id {} (token {} of {}) is outside the vocabulary's 0..{}; decode ids "
          "this tokenizer encoded",
          m.path.string(), ids[i], i + 1, ids.size(), n - 1));
    }
  }
  std::string text;
  size_t begin = 0;
  while (begin < ids.size()) {
    size_t end = ids.size();
    if (m.cuts_at_newlines && ids.size() - begin > kDecodeChunkIds) {
      // Before a non-byte id, so that no character's bytes are split between two calls.
      end = begin + kDecodeChunkIds;
      while (end < ids.size() && m.sp.IsByte(ids[end])) ++end;
    }
    const std::vector<int> part(ids.begin() + static_cast<std::ptrdiff_t>(begin),
                                ids.begin() + static_cast<std::ptrdiff_t>(end));
    std::string piece_text;
    const spm::util::Status status = m.sp.Decode(part, &piece_text);
    if (!status.ok()) {
      throw Error(fmt::format("tokenizer '{}': SentencePiece could not decode {} ids: {}",
                              m.path.string(), part.size(), status.ToString()));
    }
    text += piece_text;
    begin = end;
  }
  return text;
}

int32_t Tokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }
int32_t Tokenizer::bos_id() const { return impl_->sp.bos_id(); }
int32_t Tokenizer::eos_id() const { return impl_->sp.eos_id(); }
int32_t Tokenizer::unk_id() const { return impl_->sp.unk_id(); }
int32_t Tokenizer::pad_id() const { return impl_->sp.pad_id(); }

std::string Tokenizer::piece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    throw InvalidArgument(fmt::format("tokenizer '{}': id {} is outside the vocabulary's 0..{}",
                                      impl_->path.string(), id, vocab_size() - 1));
  }
  return impl_->sp.IdToPiece(id);
}

bool Tokenizer::is_byte(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->sp.IsByte(id);
}

bool Tokenizer::lossless() const { return impl_->lossless; }
const std::string& Tokenizer::model_type() const { return impl_->facts.model_type; }
const std::string& Tokenizer::normalizer() const { return impl_->facts.normalizer; }
const fs::path& Tokenizer::path() const { return impl_->path; }
const std::string& Tokenizer::sha256() const { return impl_->sha256; }
uint64_t Tokenizer::file_bytes() const { return impl_->file_bytes; }

}  // namespace zerodp::tokenizer
