// --trace writes a Chrome trace-event file: every rank, every unit's forward and backward,
// the optimizer, and one span per collective the comm ledger counted.
#include <fstream>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/gpt.h"
#include "temp_dir.h"
#include "train/report.h"
#include "train_testing.h"

namespace zerodp {
namespace {

TEST(Trace, HoldsEveryRanksComputeAndEveryCollective) {
  testing::TempDir tmp;
  TrainConfig c = testing::tiny_config(3, 3);
  c.steps = 2;
  c.trace_path = (tmp.path() / "trace.json").string();
  const TrainResult r = testing::run(c);
  std::ifstream in(c.trace_path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  ASSERT_TRUE(trace.contains("traceEvents"));
  std::map<int, int> comm_spans, forward, backward, optimizer, steps;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    EXPECT_GE(e["dur"].get<int64_t>(), 0);
    const int pid = e["pid"].get<int>();
    const std::string name = e["name"].get<std::string>();
    if (e["tid"] == 1) ++comm_spans[pid];
    if (name.starts_with("forward ")) ++forward[pid];
    if (name.starts_with("backward ")) ++backward[pid];
    if (name == "optimizer") ++optimizer[pid];
    if (name.starts_with("step ")) ++steps[pid];
  }
  const int units = static_cast<int>(r.unit_names.size());
  for (int rank = 0; rank < 3; ++rank) {
    uint64_t calls = 0;
    for (const auto& k : r.ranks[static_cast<size_t>(rank)].comm_train) calls += k.calls;
    for (const auto& k : r.ranks[static_cast<size_t>(rank)].comm_other) calls += k.calls;
    // The summary's own gather comes after the snapshot the ledger figures are taken from.
    EXPECT_EQ(static_cast<uint64_t>(comm_spans[rank]), calls + 1) << "rank " << rank;
    EXPECT_EQ(backward[rank], 2 * units) << "rank " << rank;
    EXPECT_GE(forward[rank], 2 * units) << "rank " << rank;  // + the evaluation's
    EXPECT_EQ(optimizer[rank], 2) << "rank " << rank;
    EXPECT_EQ(steps[rank], 2) << "rank " << rank;
  }
}

}  // namespace
}  // namespace zerodp

namespace zerodp {
namespace {

TEST(Mfu, IsModelFlopsOverTheCalibratedPeak) {
  TrainConfig c = testing::tiny_config(2, 1);
  c.steps = 3;
  const TrainResult r = testing::run(c);
  // tiny: 6 per parameter plus attention's 12 x layers x T x C.
  EXPECT_DOUBLE_EQ(r.flops_per_token, 6.0 * static_cast<double>(r.params) + 12.0 * 2 * 32 * 32);
  EXPECT_GT(r.peak_flops, 1e9) << "a GEMM slower than 1 GFLOP/s: the calibration is broken";
  EXPECT_DOUBLE_EQ(r.mfu, r.flops_per_token * r.tokens_per_second / r.peak_flops);
  EXPECT_GT(r.mfu, 0.0);
  EXPECT_LT(r.mfu, 1.5) << "model FLOPs well past the measured peak";
  for (const auto& s : r.steps) {
    ASSERT_TRUE(s.mfu.has_value());
    EXPECT_GT(*s.mfu, 0.0);
  }
}

TEST(Mfu, HasASecondPeakOnTheModelsOwnShapes) {
  for (Precision p : {Precision::kFP32, Precision::kBF16}) {
    SCOPED_TRACE(p == Precision::kBF16 ? "bf16" : "fp32");
    testing::TempDir tmp;
    TrainConfig c = testing::tiny_config(2, 0, p);
    c.steps = 3;
    c.report_path = (tmp.path() / "report.json").string();
    const TrainResult r = testing::run(c);
    ASSERT_TRUE(r.peak_flops_model_shapes.has_value());
    ASSERT_TRUE(r.mfu_model_shapes.has_value());
    EXPECT_GT(*r.peak_flops_model_shapes, 1e8) << "the model-shape calibration is broken";
    EXPECT_GT(r.peak_flops, 0.0);
    EXPECT_DOUBLE_EQ(*r.mfu_model_shapes,
                     r.flops_per_token * r.tokens_per_second / *r.peak_flops_model_shapes);
    EXPECT_GT(*r.mfu_model_shapes, 0.0);
    std::ifstream in(c.report_path);
    const nlohmann::json tp = nlohmann::json::parse(in)["throughput"];
    EXPECT_DOUBLE_EQ(tp["peak_flops"].get<double>(), r.peak_flops);
    EXPECT_DOUBLE_EQ(tp["peak_flops_model_shapes"].get<double>(), *r.peak_flops_model_shapes);
    EXPECT_DOUBLE_EQ(tp["mfu_model_shapes"].get<double>(), *r.mfu_model_shapes);
  }
}

// A caller's model whose units declare no products (Unit::products' default): the gpt's
// units behind a wrapper that forwards the computation and nothing else.
class Undeclared final : public Unit {
 public:
  explicit Undeclared(std::unique_ptr<Unit> inner) : Unit(inner->name()), inner_(std::move(inner)) {
    for (const TensorSpec& t : inner_->tensors()) {
      add_tensor(t.name, t.shape, t.init, t.init_std, t.weight_decay);  // read as kAny
    }
  }
  size_t input_count(const BatchShape& s) const override { return inner_->input_count(s); }
  size_t output_count(const BatchShape& s) const override { return inner_->output_count(s); }
  size_t saved_count(const BatchShape& s, GemmCompute compute) const override {
    return inner_->saved_count(s, compute);
  }
  size_t scratch_count(const BatchShape& s) const override { return inner_->scratch_count(s); }

 private:
  void do_forward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                  std::span<float> out, std::span<float> saved, std::span<float> scratch,
                  const MicroBatch& mb) override {
    inner_->forward({.values = w, .stored_bf16 = {}, .compute = compute}, in, out, saved, scratch,
                    mb);
  }
  void do_backward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                   std::span<const float> saved, std::span<const float> dout, std::span<float> dw,
                   std::span<float> din, std::span<float> scratch, const MicroBatch& mb) override {
    inner_->backward({.values = w, .stored_bf16 = {}, .compute = compute}, in, saved, dout, dw, din,
                     scratch, mb);
  }
  std::unique_ptr<Unit> inner_;
};

TEST(Mfu, ACallersModelThatDeclaresNoProductsHasNoModelShapePeak) {
  testing::TempDir tmp;
  TrainConfig c = testing::tiny_config(1, 0, Precision::kFP32);
  c.model = "custom-text";
  c.size.clear();
  c.seq_len = 32;
  c.steps = 2;
  c.report_path = (tmp.path() / "report.json").string();
  const GptConfig g = gpt_preset("tiny").config;
  int argc = 1;
  char name[] = "test";
  char* args[] = {name, nullptr};
  char** argv = args;
  const TrainResult r = train(c, argc, argv, {}, [&] {
    Model m;
    for (auto& u : make_gpt(g)) m.push_back(std::make_unique<Undeclared>(std::move(u)));
    return m;
  });
  EXPECT_GT(r.peak_flops, 0.0);
  EXPECT_GT(r.mfu, 0.0);
  EXPECT_FALSE(r.peak_flops_model_shapes.has_value());
  EXPECT_FALSE(r.mfu_model_shapes.has_value());
  std::ifstream in(c.report_path);
  const nlohmann::json tp = nlohmann::json::parse(in)["throughput"];
  EXPECT_TRUE(tp.contains("peak_flops_model_shapes") && tp["peak_flops_model_shapes"].is_null());
  EXPECT_TRUE(tp.contains("mfu_model_shapes") && tp["mfu_model_shapes"].is_null());
}

}  // namespace
}  // namespace zerodp
