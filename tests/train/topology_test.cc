// Two-level collectives in training (docs/topology.md): a fixed order, so two runs give the
// same bits; the per-element fold does not depend on how a buffer is partitioned, so every
// stage gives the same bits for the same nodes; and it is not the flat order.
#include <gtest/gtest.h>

#include <fmt/core.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <tuple>
#include <utility>

#include "checkpoint/format.h"
#include "checkpoint/store.h"
#include "core/error.h"
#include "temp_dir.h"
#include "train/plan.h"
#include "train_testing.h"

namespace zerodp {
namespace {

using testing::run;
using testing::tiny_config;

TrainConfig two_level_config(int ranks, int node_ranks, int stage, Precision precision) {
  TrainConfig c = tiny_config(ranks, stage, precision);
  c.launch.comm.node_ranks = node_ranks;
  c.launch.comm.two_level = true;
  c.accumulate = AccumulatePolicy::kReduce;
  return c;
}

class TwoLevelTraining : public ::testing::TestWithParam<Precision> {};

TEST_P(TwoLevelTraining, EveryStageGivesTheSameBitsTwice) {
  const Precision p = GetParam();
  for (const auto& [ranks, per_node] : {std::pair{4, 2}, std::pair{6, 3}}) {
    const TrainResult want = run(two_level_config(ranks, per_node, 0, p));
    for (int stage = 0; stage <= 3; ++stage) {
      const std::string where = fmt::format("{} {} nodes x {} ranks, stage {}", precision_name(p),
                                            ranks / per_node, per_node, stage);
      const TrainResult got = run(two_level_config(ranks, per_node, stage, p));
      EXPECT_EQ(got.weights_sha256, want.weights_sha256) << where;
      ASSERT_EQ(got.steps.size(), want.steps.size()) << where;
      for (size_t k = 0; k < got.steps.size(); ++k) {
        EXPECT_EQ(got.steps[k].loss, want.steps[k].loss) << where << " step " << k + 1;
        EXPECT_EQ(got.steps[k].grad_norm, want.steps[k].grad_norm) << where << " step " << k + 1;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, TwoLevelTraining,
                         ::testing::Values(Precision::kBF16, Precision::kFP16, Precision::kFP32),
                         [](const ::testing::TestParamInfo<Precision>& p) {
                           return std::string(precision_name(p.param));
                         });

// The node partials are rounded to bf16 before they cross nodes: a different sum from the
// flat fold, so the weights differ. (Would the two agree, a backend that silently ran flat
// would pass every other test here.)
TEST(TwoLevelTrainingOrder, IsNotTheFlatOrder) {
  TrainConfig flat = two_level_config(4, 2, 3, Precision::kBF16);
  flat.launch.comm.two_level = false;
  EXPECT_NE(run(two_level_config(4, 2, 3, Precision::kBF16)).weights_sha256,
            run(flat).weights_sha256);
}

// The canonical order is the flat fold: --invariant on with two-level collectives is
// refused, and auto turns the canonical order off.
TEST(TwoLevelTrainingOrder, IsNotTheCanonicalOrder) {
  TrainConfig c = two_level_config(4, 2, 3, Precision::kBF16);
  c.invariant = true;
  try {
    resolve_config(c);
    ADD_FAILURE() << "--invariant on with two-level collectives was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--invariant on needs --collectives flat"),
              std::string::npos)
        << e.what();
  }
  c.invariant.reset();
  resolve_config(c);
  EXPECT_FALSE(canonical_order(c));
  c.launch.comm.two_level = false;
  EXPECT_TRUE(canonical_order(c));
}

// hpZ changes where the backward's parameters come from, not their values: the same bits
// as without it, over flat and two-level collectives and with micro-batches accumulated.
// Its copy is the parameters' bytes / T per rank, and of a step's 2A gathers only the
// forward's A cross nodes.
TEST(Hpz, GivesTheSameBitsAndKeepsTheBackwardsGathersInsideTheNode) {
  for (bool two_level : {false, true}) {
    for (const auto& [ranks, per_node, accum] : {std::tuple{4, 2, 1}, {6, 3, 2}, {6, 2, 1}}) {
      TrainConfig c = two_level_config(ranks, per_node, 3, Precision::kBF16);
      c.launch.comm.two_level = two_level;
      c.grad_accum = accum;
      const std::string where = fmt::format("{} x {} A={} {}", ranks / per_node, per_node, accum,
                                            two_level ? "two-level" : "flat");
      const TrainResult plain = run(c);
      c.hpz = true;
      const TrainResult hpz = run(c);
      EXPECT_EQ(hpz.weights_sha256, plain.weights_sha256) << where;
      ASSERT_EQ(hpz.ranks.size(), plain.ranks.size());
      for (size_t r = 0; r < hpz.ranks.size(); ++r) {
        const auto& a = plain.ranks[r].comm_train[static_cast<int>(CommKind::kAllGather)];
        const auto& b = hpz.ranks[r].comm_train[static_cast<int>(CommKind::kAllGather)];
        EXPECT_EQ(b.calls, a.calls) << where << " rank " << r;
        EXPECT_EQ(2 * b.cross_node_bytes, a.cross_node_bytes) << where << " rank " << r;
        EXPECT_LT(b.bytes, a.bytes) << where << " rank " << r;
        uint64_t copy = 0;
        for (uint64_t numel : hpz.unit_numel) {
          copy += Partition(numel, per_node).count(static_cast<int>(r) % per_node) * 2;
        }
        EXPECT_EQ(hpz.ranks[r].peak[static_cast<int>(MemCategory::kHpzParams)], copy)
            << where << " rank " << r;
        EXPECT_EQ(plain.ranks[r].peak[static_cast<int>(MemCategory::kHpzParams)], 0u) << where;
      }
    }
  }
}

// qwZ: the passes see weights rounded to int8 blocks, the same on every rank and every run;
// the loss stays close to the unquantized run's; hpZ on top keeps the node's copy of the
// dequantized weights, so the bits do not change; the gathers carry about half the bytes.
TEST(Qwz, IsDeterministicAndCloseToTheUnquantizedRun) {
  TrainConfig c = two_level_config(4, 2, 3, Precision::kBF16);
  c.steps = 8;
  c.qwz_block = 64;
  const TrainResult plain = run(c);
  c.qwz = true;
  const TrainResult q1 = run(c);
  const TrainResult q2 = run(c);
  c.hpz = true;
  const TrainResult q_hpz = run(c);
  EXPECT_EQ(q1.weights_sha256, q2.weights_sha256);
  EXPECT_EQ(q_hpz.weights_sha256, q1.weights_sha256);
  EXPECT_NE(q1.weights_sha256, plain.weights_sha256);
  const double a = plain.steps.back().loss, b = q1.steps.back().loss;
  EXPECT_LT(std::abs(b - a) / a, 0.02) << "unquantized " << a << ", qwZ " << b;
  const auto gathered = [](const TrainResult& r) {
    return r.ranks[0].comm_train[static_cast<int>(CommKind::kAllGather)].bytes;
  };
  // int8 plus a 4-byte scale per 64 elements, against 2 bytes per element.
  const double ratio = static_cast<double>(gathered(q1)) / static_cast<double>(gathered(plain));
  EXPECT_GT(ratio, 0.5);
  EXPECT_LT(ratio, 0.55);
}

TEST(Qwz, IsRefusedWhereNothingIsGathered) {
  TrainConfig c = two_level_config(4, 2, 2, Precision::kBF16);
  c.qwz = true;
  try {
    resolve_config(c);
    ADD_FAILURE() << "--qwz at stage 2 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--qwz quantizes stage 3's parameter gathers"),
              std::string::npos)
        << e.what();
  }
  c.stage = 3;
  c.qwz_block = 0;
  EXPECT_THROW(resolve_config(c), InvalidArgument);
}

// qgZ: gradients reduced in int4 blocks; deterministic, close to the unquantized loss, and
// with qwZ and hpZ, ZeRO++'s three together, at least 3.5x fewer bytes across nodes than
// stage 3 on the same two-level collectives (6 / (1.5 + 8 / B) for blocks of B).
TEST(Qgz, WithQwzAndHpzCutsTheCrossNodeBytesAtLeastThreeAndAHalfTimes) {
  TrainConfig c = two_level_config(4, 2, 3, Precision::kBF16);
  c.steps = 8;
  const TrainResult plain = run(c);
  c.launch.comm.qgz_bits = 4;
  const TrainResult g1 = run(c);
  const TrainResult g2 = run(c);
  EXPECT_EQ(g1.weights_sha256, g2.weights_sha256);
  EXPECT_NE(g1.weights_sha256, plain.weights_sha256);
  const double a = plain.steps.back().loss, b = g1.steps.back().loss;
  EXPECT_LT(std::abs(b - a) / a, 0.02) << "unquantized " << a << ", qgZ int4 " << b;
  c.qwz = true;
  c.hpz = true;
  const TrainResult all = run(c);
  const auto cross = [](const TrainResult& r) {
    uint64_t bytes = 0;
    for (int k = 0; k < kNumCommKinds; ++k) {
      if (static_cast<CommKind>(k) != CommKind::kControl) {
        bytes += r.ranks[0].comm_train[k].cross_node_bytes;
      }
    }
    return static_cast<double>(bytes);
  };
  EXPECT_GE(cross(plain) / cross(all), 3.5) << cross(plain) << " / " << cross(all);
  const double c_all = all.steps.back().loss;
  EXPECT_LT(std::abs(c_all - a) / a, 0.02) << "unquantized " << a << ", all three " << c_all;
}

// Stage 0 all-reduces its gradients: qgZ quantizes the all-reduce's reduce-scatter half, so
// every rank still ends with the same gradient, deterministically, and the loss stays close.
TEST(Qgz, QuantizesStageZerosAllReduce) {
  TrainConfig c = two_level_config(4, 2, 0, Precision::kBF16);
  c.steps = 8;
  const TrainResult plain = run(c);
  c.launch.comm.qgz_bits = 4;
  c.launch.comm.qgz_block = 64;
  const TrainResult q1 = run(c);
  EXPECT_EQ(run(c).weights_sha256, q1.weights_sha256);
  EXPECT_NE(q1.weights_sha256, plain.weights_sha256);
  const double a = plain.steps.back().loss, b = q1.steps.back().loss;
  EXPECT_LT(std::abs(b - a) / a, 0.02) << "unquantized " << a << ", qgZ " << b;
  const auto reduced = [](const TrainResult& r) {
    const auto& k = r.ranks[0].comm_train[static_cast<int>(CommKind::kAllReduce)];
    return static_cast<double>(k.cross_node_bytes);
  };
  EXPECT_LT(reduced(q1), reduced(plain));
}

TEST(Qgz, IsRefusedWhereGradientsMustStayInvariant) {
  TrainConfig c = two_level_config(4, 2, 2, Precision::kBF16);
  c.launch.comm.qgz_bits = 8;
  c.invariant = true;
  c.launch.comm.two_level = false;
  try {
    resolve_config(c);
    ADD_FAILURE() << "--qgz with --invariant on accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--invariant on needs unquantized gradients"),
              std::string::npos)
        << e.what();
  }
  c.invariant.reset();
  resolve_config(c);
  EXPECT_FALSE(canonical_order(c));
}

TEST(Hpz, IsRefusedWhereItHasNothingToKeep) {
  TrainConfig c = two_level_config(4, 2, 2, Precision::kBF16);
  c.hpz = true;
  EXPECT_THROW(resolve_config(c), InvalidArgument);
  c.stage = 3;
  c.launch.comm.node_ranks = 0;
  c.launch.comm.two_level = false;
  try {
    resolve_config(c);
    ADD_FAILURE() << "--hpz without --node-ranks accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("needs --node-ranks"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zerodp

namespace zerodp {
namespace {

TrainConfig hsdp_config(int ranks, int node_ranks, int stage, Precision precision) {
  TrainConfig c = testing::tiny_config(ranks, stage, precision);
  c.launch.comm.node_ranks = node_ranks;
  c.shard_within_node = true;
  c.accumulate = AccumulatePolicy::kReduce;
  return c;
}

// HSDP reduces every element as the two-level collectives do (the node's ranks folded and
// rounded, then the nodes in order) and its squares are exact, so at every stage it gives the
// two-level run's bits; its states are 1/T of the model per rank, not 1/N, and its gathers
// never leave the node.
TEST(ShardWithinNode, GivesTheTwoLevelBitsWithStatesShardedOverTheNode) {
  for (const auto& [ranks, per_node, accum] : {std::tuple{4, 2, 1}, {6, 3, 2}, {6, 2, 1}}) {
    TrainConfig tl = two_level_config(ranks, per_node, 2, Precision::kBF16);
    tl.grad_accum = accum;
    const TrainResult want = run(tl);
    for (int stage = 1; stage <= 3; ++stage) {
      TrainConfig c = hsdp_config(ranks, per_node, stage, Precision::kBF16);
      c.grad_accum = accum;
      const std::string where =
          fmt::format("{} x {} A={} stage {}", ranks / per_node, per_node, accum, stage);
      const TrainResult got = run(c);
      EXPECT_EQ(got.weights_sha256, want.weights_sha256) << where;
      ASSERT_EQ(got.steps.size(), want.steps.size()) << where;
      for (size_t k = 0; k < got.steps.size(); ++k) {
        EXPECT_EQ(got.steps[k].grad_norm, want.steps[k].grad_norm) << where << " step " << k + 1;
      }
      for (size_t r = 0; r < got.ranks.size(); ++r) {
        const StateBytes s = model_state_bytes(got.unit_numel, per_node, stage, Precision::kBF16,
                                               static_cast<int>(r) % per_node);
        const auto& m = got.ranks[r].model_state;
        EXPECT_EQ(m[static_cast<int>(MemCategory::kParams)], s.params) << where << " rank " << r;
        EXPECT_EQ(m[static_cast<int>(MemCategory::kMaster)], s.master) << where << " rank " << r;
        EXPECT_EQ(m[static_cast<int>(MemCategory::kAdamM)], s.adam_m) << where << " rank " << r;
        const auto& ag = got.ranks[r].comm_train[static_cast<int>(CommKind::kAllGather)];
        EXPECT_GT(ag.bytes, 0u) << where;
        EXPECT_EQ(ag.cross_node_bytes, 0u) << where << " rank " << r;
        const auto& rs = got.ranks[r].comm_train[static_cast<int>(CommKind::kReduceScatter)];
        EXPECT_GT(rs.cross_node_bytes, 0u) << where << " rank " << r;
      }
    }
  }
}

// Stage 1 under --accumulate local reduces the full gradient buffer in place, which over
// several nodes the other nodes' ranks read as well: still the two-level bits.
TEST(ShardWithinNode, ReducesInPlaceAtStageOneWithLocalAccumulation) {
  for (const auto& [ranks, per_node] : {std::pair{4, 2}, {6, 3}}) {
    TrainConfig tl = two_level_config(ranks, per_node, 1, Precision::kBF16);
    tl.accumulate = AccumulatePolicy::kLocal;
    tl.grad_accum = 2;
    TrainConfig c = hsdp_config(ranks, per_node, 1, Precision::kBF16);
    c.accumulate = AccumulatePolicy::kLocal;
    c.grad_accum = 2;
    EXPECT_EQ(run(c).weights_sha256, run(tl).weights_sha256) << ranks << " ranks of " << per_node;
  }
}

// One node's ranks write the checkpoint (the others hold copies): a world of T shards, from
// which a continuation resumes to the uninterrupted run's bits, and a plain run resumes too.
TEST(ShardWithinNode, CheckpointsOneNodesShardsAndResumesToTheSameBits) {
  testing::TempDir tmp;
  TrainConfig c = hsdp_config(6, 3, 3, Precision::kBF16);
  c.steps = 6;
  c.checkpoint_dir = (tmp.path() / "full").string();
  c.checkpoint_every = 3;
  const TrainResult full = run(c);
  const std::filesystem::path step3 = tmp.path() / "full" / "step_00000003";
  const checkpoint::Checkpoint saved(step3);
  EXPECT_EQ(saved.meta().world_size, 3);
  EXPECT_TRUE(std::filesystem::exists(step3 / checkpoint::rank_file_name(2)));
  EXPECT_FALSE(std::filesystem::exists(step3 / checkpoint::rank_file_name(3)));
  TrainConfig r = c;
  r.checkpoint_dir = (tmp.path() / "cont").string();
  r.resume = step3.string();
  EXPECT_EQ(run(r).weights_sha256, full.weights_sha256);
  TrainConfig plain = testing::tiny_config(2, 1, Precision::kBF16);
  plain.steps = 6;
  plain.resume = step3.string();
  const TrainResult other = run(plain);
  EXPECT_EQ(other.first_step, 4);
  ASSERT_EQ(other.steps.size(), 3u);
  EXPECT_NEAR(other.steps.back().loss, full.steps.back().loss, 0.01);
}

TEST(ShardWithinNode, IsRefusedWhereItCannotWork) {
  const auto refused = [](TrainConfig c, const std::string& expect) {
    try {
      resolve_config(c);
      ADD_FAILURE() << "accepted; wanted a refusal saying '" << expect << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  };
  refused(hsdp_config(4, 2, 0, Precision::kBF16), "--stage 0 shards none");
  refused(hsdp_config(4, 0, 2, Precision::kBF16), "needs --node-ranks");
  TrainConfig c = hsdp_config(4, 2, 3, Precision::kBF16);
  c.hpz = true;
  refused(c, "--hpz has nothing to act on");
  c = hsdp_config(4, 2, 2, Precision::kBF16);
  c.invariant = true;
  refused(c, "--invariant on");
  c = hsdp_config(4, 2, 2, Precision::kBF16);
  resolve_config(c);
  EXPECT_FALSE(canonical_order(c));
}

}  // namespace
}  // namespace zerodp
