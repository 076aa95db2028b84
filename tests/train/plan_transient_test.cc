// The planner's transient bytes are what the engine allocates: activations, workspace,
// gathered units, buckets and reduced shards, the offload tier's staging, per rank, exactly
// as the ledger measures them.
#include <fmt/core.h>
#include <gtest/gtest.h>

#include "memory/ledger.h"
#include "models/gpt.h"
#include "models/mlp.h"
#include "temp_dir.h"
#include "train/model_kind.h"
#include "train/plan.h"
#include "train_testing.h"

namespace zerodp {
namespace {

struct Case {
  int ranks, stage;
  Precision precision;
  AccumulatePolicy policy;
  int prefetch;
  bool checkpoint;
  Offload offload = Offload::kNone;
  uint64_t piece = 0;
};

TEST(PlanTransients, EqualTheLedgerPeaksForEveryRank) {
  const Case cases[] = {
      {2, 0, Precision::kBF16, AccumulatePolicy::kLocal, 1, false},
      {3, 1, Precision::kFP32, AccumulatePolicy::kReduce, 1, false},
      {3, 2, Precision::kFP16, AccumulatePolicy::kLocal, 1, true},
      {4, 2, Precision::kBF16, AccumulatePolicy::kReduce, 1, false},
      {3, 3, Precision::kBF16, AccumulatePolicy::kReduce, 2, true},
      {2, 3, Precision::kFP32, AccumulatePolicy::kLocal, 0, false},
      {3, 0, Precision::kBF16, AccumulatePolicy::kLocal, 1, false, Offload::kOptimizer, 1024},
      {2, 3, Precision::kFP32, AccumulatePolicy::kReduce, 1, false, Offload::kOptimizer, 0},
      {3, 3, Precision::kBF16, AccumulatePolicy::kReduce, 2, false, Offload::kParams, 2048},
      {2, 3, Precision::kFP32, AccumulatePolicy::kReduce, 0, false, Offload::kParams, 1024},
  };
  testing::TempDir tmp;
  for (const Case& k : cases) {
    TrainConfig c = testing::tiny_config(k.ranks, k.stage, k.precision);
    c.offload = k.offload;
    c.offload_piece = k.piece;
    c.offload_dir = tmp.path().string();
    c.accumulate = k.policy;
    c.prefetch = k.prefetch;
    c.checkpoint_activations = k.checkpoint;
    c.steps = 1;
    const TrainResult r = testing::run(c);
    const Model model = make_gpt({.layers = 2, .heads = 2, .embd = 32, .seq_len = 32});
    const TransientPlan plan{.world = k.ranks,
                             .stage = k.stage,
                             .precision = k.precision,
                             .policy = k.policy,
                             .prefetch = k.prefetch,
                             .checkpoint_activations = k.checkpoint,
                             .micro_batch = c.micro_batch,
                             .seq_len = 32,
                             .offload = k.offload,
                             .offload_piece = k.piece};
    const std::string what =
        fmt::format("N={} stage {} {} {} prefetch {}{} offload {}", k.ranks, k.stage,
                    precision_name(k.precision), accumulate_name(k.policy), k.prefetch,
                    k.checkpoint ? " checkpointed" : "", offload_name(k.offload));
    for (int rank = 0; rank < k.ranks; ++rank) {
      const TransientBytes t = transient_bytes(model, plan, rank);
      const auto& peak = r.ranks[static_cast<size_t>(rank)].peak;
      const auto at = [&](MemCategory m) { return peak[static_cast<size_t>(m)]; };
      EXPECT_EQ(at(MemCategory::kActivations), t.activations) << what << " rank " << rank;
      EXPECT_EQ(at(MemCategory::kWorkspace), t.workspace) << what << " rank " << rank;
      EXPECT_EQ(at(MemCategory::kGathered), t.gathered) << what << " rank " << rank;
      EXPECT_EQ(at(MemCategory::kGradBuckets), t.grad_buckets) << what << " rank " << rank;
      EXPECT_EQ(at(MemCategory::kCommBuffers), t.comm_buffers) << what << " rank " << rank;
      EXPECT_EQ(at(MemCategory::kOffloadStaging), t.offload_staging) << what << " rank " << rank;
      const StateBytes s =
          model_state_bytes(r.unit_numel, k.ranks, k.stage, k.precision, rank, false, k.offload);
      EXPECT_EQ(r.ranks[static_cast<size_t>(rank)].peak_total, s.total() + t.total())
          << what << " rank " << rank;
    }
  }
}

// What the ledger does not hold is reported beside it: bf16 products keep rounded operand
// copies per rank thread, at least attention's rounded q/k/v of a micro-batch; fp32 keeps none.
TEST(OutsideTheLedger, Bf16OperandCopiesAreReportedPerRank) {
  for (const Precision p : {Precision::kBF16, Precision::kFP32}) {
    TrainConfig c = testing::tiny_config(2, 1, p);
    c.steps = 1;
    const TrainResult r = testing::run(c);
    const uint64_t qkv_rounded = uint64_t{4} * 32 * 3 * 32 * 2;  // micro-batch x T x 3C bf16
    for (const auto& rank : r.ranks) {
      if (p == Precision::kBF16) {
        EXPECT_GE(rank.gemm_bf16_copy_bytes, qkv_rounded) << "rank " << rank.rank;
      } else {
        EXPECT_EQ(rank.gemm_bf16_copy_bytes, 0u) << "rank " << rank.rank;
      }
    }
  }
}

TEST(PlanTransients, CountImagesForTheMlp) {
  TrainConfig c = testing::tiny_config(2, 2);
  c.model = "mlp";
  c.steps = 1;
  const TrainResult r = testing::run(c);
  const Model model = make_mlp(MlpConfig{.hidden = c.mlp_hidden, .hidden_layers = c.mlp_layers});
  const TransientPlan plan{.world = 2,
                           .stage = 2,
                           .precision = Precision::kBF16,
                           .policy = c.accumulate,
                           .micro_batch = c.micro_batch,
                           .seq_len = 1,
                           .text = false,
                           .features_per_sample = 784};
  const TransientBytes t = transient_bytes(model, plan, 0);
  EXPECT_EQ(r.ranks[0].peak[static_cast<size_t>(MemCategory::kActivations)], t.activations);
}

// The llama's units are counted as the gpt's: its blocked head's scratch, RoPE's and
// grouped-query attention's buffers, at every stage and precision.
TEST(PlanTransients, EqualTheLedgerPeaksForTheLlama) {
  const Case cases[] = {
      {2, 0, Precision::kBF16, AccumulatePolicy::kLocal, 1, false},
      {3, 1, Precision::kFP16, AccumulatePolicy::kReduce, 1, true},
      {3, 2, Precision::kFP32, AccumulatePolicy::kReduce, 1, false},
      {2, 3, Precision::kBF16, AccumulatePolicy::kReduce, 2, true},
  };
  for (const Case& k : cases) {
    TrainConfig c = testing::tiny_config(k.ranks, k.stage, k.precision);
    c.model = "llama";
    c.accumulate = k.policy;
    c.prefetch = k.prefetch;
    c.checkpoint_activations = k.checkpoint;
    c.steps = 1;
    const TrainResult r = testing::run(c);
    TrainConfig resolved = c;
    resolve_config(resolved);
    const Model model = model_kind("llama").build(resolved);
    const TransientPlan plan{.world = k.ranks,
                             .stage = k.stage,
                             .precision = k.precision,
                             .policy = k.policy,
                             .prefetch = k.prefetch,
                             .checkpoint_activations = k.checkpoint,
                             .micro_batch = c.micro_batch,
                             .seq_len = resolved.seq_len};
    for (int rank = 0; rank < k.ranks; ++rank) {
      const std::string what = fmt::format("llama N={} stage {} {} rank {}", k.ranks, k.stage,
                                           precision_name(k.precision), rank);
      const TransientBytes t = transient_bytes(model, plan, rank);
      const auto& peak = r.ranks[static_cast<size_t>(rank)].peak;
      const auto at = [&](MemCategory m) { return peak[static_cast<size_t>(m)]; };
      EXPECT_EQ(at(MemCategory::kActivations), t.activations) << what;
      EXPECT_EQ(at(MemCategory::kWorkspace), t.workspace) << what;
      EXPECT_EQ(at(MemCategory::kGathered), t.gathered) << what;
      const StateBytes s = model_state_bytes(r.unit_numel, k.ranks, k.stage, k.precision, rank);
      EXPECT_EQ(r.ranks[static_cast<size_t>(rank)].peak_total, s.total() + t.total()) << what;
      // The planner's comm per step is the ledger's, as for the gpt.
      const CommBytes comm = comm_bytes_per_step(r.unit_numel, k.ranks, k.stage, k.precision, 1,
                                                 k.policy, false, rank);
      const auto& ledger = r.ranks[static_cast<size_t>(rank)].comm_train;
      EXPECT_EQ(ledger[static_cast<int>(CommKind::kAllReduce)].bytes, comm.all_reduce) << what;
      EXPECT_EQ(ledger[static_cast<int>(CommKind::kReduceScatter)].bytes, comm.reduce_scatter)
          << what;
      EXPECT_EQ(ledger[static_cast<int>(CommKind::kAllGather)].bytes, comm.all_gather) << what;
    }
  }
}

}  // namespace
}  // namespace zerodp
