// The engine's parts on their own: the stage plan's table, a RankTrainer built directly
// (its ledger is the planner's description, before and after a step), the fault plan's
// hook points, and error re-typing.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <typeinfo>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "comm/launch.h"
#include "comm/local.h"
#include "core/error.h"
#include "data/source.h"
#include "models/gpt.h"
#include "train/config.h"
#include "train/fault_plan.h"
#include "train/flat.h"
#include "train/plan.h"
#include "train/rank_trainer.h"
#include "train/setup.h"
#include "train/stage_plan.h"
#include "train_testing.h"

namespace zerodp {
namespace {

using Extent = StagePlan::Extent;
using Reduce = StagePlan::Reduce;

// docs/zero.md's table, row by row.
TEST(StagePlan, EveryStageShardsWhatItsRowSays) {
  struct Row {
    Extent params, grads, optimizer;
    Reduce reduce;  // the one reduction, at the boundary or per micro-batch
    bool accumulate_full, gather_before, gather_after;
  };
  const Row rows[4] = {
      {Extent::kFull, Extent::kFull, Extent::kFull, Reduce::kAllReduce, false, false, false},
      {Extent::kFull, Extent::kFull, Extent::kOwn, Reduce::kReduceScatter, false, false, true},
      {Extent::kFull, Extent::kOwn, Extent::kOwn, Reduce::kReduceScatter, true, false, true},
      {Extent::kOwn, Extent::kOwn, Extent::kOwn, Reduce::kReduceScatter, true, true, false},
  };
  for (int stage = 0; stage <= 3; ++stage) {
    const Row& want = rows[stage];
    for (const auto policy : {AccumulatePolicy::kLocal, AccumulatePolicy::kReduce}) {
      SCOPED_TRACE(::testing::Message() << "stage " << stage << ", " << accumulate_name(policy));
      const StagePlan p = StagePlan::make(stage, policy);
      EXPECT_EQ(p.params, want.params);
      EXPECT_EQ(p.grads, want.grads);
      EXPECT_EQ(p.optimizer, want.optimizer);
      const bool local = policy == AccumulatePolicy::kLocal;
      EXPECT_EQ(p.boundary_reduce, local ? want.reduce : Reduce::kNone);
      EXPECT_EQ(p.micro_batch_reduce, local ? Reduce::kNone : want.reduce);
      EXPECT_EQ(p.accumulate_full, local && want.accumulate_full);
      EXPECT_EQ(p.gather_before_compute, want.gather_before);
      EXPECT_EQ(p.gather_after_update, want.gather_after);
    }
  }
  EXPECT_THROW(StagePlan::make(4, AccumulatePolicy::kLocal), InvalidArgument);
}

TEST(StagePlan, OffsetsOfTheOwnRangeInEachExtent) {
  const Range own{30, 45};
  EXPECT_EQ(StagePlan::held(Extent::kOwn, own, 100), own);
  EXPECT_EQ(StagePlan::held(Extent::kFull, own, 100), (Range{0, 100}));
  EXPECT_EQ(StagePlan::offset(Extent::kOwn, own, 30), 0u);
  EXPECT_EQ(StagePlan::offset(Extent::kFull, own, 30), 30u);
  EXPECT_EQ(StagePlan::count(Extent::kOwn, 15, 100), 15u);
  EXPECT_EQ(StagePlan::count(Extent::kFull, 15, 100), 100u);
}

DataSplits synthetic_text(const TrainConfig& c) {
  DataOptions o;
  o.source = "synthetic";
  o.task = TaskKind::kLanguageModel;
  o.seq_len = c.seq_len;
  o.seed = c.seed;
  return open_data(o);
}

// A trainer's ledger holds exactly what the planner describes, category by category, for
// every stage, policy and rank of a ragged partition; a step allocates nothing.
TEST(RankTrainer, AllocatesWhatThePlannerDescribesAndNothingPerStep) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (const auto policy : {AccumulatePolicy::kLocal, AccumulatePolicy::kReduce}) {
      SCOPED_TRACE(::testing::Message() << "stage " << stage << ", " << accumulate_name(policy));
      TrainConfig c = testing::tiny_config(3, stage, Precision::kBF16);
      c.accumulate = policy;
      c.grad_accum = 2;
      c.micro_batch = 2;
      resolve_config(c);
      const DataSplits data = synthetic_text(c);
      std::mutex mu;
      std::vector<std::string> failures;
      int argc = 1;
      char name[] = "test";
      char* args[] = {name, nullptr};
      char** argv = args;
      launch(c.launch, argc, argv, [&](Communicator& comm) {
        RankTrainer t(c, comm, data, {});
        std::vector<uint64_t> numel;
        for (const auto& u : t.model()) numel.push_back(u->numel());
        const StateBytes s = model_state_bytes(numel, comm.size(), stage, c.precision, comm.rank(),
                                               fp32_accumulator(c));
        const TransientBytes tb =
            transient_bytes(t.model(), transient_plan(c, data, comm.size()), comm.rank());
        const MemoryLedger::Table before = t.ledger().current_table();
        const std::pair<MemCategory, uint64_t> want[] = {
            {MemCategory::kParams, s.params},
            {MemCategory::kGrads, s.grads},
            {MemCategory::kMaster, s.master},
            {MemCategory::kAdamM, s.adam_m},
            {MemCategory::kAdamV, s.adam_v},
            {MemCategory::kActivations, tb.activations},
            {MemCategory::kWorkspace, tb.workspace},
            {MemCategory::kGathered, tb.gathered},
            {MemCategory::kGradBuckets, tb.grad_buckets},
            {MemCategory::kGradAccum, tb.grad_accum},
            {MemCategory::kCommBuffers, tb.comm_buffers}};
        std::string bad;
        for (const auto& [cat, bytes] : want) {
          if (t.ledger().current(cat) != bytes) {
            bad += fmt::format(" {} holds {} (planner {});", mem_category_name(cat),
                               t.ledger().current(cat), bytes);
          }
        }
        const StepRecord rec = t.step(1);
        if (!std::isfinite(rec.loss) || rec.skipped) bad += " step 1 did not train;";
        if (t.ledger().current_table() != before) bad += " step 1 changed the ledger;";
        if (t.ledger().peak_total() != t.ledger().current_total()) bad += " a step allocated;";
        std::lock_guard lock(mu);
        if (!bad.empty()) failures.push_back(fmt::format("rank {}:{}", comm.rank(), bad));
      });
      EXPECT_TRUE(failures.empty()) << fmt::format("{}", fmt::join(failures, "\n"));
    }
  }
}

// The fault plan acts at its hook point, on the rank it names, and nowhere else.
TEST(FaultPlan, EachKindActsAtItsHookOnItsRankOnly) {
  const std::vector<Injection> inj = {
      {Injection::Kind::kThrow, 2, 1}, {Injection::Kind::kIo, 3, 1}, {Injection::Kind::kNan, 4, 1}};
  const FaultPlan rank0(inj, 0, 1.0), rank1(inj, 1, 1.0);
  EXPECT_NO_THROW(rank0.step_start(2));
  EXPECT_NO_THROW(rank1.step_start(1));
  try {
    rank1.step_start(2);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "injected failure (--inject throw@2:1)");
  }
  EXPECT_NO_THROW(rank1.shard_write(2, "/x/rank1.safetensors"));
  try {
    rank1.shard_write(3, "/x/rank1.safetensors");
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/x/rank1.safetensors"), std::string::npos) << e.what();
  }

  // nan: one element of rank 1's own gradient range, in the last unit that owns any.
  const Model model = make_gpt(gpt_preset("tiny").config);
  MemoryLedger ledger;
  ShardedState state(model, StagePlan::make(1, AccumulatePolicy::kLocal), Precision::kFP32, false,
                     false, 1, 3, 1, ledger);
  const auto nan_count = [&] {
    size_t n = 0;
    for (auto& u : state.units()) {
      std::vector<float> v(u.grads.count);
      widen(u.grads.data(), state.dtype(), 0, v);
      for (float x : v) n += std::isnan(x) ? 1 : 0;
    }
    return n;
  };
  rank0.gradients_reduced(4, state);
  rank1.gradients_reduced(3, state);
  EXPECT_EQ(nan_count(), 0u);
  rank1.gradients_reduced(4, state);
  EXPECT_EQ(nan_count(), 1u);
  const UnitState& last = state.units().back();
  std::vector<float> v(last.own.count());
  widen(last.grads.data(), state.dtype(), last.grads_own, v);
  EXPECT_TRUE(std::isnan(v[0]));
}

// A failure re-thrown with its place keeps its type (and the exit code main gives it).
TEST(Errors, RethrowWithContextKeepsTheTypeAndLeadsWithThePlace) {
  const auto again = [](const auto& error) {
    try {
      try {
        throw error;
      } catch (...) {
        rethrow_with_context("rank 1 of 2, step 3");
      }
    } catch (const std::exception& e) {
      return std::pair<std::string, std::string>(typeid(e).name(), e.what());
    }
    return std::pair<std::string, std::string>();
  };
  EXPECT_EQ(again(CorruptData("bad")), std::make_pair(std::string(typeid(CorruptData).name()),
                                                      std::string("rank 1 of 2, step 3: bad")));
  EXPECT_EQ(again(OutOfMemory("m")).first, typeid(OutOfMemory).name());
  EXPECT_EQ(again(IoError("m")).first, typeid(IoError).name());
  EXPECT_EQ(again(InvalidArgument("m")).first, typeid(InvalidArgument).name());
  EXPECT_EQ(again(std::runtime_error("m")).first, typeid(Error).name());
  try {
    try {
      throw CommTimeout("late", 2);
    } catch (...) {
      rethrow_with_context("step 9");
    }
  } catch (const CommTimeout& e) {
    EXPECT_EQ(e.failed_rank(), 2);
    EXPECT_STREQ(e.what(), "step 9: late");
  }
}

// The options compared across ranks are as many as a configuration holds: a fixed number of
// slots once failed every MPI run as soon as options outgrew it.
TEST(SameConfig, ComparesAnyNumberOfOptionsAndNamesTheOneThatDiffers) {
  const TrainConfig cfg;
  nlohmann::json base = config_json(cfg);
  for (int i = 0; base.size() < 300; ++i) base[fmt::format("extra_option_{:03}", i)] = i;
  run_local(3, {}, [&](Communicator& comm) { check_same_options(base, comm); });
  std::string error;
  std::mutex mu;
  run_local(3, {}, [&](Communicator& comm) {
    nlohmann::json mine = base;
    if (comm.rank() == 2) mine["extra_option_100"] = -1;
    try {
      check_same_options(mine, comm);
    } catch (const InvalidArgument& e) {
      const std::lock_guard lock(mu);
      if (comm.rank() == 0) error = e.what();
    }
  });
  EXPECT_NE(error.find("rank(s) 2 run another configuration than rank 0: --extra-option-100 "
                       "differs"),
            std::string::npos)
      << error;
  // One rank with more options than the others still meets them and is named.
  error.clear();
  run_local(2, {}, [&](Communicator& comm) {
    nlohmann::json mine = base;
    if (comm.rank() == 1) mine["zz_only_on_rank_1"] = 1;
    try {
      check_same_options(mine, comm);
    } catch (const InvalidArgument& e) {
      const std::lock_guard lock(mu);
      if (comm.rank() == 0) error = e.what();
    }
  });
  EXPECT_NE(error.find("rank(s) 1 run another configuration"), std::string::npos) << error;
}

}  // namespace
}  // namespace zerodp
