// SentencePiece tokenizers: exact round trips of hostile text, the special ids, the file's
// digest, refusals of damaged models and of vocabularies that do not fit, and models trained
// with other settings (Llama's, SentencePiece's defaults) loaded as they are.
#include "tokenizer/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/sha256.h"
#include "data/encoded_text.h"
#include "temp_dir.h"
#include "tokenizer/train.h"

namespace zerodp::tokenizer {
namespace {

namespace fs = std::filesystem;
using zerodp::testing::TempDir;

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out << bytes;
}

// About `bytes` of verse-like lines: KJV-style references, words of a fixed list with capitals
// and punctuation, now and then indentation, a tab, a number, a few non-ASCII words.
std::string corpus(size_t bytes) {
  static const char* kWords[] = {
      "the",       "and",    "of",      "to",    "in",     "that",  "he",    "shall",   "unto",
      "for",       "his",    "a",       "lord",  "they",   "be",    "is",    "him",     "not",
      "them",      "it",     "with",    "all",   "thou",   "thy",   "was",   "god",     "which",
      "my",        "me",     "said",    "but",   "ye",     "their", "have",  "will",    "thee",
      "from",      "as",     "are",     "when",  "this",   "out",   "were",  "upon",    "man",
      "by",        "israel", "king",    "son",   "up",     "there", "hath",  "then",    "people",
      "came",      "had",    "house",   "into",  "on",     "her",   "come",  "one",     "we",
      "children",  "before", "your",    "also",  "day",    "land",  "men",   "against", "shalt",
      "let",       "go",     "hand",    "us",    "made",   "went",  "even",  "behold",  "saying",
      "therefore", "every",  "because", "after", "father", "david", "great", "name",    "heart",
      "café",      "naïve",  "Æther",   "日本",  "ελπίς",  "😀"};
  static const char* kBooks[] = {"Ge", "Ex", "Le", "Nu", "De", "Jos", "Ps", "Isa", "Mt", "Re"};
  static const char* kPunct[] = {",", ";", ":", ".", "?", "!"};
  uint64_t s = 88172645463325252ull;
  const auto next = [&s](uint64_t n) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s % n;
  };
  std::string text;
  for (uint64_t line = 0; text.size() < bytes; ++line) {
    if (line % 37 == 0) text += "    ";
    if (line % 53 == 0) text += "\t";
    text += kBooks[next(std::size(kBooks))] + std::to_string(1 + next(50)) + ":" +
            std::to_string(1 + next(40));
    const uint64_t words = 5 + next(20);
    for (uint64_t w = 0; w < words; ++w) {
      std::string word = kWords[next(std::size(kWords))];
      if (w == 0 && word[0] >= 'a' && word[0] <= 'z') word[0] = static_cast<char>(word[0] - 32);
      text += ' ';
      text += word;
      if (next(6) == 0) text += kPunct[next(std::size(kPunct))];
      if (next(40) == 0) {
        text += ' ';
        text += std::to_string(next(100000));
      }
    }
    text += line % 29 == 0 ? "\r\n" : "\n";
    if (line % 31 == 0) text += "\n";
  }
  return text;
}

// Text that a tokenizer with normalization, whitespace rules or <unk> would change.
std::vector<std::string> hostile_strings() {
  return {
      "",
      " ",
      "   leading spaces",
      "trailing spaces   ",
      "a  b   c    d",
      "\t\ttabs\there\t",
      "windows\r\nline\r\nends\r\n",
      "\n\n\nblank lines\n\n\n",
      "emoji 😀🎉👍🏽 and a family 👨‍👩‍👧",
      "CJK 日本語の文章と中文，한국어",
      "combining e\u0301 a\u0308 n\u0303 and precomposed é ä ñ",
      "NFKC would change: ﬁ Ａ ① ㎏ \u00A0nbsp \u2009thin",
      "SentencePiece's marks: ▁ ▁▁x▁ and ▅ alone",
      "<s> </s> <unk> <pad> <0x41> <0x0A>",
      std::string("a NUL \0 inside", 14),
      "digits 0123456789 3.14159 1,000,000",
      "  \n \t \r  \n",
      std::string(10000, 'x') + " a line above SentencePiece's default max_sentence_length",
      "\U0010FFFF\U0001F600 the last code point",
  };
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    text_ = new std::string(corpus(200 * 1024));
    write_file(dir_->path() / "corpus.txt", *text_);
    TrainOptions o;
    o.inputs = {dir_->path() / "corpus.txt"};
    o.vocab_size = 800;
    o.output = dir_->path() / "bpe.model";
    trained_ = new TrainResult(train_tokenizer(o));
  }
  static void TearDownTestSuite() {
    delete trained_;
    delete text_;
    delete dir_;
  }
  static fs::path model() { return dir_->path() / "bpe.model"; }
  static fs::path corpus_file() { return dir_->path() / "corpus.txt"; }

  static TempDir* dir_;
  static std::string* text_;
  static TrainResult* trained_;
};
TempDir* TokenizerTest::dir_ = nullptr;
std::string* TokenizerTest::text_ = nullptr;
TrainResult* TokenizerTest::trained_ = nullptr;

TEST_F(TokenizerTest, RoundTripsHostileTextExactly) {
  const Tokenizer t(model());
  ASSERT_TRUE(t.lossless());
  for (const std::string& s : hostile_strings()) {
    const std::vector<int32_t> ids = t.encode(s);
    EXPECT_EQ(t.decode(ids), s) << "text: " << s.substr(0, 80);
    for (const int32_t id : ids) EXPECT_NE(id, t.unk_id()) << "text: " << s.substr(0, 80);
  }
  std::string all;
  for (const std::string& s : hostile_strings()) all += s + "\n";
  EXPECT_EQ(t.decode(t.encode(all)), all);
}

TEST_F(TokenizerTest, SpecialIdsAndSettings) {
  const Tokenizer t(model());
  EXPECT_EQ(t.vocab_size(), 800);
  EXPECT_EQ(trained_->vocab_size, 800);
  EXPECT_EQ(t.unk_id(), 0);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.pad_id(), -1);
  EXPECT_EQ(t.piece(0), "<unk>");
  EXPECT_EQ(t.piece(1), "<s>");
  EXPECT_EQ(t.piece(2), "</s>");
  EXPECT_EQ(t.piece(3), "<0x00>");
  EXPECT_TRUE(t.is_byte(3 + 0x0A));
  EXPECT_EQ(t.model_type(), "bpe");
  EXPECT_EQ(t.normalizer(), "identity");
  // A newline is one token, byte fallback's <0x0A>; bos and eos decode to nothing.
  EXPECT_EQ(t.encode("\n"), std::vector<int32_t>{3 + 0x0A});
  const std::vector<int32_t> framed = {t.bos_id(), t.encode("In the beginning")[0], t.eos_id()};
  EXPECT_EQ(t.decode(framed), t.decode(std::vector<int32_t>{framed[1]}));
  EXPECT_THROW(t.piece(800), InvalidArgument);
  EXPECT_THROW(t.decode(std::vector<int32_t>{5, 800}), InvalidArgument);
  EXPECT_THROW(t.decode(std::vector<int32_t>{-1}), InvalidArgument);
}

TEST_F(TokenizerTest, TrainingCountsTheInput) {
  EXPECT_EQ(trained_->files, 1u);
  EXPECT_EQ(trained_->bytes, text_->size());
  uint64_t lines = 0, empty = 0;
  for (size_t i = 0; i < text_->size(); ++i) {
    if ((*text_)[i] != '\n') continue;
    ++lines;
    if (i > 0 && (*text_)[i - 1] == '\n') ++empty;
  }
  EXPECT_EQ(trained_->lines, lines);
  EXPECT_EQ(trained_->empty_lines, empty);
  EXPECT_GT(trained_->characters, 60u);
  EXPECT_EQ(trained_->min_vocab, kSpecialPieces + trained_->characters);
}

TEST_F(TokenizerTest, Sha256IsTheFilesBytes) {
  const Tokenizer t(model());
  EXPECT_EQ(t.sha256(), sha256_file_hex(model()));
  EXPECT_EQ(t.sha256(), trained_->sha256);
  EXPECT_EQ(t.file_bytes(), fs::file_size(model()));
}

TEST_F(TokenizerTest, EncodesInPiecesAsSentencePieceDoesWhole) {
  // Longer than the encoder's pieces (64 KiB of text, 32 Ki ids): the ids SentencePiece gives
  // the whole text at once, and the text it decodes them to.
  const Tokenizer t(model());
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(model().string()).ok());
  std::vector<int> whole;
  ASSERT_TRUE(sp.Encode(*text_, &whole).ok());
  const std::vector<int32_t> ids = t.encode(*text_);
  EXPECT_EQ(std::vector<int>(ids.begin(), ids.end()), whole);
  EXPECT_GT(ids.size(), size_t{1} << 15);
  EXPECT_EQ(t.decode(ids), *text_);
}

TEST_F(TokenizerTest, RefusesTextThatIsNotUtf8) {
  const Tokenizer t(model());
  try {
    t.encode("ok \xC3\x28 bad");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("not UTF-8 at byte 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.encode("\xED\xA0\x80"), InvalidArgument);      // a surrogate
  EXPECT_THROW(t.encode("\xC0\xAF"), InvalidArgument);          // overlong
  EXPECT_THROW(t.encode("\xF4\x90\x80\x80"), InvalidArgument);  // past U+10FFFF
}

TEST_F(TokenizerTest, RefusesDamagedModels) {
  const std::string bytes = zerodp::testing::file_bytes(model());
  const fs::path damaged = dir_->path() / "damaged.model";
  for (const std::string& d :
       {bytes.substr(0, bytes.size() / 2), std::string(), std::string("not a model at all\n")}) {
    write_file(damaged, d);
    try {
      const Tokenizer t(damaged);
      FAIL() << "loaded a damaged model of " << d.size() << " bytes";
    } catch (const CorruptData& e) {
      EXPECT_NE(std::string(e.what()).find(damaged.string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("not a SentencePiece model"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(Tokenizer(dir_->path() / "missing.model"), InvalidArgument);
  EXPECT_THROW(Tokenizer(dir_->path()), InvalidArgument);  // a directory
}

TEST_F(TokenizerTest, RefusesVocabulariesThatDoNotFit) {
  TrainOptions o;
  o.inputs = {corpus_file()};
  o.output = dir_->path() / "refused.model";
  const auto message = [&](int vocab) {
    o.vocab_size = vocab;
    try {
      train_tokenizer(o);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  std::string m = message(100000);
  EXPECT_NE(m.find("--vocab 100000 is too large"), std::string::npos) << m;
  EXPECT_NE(m.find("or less"), std::string::npos) << m;
  m = message(300);
  EXPECT_NE(m.find("--vocab 300 is too small"), std::string::npos) << m;
  EXPECT_NE(m.find(fmt::format("use --vocab {} or more", trained_->min_vocab)), std::string::npos)
      << m;
  m = message(259);
  EXPECT_NE(m.find("needs more than 259"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(o.output));

  // 3 characters and 9 substrings that may be pieces: ab aba abab ba bab ▁a ▁ab ▁aba ▁abab.
  // Above that the scan refuses; at it, training ends below, and says where.
  write_file(dir_->path() / "abab.txt", std::string("abab abab\n") + "abab abab abab\n");
  o.inputs = {dir_->path() / "abab.txt"};
  m = message(kSpecialPieces + 3 + 9 + 1);
  EXPECT_NE(m.find("it gives at most 271 pieces"), std::string::npos) << m;
  m = message(kSpecialPieces + 3 + 9);
  EXPECT_NE(m.find("training ended at"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(o.output));
}

TEST_F(TokenizerTest, RefusesBadInputsAndOutputs) {
  TrainOptions o;
  o.vocab_size = 800;
  o.inputs = {dir_->path() / "missing.txt"};
  o.output = dir_->path() / "x.model";
  EXPECT_THROW(train_tokenizer(o), InvalidArgument);
  o.inputs = {corpus_file()};
  o.output = corpus_file();  // onto its input
  EXPECT_THROW(train_tokenizer(o), InvalidArgument);
  EXPECT_EQ(zerodp::testing::file_bytes(corpus_file()), *text_);
  write_file(dir_->path() / "blank.txt", "\n\n\n");
  o.inputs = {dir_->path() / "blank.txt"};
  o.output = dir_->path() / "x.model";
  EXPECT_THROW(train_tokenizer(o), InvalidArgument);
  o.inputs = {corpus_file()};
  o.sample_lines = 50;
  EXPECT_THROW(train_tokenizer(o), InvalidArgument);
  o.sample_lines = 0;
  write_file(dir_->path() / "latin1.txt", "fine\nna\xEFve\n");
  o.inputs = {dir_->path() / "latin1.txt"};
  o.output = dir_->path() / "x.model";
  try {
    train_tokenizer(o);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("line 2 is not UTF-8"), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerTest, UnigramRoundTripsToo) {
  TrainOptions o;
  o.inputs = {corpus_file()};
  o.vocab_size = 500;
  o.type = ModelType::kUnigram;
  o.output = dir_->path() / "unigram.model";
  const TrainResult r = train_tokenizer(o);
  EXPECT_EQ(r.vocab_size, 500);
  const Tokenizer t(o.output);
  EXPECT_EQ(t.model_type(), "unigram");
  ASSERT_TRUE(t.lossless());
  for (const std::string& s : hostile_strings()) {
    EXPECT_EQ(t.decode(t.encode(s)), s) << "text: " << s.substr(0, 80);
  }
}

// A model SentencePiece's own trainer wrote with other settings, as a downloaded one would be.
fs::path spm_model(const fs::path& dir, const fs::path& corpus,
                   std::unordered_map<std::string, std::string> settings) {
  settings["input"] = corpus.string();
  settings["model_prefix"] = (dir / "spm").string();
  settings["vocab_size"] = "500";
  settings["minloglevel"] = "2";
  const auto status = sentencepiece::SentencePieceTrainer::Train(settings);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return dir / "spm.model";
}

TEST_F(TokenizerTest, LoadsALlamaStyleModelAsItIs) {
  // Llama 2's settings: BPE, byte fallback, identity normalization, a dummy prefix, digits
  // split, unk 0 / bos 1 / eos 2.
  const fs::path m = spm_model(dir_->path(), corpus_file(),
                               {{"model_type", "bpe"},
                                {"byte_fallback", "true"},
                                {"normalization_rule_name", "identity"},
                                {"remove_extra_whitespaces", "false"},
                                {"add_dummy_prefix", "true"},
                                {"split_digits", "true"},
                                {"character_coverage", "0.99995"},
                                {"unk_id", "0"},
                                {"bos_id", "1"},
                                {"eos_id", "2"}});
  const Tokenizer t(m);
  EXPECT_EQ(t.vocab_size(), 500);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.model_type(), "bpe");
  EXPECT_FALSE(t.lossless());  // a literal U+2581 would come back a space
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(m.string()).ok());
  for (const std::string& s :
       {std::string("And God said"), std::string("  two spaces\nand ▁ a mark"), *text_}) {
    std::vector<int> want;
    ASSERT_TRUE(sp.Encode(s, &want).ok());
    const std::vector<int32_t> ids = t.encode(s);
    EXPECT_EQ(std::vector<int>(ids.begin(), ids.end()), want) << s.substr(0, 80);
  }
  EXPECT_EQ(t.piece(t.encode("And")[0]).substr(0, 3), "\xe2\x96\x81");  // the dummy prefix
  EXPECT_EQ(t.decode(t.encode("And God said\n  so")), "And God said\n  so");
}

TEST_F(TokenizerTest, LoadsADefaultUnigramModel) {
  // SentencePiece's defaults: unigram, NFKC normalization, extra whitespace removed.
  const fs::path m = spm_model(dir_->path(), corpus_file(), {});
  const Tokenizer t(m);
  EXPECT_EQ(t.model_type(), "unigram");
  EXPECT_EQ(t.normalizer(), "nmt_nfkc");
  EXPECT_FALSE(t.lossless());
  EXPECT_EQ(t.decode(t.encode("a  b")), "a b");  // as SentencePiece does
}

// --data FILE --tokenizer: the text split at the next line start after the byte split, each
// part the tokenizer's bos and then the ids of the whole part (blocks of lines encoded apart
// and joined give them), read back through the dataset.
TEST_F(TokenizerTest, EncodedTextIsEachPartsIdsAfterBos) {
  const std::vector<uint8_t> bytes(text_->begin(), text_->end());
  const Tokenizer t(model());
  const EncodedTextSplits s = encode_text_splits(bytes, "corpus", model(), 32, 800, 0.02);
  const auto byte_split =
      text_->size() - static_cast<size_t>(static_cast<double>(text_->size()) * 0.02);
  const size_t split = text_->find('\n', byte_split) + 1;
  ASSERT_GT(split, byte_split);
  for (const auto& [part, dataset] : {std::pair{text_->substr(0, split), &s.train},
                                      std::pair{text_->substr(split), &s.validation}}) {
    std::vector<int32_t> want = t.encode(part);
    want.insert(want.begin(), t.bos_id());
    ASSERT_EQ(dataset->tokens(), want.size());
    std::vector<int32_t> got(want.size());
    dataset->read(0, got);
    EXPECT_EQ(got, want);
    EXPECT_EQ(dataset->size(), (want.size() - 1) / 32);
  }
  EXPECT_EQ(s.tokenizer_sha256, t.sha256());
  EXPECT_DOUBLE_EQ(s.validation_bytes_per_token, static_cast<double>(text_->size() - split) /
                                                     static_cast<double>(s.validation.tokens()));

  EXPECT_THROW(encode_text_splits(bytes, "corpus", model(), 32, 799, 0.02), InvalidArgument);
  std::vector<uint8_t> bad = bytes;
  const size_t at = text_->find('\n', 5000) + 3;
  bad[at] = 0xFF;
  const auto line =
      std::count(text_->begin(), text_->begin() + static_cast<ptrdiff_t>(at), '\n') + 1;
  try {
    encode_text_splits(bad, "corpus", model(), 32, 800, 0.02);
    ADD_FAILURE() << "a text that is not UTF-8 was encoded";
  } catch (const InvalidArgument& e) {
    const std::string want = fmt::format("corpus: not UTF-8 at line {}, byte {} (0xFF)", line, at);
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zerodp::tokenizer
