// Elastic restarts (--max-restarts): a rank that fails mid-run costs the steps since the
// last checkpoint and nothing else. Under the canonical order (--invariant on) the survivors,
// fewer and each accumulating more micro-batches of the same step, finish with the bits of
// the run that never failed; failures a restart cannot fix end the run as before.
#include <atomic>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/store.h"
#include "core/error.h"
#include "models/gpt.h"
#include "temp_dir.h"
#include "train/report.h"
#include "train/report_reader.h"
#include "train_testing.h"

namespace zerodp {
namespace {

using testing::TempDir;
using testing::tiny_config;

// M = 12 micro-batches per step: 4 ranks x 3, checkpoints every 2 steps, the canonical order.
TrainConfig twelve_micro_batches(const TempDir& tmp) {
  TrainConfig c = tiny_config(4, 1);
  c.grad_accum = 3;
  c.accumulate = AccumulatePolicy::kReduce;
  c.invariant = true;
  c.steps = 10;
  c.checkpoint_dir = (tmp.path() / "ck").string();
  c.checkpoint_every = 2;
  return c;
}

struct Outcome {
  TrainResult result;
  std::vector<Restart> told;  // what on_restart was called with
};

Outcome run_elastic(const TrainConfig& c, const ModelFactory& make_model = {}) {
  int argc = 1;
  char name[] = "test";
  char* args[] = {name, nullptr};
  char** argv = args;
  Outcome o;
  o.result = train(c, argc, argv, {}, make_model, [&](const Restart& r) { o.told.push_back(r); });
  return o;
}

// Runs `c`, expecting an error of type E; returns its message and the restarts made.
template <typename E>
std::pair<std::string, std::vector<Restart>> fails(const TrainConfig& c,
                                                   const ModelFactory& make_model = {}) {
  int argc = 1;
  char name[] = "test";
  char* args[] = {name, nullptr};
  char** argv = args;
  std::vector<Restart> told;
  try {
    (void)train(c, argc, argv, {}, make_model, [&](const Restart& r) { told.push_back(r); });
  } catch (const E& e) {
    return {e.what(), told};
  }
  ADD_FAILURE() << "the run did not fail with the expected error";
  return {"", told};
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The failed run restarted once, 4 ranks x 3 -> 3 x 4 from step 6, and ended as `whole`.
void expect_restarted_to_the_same_bits(const Outcome& o, const TrainResult& whole) {
  const TrainResult& r = o.result;
  ASSERT_EQ(r.restarts.size(), 1u);
  const Restart& x = r.restarts[0];
  EXPECT_EQ(x.failed_step, 7);
  EXPECT_EQ(x.failed_rank, 2);
  EXPECT_TRUE(has(x.cause, "injected failure (--inject throw@7:2)")) << x.cause;
  EXPECT_EQ(x.ranks_before, 4);
  EXPECT_EQ(x.ranks_after, 3);
  EXPECT_EQ(x.grad_accum_before, 3);
  EXPECT_EQ(x.grad_accum_after, 4);
  EXPECT_EQ(x.resumed_step, 6);
  EXPECT_TRUE(has(x.checkpoint, "step_00000006")) << x.checkpoint;
  ASSERT_EQ(o.told.size(), 1u);
  EXPECT_EQ(o.told[0].failed_step, 7);
  EXPECT_EQ(o.told[0].ranks_after, 3);

  EXPECT_EQ(r.world_size, 3);
  EXPECT_EQ(r.config.grad_accum, 4);
  EXPECT_EQ(r.weights_sha256, whole.weights_sha256);
  // Steps 7..10 taken again by the survivors, 1..6 carried by the checkpoint: the same
  // losses as the run that never failed, bit for bit.
  ASSERT_EQ(r.first_step, 7);
  ASSERT_EQ(r.steps.size(), 4u);
  ASSERT_EQ(r.history.size(), 6u);
  ASSERT_EQ(whole.steps.size(), 10u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(r.history[i].loss, whole.steps[i].loss) << "step " << i + 1;
  }
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.steps[i].step, whole.steps[6 + i].step);
    EXPECT_EQ(r.steps[i].loss, whole.steps[6 + i].loss) << "step " << 7 + i;
    EXPECT_EQ(r.steps[i].grad_norm, whole.steps[6 + i].grad_norm) << "step " << 7 + i;
  }
  EXPECT_EQ(r.val_loss, whole.val_loss);
}

TEST(Elastic, AFailedRankRestartsOnThreeWithTheUninterruptedRunsBits) {
  TempDir whole_dir, elastic_dir;
  const TrainResult whole = testing::run(twelve_micro_batches(whole_dir));
  TrainConfig c = twelve_micro_batches(elastic_dir);
  c.max_restarts = 1;
  c.inject = {parse_injection("throw@7:2")};
  const Outcome o = run_elastic(c);
  expect_restarted_to_the_same_bits(o, whole);

  // The report records the restart, and reads back.
  const nlohmann::json j = report_json(o.result);
  ASSERT_TRUE(j.at(report_key::kRestarts).is_array());
  const RunReport back = report_from_json(j, "r.json");
  ASSERT_EQ(back.restarts.size(), 1u);
  EXPECT_EQ(back.restarts[0].failed_step, 7u);
  EXPECT_EQ(back.restarts[0].failed_rank, 2u);
  EXPECT_EQ(back.restarts[0].ranks_before, 4u);
  EXPECT_EQ(back.restarts[0].ranks_after, 3u);
  EXPECT_EQ(back.restarts[0].resumed_step, 6u);
  EXPECT_EQ(j.at(report_key::kConfig).at("max_restarts"), 1);
}

// A run of one micro-batch per rank is in the canonical order by default (reduce, --invariant
// auto), at every stage. The survivors accumulate 2, where the default at stages 0-1 would
// be local: the restart keeps the checkpoint's order instead, and so the bits.
TEST(Elastic, AtStageZeroTheDefaultOrderIsKeptWithTheBits) {
  const auto config = [](const TempDir& tmp) {
    TrainConfig c = tiny_config(4, 0);
    c.accumulate_default = true;
    c.steps = 12;
    c.checkpoint_dir = (tmp.path() / "ck").string();
    c.checkpoint_every = 2;
    return c;
  };
  TempDir whole_dir, elastic_dir;
  const TrainResult whole = testing::run(config(whole_dir));
  TrainConfig c = config(elastic_dir);
  c.max_restarts = 2;
  c.inject = {parse_injection("throw@5:1")};
  const Outcome o = run_elastic(c);
  ASSERT_EQ(o.result.restarts.size(), 1u);
  EXPECT_EQ(o.result.restarts[0].ranks_after, 2);
  EXPECT_EQ(o.result.restarts[0].grad_accum_after, 2);
  EXPECT_EQ(o.result.restarts[0].order_note, "");
  EXPECT_EQ(o.result.config.accumulate, AccumulatePolicy::kReduce);
  EXPECT_EQ(o.result.weights_sha256, whole.weights_sha256);
}

// Local accumulation sums in an order that depends on the rank count: the restart says the
// bits may change rather than promise them.
TEST(Elastic, LocalAccumulationSaysTheBitsMayChange) {
  TempDir dir;
  TrainConfig c = tiny_config(4, 0);
  c.accumulate_default = true;
  c.grad_accum = 2;
  c.steps = 6;
  c.checkpoint_dir = (dir.path() / "ck").string();
  c.checkpoint_every = 2;
  c.max_restarts = 1;
  c.inject = {parse_injection("throw@3:1")};
  const Outcome o = run_elastic(c);
  ASSERT_EQ(o.result.restarts.size(), 1u);
  EXPECT_TRUE(has(o.result.restarts[0].order_note, "may differ in their last bits"))
      << o.result.restarts[0].order_note;
  // The report keeps the note with the restart, and reads it back.
  const RunReport back = report_from_json(report_json(o.result), "r.json");
  ASSERT_EQ(back.restarts.size(), 1u);
  EXPECT_EQ(back.restarts[0].order_note, o.result.restarts[0].order_note);
  EXPECT_TRUE(
      has(o.result.restarts[0].order_note, "4 ranks x --grad-accum 2, these are 2 ranks x 4"))
      << o.result.restarts[0].order_note;
}

// With the parameter shards and optimizer states on disk, the failing step unwinds every
// rank with reads of shards still queued (each drained before its slot is reused), and the
// survivors go on from the checkpoint to the in-memory run's bits.
TEST(Elastic, OffloadedStateRestartsToTheInMemoryRunsBits) {
  TempDir whole_dir, elastic_dir, scratch;
  TrainConfig w = twelve_micro_batches(whole_dir);
  w.stage = 3;
  const TrainResult whole = testing::run(w);
  TrainConfig c = twelve_micro_batches(elastic_dir);
  c.stage = 3;
  c.offload = Offload::kParams;
  c.offload_dir = scratch.path().string();
  c.offload_piece = 2048;
  c.max_restarts = 1;
  c.inject = {parse_injection("throw@7:2")};
  const Outcome o = run_elastic(c);
  expect_restarted_to_the_same_bits(o, whole);
  EXPECT_TRUE(std::filesystem::is_empty(scratch.path()));
}

// Over nodes the world stays whole nodes (M = 12): 3 nodes of 2 go on as 2 nodes, not as 5
// ranks; 2 nodes of 2 go on as one node, not as 3 ranks.
TEST(Elastic, OverNodesTheSurvivorsAreWholeNodes) {
  for (const auto& [ranks, after] : {std::pair{6, 4}, std::pair{4, 2}}) {
    TempDir whole_dir, elastic_dir;
    TrainConfig w = twelve_micro_batches(whole_dir);
    w.launch.ranks = ranks;
    w.grad_accum = 12 / ranks;
    w.launch.comm.node_ranks = 2;
    const TrainResult whole = testing::run(w);
    TrainConfig c = twelve_micro_batches(elastic_dir);
    c.launch.ranks = ranks;
    c.grad_accum = 12 / ranks;
    c.launch.comm.node_ranks = 2;
    c.max_restarts = 1;
    c.inject = {parse_injection("throw@7:1")};
    const Outcome o = run_elastic(c);
    ASSERT_EQ(o.result.restarts.size(), 1u) << ranks << " ranks";
    EXPECT_EQ(o.result.restarts[0].ranks_after, after) << ranks << " ranks";
    EXPECT_EQ(o.result.world_size, after) << ranks << " ranks";
    EXPECT_EQ(o.result.config.launch.comm.node_ranks, 2) << ranks << " ranks";
    EXPECT_EQ(o.result.weights_sha256, whole.weights_sha256) << ranks << " ranks";
  }
}

// HSDP restarts on whole nodes from node 0's checkpoint and stays HSDP. Its order depends on
// the nodes (docs/determinism.md), so the bits change; the run goes on to its last step.
TEST(Elastic, ShardedWithinNodesTheSurvivorsAreWholeNodesStill) {
  TempDir dir;
  TrainConfig c = twelve_micro_batches(dir);
  c.invariant.reset();
  c.shard_within_node = true;
  c.launch.ranks = 6;
  c.grad_accum = 2;
  c.launch.comm.node_ranks = 2;
  c.stage = 3;
  c.max_restarts = 1;
  c.inject = {parse_injection("throw@7:5")};
  const Outcome o = run_elastic(c);
  ASSERT_EQ(o.result.restarts.size(), 1u);
  EXPECT_EQ(o.result.restarts[0].ranks_after, 4);
  EXPECT_EQ(o.result.world_size, 4);
  EXPECT_TRUE(o.result.config.shard_within_node);
  EXPECT_EQ(o.result.config.launch.comm.node_ranks, 2);
  ASSERT_FALSE(o.result.steps.empty());
  EXPECT_EQ(o.result.steps.back().step, c.steps);
  EXPECT_TRUE(std::isfinite(o.result.steps.back().loss));
}

TEST(Elastic, TheMlpRestartsToTheSameBitsToo) {
  TempDir whole_dir, elastic_dir;
  const auto mlp = [](const TempDir& tmp) {
    TrainConfig c = twelve_micro_batches(tmp);
    c.model = "mlp";
    c.size.clear();
    c.stage = 3;
    return c;
  };
  const TrainResult whole = testing::run(mlp(whole_dir));
  TrainConfig c = mlp(elastic_dir);
  c.max_restarts = 1;
  c.inject = {parse_injection("throw@7:2")};
  expect_restarted_to_the_same_bits(run_elastic(c), whole);
}

TEST(Elastic, ARankThatStopsArrivingIsRestartedToo) {
  TempDir whole_dir, elastic_dir;
  const TrainResult whole = testing::run(twelve_micro_batches(whole_dir));
  TrainConfig c = twelve_micro_batches(elastic_dir);
  c.launch.comm.timeout_seconds = 2;
  c.max_restarts = 1;
  c.inject = {parse_injection("hang@7:2")};
  const Outcome o = run_elastic(c);
  ASSERT_EQ(o.result.restarts.size(), 1u);
  const Restart& x = o.result.restarts[0];
  EXPECT_EQ(x.failed_step, 7);
  EXPECT_EQ(x.failed_rank, 2);  // the late rank the peers' timeout names
  EXPECT_TRUE(has(x.cause, "timed out after 2 s")) << x.cause;
  EXPECT_EQ(x.ranks_after, 3);
  EXPECT_EQ(o.result.weights_sha256, whole.weights_sha256);
}

TEST(Elastic, WithoutMaxRestartsAFailureEndsTheRunAsBefore) {
  TempDir tmp;
  TrainConfig c = twelve_micro_batches(tmp);
  c.steps = 5;
  c.inject = {parse_injection("throw@3:2")};
  const auto [what, told] = fails<Error>(c);
  EXPECT_TRUE(has(what, "rank 2 of 4, step 3: injected failure")) << what;
  EXPECT_FALSE(has(what, "restart")) << what;
  EXPECT_TRUE(told.empty());
}

TEST(Elastic, ASecondFailurePastTheBudgetEndsTheRunNamingIt) {
  TempDir tmp;
  TrainConfig c = twelve_micro_batches(tmp);
  c.max_restarts = 1;
  // After the restart rank 1 is one of 3, and fails at step 9.
  c.inject = {parse_injection("throw@7:2"), parse_injection("throw@9:1")};
  const auto [what, told] = fails<Error>(c);
  EXPECT_TRUE(has(what, "rank 1 of 3, step 9: injected failure")) << what;
  EXPECT_TRUE(has(what, "not restarted (--max-restarts 1): all 1 used (step 7 on 4 ranks -> 3)"))
      << what;
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].failed_step, 7);
}

TEST(Elastic, TwoRestartsGoFromFourToThreeToTwo) {
  TempDir tmp;
  TrainConfig c = twelve_micro_batches(tmp);
  c.max_restarts = 2;
  c.inject = {parse_injection("throw@7:2"), parse_injection("throw@9:1")};
  const Outcome o = run_elastic(c);
  ASSERT_EQ(o.result.restarts.size(), 2u);
  EXPECT_EQ(o.result.restarts[1].failed_step, 9);
  EXPECT_EQ(o.result.restarts[1].failed_rank, 1);
  EXPECT_EQ(o.result.restarts[1].ranks_before, 3);
  // 12 micro-batches: 2 ranks x 6 (the largest divisor below 3).
  EXPECT_EQ(o.result.restarts[1].ranks_after, 2);
  EXPECT_EQ(o.result.restarts[1].grad_accum_after, 6);
  EXPECT_EQ(o.result.restarts[1].resumed_step, 8);
  EXPECT_EQ(o.result.world_size, 2);
  EXPECT_EQ(o.result.history.size(), 8u);
  EXPECT_EQ(o.result.steps.size(), 2u);
}

TEST(Elastic, AFailureBeforeTheFirstCheckpointIsNotRestarted) {
  TempDir tmp;
  TrainConfig c = twelve_micro_batches(tmp);
  c.max_restarts = 1;
  c.inject = {parse_injection("throw@1:2")};
  const auto [what, told] = fails<Error>(c);
  EXPECT_TRUE(has(what, "rank 2 of 4, step 1: injected failure")) << what;
  EXPECT_TRUE(has(what, "not restarted (--max-restarts 1): no checkpoint was committed in"))
      << what;
  EXPECT_TRUE(told.empty());
}

// A unit that throws InvalidArgument at its n-th forward: a caller's error, which the same
// step on fewer ranks would meet again.
class RefusingUnit final : public Unit {
 public:
  RefusingUnit(std::unique_ptr<Unit> inner, int refuse_at)
      : Unit(inner->name()), inner_(std::move(inner)), refuse_at_(refuse_at) {
    for (const TensorSpec& t : inner_->tensors()) {
      add_tensor(t.name, t.shape, t.init, t.init_std, t.weight_decay);
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
    if (++forwards_ == refuse_at_) throw InvalidArgument("refused on purpose");
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
  int refuse_at_;
  int forwards_ = 0;
};

TEST(Elastic, AnInvalidArgumentIsNotRestarted) {
  TempDir tmp;
  TrainConfig c = twelve_micro_batches(tmp);
  c.model = "custom-text";
  c.size.clear();
  c.seq_len = 32;
  c.max_restarts = 1;
  const GptConfig g = gpt_preset("tiny").config;
  // Every rank's first unit refuses the first micro-batch of step 4 (3 per step), after the
  // checkpoint of step 2 was committed.
  const auto [what, told] = fails<InvalidArgument>(c, [&] {
    Model m = make_gpt(g);
    m[0] = std::make_unique<RefusingUnit>(std::move(m[0]), 3 * 3 + 1);
    return m;
  });
  EXPECT_TRUE(has(what, "step 4: refused on purpose")) << what;
  EXPECT_FALSE(has(what, "restart")) << what;
  EXPECT_TRUE(told.empty());
  EXPECT_TRUE(checkpoint::find_latest(c.checkpoint_dir).has_value());
}

TEST(Elastic, AFailedCheckpointWriteIsNotRestarted) {
  TempDir tmp;
  TrainConfig c = twelve_micro_batches(tmp);
  c.max_restarts = 1;
  c.inject = {parse_injection("io@4:1")};
  // Not a rank's failure but a verdict every rank shares: the run stops there.
  const Outcome o = run_elastic(c);
  ASSERT_TRUE(o.result.stopped.has_value());
  EXPECT_EQ(o.result.stopped->reason, EarlyStop::Reason::kCheckpointFailed);
  EXPECT_TRUE(has(o.result.stopped->message, "checkpoint at step 4 not committed"))
      << o.result.stopped->message;
  EXPECT_TRUE(o.told.empty());
}

TEST(Elastic, AFailedAllocationIsNotRestarted) {
  TempDir tmp;
  TrainConfig c = twelve_micro_batches(tmp);
  c.max_restarts = 1;
  c.inject = {parse_injection("oom@4:1")};
  // std::bad_alloc reaches the caller as Error, as without --max-restarts; on fewer ranks
  // each would hold more.
  const auto [what, told] = fails<Error>(c);
  EXPECT_TRUE(has(what, "rank 1 of 4, step 4")) << what;
  EXPECT_FALSE(has(what, "restart")) << what;
  EXPECT_TRUE(told.empty());
}

TEST(Elastic, TheOptionIsCheckedBeforeAnyRankStarts) {
  TempDir tmp;
  TrainConfig c = twelve_micro_batches(tmp);
  c.max_restarts = -1;
  EXPECT_TRUE(has(fails<InvalidArgument>(c).first, "--max-restarts -1 is invalid"));
  c.max_restarts = 1;
  c.checkpoint_every = 0;
  EXPECT_TRUE(has(fails<InvalidArgument>(c).first,
                  "--max-restarts 1 needs checkpoints along the way to restart from; pass "
                  "--checkpoint-every K"));
  c.checkpoint_dir.clear();
  EXPECT_TRUE(
      has(fails<InvalidArgument>(c).first, "pass --checkpoint-dir DIR and --checkpoint-every K"));
}

}  // namespace
}  // namespace zerodp
