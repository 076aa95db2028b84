// meta.json's units must describe themselves consistently (numel, offsets, coverage), a
// model's layout is compared field by field, and checkpoint files must be regular files:
// each refusal is CorruptData naming the file and the field.
#include "checkpoint/format.h"

#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/consolidate.h"
#include "core/error.h"
#include "temp_dir.h"

namespace zerodp::checkpoint {
namespace {

using zerodp::testing::TempDir;
using Json = nlohmann::ordered_json;

// One rank, one unit "u" of two tensors back to back: a (2, 3) at 0 and b (4) at 6.
Meta small_meta() {
  Meta m;
  m.zerodp_version = "test";
  m.world_size = 1;
  m.precision = "fp32";
  m.model_kind = "toy";
  m.model_shape = {{"width", 3}};
  m.units = {UnitMeta{.name = "u",
                      .numel = 10,
                      .tensors = {{"a", {2, 3}, 0, 6}, {"b", {4}, 6, 4}},
                      .counts = {10}}};
  m.samples_per_step = 4;
  m.dataset_size = 10;
  m.rank_seeds = {1};
  m.files = {FileMeta{.name = rank_file_name(0), .bytes = 100, .crc32c = "0123abcd", .sha256 = {}}};
  return m;
}

// The CorruptData message parse_meta gives after `edit` changes the JSON, or "" when none.
std::string refusal(const std::function<void(Json&)>& edit) {
  Json j = Json::parse(to_json(small_meta()));
  edit(j);
  try {
    parse_meta(j.dump(), "ck/meta.json");
  } catch (const CorruptData& e) {
    return e.what();
  }
  return "";
}

TEST(ParseMeta, TakesAHistoryFileAfterTheRankFilesAndNothingElse) {
  EXPECT_FALSE(parse_meta(to_json(small_meta()), "m").has_history());
  Meta m = small_meta();
  m.files.push_back(FileMeta{.name = std::string(kHistoryFile),
                             .bytes = 10,
                             .crc32c = {},
                             .sha256 = std::string(64, 'f')});
  EXPECT_TRUE(parse_meta(to_json(m), "m").has_history());
  const std::string e = refusal([](Json& j) {
    j["files"].push_back({{"name", "extra.bin"}, {"bytes", 1}, {"sha256", std::string(64, '0')}});
  });
  EXPECT_NE(e.find("files[1].name"), std::string::npos) << e;
  EXPECT_NE(e.find("history.jsonl"), std::string::npos) << e;
}

// A file's digest is a CRC-32C, or in checkpoints from before it a SHA-256: either round-trips;
// one of neither kind, or not lowercase hex of its length, is refused naming the field.
TEST(ParseMeta, TakesACrc32cOrAnOlderSha256PerFile) {
  Meta m = small_meta();
  m.files.push_back(FileMeta{.name = std::string(kHistoryFile),
                             .bytes = 10,
                             .crc32c = {},
                             .sha256 = std::string(64, 'e')});
  const Meta back = parse_meta(to_json(m), "m");
  EXPECT_EQ(back.files[0].crc32c, "0123abcd");
  EXPECT_EQ(back.files[0].sha256, "");
  EXPECT_EQ(back.files[1].sha256, std::string(64, 'e'));
  EXPECT_EQ(back.files[1].crc32c, "");
  EXPECT_NE(to_json(m).find("\"crc32c\": \"0123abcd\""), std::string::npos);
  std::string e = refusal([](Json& j) { j["files"][0].erase("crc32c"); });
  EXPECT_NE(e.find("files[0]"), std::string::npos) << e;
  EXPECT_NE(e.find("neither"), std::string::npos) << e;
  e = refusal([](Json& j) { j["files"][0]["crc32c"] = "0123ABCD"; });
  EXPECT_NE(e.find("files[0].crc32c"), std::string::npos) << e;
  e = refusal([](Json& j) { j["files"][0]["crc32c"] = "0123abc"; });
  EXPECT_NE(e.find("is not 8 lowercase hex digits"), std::string::npos) << e;
}

// The writer lists one digest per file; an entry with both would have one of them taken on
// trust, so it is refused whichever is wrong.
TEST(ParseMeta, RefusesAFileEntryWithBothDigests) {
  const std::string e = refusal([](Json& j) { j["files"][0]["sha256"] = std::string(64, '0'); });
  EXPECT_NE(e.find("ck/meta.json: field \"files[0]\" has both \"crc32c\" and \"sha256\""),
            std::string::npos)
      << e;
}

// A data cursor no sampler leaves is damage (CorruptData naming the field and the value),
// not a batch to advise on.
TEST(ParseMeta, RefusesADataCursorNoRunSaves) {
  const std::vector<std::pair<std::function<void(Json&)>, std::string>> cases{
      {[](Json& j) { j["data"]["samples_per_step"] = 0; },
       "field \"data.samples_per_step\" is 0; a step takes 1 sample or more"},
      {[](Json& j) { j["data"]["samples_per_step"] = -4; },
       "field \"data.samples_per_step\" is -4, expected a non-negative integer"},
      {[](Json& j) { j["data"]["samples_per_step"] = uint64_t{1} << 62; },
       "field \"data.samples_per_step\" is 4611686018427387904, more than the 10 samples"},
      {[](Json& j) { j["world_size"] = 3; },
       "field \"data.samples_per_step\" is 4, which the 3 ranks"},
      {[](Json& j) { j["data"]["step_in_epoch"] = 2; },
       "field \"data.step_in_epoch\" is 2, past the 2 steps of an epoch"}};
  for (const auto& [edit, text] : cases) {
    const std::string e = refusal([&](Json& j) {
      edit(j);
      // A world of 3 has a partition of 3.
      if (j["world_size"] == 3) j["units"][0]["partition"] = {4, 3, 3};
    });
    EXPECT_NE(e.find(text), std::string::npos) << e;
  }
  EXPECT_EQ(refusal([](Json& j) { j["data"]["step_in_epoch"] = 1; }), "");
}

TEST(SavedValues, FiniteStatesAndNonNegativeSecondMomentsAndScales) {
  EXPECT_EQ(saved_values("params"), SavedValues::kFinite);
  EXPECT_EQ(saved_values("master"), SavedValues::kFinite);
  EXPECT_EQ(saved_values("adam_m"), SavedValues::kFinite);
  EXPECT_EQ(saved_values("outer_momentum"), SavedValues::kFinite);
  EXPECT_EQ(saved_values("adam_v"), SavedValues::kFiniteNonNegative);
  EXPECT_EQ(saved_values("adam_m8_scale"), SavedValues::kFiniteNonNegative);
  EXPECT_EQ(saved_values("adam_v8_scale"), SavedValues::kFiniteNonNegative);
  EXPECT_EQ(saved_values("adam_m8"), SavedValues::kAny);
}

// Every element is looked at, past the 512 of a block too; -0 is not negative.
TEST(SavedValues, FindsTheFirstValueARunDoesNotSave) {
  using safetensors::ElementType;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(2000, 1.5f);
  x[3] = -0.0f;
  const auto bad = [&](SavedValues rule) {
    return first_bad_value(std::as_bytes(std::span(x)), ElementType::kF32, rule);
  };
  EXPECT_FALSE(bad(SavedValues::kFiniteNonNegative));
  x[1500] = -2.0f;
  EXPECT_FALSE(bad(SavedValues::kFinite));
  ASSERT_TRUE(bad(SavedValues::kFiniteNonNegative));
  EXPECT_EQ(bad(SavedValues::kFiniteNonNegative)->index, 1500u);
  EXPECT_EQ(bad(SavedValues::kFiniteNonNegative)->value, -2.0);
  x[1499] = std::nanf("");
  EXPECT_EQ(bad(SavedValues::kFinite)->index, 1499u);
  EXPECT_TRUE(std::isnan(bad(SavedValues::kFinite)->value));
  x[700] = -inf;
  EXPECT_EQ(bad(SavedValues::kFinite)->index, 700u);
  EXPECT_EQ(bad(SavedValues::kFinite)->value, -static_cast<double>(inf));
  EXPECT_FALSE(bad(SavedValues::kAny));
  // 16-bit: an all-ones exponent (BF16 0x7f80, F16 0x7c00) is not finite.
  std::vector<uint16_t> h(600, 0x3c00);
  h[599] = 0x7c00;
  const auto bad16 = [&](ElementType t) {
    return first_bad_value(std::as_bytes(std::span(h)), t, SavedValues::kFinite);
  };
  EXPECT_EQ(bad16(ElementType::kF16)->index, 599u);
  EXPECT_EQ(bad16(ElementType::kF16)->value, static_cast<double>(inf));
  EXPECT_FALSE(bad16(ElementType::kBF16));
  h[10] = 0xff80;
  EXPECT_EQ(bad16(ElementType::kBF16)->index, 10u);
  EXPECT_EQ(bad16(ElementType::kBF16)->value, -static_cast<double>(inf));
  // A half's value, normal and subnormal, exactly as the message gives it.
  const auto negative16 = [&](uint16_t bits) {
    const std::vector<uint16_t> one{0x3c00, bits};
    return first_bad_value(std::as_bytes(std::span(one)), ElementType::kF16,
                           SavedValues::kFiniteNonNegative)
        ->value;
  };
  EXPECT_EQ(negative16(0xc000), -2.0);
  EXPECT_EQ(negative16(0xbc01), -1.0009765625);
  EXPECT_EQ(negative16(0x8001), -std::ldexp(1.0, -24));
  EXPECT_FALSE(
      first_bad_value(std::as_bytes(std::span(h)), ElementType::kU8, SavedValues::kFinite));
}

TEST(History, RoundTripsEveryFieldAndNonFiniteNumbersAsNaN) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<StepHistory> steps{{.step = 4,
                                  .loss = 5.25,
                                  .lr = 1e-3,
                                  .grad_norm = 1.5,
                                  .grad_norm_clipped = 1,
                                  .loss_scale = 65536.0,
                                  .skipped = false,
                                  .tokens = 512,
                                  .val_loss = 5.5},
                                 {.step = 5,
                                  .loss = 0.1 + 0.2,
                                  .lr = 9e-4,
                                  .grad_norm = inf,
                                  .grad_norm_clipped = inf,
                                  .loss_scale = 32768.0,
                                  .skipped = true,
                                  .tokens = 512,
                                  .val_loss = std::nullopt}};
  const std::vector<StepHistory> back = parse_history(history_to_jsonl(steps), "h", 5);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].step, 4);
  EXPECT_EQ(back[0].loss, 5.25);
  EXPECT_EQ(back[0].loss_scale, 65536.0);
  EXPECT_EQ(back[0].val_loss, 5.5);
  EXPECT_EQ(back[1].loss, 0.1 + 0.2);  // every bit of a double
  EXPECT_TRUE(std::isnan(back[1].grad_norm));
  EXPECT_TRUE(back[1].skipped);
  EXPECT_EQ(back[1].tokens, 512u);
  EXPECT_FALSE(back[1].val_loss.has_value());
  EXPECT_TRUE(parse_history("", "h", 7).empty());
}

TEST(History, RefusesGapsAnEndElsewhereThanTheCheckpointAndBadLines) {
  const auto refused = [](const std::string& text, uint64_t last) {
    try {
      parse_history(text, "ck/history.jsonl", last);
    } catch (const CorruptData& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::vector<StepHistory> steps(3);
  for (int i = 0; i < 3; ++i) steps[static_cast<size_t>(i)].step = i + 1;
  const std::string text = history_to_jsonl(steps);
  EXPECT_EQ(refused(text, 3), "");
  EXPECT_NE(refused(text, 4).find("ends at step 3, the checkpoint is at step 4"),
            std::string::npos);
  steps[2].step = 4;
  EXPECT_NE(refused(history_to_jsonl(steps), 4).find("line 3: field \"step\" is 4, expected 3"),
            std::string::npos)
      << refused(history_to_jsonl(steps), 4);
  EXPECT_NE(refused(text.substr(0, text.size() - 1), 3).find("line 3 has no newline"),
            std::string::npos);
  EXPECT_NE(refused("{\"step\": 1}\n", 1).find("line 1: field \"loss\" is missing"),
            std::string::npos)
      << refused("{\"step\": 1}\n", 1);
  EXPECT_NE(refused("[1]\n", 1).find("line 1: is not a JSON object"), std::string::npos);
}

TEST(ParseMeta, AcceptsUnitsWhoseTensorsLieBackToBack) {
  EXPECT_EQ(refusal([](Json&) {}), "");
  EXPECT_EQ(parse_meta(to_json(small_meta()), "m").units, small_meta().units);
}

TEST(ParseMeta, RefusesANumelThatIsNotItsShapesProduct) {
  // A swapped numel made export declare one size and stream another.
  const std::string e = refusal([](Json& j) { j["units"][0]["tensors"][0]["numel"] = 5; });
  EXPECT_NE(e.find("ck/meta.json: field \"units[0].tensors[0].numel\" is 5, but shape [2, 3] "
                   "holds 6"),
            std::string::npos)
      << e;
  const std::string s = refusal([](Json& j) { j["units"][0]["tensors"][1]["shape"] = {5}; });
  EXPECT_NE(s.find("field \"units[0].tensors[1].numel\" is 4, but shape [5] holds 5"),
            std::string::npos)
      << s;
  // A product past 2^64 is not wrapped into agreement.
  const std::string big = refusal([](Json& j) {
    j["units"][0]["tensors"][1]["shape"] = {uint64_t{1} << 62, 4};
  });
  EXPECT_NE(big.find("holds more than the unit"), std::string::npos) << big;
}

TEST(ParseMeta, RefusesTensorsWithGapsOrThatLeaveTheUnitUncovered) {
  const std::string gap = refusal([](Json& j) { j["units"][0]["tensors"][1]["offset"] = 5; });
  EXPECT_NE(gap.find("field \"units[0].tensors[1].offset\" is 5; the tensors before it end at 6"),
            std::string::npos)
      << gap;
  const std::string short_unit = refusal([](Json& j) { j["units"][0]["tensors"].erase(1); });
  EXPECT_NE(short_unit.find("field \"units[0].tensors\" cover 6 elements, the unit has 10"),
            std::string::npos)
      << short_unit;
}

TEST(CheckModel, NamesTheFirstFieldThatDiffersFromTheModel) {
  const Meta m = small_meta();
  std::vector<UnitMeta> expected = m.units;
  EXPECT_NO_THROW(check_model(m, expected, "ck/meta.json"));
  expected[0].tensors[0].shape = {3, 2};
  try {
    check_model(m, expected, "ck/meta.json");
    ADD_FAILURE() << "expected CorruptData";
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("ck/meta.json: field \"units[0].tensors[0]\" is a [2, 3] "
                                         "at offset 0; the toy (width 3) of field \"model\" has "
                                         "a [3, 2]"),
              std::string::npos)
        << e.what();
  }
  expected.push_back(expected[0]);
  try {
    check_model(m, expected, "ck/meta.json");
    ADD_FAILURE() << "expected CorruptData";
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("field \"units\" lists 1 units"), std::string::npos)
        << e.what();
  }
}

TEST(RequireRegularFile, RefusesFifosDirectoriesAndDevicesNamingTheRole) {
  TempDir dir;
  const auto fifo = dir.path() / "rank_00000.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto zero = dir.path() / "rank_00001.safetensors";
  std::filesystem::create_symlink("/dev/zero", zero);
  const auto sub = dir.path() / "meta.json";
  std::filesystem::create_directory(sub);
  const auto regular = dir.path() / "regular";
  std::ofstream(regular) << "x";
  for (const auto& [path, text] :
       {std::pair{fifo, "checkpoint shard '" + fifo.string() + "' is a FIFO"},
        std::pair{zero, "checkpoint shard '" + zero.string() +
                            "' is a character device (a link to '/dev/zero')"},
        std::pair{sub, "checkpoint shard '" + sub.string() + "' is a directory"}}) {
    try {
      require_regular_file(path, "checkpoint shard");
      ADD_FAILURE() << "expected CorruptData for " << path;
    } catch (const CorruptData& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(require_regular_file(regular, "checkpoint shard"));
  // Absent: the caller reports it in its own words.
  EXPECT_NO_THROW(require_regular_file(dir.path() / "absent", "checkpoint shard"));
}

}  // namespace
}  // namespace zerodp::checkpoint
