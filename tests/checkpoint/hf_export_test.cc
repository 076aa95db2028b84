// export_hf: a checkpoint as a Hugging Face model directory. Sharding and the index, the
// transposes against the F32 export, bf16 rounding, the metadata, and the output directory's
// rules. The layout here is the test's own (GPT-2's names and Conv1D transposes), so the
// checkpoint library is tested without src/train's mapping; the checkpoint is a tiny gpt
// trained on 3 ranks at stage 3 in bf16, so its master is split across rank files and a
// column read crosses rank boundaries.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/consolidate.h"
#include "checkpoint/hf_export.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "temp_dir.h"
#include "tensor/dtype.h"
#include "train/train_testing.h"

namespace zerodp {
namespace {

namespace fs = std::filesystem;
using checkpoint::export_hf;
using checkpoint::HfDtype;
using checkpoint::HfExportOptions;
using testing::TempDir;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// GPT-2's names: "transformer." before all but the head, the Conv1D weights transposed.
checkpoint::HfLayout gpt2_layout() {
  checkpoint::HfLayout l;
  l.tensor = [](const std::string& kind, const std::string& name) {
    EXPECT_EQ(kind, "gpt");
    if (name == "lm_head.weight") return checkpoint::HfName{name, false};
    bool conv = false;
    for (const char* tail :
         {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
      conv = conv || ends_with(name, tail);
    }
    return checkpoint::HfName{"transformer." + name, conv};
  };
  l.config = [](const std::string& kind, const std::map<std::string, int64_t>& shape,
                std::string_view dtype) {
    return nlohmann::json{{"kind", kind}, {"n_layer", shape.at("layers")}, {"torch_dtype", dtype}}
        .dump();
  };
  return l;
}

struct Tensor {
  std::vector<int64_t> shape;
  safetensors::ElementType type;
  std::vector<std::byte> bytes;
};

// Every tensor of a file, by name, and its names in file order.
std::map<std::string, Tensor> read_all(const fs::path& file, std::vector<std::string>* order = {}) {
  const safetensors::Reader r(file);
  std::map<std::string, Tensor> out;
  for (const auto& t : r.header().tensors) {
    Tensor& x = out[t.name];
    x.shape = t.shape;
    x.type = t.type;
    x.bytes.resize(t.bytes());
    r.read(t, 0, x.bytes);
    if (order != nullptr) order->push_back(t.name);
  }
  return out;
}

std::vector<float> floats(const Tensor& t) {
  std::vector<float> v(t.bytes.size() / 4);
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class HfExport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir;
    TrainConfig c = testing::tiny_config(3, 3);
    c.steps = 2;
    c.checkpoint_dir = (tmp_->path() / "ck").string();
    (void)testing::run(c);
    checkpoint::export_fp32(ck(), tmp_->path() / "fp32.safetensors");
    fp32_ = new std::map<std::string, Tensor>(read_all(tmp_->path() / "fp32.safetensors"));
  }
  static void TearDownTestSuite() {
    delete fp32_;
    delete tmp_;
  }
  static fs::path ck() { return tmp_->path() / "ck"; }
  // A fresh output path per test.
  fs::path out() const { return own_.path() / "hf"; }

  static TempDir* tmp_;
  static std::map<std::string, Tensor>* fp32_;  // the F32 export, zerodp's names
  TempDir own_;
};
TempDir* HfExport::tmp_ = nullptr;
std::map<std::string, Tensor>* HfExport::fp32_ = nullptr;

TEST_F(HfExport, ShardsAreIndexedEveryTensorOnceWithTheTotalSize) {
  HfExportOptions o;
  o.max_shard_bytes = 40000;  // wte and lm_head are 32 KiB each: several shards
  o.chunk_elements = 1000;
  const auto s = export_hf(ck(), out(), gpt2_layout(), o);
  ASSERT_GE(s.weight_files.size(), 3u);
  EXPECT_TRUE(s.indexed);
  EXPECT_LE(s.buffer_bytes, 1000u * 4 + 256);  // + a column run
  const std::string n = std::to_string(s.weight_files.size());
  for (size_t i = 0; i < s.weight_files.size(); ++i) {
    EXPECT_EQ(s.weight_files[i],
              "model-0000" + std::to_string(i + 1) + "-of-0000" + n + ".safetensors");
  }
  std::ifstream in(out() / "model.safetensors.index.json");
  const nlohmann::json index = nlohmann::json::parse(in);
  const auto& map = index.at("weight_map");
  EXPECT_EQ(map.size(), fp32_->size());
  uint64_t total = 0;
  std::vector<std::string> order;
  for (const std::string& file : s.weight_files) {
    std::vector<std::string> names;
    const auto tensors = read_all(out() / file, &names);
    uint64_t bytes = 0;
    for (const auto& [name, t] : tensors) {
      EXPECT_EQ(map.at(name), file) << name;  // the index names the file that holds it
      bytes += t.bytes.size();
    }
    // Greedy: no shard passes the limit but one holding a single larger tensor.
    if (tensors.size() > 1) {
      EXPECT_LE(bytes, o.max_shard_bytes) << file;
    }
    total += bytes;
    order.insert(order.end(), names.begin(), names.end());
    const safetensors::Reader r(out() / file);
    const auto& meta = r.header().metadata;
    EXPECT_EQ(meta.at("format"), "pt");
    EXPECT_EQ(meta.at("zerodp_format"), checkpoint::kExportFormat);
    EXPECT_EQ(meta.at("model"), "gpt");
    EXPECT_EQ(meta.at("layers"), "2");
    EXPECT_EQ(meta.at("step"), "2");
  }
  EXPECT_EQ(index.at("metadata").at("total_size"), total);
  EXPECT_EQ(s.total_size, total);
  // Every tensor once, in model order across the files.
  ASSERT_EQ(order.size(), fp32_->size());
  EXPECT_EQ(std::set<std::string>(order.begin(), order.end()).size(), order.size());
  EXPECT_EQ(order.front(), "transformer.wte.weight");
  EXPECT_EQ(order.back(), "lm_head.weight");
  std::ifstream cin(out() / "config.json");
  EXPECT_EQ(nlohmann::json::parse(cin).at("torch_dtype"), "float32");
}

TEST_F(HfExport, ATransposedTensorIsTheF32ExportsTranspose) {
  HfExportOptions o;
  o.chunk_elements = 100;  // blocks of 1 row (c_fc has 128) up to 3: many reads per tensor
  const auto s = export_hf(ck(), out(), gpt2_layout(), o);
  ASSERT_EQ(s.weight_files, std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(s.indexed);
  EXPECT_FALSE(fs::exists(out() / "model.safetensors.index.json"));
  const auto hf = read_all(out() / "model.safetensors");
  ASSERT_EQ(hf.size(), fp32_->size());
  int transposed = 0;
  for (const auto& [name, t] : *fp32_) {
    const std::string hf_name = name == "lm_head.weight" ? name : "transformer." + name;
    const Tensor& h = hf.at(hf_name);
    const std::vector<float> a = floats(t), b = floats(h);
    if (!gpt2_layout().tensor("gpt", name).transposed) {  // attn.c_proj is square: by name
      EXPECT_EQ(h.shape, t.shape) << name;
      EXPECT_EQ(a, b) << name;
      continue;
    }
    ++transposed;
    ASSERT_EQ(t.shape.size(), 2u);
    ASSERT_EQ(h.shape, (std::vector<int64_t>{t.shape[1], t.shape[0]})) << name;
    const auto rows = static_cast<size_t>(t.shape[0]), cols = static_cast<size_t>(t.shape[1]);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t k = 0; k < cols; ++k) ASSERT_EQ(b[k * rows + r], a[r * cols + k]) << name;
    }
  }
  EXPECT_EQ(transposed, 8);  // 4 Conv1D weights in each of 2 blocks
  EXPECT_EQ(hf.at("transformer.h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{32, 96}));
}

TEST_F(HfExport, Bf16IsEachFp32ValueRoundedToNearestEven) {
  HfExportOptions o;
  o.dtype = HfDtype::kBF16;
  o.chunk_elements = 1000;
  const auto s = export_hf(ck(), out(), gpt2_layout(), o);
  EXPECT_LE(s.buffer_bytes, 1000u * (4 + 2) + 256);
  const auto hf = read_all(out() / "model.safetensors");
  int rounded_up = 0;  // values where rounding differs from truncating: the test can tell
  for (const auto& [name, t] : *fp32_) {
    const std::string hf_name = name == "lm_head.weight" ? name : "transformer." + name;
    const Tensor& h = hf.at(hf_name);
    if (gpt2_layout().tensor("gpt", name).transposed) continue;  // the test above's
    ASSERT_EQ(h.type, safetensors::ElementType::kBF16) << name;
    const std::vector<float> a = floats(t);
    ASSERT_EQ(h.bytes.size(), a.size() * 2);
    for (size_t i = 0; i < a.size(); ++i) {
      uint16_t got = 0;
      std::memcpy(&got, h.bytes.data() + 2 * i, 2);
      ASSERT_EQ(got, to_bf16(a[i]).bits) << name << " [" << i << "] = " << a[i];
      uint32_t bits = 0;
      std::memcpy(&bits, &a[i], 4);
      rounded_up += got != static_cast<uint16_t>(bits >> 16);
    }
  }
  EXPECT_GT(rounded_up, 0);
  std::ifstream cin(out() / "config.json");
  EXPECT_EQ(nlohmann::json::parse(cin).at("torch_dtype"), "bfloat16");
}

TEST_F(HfExport, AnotherExportReplacesTheEarlierOneAndRemovesItsStaleFiles) {
  HfExportOptions sharded;
  sharded.max_shard_bytes = 40000;
  const auto first = export_hf(ck(), out(), gpt2_layout(), sharded);
  ASSERT_GT(first.weight_files.size(), 1u);
  std::ofstream(out() / ".model.safetensors.tmp.123.4") << "left by a killed export";
  const auto second = export_hf(ck(), out(), gpt2_layout());  // 5GB: one file
  EXPECT_EQ(second.removed, first.weight_files.size() + 2);   // shards, index, temporary
  EXPECT_EQ(listing(out()), (std::vector<std::string>{"config.json", "model.safetensors"}));
  const auto third = export_hf(ck(), out(), gpt2_layout(), sharded);
  EXPECT_EQ(third.removed, 1u);  // model.safetensors
  std::vector<std::string> want = third.weight_files;
  want.push_back("config.json");
  want.push_back("model.safetensors.index.json");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(listing(out()), want);
}

TEST_F(HfExport, AFileNoExportWritesIsRefusedAndKept) {
  fs::create_directories(out());
  std::ofstream(out() / "notes.txt") << "mine";
  std::ofstream(out() / "config.json") << "{}";
  try {
    export_hf(ck(), out(), gpt2_layout());
    FAIL() << "a foreign file was not refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("notes.txt"), std::string::npos) << e.what();
  }
  EXPECT_EQ(listing(out()), (std::vector<std::string>{"config.json", "notes.txt"}));
  EXPECT_EQ(testing::file_bytes(out() / "notes.txt"), "mine");
  EXPECT_EQ(testing::file_bytes(out() / "config.json"), "{}");
  // A link under an export's name is refused too: writing would replace what it names.
  fs::remove(out() / "notes.txt");
  fs::create_symlink(out() / "config.json", out() / "model.safetensors");
  EXPECT_THROW(export_hf(ck(), out(), gpt2_layout()), InvalidArgument);
  EXPECT_EQ(testing::file_bytes(out() / "config.json"), "{}");
}

TEST_F(HfExport, TheCheckpointAndItsInsidesAreRefused) {
  const fs::path step = ck() / "step_00000002";
  const auto before = listing(step);
  for (const fs::path& bad : {ck(), step, step / "hf", ck() / "latest", ck() / "step_00000009"}) {
    EXPECT_THROW(export_hf(ck(), bad, gpt2_layout()), InvalidArgument) << bad;
    EXPECT_THROW(export_hf(step, bad, gpt2_layout()), InvalidArgument) << bad;
  }
  EXPECT_FALSE(fs::exists(step / "hf"));
  EXPECT_FALSE(fs::exists(ck() / "step_00000009"));
  EXPECT_EQ(listing(step), before);
}

TEST_F(HfExport, AnOutputThatCannotBeADirectoryIsRefused) {
  EXPECT_THROW(export_hf(ck(), own_.path() / "no" / "such" / "hf", gpt2_layout()), InvalidArgument);
  std::ofstream(out()) << "a file";
  EXPECT_THROW(export_hf(ck(), out(), gpt2_layout()), InvalidArgument);
  EXPECT_EQ(testing::file_bytes(out()), "a file");
  HfExportOptions zero;
  zero.max_shard_bytes = 0;
  EXPECT_THROW(export_hf(ck(), own_.path() / "z", gpt2_layout(), zero), InvalidArgument);
}

TEST(HfShards, GreedyInOrderNeverSplitALargeTensorAlone) {
  const std::vector<uint64_t> sizes = {10, 50, 10, 10, 100, 5};
  const auto s = checkpoint::plan_hf_shards(sizes, 30);
  ASSERT_EQ(s.size(), 5u);
  const std::vector<std::pair<size_t, size_t>> want = {{0, 1}, {1, 1}, {2, 2}, {4, 1}, {5, 1}};
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(std::make_pair(s[i].first, s[i].count), want[i]) << i;
    EXPECT_EQ(s[i].file, "model-0000" + std::to_string(i + 1) + "-of-00005.safetensors");
  }
  EXPECT_EQ(s[2].bytes, 20u);
  const auto one = checkpoint::plan_hf_shards(sizes, 185);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].file, "model.safetensors");
  EXPECT_EQ(one[0].count, sizes.size());
  EXPECT_EQ(checkpoint::plan_hf_shards(sizes, 184).size(), 2u);
  EXPECT_TRUE(checkpoint::is_hf_export_file("model-00002-of-00010.safetensors"));
  EXPECT_FALSE(checkpoint::is_hf_export_file("model-2-of-10.safetensors"));
  EXPECT_FALSE(checkpoint::is_hf_export_file("pytorch_model.bin"));
}

}  // namespace
}  // namespace zerodp
